"""Persistent volumes never release what the cluster keeps: the high-mark rule, kind by kind.

A PVC never shrinks and a StatefulSet keeps the claims of replicas it scales away, so a volume
term is charged at the largest figure admitted while the application exists.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import platform, request, state
from webhook.admission.admit import apply_admitted
from webhook.core.admission.decisions import Decision, Policy, decide, mutate
from webhook.core.admission.state import ReservationState
from webhook.core.base.quantities import MAX_QUANTITY
from webhook.core.pricing.contracts import compile_contract
from webhook.core.pricing.evaluation import MAX_COUNT, Charge, TermCharge, evaluate
from webhook.core.pricing.volumes import MAX_MARKS, hold, read_step, step_key
from webhook.core.tenancy.records import parse_recorded_charge
from webhook.defaults import default_contracts

GI = Decimal(1024**3)
ENFORCE = Policy()
NS = "tenant-acme"


def write(
    current: ReservationState, kind: str, name: str, spec: Any, old: Any = None, **kwargs: Any
) -> Decision:
    """A write as the API server sends it: mutated, then validated and stored."""
    operation = "UPDATE" if old is not None else "CREATE"
    body = request(kind, NS, name, spec, operation=operation, old_spec=old, **kwargs)
    decision = decide(body, current, ENFORCE)
    apply_admitted(current, body, decision)
    return decision


def storage(current: ReservationState) -> Decimal:
    node = current.tree.get(NS)
    assert node is not None
    return node.usage.get("storage", Decimal(0))


def test_lowering_a_vm_disk_keeps_its_storage_charged_until_it_is_deleted() -> None:
    current = state({NS: {"storage": "100Gi"}})
    assert write(current, "VMDisk", "d1", {"storage": "100Gi"}).allowed
    shrink = write(current, "VMDisk", "d1", {"storage": "1Gi"}, {"storage": "100Gi"})
    assert shrink.allowed
    assert shrink.charge == {"storage": 100 * GI}
    assert any(
        "held at its high mark: disk at 100Gi (values say 1Gi)" in w for w in shrink.warnings
    )
    assert storage(current) == 100 * GI
    denied = write(current, "VMDisk", "d2", {"storage": "99Gi"})
    assert not denied.allowed
    # Growing again past the mark raises it; deleting releases it.
    grow = write(current, "VMDisk", "d1", {"storage": "100Gi"}, {"storage": "1Gi"})
    assert grow.charge == {"storage": 100 * GI}
    current.forget(("VMDisk", NS, "d1"))
    assert storage(current) == 0


def test_scaling_postgres_down_keeps_the_removed_instances_volumes_charged() -> None:
    """Two 50Gi instances, scaled to one of 1Gi: the cluster still holds 100Gi of PVCs."""
    current = state({NS: {"storage": "100Gi", "cpu": "64", "memory": "64Gi"}})
    two = {"replicas": 2, "size": "50Gi"}
    assert write(current, "Postgres", "db", two).allowed
    one = {"replicas": 1, "size": "1Gi"}
    down = write(current, "Postgres", "db", one, two)
    assert down.allowed
    assert down.charge is not None
    assert down.charge["storage"] == 100 * GI
    assert down.charge["memory"] == 256 * 1024**2  # compute follows the values down
    assert not write(current, "Postgres", "db2", {"replicas": 1, "size": "1Gi"}).allowed


def test_the_mark_travels_in_the_signed_record_to_a_replica_that_never_saw_the_shrink() -> None:
    current = state({NS: {"storage": "100Gi"}})
    write(current, "VMDisk", "d1", {"storage": "100Gi"})
    body = request(
        "VMDisk", NS, "d1", {"storage": "1Gi"}, operation="UPDATE", old_spec={"storage": "100Gi"}
    )
    patched = mutate(body, current, ENFORCE)
    assert patched.charge == {"storage": 100 * GI}
    (operation,) = patched.patch
    value = operation["value"]
    assert isinstance(value, dict)
    text = value["reservation.cozystack.io/charge"]
    record = parse_recorded_charge(text)
    assert record is not None
    assert record.marks == {"disk#1": 100 * GI}
    # Another replica, fresh: it reads the mark from the record on the stored object.
    fresh = state({NS: {"storage": "100Gi"}})
    notes = {"reservation.cozystack.io/charge": text}
    later = request(
        "VMDisk",
        NS,
        "d1",
        {"storage": "2Gi"},
        operation="UPDATE",
        old_spec={"storage": "1Gi"},
        old_annotations=notes,
    )
    assert decide(later, fresh, ENFORCE).charge == {"storage": 100 * GI}


def test_a_million_clickhouse_servers_scaled_to_one_keep_their_volumes_charged() -> None:
    """1000 shards x 1000 replicas of 100Ki of PVCs each (no compute): 102400M held. Scaled to
    1 x 1 the claims stay, and so must the charge: the mark is keyed ``servers#1000000``, a
    count of seven digits, and is read back as written (not dropped, freeing the pool)."""
    current = state({NS: {"storage": "100Gi"}})
    none = {"cpu": "0", "memory": "0"}
    base = {"size": "50Ki", "logStorageSize": "50Ki", "resources": none}
    big = {**base, "shards": 1000, "replicas": 1000, "clickhouseKeeper": {"enabled": False}}
    assert write(current, "ClickHouse", "ch", big).allowed
    held = Decimal(1000 * 1000 * 100 * 1024)
    assert storage(current) == held
    small = {**big, "shards": 1, "replicas": 1}
    down = write(current, "ClickHouse", "ch", small, big)
    assert down.allowed
    assert down.charge is not None
    assert down.charge["storage"] == held
    assert storage(current) == held
    # The room the claims still take is not free for a second one.
    assert not write(current, "ClickHouse", "ch2", big).allowed


def contract(volume: str) -> Any:
    return compile_contract(
        "Pool",
        {
            "terms": [
                {
                    "name": "disks",
                    "forEach": "$.groups.*",
                    "count": "@.replicas",
                    "storage": "@.size",
                    "volume": volume,
                }
            ]
        },
        source="test",
    )


def charge(volume: str, groups: dict[str, Any], previous: dict[str, Decimal]) -> Any:
    found = evaluate(contract(volume), {"groups": groups}, platform().catalog)
    return hold(found, previous, ["disks"] if volume == "released" else [])


def test_kept_volumes_hold_the_total_and_a_removed_item_keeps_its_mark() -> None:
    groups = {"a": {"replicas": 3, "size": "10Gi"}, "b": {"replicas": 1, "size": "5Gi"}}
    first = charge("kept", groups, {})
    assert first.marks == {"disks:groups.a#3": 10 * GI, "disks:groups.b#1": 5 * GI}
    later = charge("kept", {"a": {"replicas": 1, "size": "20Gi"}}, first.marks)
    # a-0 grew to 20Gi; a-1 and a-2 keep their 10Gi claims; b's 5Gi claim stays.
    assert later.charge.resources["storage"] == 45 * GI
    assert later.held == {"disks:groups.a": (20 * GI, 40 * GI), "disks:groups.b": (0, 5 * GI)}


def test_an_item_name_cannot_pass_for_a_step_of_another_item() -> None:
    first = charge("released", {"a#3": {"replicas": 1, "size": "10Gi"}}, {})
    again = charge("released", {"a#3": {"replicas": 1, "size": "1Gi"}}, first.marks)
    assert again.charge.resources["storage"] == 10 * GI


def test_released_volumes_hold_each_units_size_and_follow_the_count() -> None:
    first = charge("released", {"a": {"replicas": 3, "size": "10Gi"}}, {})
    assert first.marks == {"disks:groups.a": 10 * GI}
    fewer = charge("released", {"a": {"replicas": 1, "size": "1Gi"}}, first.marks)
    assert fewer.charge.resources["storage"] == 10 * GI  # one unit, still at its 10Gi
    gone = charge("released", {}, first.marks)
    assert gone.charge.resources.get("storage", 0) == 0


def test_every_shipped_kind_with_pvcs_marks_its_volume_terms() -> None:
    """Every default contract term that charges storage (a PVC) is a volume, except worker
    disks of Kubernetes node groups: a machine's disk is replaced with the machine, never
    shrunk, and the node group is charged at maxReplicas whatever runs."""
    unmarked = []
    for kind, found in sorted(default_contracts().items()):
        for term in found.terms:
            stores = term.storage is not None or "storage" in repr(term.size)
            if stores and not term.volume:
                unmarked.append(f"{kind}.{term.name}")
    assert unmarked == ["ComputePlane.workers", "Kubernetes.workers", "KubernetesNodes.workers"]


sizes = st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=8)
counts = st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(sizes=sizes, counts=counts, volume=st.sampled_from(["kept", "released"]))
def test_a_volume_charge_never_drops_below_what_the_cluster_may_still_hold(
    sizes: list[int], counts: list[int], volume: str
) -> None:
    """Any sequence of resizes and scalings: the charge is at least what the PVCs hold (every
    size a unit ever had, for every unit that ever existed when kept; for every unit that
    exists when released)."""
    marks: dict[str, Decimal] = {}
    claims: dict[int, int] = {}  # what a StatefulSet leaves: claim i at its largest size
    biggest = 0
    for size, count in zip(sizes, counts, strict=False):
        held = charge(volume, {"a": {"replicas": count, "size": f"{size}Gi"}}, marks)
        marks = held.marks
        biggest = max(biggest, size)
        for unit in range(count):
            claims[unit] = max(claims.get(unit, 0), size)
        # kept: every claim ever made; released: today's units, each at its largest size
        floor = sum(claims.values()) if volume == "kept" else biggest * count
        assert held.charge.resources.get("storage", 0) >= floor * GI
        assert len(marks) <= 16


def test_piling_up_marks_cannot_push_the_record_past_what_is_believed() -> None:
    """Hundreds of items, each scaled up and down, would make a record too big to be stored
    or believed, and with it the marks would go: past 256 marks each item keeps one step and
    the items that are gone fold into one figure per term (more, never less), and repeated
    writes do not make the figure grow."""
    marks: dict[str, Decimal] = {}
    for size, replicas in (("4Gi", 1), ("1Gi", 3)):  # two steps per item: 600 marks
        groups = {f"g{i}": {"replicas": replicas, "size": size} for i in range(300)}
        marks = charge("kept", groups, marks).marks
    assert len(marks) == 300
    assert marks["disks:groups.g0#3"] == 4 * GI  # one step: 3 claims at 4Gi (real: 4+1+1)
    half = {f"g{i}": {"replicas": 1, "size": "1Gi"} for i in range(150)}
    first = charge("kept", half, marks)
    again = charge("kept", half, first.marks)
    assert again.charge.resources["storage"] == first.charge.resources["storage"]
    # 150 items at 3 x 4Gi each, and 150 gone items whose claims (4Gi + 1Gi + 1Gi) stay.
    assert first.charge.resources["storage"] >= 150 * 6 * GI + 150 * 6 * GI


# Unit counts as the bounds allow them: any count up to 2^63-1 (evaluation refuses more), and
# products of counts read from values, each at most MAX_COUNT (shards x replicas ...).
most = int(MAX_QUANTITY)
products = st.lists(st.integers(1, MAX_COUNT), min_size=2, max_size=4).map(math.prod)
unit_counts = st.one_of(
    st.integers(1, most), products.filter(lambda n: n <= most), st.sampled_from([1, 10**6, most])
)
volume_terms = st.lists(
    st.tuples(
        st.from_regex(r"[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?", fullmatch=True),  # a term's name
        st.one_of(st.just(""), st.text(max_size=8)),  # the forEach item: the tenant's name
        unit_counts,
        st.integers(1, 2**40).map(Decimal),  # bytes of one unit
        st.sampled_from(["kept", "released"]),
    ),
    min_size=1,
    max_size=5,
    unique_by=lambda t: (t[0], t[1]),
)


def volumes(terms: list[tuple[str, str, int, Decimal, str]], *, scaled_to_zero: bool) -> Charge:
    """A charge of these volume terms; scaled to zero, each kept term has no units left and
    each released one keeps its units at no size (what the marks must still hold)."""
    built = []
    for name, path, count, size, volume in terms:
        if scaled_to_zero:
            count, size = (0 if volume == "kept" else count), Decimal(0)
        stored = Decimal(count * int(size))  # exact, as evaluation computes in 60 digits
        built.append(TermCharge(name, path, Decimal(count), "", {"storage": stored}, volume, size))
    total = Decimal(sum(int(t.resources["storage"]) for t in built))
    return Charge("Thing", {"storage": total}, "d", "c", tuple(built))


def written_keys_read_back(marks: dict[str, Decimal]) -> None:
    for key in marks:
        step = read_step(key)
        if step is None:
            assert "#" not in key, key  # a released unit size: its base alone
        else:
            assert step_key(*step) == key


@settings(max_examples=150, deadline=None, derandomize=True)
@given(terms=volume_terms, crowded=st.booleans())
def test_every_volume_mark_written_is_read_back_for_any_unit_count(
    terms: list[tuple[str, str, int, Decimal, str]], crowded: bool
) -> None:
    """Whatever the counts (a million servers, 2^63-1, a product of counts), item names and
    folding (past MAX_MARKS), every mark the keying and folding write reads back: scaled to
    nothing and then removed, the charge never drops below what the claims hold."""
    if crowded:  # enough items to fold: each present item keeps one step, gone items one sum
        terms = terms + [("filler", f"g{i}", 1, Decimal(1), "kept") for i in range(MAX_MARKS)]
    kept = sum(c * int(s) for _, _, c, s, v in terms if v == "kept")  # exact integers
    released = sum(c * int(s) for _, _, c, s, v in terms if v == "released")
    gone = Charge("Thing", {}, "d", "c")
    first = hold(volumes(terms, scaled_to_zero=False), {})
    written_keys_read_back(first.marks)
    down = hold(volumes(terms, scaled_to_zero=True), first.marks)
    written_keys_read_back(down.marks)
    assert down.charge.resources["storage"] >= kept + released
    marks = down.marks
    for _ in range(2):  # removed, and written again: nothing kept is let go
        after = hold(gone, marks)
        written_keys_read_back(after.marks)
        assert after.charge.resources.get("storage", 0) >= kept
        marks = after.marks

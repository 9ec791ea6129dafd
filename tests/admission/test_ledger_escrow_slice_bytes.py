"""``status.slices`` has a byte bound of its own (``MAX_SLICES_BYTES``): a record lists keys of
the pool's budget, and a budget of 64 keys of the longest names makes one of some 60 KiB, so
without the bound a few replicas' lives would pass the object's bound and ten etcd's limit,
and the pool would stop for everyone. A grant past the bound is not made (the replica admits by
the exact path, counted as ``slices-full``), and no write past ``MAX_OBJECT_BYTES`` is sent."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.admission.test_ledger import PAST_GRACE, POOL, Clock, Cluster, Replica
from tests.builders import review
from webhook.admission.ledger.book import TooLarge
from webhook.admission.ledger.bounds import MAX_OBJECT_BYTES, MAX_SLICES_BYTES
from webhook.admission.ledger.escrowed import record_json
from webhook.admission.ledger.slices import largest_bytes, slice_records, slices_bytes
from webhook.core.admission.escrow import SliceRecord
from webhook.core.admission.reviews import AdmissionRequest, parse_review
from webhook.core.base.json_codec import encode_json
from webhook.core.base.quantities import MAX_QUANTITY
from webhook.core.tenancy.counts import MAX_BUDGET_KEYS, MAX_KEY_CHARS

# The longest budget keys a quota may name: a 244-character prefix (the chart renders it after
# "requests.", and the whole must stay a subdomain), "/", a 63-character name; each distinct.
PREFIX = 253 - len("requests.")


def longest_key(index: int) -> str:
    prefix = (f"k{index:02d}." + "p" * PREFIX)[:PREFIX]
    return f"{prefix}/{'n' * 63}"


KEYS = [longest_key(i) for i in range(MAX_BUDGET_KEYS)]
BUDGET = dict.fromkeys(KEYS, "1000000")


def sub_tenant(name: str, uid: str) -> AdmissionRequest:
    """A sub-tenant whose quota names every key of the pool's budget: its charge does too."""
    quotas = dict.fromkeys(KEYS, "1")
    return parse_review(review("Tenant", POOL, name, {"resourceQuotas": quotas}, uid=uid))


def _slices(cluster: Cluster) -> dict[str, Any]:
    return dict((cluster.objects[POOL].get("status") or {}).get("slices") or {})


def _replica(cluster: Cluster, name: str, clock: Clock | None = None) -> tuple[Replica, list[str]]:
    replica = Replica(
        cluster, name, {POOL: BUDGET}, escrow=True, namespace_share=1.0, clock=clock or Clock()
    )
    reasons: list[str] = []
    replica.ledger.on_fallback = lambda reason, seconds: reasons.append(reason)
    return replica, reasons


async def test_slice_records_at_longest_budget_keys_keep_object_within_bound() -> None:
    assert len(KEYS[0]) == PREFIX + 1 + 63 > MAX_KEY_CHARS - 10
    cluster, clock = Cluster(), Clock()
    # Ten lives asking for slices: replicas, and new lives of the same pods.
    replicas = [_replica(cluster, f"r{index % 4}", clock) for index in range(10)]
    for number, (replica, _) in enumerate(replicas):
        for index in range(2):  # a recent rate on all 64 keys: each asks for a slice
            name = f"w{number}x{index}"
            assert (await replica.admit(sub_tenant(name, f"uid-{name}"))).allowed
    for _ in range(3):
        for replica, _ in replicas:
            replica.deliver()
            await replica.ledger.escrow()
            slices = _slices(cluster)
            assert len(encode_json(slices)) <= slices_bytes(slices) <= MAX_SLICES_BYTES
            assert len(encode_json(cluster.objects[POOL])) <= MAX_OBJECT_BYTES
    records = slice_records(cluster.objects[POOL]["status"])
    assert len(records) == 1, "one record of the longest keys fits the bound, a second not"
    assert slices_bytes(_slices(cluster)) > MAX_SLICES_BYTES // 2
    # Every other life admits by the exact path, told apart as the bound's doing (the
    # entries of 64 long keys fill the ledger's bytes: the first ones are let expire).
    clock.now += PAST_GRACE
    for number, (replica, reasons) in enumerate(replicas):
        replica.deliver()
        if replica.ledger._escrowed and replica.ledger._escrowed.escrow.record(POOL):
            continue
        before = cluster.writes
        decision = await replica.admit(sub_tenant(f"late{number}", f"uid-late{number}"))
        assert decision.allowed
        assert cluster.writes == before + 1, "the exact path wrote an entry"
        assert reasons[-1] == "slices-full"
    assert len(encode_json(cluster.objects[POOL])) <= MAX_OBJECT_BYTES


async def test_the_one_slice_of_longest_keys_folds_and_renews_within_its_bound() -> None:
    # A record grows between grants (its folded and returned list every key), so it is counted
    # at its largest when granted: the holder's own later writes never pass the bound.
    cluster = Cluster()
    a, _ = _replica(cluster, "a")
    for index in range(2):
        assert (await a.admit(sub_tenant(f"w{index}", f"uid-w{index}"))).allowed
    assert await a.ledger.escrow() == 1
    granted = slices_bytes(_slices(cluster))
    escrowed = a.escrowed
    spends = escrowed.spends
    for index in range(3):
        await a.admit(sub_tenant(f"s{index}", f"uid-s{index}"))
    assert escrowed.spends > spends, "answered from the slice"
    escrowed.monotonic = lambda: 1e9  # far later: the spends can no longer be stored, idle
    a.deliver()
    await a.ledger.escrow()
    (record,) = slice_records(cluster.objects[POOL]["status"]).values()
    assert set(record.folded) == set(KEYS), "folded, on every key"
    assert set(record.returned) == set(KEYS), "given back, on every key"
    assert len(encode_json(_slices(cluster))) <= granted <= MAX_SLICES_BYTES


async def test_a_write_past_the_object_bound_is_never_sent() -> None:
    cluster = Cluster()
    a, _ = _replica(cluster, "a")
    assert (await a.admit(sub_tenant("w0", "uid-w0"))).allowed
    book = a.ledger._book
    current = cluster.objects[POOL]
    status = {**current["status"], "padding": "x" * MAX_OBJECT_BYTES}
    before = cluster.writes
    with pytest.raises(TooLarge) as refused:
        await book.write(POOL, current, status)
    assert refused.value.status == 413
    assert cluster.writes == before, "nothing was sent"
    assert book.oversized == 1


async def test_a_foreign_record_past_the_bound_makes_no_grant_and_no_write_fail() -> None:
    # Records another writer put there, past the bound: no grant is made beside them, and
    # the exact path still admits.
    cluster = Cluster()
    a, reasons = _replica(cluster, "a")
    assert (await a.admit(sub_tenant("w0", "uid-w0"))).allowed
    stored = cluster.objects[POOL]
    far = "2999-01-01T00:00:00Z"
    stored["status"]["slices"] = {"other.0": {"holder": "o" * MAX_SLICES_BYTES, "expires": far}}
    stored["metadata"]["resourceVersion"] = str(cluster.bump())
    a.deliver()
    assert (await a.admit(sub_tenant("w1", "uid-w1"))).allowed
    assert await a.ledger.escrow() == 0
    assert set(_slices(cluster)) == {"other.0"}
    assert (await a.admit(sub_tenant("w2", "uid-w2"))).allowed
    assert reasons[-1] == "slices-full"


_NANO = Decimal("1e-9")
_NANOS = st.integers(min_value=0, max_value=int(MAX_QUANTITY) * 10**9)


@st.composite
def _grants(draw: st.DrawFn) -> tuple[dict[str, Decimal], dict[str, Decimal], dict[str, Decimal]]:
    """A grant, and what is folded and returned of it (each within the grant, together too)."""
    keys = draw(st.lists(st.sampled_from([*KEYS[:4], "cpu", "memory"]), unique=True, max_size=6))
    granted, folded, returned = {}, {}, {}
    for key in keys:
        whole = draw(_NANOS)
        spent = draw(st.integers(min_value=0, max_value=whole))
        back = draw(st.integers(min_value=0, max_value=whole - spent))
        granted[key] = whole * _NANO
        if draw(st.booleans()):
            folded[key] = spent * _NANO
        if draw(st.booleans()):
            returned[key] = back * _NANO
    return granted, folded, returned


@settings(max_examples=200, deadline=None)
@given(_grants(), st.frozensets(st.sampled_from(["Tenant", "Thing", "Bucket"])))
def test_any_record_the_code_writes_stays_within_its_size_at_grant(
    grant: tuple[dict[str, Decimal], dict[str, Decimal], dict[str, Decimal]],
    kinds: frozenset[str],
) -> None:
    granted, folded, returned = grant
    at_grant = SliceRecord("r.0", "r", kinds, granted=granted, expires=1.8e9)
    later = SliceRecord(
        "r.0", "r", kinds, granted=granted, folded=folded, returned=returned, expires=2.1e9
    )
    counted = largest_bytes("r.0", record_json(at_grant))
    assert len(encode_json({"r.0": record_json(later)})) <= counted
    slices = {"r.0": record_json(later), "s.1": record_json(at_grant)}
    assert len(encode_json(slices)) <= slices_bytes(slices)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=8),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
            max_leaves=8,
        ),
        max_size=4,
    )
)
def test_any_slices_a_writer_put_there_are_counted_at_least_at_their_size(
    slices: dict[str, Any],
) -> None:
    assert len(encode_json(slices)) <= slices_bytes(slices)

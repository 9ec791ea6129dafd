"""A pool's ledger object never outgrows what every replica's watch reads back.

The ledger is bounded in bytes, not only in entries: its entries together take at most
``MAX_PENDING_BYTES`` (one tenant at most its share of them), its caps, summary and escrowed
slices bounds of their own, so the whole ``TenantReservation`` stays within
``MAX_OBJECT_BYTES``, far under etcd's 1.5 MiB and the watch's event bound. The attack: a
tenant admin whose budget-less sub-tenants have the longest namespaces and hold applications
with the longest names Kubernetes allows fills the ledger; at the bound each of them is
refused, cleanly and alone, in bytes.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.admission.test_ledger import POOL, Cluster, Replica, create
from tests.builders import review
from webhook.admission.ledger.bounds import (
    MAX_CAPS,
    MAX_CAPS_BYTES,
    MAX_ENTRY_BYTES,
    MAX_OBJECT_BYTES,
    MAX_PENDING_BYTES,
    MAX_SLICES_BYTES,
    MAX_SUMMARY_BYTES,
    MAX_WANT_BYTES,
    REVISION_BYTES,
    LedgerSettings,
)
from webhook.admission.ledger.entries import listed_size, size
from webhook.admission.ledger.shares import Room
from webhook.core.admission.reviews import parse_review
from webhook.core.base.json_codec import encode_json
from webhook.core.base.kube_limits import ETCD_MAX_REQUEST_BYTES
from webhook.core.base.quantities import MAX_DIGITS
from webhook.core.tenancy.counts import MAX_BUDGET_KEYS, MAX_KEY_CHARS
from webhook.kube.client import MAX_WATCH_EVENT_BYTES

OTHER = "tenant-other"
NAMESPACE = 63  # a namespace is a DNS-1123 label
NAME = 253  # an object's name is a DNS-1123 subdomain (a Pod's, the replica, too)
UID = 36  # an AdmissionReview's uid: a UUID


def longest_namespace(index: int) -> str:
    stem = f"{POOL}-s{index}"  # a tenant name has no hyphen
    return stem + "n" * (NAMESPACE - len(stem))


def longest_name(index: int) -> str:
    tail = f"-{index:06d}"
    return "v" * (NAME - len(tail)) + tail


def longest_uid(tenant: int, index: int) -> str:
    return f"{tenant:08d}-0000-4000-8000-{index:012d}"


def grow(namespace: str, name: str, uid: str) -> Any:
    body = review(
        "Thing",
        namespace,
        name,
        {"memory": "16Gi"},
        operation="UPDATE",
        old_spec={"memory": "1Gi"},
        uid=uid,
    )
    return parse_review(body)


async def test_a_ledger_filled_with_the_longest_names_kubernetes_allows_stays_readable() -> None:
    # Ten budget-less sub-tenants with 63-character namespaces send UPDATEs of 253-character
    # names, 120 each (more than a tenant's 100 entries): each is refused, alone, once its
    # entries take its share in bytes, and the object never passes its bound.
    subs = [longest_namespace(i) for i in range(10)]
    cluster = Cluster()
    tenants: dict[str, dict[str, str] | None] = {
        POOL: {"memory": "1000000Gi"},
        OTHER: {"memory": "1Gi"},
    }
    tenants.update(dict.fromkeys(subs))
    a = Replica(cluster, "r" * NAME, tenants)
    assert all(len(ns) == NAMESPACE for ns in subs)
    assert len(longest_name(0)) == NAME
    assert len(longest_uid(0, 0)) == UID
    requests = [
        grow(ns, longest_name(i), longest_uid(t, i))
        for t, ns in enumerate(subs)
        for i in range(120)
    ]
    answers = await asyncio.gather(*(a.admit(r) for r in requests))
    refused = [d for d in answers if not d.allowed]
    assert refused, "the longest names fill a tenant's share in bytes before its 100 entries"
    # Ten tenants' shares are the whole pool: the last to reach both hears it is full.
    assert {(d.code, d.reason) for d in refused} <= {(429, "ledger-share"), (429, "ledger-full")}
    assert all("bytes of admissions not yet observed" in d.message for d in refused)
    assert all("try again" in d.message for d in refused)
    per_tenant = [sum(d.allowed for d in answers[t * 120 : (t + 1) * 120]) for t in range(10)]
    assert len(set(per_tenant)) == 1, f"each tenant the same share: {per_tenant}"
    assert 50 < per_tenant[0] < 100
    stored = cluster.objects[POOL]
    written = len(encode_json(stored))
    entries = cluster.entries()
    assert len(entries) == sum(per_tenant)
    listed = sum(listed_size(e) for e in entries)
    assert len(encode_json(entries)) <= listed + 2  # and the list's brackets
    assert listed <= MAX_PENDING_BYTES
    assert written <= MAX_OBJECT_BYTES
    other = await a.admit(create("vm", "1Gi", namespace=OTHER))
    assert other.allowed, "another pool's tenant is never refused for this pool's ledger"


async def test_a_full_ledger_in_bytes_answers_try_again_for_everyone_in_the_pool_alone() -> None:
    # One tenant may take the whole ledger here, so that the pool's byte bound is what is met.
    cluster = Cluster()
    ns = longest_namespace(0)
    a = Replica(cluster, "r" * NAME, {POOL: {"memory": "1000000Gi"}, ns: None}, namespace_share=1.0)
    answers = await asyncio.gather(
        *(a.admit(grow(ns, longest_name(i), longest_uid(0, i))) for i in range(1000))
    )
    full = [d for d in answers if not d.allowed]
    assert full
    assert {(d.code, d.reason) for d in full} == {(429, "ledger-full")}
    assert f"has {MAX_PENDING_BYTES} bytes of admissions not yet observed" in full[0].message
    assert sum(listed_size(e) for e in cluster.entries()) <= MAX_PENDING_BYTES
    assert len(encode_json(cluster.objects[POOL])) <= MAX_OBJECT_BYTES


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=NAME)
entries = st.fixed_dictionaries(
    {
        "id": st.text(min_size=1, max_size=UID),
        "application": st.builds(
            lambda kind, ns, name: f"{kind}/{ns}/{name}",
            st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", max_size=63),
            st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", max_size=NAMESPACE),
            names,
        ),
        "charge": st.dictionaries(names, st.decimals(allow_nan=False).map(str), max_size=6),
        "expires": st.just("2027-01-15T08:00:00.000000Z"),
        "replica": names,
    },
    optional={
        "expected": st.dictionaries(names, st.decimals(allow_nan=False).map(str), max_size=6),
        "dryRun": st.just(True),
        "replaces": st.lists(st.text(max_size=UID), max_size=4),
        "revision": st.integers(min_value=1, max_value=2**64 - 1).map(str),
    },
)


@settings(max_examples=200, deadline=None)
@given(listed=st.lists(entries, max_size=8))
def test_the_bytes_an_entry_is_counted_for_are_never_fewer_than_it_takes_listed(
    listed: list[dict[str, Any]],
) -> None:
    for entry in listed:
        stamped = {**entry, "revision": entry.get("revision") or str(2**64 - 1)}
        assert len(encode_json(stamped)) <= listed_size(entry)
        assert len(encode_json(entry)) <= size(entry)
    listed_bytes = sum(listed_size(e) for e in listed)
    assert len(encode_json(listed)) <= listed_bytes + 2  # and the list's brackets


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=MAX_ENTRY_BYTES), max_size=60),
    share=st.sampled_from([0.001, 0.01, 0.1, 0.5, 1.0]),
)
def test_what_a_room_lets_in_never_passes_the_pools_bytes_nor_a_tenants_share(
    sizes: list[int], share: float
) -> None:
    settings_ = LedgerSettings(replica="a", namespace_share=share)
    room = Room(POOL, [], settings_)
    taken = 0
    for index, grown in enumerate(sizes):
        entry = {"id": f"u{index}", "application": f"Thing/{POOL}-t/x", "replica": "x" * grown}
        if room.refusal(entry) is None:
            room.take(entry)
            taken += listed_size(entry)
    assert room.bytes == taken <= min(MAX_PENDING_BYTES, settings_.share_bytes_limit)
    largest = {"id": "u", "application": f"Thing/{POOL}-t/x", "replica": ""}
    largest["replica"] = "x" * (MAX_ENTRY_BYTES - size(largest))
    assert size(largest) == MAX_ENTRY_BYTES
    assert Room(POOL, [], settings_).refusal(largest) is None, "a tenant always has room for one"


def test_every_part_of_a_ledger_object_fits_its_bound_and_the_whole_what_is_read_back() -> None:
    caps = MAX_CAPS_BYTES  # all of them, each keyed by its namespace
    assert MAX_CAPS * (1_024 + NAMESPACE + 6) <= MAX_CAPS_BYTES, "200 caps of 1 KiB fit"
    rest = 40_960  # metadata, the removal counts by kind
    slices = MAX_SLICES_BYTES  # every replica's escrowed slices, each at its largest
    parts = MAX_PENDING_BYTES + caps + MAX_SUMMARY_BYTES + slices + MAX_WANT_BYTES + rest
    assert parts <= MAX_OBJECT_BYTES
    assert MAX_OBJECT_BYTES * 3 // 2 <= ETCD_MAX_REQUEST_BYTES, "a third under etcd's limit"
    assert MAX_OBJECT_BYTES <= MAX_WATCH_EVENT_BYTES // 8


def test_a_summary_of_many_long_keys_is_cut_to_its_bound() -> None:
    from webhook.admission.ledger.status import _bounded

    keys = {f"{'k' * 60}{i:04d}": Decimal(i) for i in range(5000)}
    line = ", ".join(f"{k}={v}" for k, v in keys.items())
    summary: dict[str, Any] = {
        "budget": {k: str(v) for k, v in keys.items()},
        "reserved": {k: str(v) for k, v in keys.items()},
        "budgetSummary": line,
        "reservedSummary": line,
        "overcommitted": {},
        "conditions": [{"type": "Overcommitted", "status": "True", "message": "x" * 400_000}],
        "committed": None,
        "discount": None,
    }
    assert len(encode_json(summary)) > MAX_SUMMARY_BYTES
    cut = _bounded(summary)
    assert len(encode_json(cut)) <= MAX_SUMMARY_BYTES
    assert cut["budget"] is None
    assert cut["reserved"] is None
    assert cut["budgetSummary"] == line[:1023] + "\u2026"
    small = {**summary, "budget": {"memory": "1Gi"}, "reserved": {}, "conditions": []}
    small.update(budgetSummary="memory=1Gi", reservedSummary="")
    assert _bounded(small) == small, "a summary within its bound is written whole"


def test_an_entry_measured_in_an_earlier_batch_counts_what_it_takes_now_never_less() -> None:
    settings_ = LedgerSettings(replica="a")
    entries = [
        {"id": f"u{i}", "application": f"Thing/{POOL}-t{i % 3}/x{i}", "expires": "e1"}
        for i in range(30)
    ]
    before = Room(POOL, entries, settings_)
    stamped = [{**e, "revision": "12345"} for e in entries]  # the next write stamps them
    reused = Room(POOL, stamped, settings_, before.sizes)
    fresh = Room(POOL, stamped, settings_)
    assert reused.held == fresh.held
    assert reused.bytes >= fresh.bytes, "the unstamped measure is never below the stamped one"
    # An entry under a known id but another expiry (another write of it) is measured again.
    grown = [{**stamped[0], "replica": "r" * 500, "expires": "e2"}, *stamped[1:]]
    again = Room(POOL, grown, settings_, reused.sizes)
    assert again.bytes == reused.bytes - reused.sizes["u0"][2] + listed_size(grown[0])


def test_the_entry_of_a_sub_tenant_with_the_widest_budget_fits_one_entry_and_a_share() -> None:
    # A sub-tenant's entry carries its budget twice (what it adds, what it is expected to show):
    # 64 keys of the longest a budget takes, each with a quantity of the most digits parsed, in
    # the longest namespace, under the longest name, written by the longest replica name. At
    # 1 KiB a budget counting each of the 31 kinds was refused for good.
    budget = {
        f"{index:02d}{'k' * (MAX_KEY_CHARS - 2)}": "9" * MAX_DIGITS + "Ei"
        for index in range(MAX_BUDGET_KEYS)
    }
    entry = {
        "id": "u" * UID,
        "application": f"KubernetesNodes/{'n' * NAMESPACE}/{'x' * NAME}",
        "charge": budget,
        "expected": {key: value + "0" for key, value in budget.items()},
        "expires": "2026-12-02T07:40:00.000000Z",
        "replica": "r" * NAME,
        "update": True,
        "revision": "9" * REVISION_BYTES,
    }
    assert size(entry) <= MAX_ENTRY_BYTES
    settings_ = LedgerSettings(replica="a")
    assert listed_size(entry) <= settings_.share_bytes_limit <= MAX_PENDING_BYTES

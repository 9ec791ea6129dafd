"""Every replica counts the escrowed slices a pool's TenantReservation lists (docs/escrow.md):
outstanding room whole, room folded out of a slice or a removed record's until the state has
caught up, and a pool whose records came and went unseen fenced. The slices here are written as
another replica holding them would write them; this replica spends none."""

from __future__ import annotations

from typing import Any

from tests.admission.test_ledger import POOL, Clock, Cluster, Replica, create, thing
from webhook.admission.ledger.wants import ANSWER_SECONDS


def _slices(cluster: Cluster, slices: dict[str, Any], *, removals: int = 0) -> int:
    """Another replica's write of the pool's object listing ``slices``; its revision."""
    obj = cluster.objects.get(POOL) or {
        "apiVersion": "reservation.cozystack.io/v1alpha1",
        "kind": "TenantReservation",
        "metadata": {"name": POOL, "namespace": POOL},
        "spec": {"pool": POOL},
    }
    status = dict(obj.get("status") or {})
    status["slices"] = slices
    if removals:
        status["removals"] = removals
    revision = cluster.bump()
    obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(revision)}}
    cluster.objects[POOL] = {**obj, "status": status}
    return revision


def _record(granted: str, *, folded: str = "0", returned: str = "0") -> dict[str, Any]:
    return {
        "holder": "b",
        "kinds": ["Thing"],
        "granted": {"memory": granted},
        "folded": {"memory": folded},
        "returned": {"memory": returned},
        "expires": "2027-01-15T08:00:30.000000Z",
    }


async def test_a_tenant_cannot_be_admitted_into_room_another_replica_holds_as_a_slice() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    _slices(cluster, {"b.1": _record("3Gi")})
    a.deliver()
    decision = await a.admit(create("x", "2Gi"))
    assert not decision.allowed, "3Gi held as b's slice + 2Gi > 4Gi"
    # The room is there, escrowed: b gives it back near the bound, so the answer says so
    # rather than "exceeded" (a client that retries gets it; one that gives up is not misled).
    assert (decision.code, decision.reason) == (429, "escrowed"), decision.message
    assert "memory=3Gi" in decision.message
    assert "try again" in decision.message
    assert (await a.admit(create("y", "1Gi"))).allowed


async def test_a_tenant_repeating_a_refused_create_writes_one_want() -> None:
    # Each refusal that others' slices could answer asks their holders, which is a write: a
    # tenant repeating one costs one write per pool and want, not one per call, and once the
    # holders had their few seconds the answer is final.
    cluster, clock = Cluster(), Clock()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}}, clock=clock)
    a.ledger._wants.monotonic = clock
    _slices(cluster, {"b.1": _record("3Gi")})
    a.deliver()
    writes = cluster.writes
    answers = [await a.admit(create(f"x{i}", "2Gi", uid=f"uid-{i}")) for i in range(20)]
    assert {d.reason for d in answers} == {"escrowed"}
    assert cluster.writes == writes + 1, "one want for twenty refusals"
    clock.now += ANSWER_SECONDS
    late = await a.admit(create("late", "2Gi", uid="uid-late"))
    assert late.reason == "exceeded", "b gave nothing back: what it holds is spent"
    assert cluster.writes == writes + 1


async def test_a_pool_full_even_without_the_slices_others_hold_says_exceeded() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    _slices(cluster, {"b.1": _record("1Gi")})
    a.deliver()
    assert (await a.admit(create("x", "3Gi"))).allowed
    decision = await a.admit(create("y", "2Gi", uid="uid-y"))
    assert not decision.allowed
    assert decision.reason == "exceeded", "3Gi + 2Gi > 4Gi whatever b gives back"


async def test_room_folded_out_of_a_slice_stays_counted_until_the_watch_has_passed_the_fold() -> (
    None
):
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    _slices(cluster, {"b.1": _record("3Gi")})
    a.deliver()
    spent = thing(cluster, "x", "2Gi")  # b spent 2Gi of its slice on x, stored here
    _slices(cluster, {"b.1": _record("3Gi", folded="2Gi")})  # b saw x stored and folded it
    a.deliver()  # a reads the fold before its watch of Things has reached x
    assert not (await a.admit(create("y", "2Gi"))).allowed, "x is not observed yet: 3Gi held"
    a.seen = cluster.revision
    a.observe(spent)
    assert not (await a.admit(create("y", "2Gi", uid="uid-y2"))).allowed, "x 2Gi + 1Gi left"
    assert (await a.admit(create("z", "1Gi"))).allowed


async def test_room_returned_unspent_is_free_at_once() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    _slices(cluster, {"b.1": _record("3Gi")})
    a.deliver()
    _slices(cluster, {"b.1": _record("3Gi", returned="3Gi")})
    a.deliver()
    assert (await a.admit(create("x", "4Gi"))).allowed


async def test_a_removed_slice_stays_counted_until_the_watch_has_passed_its_removal() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    _slices(cluster, {"b.1": _record("3Gi")})
    a.deliver()
    _slices(cluster, {}, removals=1)  # reclaimed: b's life ended, its lease and bound passed
    a.deliver()
    assert not (await a.admit(create("x", "2Gi"))).allowed, "what b spent may not be seen yet"
    a.seen = cluster.revision
    assert (await a.admit(create("x", "4Gi", uid="uid-x2"))).allowed


async def test_slices_that_came_and_went_unseen_fence_the_pool_until_the_state_caught_up() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}}, catch_up_seconds=0.05)
    assert (await a.admit(create("w", "1Gi"))).allowed  # a has read the object once
    _slices(cluster, {}, removals=2)  # two slices granted and reclaimed between a's reads
    a.deliver()
    decision = await a.admit(create("x", "1Gi"))
    assert not decision.allowed
    assert decision.reason == "ledger-catching-up"
    a.seen = cluster.revision
    assert (await a.admit(create("x", "1Gi", uid="uid-x2"))).allowed


async def test_a_ledger_write_keeps_the_slices_it_does_not_hold() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}})
    _slices(cluster, {"b.1": _record("3Gi")}, removals=1)
    a.deliver()
    a.seen = cluster.revision  # past the removal it never saw
    assert (await a.admit(create("x", "1Gi"))).allowed
    status = cluster.objects[POOL]["status"]
    assert status["slices"] == {"b.1": _record("3Gi")}
    assert status["removals"] == 1

"""Admission from escrowed slices (``LedgerSettings.escrow``): a CREATE that fits this process's
slice is answered with no API call; the slice is granted, folded, renewed and reclaimed off the
admission path by conditional writes, counted whole by every replica, and never spent by a new
life of the same pod."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from tests.admission.test_ledger import POOL, Clock, Cluster, Replica, create, thing
from tests.admission.test_ledger_writes import Live
from tests.realkube import reservations_on_real_apiserver
from webhook.admission.ledger import LedgerSettings
from webhook.admission.ledger.book import Book
from webhook.admission.ledger.entries import TENANT_RESERVATIONS
from webhook.admission.ledger.escrowed import record_json
from webhook.admission.ledger.slices import slice_records
from webhook.core.admission.escrow import SliceRecord


async def _busy(replica: Replica, count: int = 3, memory: str = "1Gi") -> None:
    """Admit ``count`` creates by the exact path, so the pool has a recent rate."""
    for index in range(count):
        assert (await replica.admit(create(f"warm{index}", memory))).allowed


def _records(cluster: Cluster) -> dict[str, SliceRecord]:
    return dict(slice_records(cluster.objects[POOL].get("status") or {}))


async def test_a_create_that_fits_the_slice_is_answered_with_no_api_call() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    assert await a.ledger.escrow() == 1  # the slice is granted off the admission path
    assert len(_records(cluster)) == 1
    writes = cluster.writes
    decision = await a.admit(create("x", "1Gi"))
    assert decision.allowed
    assert cluster.writes == writes, "answered from the slice: no write"
    assert a.ledger.spends == 1


async def test_another_replica_counts_the_slice_whole_and_admits_only_around_it() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}}, escrow=True)
    b = Replica(cluster, "b", {POOL: {"memory": "8Gi"}})
    await _busy(a, count=2)  # 2Gi held as entries until observed
    assert await a.ledger.escrow() == 1
    (record,) = slice_records(cluster.objects[POOL]["status"]).values()
    held = record.outstanding()["memory"]
    assert held > 0
    b.deliver()
    free = 8 * 1024**3 - 2 * 1024**3 - int(held)
    assert not (await b.admit(create("big", str(free + 1)))).allowed
    assert (await b.admit(create("fits", str(free)))).allowed


async def test_a_slice_is_never_spent_past_its_room_the_exact_path_takes_the_rest() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    await a.ledger.escrow()
    (record,) = _records(cluster).values()
    room = int(record.outstanding()["memory"])
    writes = cluster.writes
    assert (await a.admit(create("x", str(room)))).allowed
    assert cluster.writes == writes
    assert (await a.admit(create("y", "1"))).allowed
    assert cluster.writes == writes + 1, "the slice is spent: the exact path wrote an entry"


async def test_near_the_bound_no_slice_is_granted_so_the_last_byte_can_be_used() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}}, escrow=True)
    await _busy(a, count=3)  # 3Gi of 4Gi: a quarter of the free room is less than wanted
    assert await a.ledger.escrow() == 0
    assert _records(cluster) == {}
    assert (await a.admit(create("last", "1Gi"))).allowed
    assert not (await a.admit(create("over", "1"))).allowed


async def test_a_new_life_of_the_same_pod_never_spends_the_old_lifes_slice() -> None:
    cluster = Cluster()
    old = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(old)
    await old.ledger.escrow()
    new = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    new.deliver()
    writes = cluster.writes
    assert (await new.admit(create("x", "1Gi"))).allowed
    assert cluster.writes == writes + 1, "the new life took the exact path"
    assert new.ledger.spends == 0


async def test_a_dead_replicas_slice_is_reclaimed_only_past_its_lease_and_the_store_bound() -> None:
    cluster = Cluster()
    clock = Clock()
    dead = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True, clock=clock)
    await _busy(dead)
    await dead.ledger.escrow()
    (record,) = _records(cluster).values()
    b = Replica(cluster, "b", {POOL: {"memory": "64Gi"}}, escrow=True, clock=clock)
    b.deliver()
    await _busy(b)
    clock.now = record.expires + 60
    await b.ledger.escrow()
    assert record.incarnation in _records(cluster)
    clock.now = record.expires + 66
    await b.ledger.escrow()
    assert record.incarnation not in _records(cluster)
    assert cluster.objects[POOL]["status"]["removals"] == 1


async def test_a_spend_is_folded_once_its_object_is_observed() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    await a.ledger.escrow()
    assert (await a.admit(create("x", "1Gi"))).allowed
    a.observe(thing(cluster, "x", "1Gi"))
    # Far from the bound a fold is not worth a write of its own: it rides on the next one.
    assert await a.ledger.escrow() == 0
    escrowed = a.ledger._escrowed
    assert escrowed is not None
    later = escrowed.monotonic() + escrowed.escrow.bounds.renew_seconds + 1
    escrowed.monotonic = lambda: later  # the lease is due for renewal
    assert await a.ledger.escrow() == 1
    (record,) = _records(cluster).values()
    assert record.folded == {"memory": 1024**3}


async def test_a_fold_is_written_at_once_when_the_room_it_counts_twice_matters() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}}, escrow=True)
    await _busy(a, count=2)
    assert await a.ledger.escrow() == 1
    assert (await a.admit(create("x", "1Gi"))).allowed
    a.observe(thing(cluster, "x", "1Gi"))
    assert await a.ledger.escrow() == 1
    (record,) = _records(cluster).values()
    assert record.folded == {"memory": 1024**3}


@pytest.mark.kube
async def test_a_real_api_server_keeps_a_slice_record_as_written(tmp_path: Path) -> None:
    # A field the CRD's schema does not know is pruned: the shipped schema must keep a record
    # whole, or its holder would spend a slice no other replica counts.
    async with reservations_on_real_apiserver(tmp_path / "kube", POOL) as client:
        book = Book(client, Live(), LedgerSettings(replica="a"), clock=Clock())
        current = await book.ensure(POOL)
        record = SliceRecord(
            "a.1",
            "a",
            frozenset({"VMInstance"}),
            {"memory": Decimal(3 * 1024**3), "cpu": Decimal("1.5")},
            folded={"memory": Decimal(1024**3)},
            returned={},
            expires=1_800_000_030.0,
        )
        status = {"slices": {"a.1": record_json(record)}, "removals": 2}
        await book.write(POOL, current, status)
        stored = await client.get(TENANT_RESERVATIONS, POOL, POOL)
        assert slice_records(stored["status"]) == {"a.1": record}
        assert stored["status"]["removals"] == 2

"""The escrow duty's rounds: every pool due has its write in the same round, at once, and an
admission that found no slice of its pool wakes the duty before its next tick."""

from __future__ import annotations

import asyncio

from tests.admission.test_ledger import Cluster, Replica, create
from webhook.admission.ledger.slices import slice_records

POOLS = [f"tenant-p{index}" for index in range(3)]


async def _warm(replica: Replica, pool: str) -> None:
    for index in range(3):
        assert (await replica.admit(create(f"{pool}-warm{index}", "1Gi", namespace=pool))).allowed


async def _first_create_nudged(budget: str) -> tuple[str, Replica]:
    """A replica whose first create into its pool (no object yet) was answered by the exact
    path and woke the duty, which nothing has taken up yet (the nudge is cleared)."""
    pool = POOLS[0]
    a = Replica(Cluster(), "a", {pool: {"memory": budget}}, escrow=True)
    assert (await a.admit(create("first", "1Gi", namespace=pool))).allowed
    assert a.escrowed.nudged.is_set(), "the exact path answered: the pool wants its first grant"
    a.escrowed.nudged.clear()
    return pool, a


async def test_a_stalled_write_to_one_pool_does_not_hold_up_the_grants_of_the_others() -> None:
    # One pool's write is slow (its object hot, the API server busy): the duty's round must
    # not grant the other pools one after another behind it, or a cold burst over many pools
    # falls back to the exact path in every pool granted late.
    cluster = Cluster()
    a = Replica(cluster, "a", {pool: {"memory": "64Gi"} for pool in POOLS}, escrow=True)
    for pool in POOLS:
        await _warm(a, pool)
    stall = cluster.stall(POOLS[0])  # the first in the round's order
    round_ = asyncio.ensure_future(a.ledger.escrow())
    for _ in range(50):
        await asyncio.sleep(0)
    later = {pool for pool in POOLS[1:] if slice_records(cluster.objects[pool].get("status") or {})}
    assert later == set(POOLS[1:]), "the other pools were granted while the first one waited"
    stall.set()
    assert await round_ == len(POOLS)
    assert slice_records(cluster.objects[POOLS[0]].get("status") or {})


async def test_one_pools_failure_leaves_the_rest_of_the_round_written() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {pool: {"memory": "64Gi"} for pool in POOLS}, escrow=True)
    for pool in POOLS:
        await _warm(a, pool)
    escrowed = a.escrowed
    granted = escrowed._pool

    async def broken(pool: str, *, give_all: bool = False) -> int:
        if pool == POOLS[0]:
            raise RuntimeError("a bad pool")
        return await granted(pool, give_all=give_all)

    escrowed._pool = broken  # type: ignore[method-assign]
    try:
        await a.ledger.escrow()
    except RuntimeError:
        pass
    else:
        raise AssertionError("the bad pool's failure reaches the round")
    assert all(slice_records(cluster.objects[p].get("status") or {}) for p in POOLS[1:])


async def test_an_admission_with_no_slice_wakes_the_duty_and_one_from_a_slice_does_not() -> None:
    pool, a = await _first_create_nudged("64Gi")
    escrowed = a.escrowed
    assert await a.ledger.escrow() == 1
    assert (await a.admit(create("second", "1Gi", namespace=pool))).allowed
    assert a.ledger.spends == 1
    assert not escrowed.nudged.is_set(), "answered from the slice: nothing to wake for"


async def test_the_duty_woken_early_still_rests_a_fifth_of_its_period() -> None:
    # A tenant whose every create falls back (its pool near the bound) wakes the duty each
    # time: the rounds come no more often than five a period, so nudges never make it spin.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOLS[0]: {"memory": "64Gi"}}, escrow=True, escrow_seconds=1.0)
    escrowed = a.escrowed
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    escrowed.nudged.set()
    started = loop.time()
    await a.ledger.escrow_rest(stop)
    woken = loop.time() - started
    assert 0.19 <= woken < 0.8, woken
    assert not escrowed.nudged.is_set()
    started = loop.time()
    await a.ledger.escrow_rest(stop)
    assert loop.time() - started >= 0.95, "no nudge: the whole period"


async def test_slices_held_in_other_pools_are_not_walked_by_an_admission() -> None:
    # A burst over many pools leaves a slice in each until it goes idle: an admission into
    # one pool takes only the slices of the pools on its way up out of the usage it decides
    # on, so each admission no longer pays for every other tenant's slices and spends.
    cluster = Cluster()
    a = Replica(cluster, "a", {pool: {"memory": "64Gi"} for pool in POOLS}, escrow=True)
    for pool in POOLS:
        await _warm(a, pool)
    await a.ledger.escrow()
    escrowed = a.escrowed
    assert set(escrowed.escrow.pools()) == set(POOLS)
    walked: list[str] = []
    available = escrowed.escrow.available

    def counted(pool: str) -> dict[str, object]:
        walked.append(pool)
        return available(pool)  # type: ignore[return-value]

    escrowed.escrow.available = counted  # type: ignore[method-assign,assignment]
    writes = cluster.writes
    assert (await a.admit(create("x", "1Gi", namespace=POOLS[1]))).allowed
    assert cluster.writes == writes, "answered from its pool's slice"
    assert set(walked) == {POOLS[1]}


async def test_a_pool_too_full_to_split_wakes_the_duty_once_not_on_every_create() -> None:
    # A tenant keeping its pool near the bound has every create fall back: only the first,
    # which leaves the pool rated, wakes the duty early; the others leave it at its period.
    pool, a = await _first_create_nudged("4Gi")
    escrowed = a.escrowed
    await a.ledger.escrow()
    assert escrowed.escrow.record(pool) is None, "too full to split: no slice"
    for index in range(2):
        assert (await a.admit(create(f"vm{index}", "1Gi", namespace=pool))).allowed
        assert not escrowed.nudged.is_set()

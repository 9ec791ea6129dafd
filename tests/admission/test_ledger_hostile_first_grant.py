"""Attacks on a cold pool's first slice (``Escrowed.open``): a tenant's own pools' writes hold
up no other tenant's create, a create cut off mid-grant leaves no pool ungrantable, one small
create parks no large share of a shared pool, and no charge is counted twice in the rate."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest

from tests.admission.test_ledger import POOL, Clock, Cluster, Minted, Replica, create
from tests.admission.test_ledger_escrow_first_grant import cold_pool
from tests.builders import review
from tests.waiting import eventually
from webhook.admission.ledger.slices import slice_records
from webhook.core.admission.escrow import SliceRecord
from webhook.core.admission.reviews import AdmissionRequest, parse_review

PARENT, CHILD, SIBLING = "tenant-acme", "tenant-acme-dev", "tenant-acme-ops"
TREE = {PARENT: {"memory": "64Gi"}, CHILD: {"cpu": "8"}, SIBLING: None}


def across(name: str, *, uid: str) -> AdmissionRequest:
    return parse_review(review("Thing", CHILD, name, {"cpu": "1", "memory": "1Gi"}, uid=uid))


async def _cold_tree(
    cluster: Cluster, tree: dict[str, dict[str, str] | None], *more: AdmissionRequest
) -> Replica:
    """Replica ``a`` (escrow on) meeting PARENT and CHILD cold: another replica admitted one
    create across both (and ``more``), and the watch has delivered both objects."""
    seed = Replica(cluster, "seed", tree)
    for request in (across("seed", uid="seed"), *more):
        assert (await seed.admit(request)).allowed
    a = Replica(cluster, "a", tree, escrow=True)
    a.deliver(PARENT)
    a.deliver(CHILD)
    return a


def _records(cluster: Cluster, pool: str = POOL) -> dict[str, SliceRecord]:
    return dict(slice_records(cluster.objects[pool].get("status") or {}))


async def test_a_tenants_child_pool_grant_never_holds_up_a_siblings_create_in_the_parent() -> None:
    # The hostile tenant owns CHILD (a sub-tenant of the shared PARENT). Its create opens
    # both cold pools; PARENT's event is set only after CHILD's write too.
    cluster = Cluster()
    a = await _cold_tree(cluster, TREE)
    parent, child = cluster.stall(PARENT), cluster.stall(CHILD)
    hostile = asyncio.create_task(a.admit(across("vm", uid="req-1")))
    await eventually(lambda: cluster.held.get(PARENT) == 1)
    other = asyncio.create_task(a.admit(create("db", "1Gi", namespace=SIBLING, uid="ops")))
    for _ in range(20):
        await asyncio.sleep(0)
    parent.set()  # PARENT's first slice is stored: the sibling could be answered now
    await eventually(lambda: cluster.held.get(CHILD) == 1)
    escrowed = a.escrowed
    assert escrowed.escrow.live(PARENT, escrowed.monotonic()), "PARENT's slice is spendable"
    try:
        decision = await asyncio.wait_for(asyncio.shield(other), timeout=2)
        assert decision.allowed
    finally:
        child.set()
        await hostile
        await other


async def test_a_create_cancelled_during_its_first_grant_leaves_the_pool_grantable() -> None:
    cluster = Cluster()
    a = await cold_pool(cluster)
    stall = cluster.stall(POOL)
    opener = asyncio.create_task(a.admit(create("x", "1Gi")))
    await eventually(lambda: cluster.held.get(POOL) == 1)
    opener.cancel()  # the webhook's deadline, or the API server's client gone
    with pytest.raises(asyncio.CancelledError):
        await opener
    stall.set()
    del cluster.stalls[POOL]
    assert (await a.admit(create("y", "1Gi"))).allowed  # the exact path: the pool is rated
    a.deliver()
    assert await a.ledger.escrow() == 1, "the duty grants the pool its slice"
    assert any(k.startswith("a.") for k in _records(cluster)), _records(cluster)


async def test_one_small_create_parks_no_quarter_of_a_shared_pool() -> None:
    cluster = Cluster()
    a = await cold_pool(cluster, budget="640Gi")
    assert (await a.admit(create("x", "1Gi"))).allowed
    (record,) = _records(cluster).values()
    granted = record.granted["memory"] / 1024**3
    # A young rate reads as about one charge a second: ten seconds of it, not a quarter of the
    # 639Gi free (a 1Gi create once parked 41Gi).
    assert 1 <= granted <= 12, granted


async def test_a_create_whose_first_grant_answers_nothing_is_counted_once_in_the_rate() -> None:
    cluster = Cluster()
    a = await cold_pool(cluster, budget="8Gi", seed="4Gi")
    escrowed = a.escrowed
    now = [100.0]
    escrowed.monotonic = lambda: now[0]
    answers = await asyncio.gather(a.admit(create("x", "2Gi")), a.admit(create("y", "1Gi")))
    assert all(answer.allowed for answer in answers)
    assert _records(cluster) == {}
    rate = escrowed.recent.rate(POOL, now[0])["memory"] * 5 / 1024**3
    assert rate == pytest.approx(3.0), f"3Gi admitted, {rate}Gi counted"


async def test_a_create_across_two_cold_pools_is_counted_once_in_the_parents_rate() -> None:
    tree = {PARENT: {"memory": "8Gi"}, CHILD: {"cpu": "8"}, SIBLING: None}
    cluster = Cluster()
    a = await _cold_tree(cluster, tree, create("big", "4Gi", namespace=SIBLING, uid="big"))
    escrowed = a.escrowed
    now = [100.0]
    escrowed.monotonic = lambda: now[0]
    answers = await asyncio.gather(
        a.admit(across("vm", uid="req-1")),
        a.admit(create("db", "1Gi", namespace=SIBLING, uid="ops")),
    )
    assert all(answer.allowed for answer in answers), [x.message for x in answers]
    rate = escrowed.recent.rate(PARENT, now[0])["memory"] * 5 / 1024**3
    assert rate == pytest.approx(2.0), f"2Gi admitted into {PARENT}, {rate}Gi counted"


class SharedPool:
    """A pool shared by a hostile tenant and a victim (neither with a quota of its own) that
    replica ``a`` (escrow on, its clocks the test's) meets cold: another replica admitted a
    create of the victim's into it."""

    POOL, HOSTILE, VICTIM = "tenant-acme", "tenant-acme-evil", "tenant-acme-ops"
    TREE: ClassVar[dict[str, dict[str, str] | None]] = {
        POOL: {"memory": "640Gi"},
        HOSTILE: None,
        VICTIM: None,
    }

    def __init__(self) -> None:
        self.cluster, self.clock = Cluster(), Clock()
        self.a = Replica(self.cluster, "a", self.TREE, escrow=True, clock=self.clock)
        self.now = [100.0]
        self.a.escrowed.monotonic = lambda: self.now[0]
        self.minted = Minted(self.a)

    @classmethod
    async def cold(cls) -> SharedPool:
        shared = cls()
        seed = Replica(shared.cluster, "seed", cls.TREE, clock=shared.clock)
        seeded = create("seed", "1Gi", namespace=cls.VICTIM, uid="seed")
        assert (await seed.admit(seeded)).allowed
        shared.a.deliver(cls.POOL)
        return shared

    async def victim_second(self, second: int) -> int:
        """A second of the victim's steady creates, four of 256Mi, each stored and observed,
        with an escrow round after each; how many were answered from the slice."""
        a, spent = self.a, 0
        for quarter in range(4):
            before = a.ledger.spends
            request = self.minted(
                "Thing", self.VICTIM, f"vm{second}-{quarter}", {"memory": "256Mi"}
            )
            decided = await a.admit(request)
            assert decided.allowed, decided.message
            spent += a.ledger.spends - before
            self.minted.observe()
            self.now[0] += 0.25
            self.clock.now += 0.25
            a.deliver(self.POOL)
            await a.ledger.escrow()
            a.deliver(self.POOL)
        return spent


async def test_a_tenants_first_create_of_a_rare_kind_does_not_keep_other_kinds_off_a_shared_pools_slice() -> (  # noqa: E501
    None
):
    # A hostile tenant of a shared pool (no quota of its own) waits until the pool has been
    # idle on a replica, then sends one small create of a kind nobody else uses. The cold
    # pool's first slice is granted for it (Escrowed.open), and a record's kinds are fixed at
    # its first grant: the slice names that kind only. A trickle of the same kind, one create
    # every 20 s, keeps the slice from going idle, so every other tenant's create in the pool
    # takes the exact path (a ledger write each) for as long as the trickle lasts, while the
    # refills sized from their own rate park room only the hostile's kind can spend.
    shared = await SharedPool.cold()
    a, pool, minted = shared.a, shared.POOL, shared.minted

    def rare(index: int) -> AdmissionRequest:
        return minted("NATS", shared.HOSTILE, f"n{index}", {})

    assert (await a.admit(rare(0))).allowed  # the pool's first create on this replica
    minted.observe()
    (record,) = _records(shared.cluster, pool).values()
    assert record.kinds == frozenset({"NATS"}), record.kinds
    spends = 0
    writes_before = shared.cluster.written.get(pool, 0)
    for second in range(1, 61):  # a minute of the victim's steady creates, four a second
        spends += await shared.victim_second(second)
        if second % 20 == 0:
            assert (await a.admit(rare(second))).allowed  # the trickle
            minted.observe()
    victims = 60 * 4
    exact = shared.cluster.written.get(pool, 0) - writes_before
    assert spends >= victims // 2, (
        f"{spends} of {victims} victim creates answered from the slice; "
        f"{exact} writes of the shared pool's object; slice kinds "
        f"{sorted(a.escrowed.escrow.record(pool).kinds)}"  # type: ignore[union-attr]
    )

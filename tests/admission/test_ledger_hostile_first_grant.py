"""Attacks on a cold pool's first slice (``Escrowed.open``): a tenant's own pools' writes hold
up no other tenant's create, a create cut off mid-grant leaves no pool ungrantable, one small
create parks no large share of a shared pool, no charge is counted twice in the rate, and a
sub-tenant deleted while its pool's grant is written leaves nothing in the holder's books (nor,
created again, gets a slice spent twice)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable
from decimal import Decimal
from typing import Any, ClassVar

import pytest

from tests.admission.test_ledger import POOL, Clock, Cluster, Minted, Replica, create
from tests.admission.test_ledger_escrow_first_grant import cold_pool
from tests.builders import review, tenant
from tests.waiting import eventually
from webhook.admission.ledger.slices import slice_records
from webhook.core.admission.escrow import SliceRecord
from webhook.core.admission.reviews import AdmissionRequest, parse_review
from webhook.core.base import resources as rl

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


class DeletedSubTenant:
    """A hostile tenant's sub-tenant pool CHILD (a quota of its own, inside PARENT) that replica
    ``a`` (escrow on, its clock the test's) meets cold: replica ``seed`` admitted a create into
    it. The tenant deletes CHILD while ``a`` writes its object, and may create it again."""

    TREE: ClassVar[dict[str, dict[str, str] | None]] = {
        PARENT: {"memory": "64Gi"},
        CHILD: {"memory": "8Gi"},
    }

    def __init__(self) -> None:
        self.cluster = Cluster()
        self.seed = Replica(self.cluster, "seed", self.TREE)
        self.a = Replica(self.cluster, "a", self.TREE, escrow=True)
        self.now = [100.0]
        self.a.escrowed.monotonic = lambda: self.now[0]
        self.escrow = self.a.escrowed.escrow

    @classmethod
    async def cold(cls) -> DeletedSubTenant:
        child = cls()
        seeded = create("seed", "1Gi", namespace=CHILD, uid="seed")
        assert (await child.seed.admit(seeded)).allowed
        child.a.deliver(CHILD)
        return child

    async def delete_during(self, write: Awaitable[Any]) -> Any:
        """``write`` (a's, of CHILD's object) held at the API server while CHILD is deleted
        (its namespace goes, with the TenantReservation in it, and both replicas' watches
        deliver it), then let through: it finds no object."""
        cluster = self.cluster
        stall = cluster.stall(CHILD)
        task = asyncio.ensure_future(write)
        await eventually(lambda: cluster.held.get(CHILD) == 1)
        deleted = cluster.objects.pop(CHILD)
        deleted["metadata"]["resourceVersion"] = str(cluster.bump())
        gone = cluster.bump()
        for replica in (self.a, self.seed):
            replica.ledger.reflector.on_event("DELETED", copy.deepcopy(deleted))
            replica.state.forget(("Tenant", PARENT, "dev"), version=gone)
        stall.set()
        del cluster.stalls[CHILD]
        return await task

    async def create_again(self) -> None:
        """CHILD by the same name again: its new object (the seed's create) delivered to a."""
        for replica in (self.a, self.seed):
            replica.state.observe(tenant(CHILD, {"memory": "8Gi"}))
        assert (await self.seed.admit(create("again", "1Gi", namespace=CHILD, uid="again"))).allowed
        self.a.deliver(CHILD)


async def test_a_sub_tenant_deleted_while_its_first_grant_is_in_flight_leaves_nothing_the_holder_keeps() -> (  # noqa: E501
    None
):
    # The hostile tenant creates into its own cold sub-tenant pool and deletes the sub-tenant
    # while the first grant's write is on its way: the write finds no object (404, an outcome
    # the holder cannot tell), and the deletion, seen while the write was in flight, left the
    # pool in the holder's books for good. Repeated, each sub-tenant created and deleted so
    # grew them by one pool, which every round of the escrow duty walked.
    child = await DeletedSubTenant.cold()
    a, escrow = child.a, child.escrow
    opener = a.admit(create("vm", "1Gi", namespace=CHILD, uid="req-1"))
    assert not (await child.delete_during(opener)).allowed, "its namespace is no Tenant's now"
    assert await a.ledger.escrow() == 0
    assert escrow.pools() == [], "nothing kept of a pool whose object is gone"
    # The sub-tenant again, by the same name: the holder starts afresh from a grant of its own.
    await child.create_again()
    assert await a.ledger.escrow() == 1, "the pool is still rated: the duty grants it"
    a.deliver(CHILD)
    assert (await a.admit(create("vm2", "1Gi", namespace=CHILD, uid="req-2"))).allowed
    (record,) = _records(child.cluster, CHILD).values()
    assert record.folded == {}
    assert a.escrowed.spends == 1
    assert escrow.available(CHILD) == rl.subtract(record.granted, {"memory": Decimal(1024**3)})


async def test_a_sub_tenant_deleted_and_created_again_gets_no_slice_spent_twice() -> None:
    # The reverse: the holder drops a deleted pool's books, so a copy of the old object listing
    # its record (a relist from a stale cache) must not bring them back without the spends
    # made from it, and the request spent there is not answered from the new pool's slice.
    child = await DeletedSubTenant.cold()
    a, escrow = child.a, child.escrow
    assert (await a.admit(create("vm", "1Gi", namespace=CHILD, uid="req-1"))).allowed
    assert a.escrowed.spends == 1, "answered from the slice granted for it"
    old = copy.deepcopy(child.cluster.objects[CHILD])
    child.now[0] += escrow.bounds.renew_seconds  # a renewal is due: a write of the record
    assert await child.delete_during(a.ledger.escrow()) == 0
    assert await a.ledger.escrow() == 0
    assert escrow.pools() == []
    a.ledger.reflector.on_event("MODIFIED", old)  # older than the deletion
    assert escrow.record(CHILD) is None, "a copy older than the deletion brings no slice back"
    assert escrow.available(CHILD) == {}
    await child.create_again()
    assert await a.ledger.escrow() == 1
    a.deliver(CHILD)
    (record,) = _records(child.cluster, CHILD).values()
    assert record.folded == {}
    assert escrow.spends(CHILD) == [], "nothing spent from the old slice is in the new one's"
    again = await a.admit(create("vm", "1Gi", namespace=CHILD, uid="req-1"))  # the same call
    assert again.allowed
    assert a.escrowed.spends == 1, "a uid spent within the store bound takes the exact path"

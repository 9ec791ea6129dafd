"""Attacks on the spends a replica answers from its slices and keeps in memory until their
objects are observed (``webhook/admission/ledger/spent.py``), and on what it keeps of every
pool it ever saw: a tenant whose creates are never stored, or who churns sub-tenants, must not
make other tenants' admissions or the escrow duty pay for it."""

from __future__ import annotations

import copy
from typing import Any

from tests.admission.test_ledger import POOL, Cluster, Replica, create
from tests.admission.test_ledger_escrow import _busy, _visits
from tests.admission.test_ledger_escrow_first_grant import cold_pool
from tests.builders import review
from webhook.admission.ledger import LedgerSettings
from webhook.core.admission.reviews import AdmissionRequest, parse_review
from webhook.core.tenancy.applications import Application

POOLS = [POOL, *(f"tenant-p{index}" for index in range(8))]


def _disk(name: str, *, uid: str) -> AdmissionRequest:
    """A VMDisk: it charges only ``storage``, a key the pool's budget does not declare."""
    return parse_review(review("VMDisk", POOL, name, {}, uid=uid))


async def test_a_tenant_whose_creates_are_never_stored_holds_no_more_spends_than_its_share() -> (
    None
):
    # On the exact path a tenant holds at most share_limit entries in a pool's ledger. From a
    # slice, a create that adds nothing to the pool's budgeted keys (a VMDisk where the quota
    # names no storage) is a spend of no room: nothing limits how many a tenant makes, and one
    # whose object is never stored (AlreadyExists) is kept for the store bound, 60 s.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    escrowed = a.escrowed
    a.observe(Application("VMDisk", POOL, "taken", {}, version=cluster.bump()))
    # The slice names the pool's recent kinds at its first grant: a VMDisk among them.
    assert (await a.admit(_disk("taken", uid="first"))).allowed
    a.deliver()
    await a.ledger.escrow()
    a.deliver()
    limit = LedgerSettings("a").share_limit
    spent = a.ledger.spends
    reasons: list[str] = []
    a.ledger.on_fallback = lambda reason, seconds: reasons.append(reason)
    answers = [await a.admit(_disk("taken", uid=f"again-{index}")) for index in range(3 * limit)]
    assert "share" in reasons, reasons[:5]  # the metrics say why those took the exact path
    held = len(escrowed.escrow.spends(POOL))
    refused = {(answer.reason, answer.code) for answer in answers if not answer.allowed}
    assert refused <= {("ledger-share", 429)}, refused  # past its share: "try again"
    assert held <= limit, (
        f"{a.ledger.spends - spent} creates answered from the slice, {held} spends held "
        f"(a tenant's share of entries: {limit})"
    )


async def test_a_tenants_waiting_spends_are_read_once_a_round_not_once_per_pool() -> None:
    # Each pool the duty takes up reads every waiting spend's object record again (spent.py,
    # SpentAdmissions.observe, called from Escrowed._pool): a round over P pools reads a
    # tenant's S unobserved spends P + 1 times, so S never-stored creates in one pool make
    # every round, and so every admission on the replica, wait O(P x S).
    cluster = Cluster()
    a = Replica(cluster, "a", {pool: {"memory": "64Gi"} for pool in POOLS}, escrow=True)
    for pool in POOLS:
        for index in range(3):
            name = f"{pool}-w{index}"
            assert (await a.admit(create(name, "1Gi", namespace=pool, uid=name))).allowed
    assert await a.ledger.escrow() == len(POOLS)
    # The name is taken: these creates pass admission, and the API server refuses each.
    a.observe(Application("Thing", POOL, "taken", {"memory": "1"}, version=cluster.bump()))
    spends = LedgerSettings("a").share_limit  # one tenant's share: all it can hold
    for index in range(spends):
        assert (await a.admit(create("taken", "1Mi", uid=f"again-{index}"))).allowed
    escrowed = a.escrowed
    assert len(escrowed.escrow.spends(POOL)) == spends
    state: Any = a.state
    reads = [0]
    record = state.record

    def counted(key: Any) -> Any:
        reads[0] += 1
        return record(key)

    state.record = counted
    await a.ledger.escrow()
    assert reads[0] <= 2 * spends, f"{reads[0]} record reads in one round for {spends} spends"


async def test_a_tenant_churning_fresh_sub_tenants_leaves_nothing_the_holder_keeps_or_walks() -> (
    None
):
    # Every TenantReservation the watch delivers gets an entry in the holder's books (Book.track
    # -> Escrow.recorded), kept after its object is deleted. A tenant that creates sub-tenants
    # with quotas, admits one create into each (its object is created) and deletes them, leaves
    # one per sub-tenant for good: every admission sorts them all (Escrow.pools, in
    # Escrowed.admit) and every duty round looks at each (Escrowed.duty, _resting).
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    assert await a.ledger.escrow() == 1
    for index in range(500):
        name = f"{POOL}-churn{index}"
        obj: dict[str, Any] = {
            "apiVersion": "reservation.cozystack.io/v1alpha1",
            "kind": "TenantReservation",
            "metadata": {"name": name, "namespace": name, "resourceVersion": str(cluster.bump())},
            "spec": {"pool": name},
            "status": {},
        }
        a.ledger.reflector.on_event("ADDED", copy.deepcopy(obj))
        obj["metadata"]["resourceVersion"] = str(cluster.bump())
        a.ledger.reflector.on_event("DELETED", obj)
    escrowed = a.escrowed
    kept = escrowed.escrow.pools()
    assert kept == [POOL], f"{len(kept)} pools in the holder's books, {len(kept) - 1} gone"


async def test_creates_that_charge_no_budgeted_key_wake_the_duty_once_not_on_every_create() -> None:
    # A VMDisk into a pool whose quota names no storage is allowed with nothing charged: its
    # note leaves the pool's rate empty, so the pool stays "cold". Every such create then tries
    # a first grant under the pool's lock (Escrowed.open; creates of other tenants arriving
    # meanwhile wait for it) and wakes the duty early (Escrowed.note): a tenant sending them
    # keeps the duty at five rounds a period for good, where a pool too full to split wakes
    # it once.
    a = await cold_pool(Cluster())
    escrowed = a.escrowed
    tried = _visits(a)
    assert (await a.admit(_disk("d0", uid="d0"))).allowed
    escrowed.nudged.clear()
    await a.ledger.escrow()
    tried.clear()
    nudges = 0
    for index in range(1, 11):
        assert (await a.admit(_disk(f"d{index}", uid=f"d{index}"))).allowed
        nudges += escrowed.nudged.is_set()
        escrowed.nudged.clear()
    assert (nudges, len(tried)) == (0, 0), (
        f"10 creates that charge nothing budgeted: {nudges} nudges, {len(tried)} grant tries"
    )

"""The reservation ledger, driven deterministically: real :class:`Ledger` replicas over a stub
API server (one revision counter, TenantReservations only), each with its own state whose
watches the test delivers by hand, in the order that breaks things."""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import FIXTURES, KEYS, THING_DEFINITION, review
from tests.builders import state as build_state
from tests.cluster import app, cluster
from tests.waiting import eventually
from webhook.admission.ledger import MAX_ENTRIES, MAX_ENTRY_BYTES, Ledger, LedgerSettings
from webhook.admission.ledger.escrowed import Escrowed
from webhook.core.admission import decisions
from webhook.core.admission.decisions import Decision, Policy
from webhook.core.admission.price import price
from webhook.core.admission.reviews import AdmissionRequest, parse_review
from webhook.core.admission.state import ReservationState
from webhook.core.pricing.platform import Platform, PlatformBuilder
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, Application
from webhook.core.tenancy.records import parse_recorded_charge, record_annotation, sign
from webhook.defaults import default_contracts, default_presets
from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.state.manifests import read_manifests

POLICY = Policy()
POOL = "tenant-acme"
# How long an unobserved entry is held by default: past it, plus a second.
PAST_GRACE = LedgerSettings("a").grace_seconds + 1


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Cluster:
    """The stub API server: one etcd-like revision counter, TenantReservations by pool."""

    def __init__(self) -> None:
        self.revision = 1
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.written: dict[str, int] = {}  # pool -> writes of its object that reached the server
        self.faults: list[tuple[str, int]] = []  # (pool, status) the next writes to it fail with
        self.stalls: dict[str, asyncio.Event] = {}  # pool -> writes to it wait until it is set
        self.held: dict[str, int] = {}  # pool -> writes to it waiting at its stall now

    def stall(self, pool: str) -> asyncio.Event:
        """Hold every write to ``pool``'s object until the returned event is set."""
        return self.stalls.setdefault(pool, asyncio.Event())

    def bump(self) -> int:
        self.revision += 1
        return self.revision

    def entries(self, pool: str = POOL) -> list[dict[str, Any]]:
        obj = self.objects.get(pool) or {}
        return list((obj.get("status") or {}).get("pending") or [])


class StubClient:
    """The three calls the ledger makes, with optimistic concurrency on resourceVersion."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def get(self, ref: ResourceRef, namespace: str, name: str) -> dict[str, Any]:
        await asyncio.sleep(0)
        found = self.cluster.objects.get(name)
        if found is None:
            raise ApiError(404, "NotFound", name)
        return copy.deepcopy(found)

    async def create(self, ref: ResourceRef, obj: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        name = obj["metadata"]["name"]
        if name in self.cluster.objects:
            raise ApiError(409, "AlreadyExists", name)
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.cluster.bump())
        self.cluster.objects[name] = stored
        return copy.deepcopy(stored)

    async def replace(
        self, ref: ResourceRef, obj: dict[str, Any], *, status: bool = False
    ) -> dict[str, Any]:
        await asyncio.sleep(0)
        name = obj["metadata"]["name"]
        if name in self.cluster.stalls:
            held = self.cluster.held
            held[name] = held.get(name, 0) + 1
            try:
                await self.cluster.stalls[name].wait()
            finally:
                held[name] -= 1
        self.cluster.writes += 1
        self.cluster.written[name] = self.cluster.written.get(name, 0) + 1
        for fault in self.cluster.faults:
            if fault[0] == name:
                self.cluster.faults.remove(fault)
                raise ApiError(fault[1], "Fault", "injected")
        current = self.cluster.objects.get(name)
        if current is None:  # deleted meanwhile (its namespace, with its Tenant)
            raise ApiError(404, "NotFound", name)
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.cluster.bump())
        self.cluster.objects[name] = stored
        return copy.deepcopy(stored)


class Replica:
    """One webhook replica: its state, its ledger, and a watch position the test controls."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        tenants: dict[str, dict[str, str] | None],
        *,
        clock: Clock | None = None,
        **settings: Any,
    ) -> None:
        self.cluster = cluster
        self.state: ReservationState = build_state(tenants)
        self.seen = cluster.revision  # every application watch is this far
        client: Any = StubClient(cluster)
        stub: KubeClient = client
        self.ledger = Ledger(
            stub,
            self,
            LedgerSettings(replica=name, **settings),
            clock=clock or Clock(),
        )

    @property
    def escrowed(self) -> Escrowed:
        """The ledger's escrow: the replica was built with ``escrow=True``."""
        escrowed = self.ledger._escrowed
        assert escrowed is not None, "built with escrow=True"
        return escrowed

    def observed_version(self, kind: str) -> int:
        return self.seen

    def confirm(self, kind: str, revision: int) -> None:
        return None  # the test delivers every watch by hand

    def observe(self, app: Application) -> None:
        self.state.observe(app)
        self.seen = max(self.seen, app.version)

    def deliver(self, pool: str = POOL) -> None:
        """The TenantReservation watch delivers the pool's current object (if one is stored)."""
        if pool in self.cluster.objects:
            self.ledger.reflector.on_event("MODIFIED", copy.deepcopy(self.cluster.objects[pool]))

    async def admit(self, request: AdmissionRequest) -> Decision:
        return await self.ledger.admit(request, POLICY)


def usage(replica: Replica, pool: str) -> dict[str, Decimal]:
    """What ``replica`` counts in ``pool`` now."""
    node = replica.state.tree.get(pool)
    assert node is not None, f"{pool} is not a pool"
    return dict(node.usage)


def thing(cluster: Cluster | None, name: str, memory: str, **more: str) -> Application:
    """A Thing as stored (at the next revision) or, without a cluster, unversioned."""
    version = cluster.bump() if cluster else 0
    return Application("Thing", POOL, name, {"memory": memory, **more}, version=version)


def create(name: str, memory: str, *, uid: str = "", namespace: str = POOL, **more: str) -> Any:
    return parse_review(
        review("Thing", namespace, name, {"memory": memory, **more}, uid=uid or f"uid-{name}")
    )


class Minted:
    """Creates as the validating call sees them (the record /mutate signed on each, naming
    its request), whose objects are stored, then observed by :meth:`observe` as the watch
    would deliver them (one dropped from :attr:`stored` before is never stored)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.stored: list[Application] = []

    def __call__(
        self, kind: str, namespace: str, name: str, spec: dict[str, str]
    ) -> AdmissionRequest:
        body = parse_review(review(kind, namespace, name, spec, uid=f"mutate-{name}"))
        written = decisions.mutate(body, self.replica.state, POLICY).patch[0]["value"]
        assert isinstance(written, dict)
        recorded = parse_recorded_charge(written[CHARGE_ANNOTATION])
        self.stored.append(Application(kind, namespace, name, spec, recorded=recorded))
        return parse_review(review(kind, namespace, name, spec, uid=name, annotations=written))

    def observe(self) -> None:
        for stored in self.stored:
            self.replica.observe(replace(stored, version=self.replica.cluster.bump()))
        self.stored.clear()


def grow(name: str, old: str, new: str, *, uid: str) -> AdmissionRequest:
    return parse_review(
        review(
            "Thing",
            POOL,
            name,
            {"memory": new},
            operation="UPDATE",
            old_spec={"memory": old},
            uid=uid,
        )
    )


# ---------------------------------------------------------------------------------------------
# Settling: only an observation newer than the admission


async def test_a_stale_copy_with_the_expected_charge_does_not_settle_another_replicas_entry() -> (
    None
):
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "16Gi"}})
    b = Replica(cluster, "b", {POOL: {"memory": "16Gi"}})
    big = thing(cluster, "x", "16Gi")
    a.observe(big)
    b.observe(big)
    small = thing(cluster, "x", "8Gi")
    a.observe(small)  # b's watch still shows x at 16Gi
    assert (await a.admit(grow("x", "8Gi", "16Gi", uid="grow"))).allowed
    b.deliver()  # b reads a's entry expecting 16Gi, which its stale copy happens to show
    b.observe(small)  # then b sees the shrink: only the pending grow keeps the pool full
    decision = await b.admit(create("y", "8Gi"))
    assert not decision.allowed, "8Gi (x) + 8Gi (the grow, pending) + 8Gi (y) > 16Gi"
    assert decision.reason == "exceeded"


async def test_an_observation_newer_than_the_admission_settles_the_entry() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "2Gi"}})
    assert (await a.admit(create("x", "1Gi"))).allowed
    assert len(a.state.pending) == 1
    a.observe(thing(cluster, "x", "1Gi"))  # stored after the ledger write: a newer revision
    assert len(a.state.pending) == 0
    assert (await a.admit(create("y", "1Gi"))).allowed
    assert not (await a.admit(create("z", "1Gi"))).allowed


async def test_a_delete_older_than_the_admission_releases_nothing() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "1Gi"}})
    old = thing(cluster, "x", "1Gi")
    deleted_at = cluster.bump()
    assert (await a.admit(create("x", "1Gi"))).allowed  # re-created; a never saw the old one
    a.state.forget(old.key, version=deleted_at)  # the old incarnation's delete arrives late
    assert len(a.state.pending) == 1
    assert not (await a.admit(create("y", "1Gi"))).allowed


# ---------------------------------------------------------------------------------------------
# Expiry: only once the state has seen every write up to the entry's removal


async def test_a_hold_outlives_its_grace_while_the_watch_is_silent() -> None:
    cluster = Cluster()
    clock = Clock()
    a = Replica(
        cluster,
        "a",
        {POOL: {"memory": "1Gi"}},
        clock=clock,
        grace_seconds=25.0,
        catch_up_seconds=0.05,
    )
    assert (await a.admit(create("x", "1Gi"))).allowed
    # The object is stored, but the watch is silent: the state never hears of it.
    cluster.bump()
    clock.now += PAST_GRACE
    decision = await a.admit(create("y", "1Gi"))
    assert not decision.allowed, "the expired hold is all that keeps x counted"
    assert cluster.entries() == [], "dropped from the ledger, still counted here"
    assert len(a.state.pending) == 1
    a.seen = cluster.revision  # the watch catches up (a bookmark past the removal)
    a.observe(thing(None, "x", "1Gi"))  # ... and with it the object x
    assert not (await a.admit(create("y", "1Gi", uid="uid-y2"))).allowed
    assert len(a.state.pending) == 0


async def test_a_create_stored_thirty_seconds_after_its_decision_is_still_counted() -> None:
    # kube-apiserver may store an admitted request until its --request-timeout (60 s) has
    # passed: a slow etcd or a slow later admission step. Its entry must outlive that, or the
    # room is given to another first and the late write lands on top of it.
    cluster = Cluster()
    clock = Clock()
    a = Replica(cluster, "a", {POOL: {"memory": "1Gi"}}, clock=clock, catch_up_seconds=0.05)
    assert (await a.admit(create("slow", "1Gi"))).allowed
    clock.now += 30
    a.seen = cluster.revision  # the state is caught up: "slow" is simply not stored yet
    assert not (await a.admit(create("next", "1Gi"))).allowed
    assert len(cluster.entries()) == 1, "still listed, so every replica counts it"


async def test_an_admission_that_never_became_an_object_is_released_once_the_state_caught_up() -> (
    None
):
    cluster = Cluster()
    clock = Clock()
    a = Replica(cluster, "a", {POOL: {"memory": "1Gi"}}, clock=clock, catch_up_seconds=0.05)
    assert (await a.admit(create("ghost", "1Gi"))).allowed
    clock.now += PAST_GRACE
    a.seen = 0  # silent watch
    assert not (await a.admit(create("next", "1Gi"))).allowed
    a.seen = cluster.revision
    assert (await a.admit(create("next", "1Gi", uid="uid-next2"))).allowed


async def test_another_replicas_expired_entry_stays_counted_until_this_state_caught_up() -> None:
    cluster = Cluster()
    clock = Clock()
    a = Replica(cluster, "a", {POOL: {"memory": "1Gi"}}, clock=clock, catch_up_seconds=0.05)
    b = Replica(cluster, "b", {POOL: {"memory": "1Gi"}}, clock=clock, catch_up_seconds=0.05)
    assert (await a.admit(create("x", "1Gi"))).allowed
    b.deliver()
    clock.now += PAST_GRACE
    assert not (await a.admit(create("y", "1Gi"))).allowed  # a drops x's entry from the ledger
    b.deliver()
    assert cluster.entries() == []
    assert not (await b.admit(create("z", "1Gi"))).allowed, "b's watch has not passed the drop"
    b.seen = cluster.revision
    assert (await b.admit(create("z", "1Gi", uid="uid-z2"))).allowed


async def test_a_lagging_replica_that_never_saw_a_settled_entry_waits_before_deciding() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}}, catch_up_seconds=0.05)
    b = Replica(cluster, "b", {POOL: {"memory": "8Gi"}}, catch_up_seconds=0.05)
    assert (await a.admit(create("w", "1Gi"))).allowed
    b.deliver()  # b reads w's entry; from here on both of b's watches lag
    assert (await a.admit(create("x", "2Gi"))).allowed
    a.observe(thing(cluster, "w", "1Gi"))
    a.observe(thing(cluster, "x", "2Gi"))
    assert (await a.admit(create("v", "1Gi"))).allowed  # the write drops w and x, settled
    assert [e["id"] for e in cluster.entries()] == ["uid-v"]
    b.deliver()  # w left before b's eyes; x came and went unseen, its object stored
    decision = await b.admit(create("y", "5Gi"))
    assert not decision.allowed, "w 1Gi + x 2Gi + v 1Gi + y 5Gi > 8Gi"
    assert decision.reason == "ledger-catching-up"
    b.observe(thing(None, "w", "1Gi"))
    b.observe(thing(None, "x", "2Gi"))
    b.seen = cluster.revision  # the application watch passes the version b read
    decision = await b.admit(create("y", "5Gi", uid="uid-y2"))
    assert not decision.allowed
    assert decision.reason == "exceeded"
    assert (await b.admit(create("z", "4Gi"))).allowed


async def test_a_grow_decided_on_a_copy_that_missed_a_shrink_holds_the_whole_increase() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "6Gi"}})
    b = Replica(cluster, "b", {POOL: {"memory": "6Gi"}})
    big = thing(cluster, "x", "3Gi")
    a.observe(big)
    b.observe(big)
    small = thing(cluster, "x", "1Gi")
    b.observe(small)  # a's watch lags: it still counts x at 3Gi
    body = review(
        "Thing", POOL, "x", {"memory": "3Gi"}, operation="UPDATE", old_spec={"memory": "1Gi"}
    )
    body["request"]["uid"] = "grow"
    body["request"]["oldObject"]["metadata"]["resourceVersion"] = str(small.version)
    assert (await a.admit(parse_review(body))).allowed
    assert len(cluster.entries()) == 1, "the grow from the stored 1Gi is held, not 0"
    b.deliver()
    decision = await b.admit(create("z", "4Gi"))
    assert not decision.allowed, "x 1Gi + the grow 2Gi + z 4Gi > 6Gi"


def label(name: str, memory: str, *, uid: str) -> AdmissionRequest:
    """``kubectl label`` as cozystack-api decides it: the spec as read, a label changed."""
    body = review(
        "Thing", POOL, name, {"memory": memory}, operation="UPDATE", old_spec={"memory": memory}
    )
    body["request"]["uid"] = uid
    body["request"]["object"]["metadata"]["labels"] = {"touch": uid}
    return parse_review(body)


async def test_a_label_patch_read_before_a_shrink_keeps_the_old_size_on_every_replica() -> None:
    # cozystack-api writes the label patch without a precondition: stored after the shrink, it
    # writes 4Gi back. Whichever replica decides the creates, the shrink's 3Gi is not given away.
    clock = Clock()
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}}, clock=clock)
    b = Replica(cluster, "b", {POOL: {"memory": "4Gi"}}, clock=clock)
    full = thing(cluster, "x", "4Gi")
    a.observe(full)
    b.observe(full)
    labelled = await a.admit(label("x", "4Gi", uid="label"))
    assert labelled.allowed, labelled.message
    assert (await a.admit(grow("x", "4Gi", "1Gi", uid="shrink"))).allowed
    entries = {e["id"]: e for e in cluster.entries()}
    assert (entries["label"]["charge"], entries["label"]["update"]) == ({}, True)
    b.deliver()
    shrunk = thing(cluster, "x", "1Gi")
    a.observe(shrunk)
    b.observe(shrunk)
    for replica, uid in ((a, "ya"), (b, "yb")):
        refused = await replica.admit(create("y", "1Gi", uid=uid))
        assert not refused.allowed, f"{uid}: the label patch may still write 4Gi back"
        assert "Thing tenant-acme/x at the size an update admitted moments ago" in refused.message
    clock.now += PAST_GRACE  # past the label patch's grace: stored by now, or never
    # b drops the expired entry, but its state has not yet seen past that drop: the label
    # patch may have been stored just before its expiry, where b's watch has not looked yet.
    assert not (await b.admit(create("y", "1Gi", uid="early"))).allowed
    b.seen = cluster.bump()  # the state confirms Things up to now: the patch was never stored
    assert (await b.admit(create("y", "1Gi", uid="late"))).allowed


def tenant_update(quota: str, old: str, *, uid: str, labels: dict[str, str] | None = None) -> Any:
    """An UPDATE of sub-Tenant ``bee`` of the pool (owning ``tenant-acme-bee``)."""
    body = review(
        "Tenant",
        POOL,
        "bee",
        {"resourceQuotas": {"memory": quota}},
        operation="UPDATE",
        old_spec={"resourceQuotas": {"memory": old}},
        uid=uid,
    )
    if labels:
        body["request"]["object"]["metadata"]["labels"] = labels
    return parse_review(body)


async def test_a_stale_label_patch_of_a_sub_tenant_cannot_write_its_old_quota_back_over_room_given_away() -> (  # noqa: E501
    None
):
    # cozystack-api stores a label patch of a Tenant without a precondition too: one that read
    # the sub-tenant's 4Gi quota, stored after the shrink to 1Gi, writes 4Gi back, and the
    # sub-tenant may then fill it. Until it can no longer be stored, the 3Gi stay counted.
    clock = Clock()
    cluster = Cluster()
    tenants: dict[str, dict[str, str] | None] = {
        POOL: {"memory": "4Gi"},
        "tenant-acme-bee": {"memory": "4Gi"},
    }
    a = Replica(cluster, "a", tenants, clock=clock)
    b = Replica(cluster, "b", tenants, clock=clock)
    labelled = await a.admit(tenant_update("4Gi", "4Gi", uid="label", labels={"touch": "1"}))
    assert labelled.allowed, labelled.message
    shrunk = await a.admit(tenant_update("1Gi", "4Gi", uid="shrink"))
    assert shrunk.allowed, shrunk.message
    b.deliver()
    stored = Application(
        "Tenant", POOL, "bee", {"resourceQuotas": {"memory": "1Gi"}}, version=cluster.bump()
    )
    a.observe(stored)
    b.observe(stored)
    for replica, uid in ((a, "ya"), (b, "yb")):
        refused = await replica.admit(create("y", "3Gi", uid=uid))
        assert not refused.allowed, f"{uid}: the label patch may still write the 4Gi quota back"
    clock.now += PAST_GRACE  # past the label patch's grace: stored by now, or never
    for replica in (a, b):
        await replica.ledger.reconcile()
        replica.deliver()
        replica.seen = cluster.bump()
    assert (await b.admit(create("y", "3Gi", uid="late"))).allowed


async def test_a_sub_tenant_with_a_quota_of_many_keys_is_held_by_the_keys_its_parent_bounds() -> (
    None
):
    # A quota of 40 count keys does not fit one entry: the parent's pool lists, and keeps the
    # floor of, only the keys it bounds, so labelling or shrinking such a sub-tenant still works.
    counts = {f"count/kind{i:02d}.apps.cozystack.io": "10" for i in range(40)}
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})

    def bee(memory: str, old: str, uid: str, **labels: str) -> AdmissionRequest:
        body = review(
            "Tenant",
            POOL,
            "bee",
            {"resourceQuotas": {"memory": memory, **counts}},
            operation="UPDATE",
            old_spec={"resourceQuotas": {"memory": old, **counts}},
            uid=uid,
        )
        body["request"]["object"]["metadata"]["labels"] = labels
        return parse_review(body)

    full = {"resourceQuotas": {"memory": "4Gi", **counts}}
    a.observe(Application("Tenant", POOL, "bee", full, version=cluster.bump()))
    labelled = await a.admit(bee("4Gi", "4Gi", "label", touch="1"))
    assert labelled.allowed, labelled.message
    assert [e["expected"] for e in cluster.entries()] == [{"memory": "4Gi"}]
    shrunk = await a.admit(bee("1Gi", "4Gi", "shrink"))
    assert shrunk.allowed, shrunk.message
    small = {"resourceQuotas": {"memory": "1Gi", **counts}}
    a.observe(Application("Tenant", POOL, "bee", small, version=cluster.bump()))
    refused = await a.admit(create("y", "3Gi", uid="y"))
    assert not refused.allowed, "the label patch may still write the 4Gi quota back"
    grown = await a.admit(bee("2Gi", "1Gi", "grow"))  # within what the floor keeps
    assert grown.allowed, grown.message


async def test_a_sub_tenant_with_a_quota_of_many_keys_can_grow() -> None:
    counts = {f"count/kind{i:02d}.apps.cozystack.io": "10" for i in range(40)}
    cluster = Cluster()
    a = Replica(
        cluster, "a", {POOL: {"memory": "8Gi"}, "tenant-acme-bee": {"memory": "1Gi", **counts}}
    )
    grow_body = review(
        "Tenant",
        POOL,
        "bee",
        {"resourceQuotas": {"memory": "2Gi", **counts}},
        operation="UPDATE",
        old_spec={"resourceQuotas": {"memory": "1Gi", **counts}},
        uid="grow",
    )
    grown = await a.admit(parse_review(grow_body))
    assert grown.allowed, grown.message  # its entry listing 41 keys exceeded 1 KiB: refused
    assert [(e["charge"], e["expected"]) for e in cluster.entries()] == [
        ({"memory": "1Gi"}, {"memory": "2Gi"})
    ]


# ---------------------------------------------------------------------------------------------
# What a replica counts for others: the ledger as it is now


async def test_a_follower_counts_nothing_for_others_once_the_ledger_is_empty() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "2Gi"}})
    b = Replica(cluster, "b", {POOL: {"memory": "2Gi"}})
    assert (await a.admit(create("va", "1Gi"))).allowed
    b.deliver()
    assert (await b.admit(create("vb", "1Gi"))).allowed
    a.deliver()
    stored = [thing(cluster, "va", "1Gi"), thing(cluster, "vb", "1Gi")]
    for each in stored:
        a.observe(each)
        b.observe(each)
    for each in stored:
        version = cluster.bump()
        a.state.forget(each.key, version=version)
        b.state.forget(each.key, version=version)
    assert await a.ledger.reconcile() == 1  # the leader drops the settled entries
    b.deliver()
    b.seen = cluster.revision
    assert cluster.entries() == []
    decision = await b.admit(create("big", "2Gi"))
    assert decision.allowed, decision.message
    node = b.state.tree.get(POOL)
    assert node is not None
    assert node.usage.get("memory") == 2 * 1024**3


# ---------------------------------------------------------------------------------------------
# A request charging two pools: its entries are its own, by id


TWO_POOLS: dict[str, dict[str, str] | None] = {
    "tenant-acme": {"memory": "4Gi"},
    "tenant-acme-dev": {"cpu": "2"},
}


def across(name: str, *, uid: str) -> AdmissionRequest:
    return parse_review(
        review("Thing", "tenant-acme-dev", name, {"cpu": "1", "memory": "1Gi"}, uid=uid)
    )


async def test_a_conflict_on_the_second_pool_is_retried_as_the_same_request_never_a_duplicate() -> (
    None
):
    cluster = Cluster()
    a = Replica(cluster, "a", TWO_POOLS)
    cluster.faults.append(("tenant-acme-dev", 409))
    decision = await a.ledger.admit(across("vm", uid="req-1"), POLICY)
    assert decision.allowed, decision.message
    assert set(decision.charged_pools) == {"tenant-acme", "tenant-acme-dev"}
    for pool in ("tenant-acme", "tenant-acme-dev"):
        assert [e["id"] for e in cluster.entries(pool)] == ["req-1"]
    # The API server retries the same request (same uid): recognised, not counted twice.
    again = await a.ledger.admit(across("vm", uid="req-1"), POLICY)
    assert again.allowed
    for pool in ("tenant-acme", "tenant-acme-dev"):
        assert [e["id"] for e in cluster.entries(pool)] == ["req-1"]


async def test_a_request_that_fails_on_the_second_pool_leaves_nothing_in_the_first() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", TWO_POOLS)
    cluster.faults.extend([("tenant-acme-dev", 409)] * 3)  # every attempt conflicts
    decision = await a.ledger.admit(across("vm", uid="req-1"), POLICY)
    assert not decision.allowed
    assert "try again" in decision.message
    assert cluster.entries("tenant-acme") == []
    assert cluster.entries("tenant-acme-dev") == []
    assert len(a.state.pending) == 0
    assert (await a.ledger.admit(across("vm", uid="req-2"), POLICY)).allowed


async def test_a_request_across_two_pools_retried_under_its_uid_after_a_roll_back_is_counted() -> (
    None
):
    # Refused in the second pool (its entries withdrawn), the answer lost, the API server
    # sends the request again under the same uid and it is admitted: counted in both pools,
    # so the room it holds is not given to the next request.
    cluster = Cluster()
    a = Replica(cluster, "a", TWO_POOLS)
    cluster.faults.extend([("tenant-acme-dev", 409)] * 3)  # every attempt conflicts
    assert not (await a.ledger.admit(across("vm", uid="req-1"), POLICY)).allowed
    assert (await a.ledger.admit(across("vm", uid="req-1"), POLICY)).allowed
    for pool in ("tenant-acme", "tenant-acme-dev"):
        assert [e["id"] for e in cluster.entries(pool)] == ["req-1"]
    assert {(h.namespace, h.id) for h in a.state.pending.holds()} == {
        ("tenant-acme", "req-1"),
        ("tenant-acme-dev", "req-1"),
    }
    node = a.state.tree.get("tenant-acme")
    assert node is not None
    assert node.usage.get("memory") == 1024**3
    assert (await a.ledger.admit(across("vm2", uid="req-2"), POLICY)).allowed
    third = await a.ledger.admit(across("vm3", uid="req-3"), POLICY)
    assert not third.allowed, "cpu: 2 in tenant-acme-dev, both held"


async def test_a_write_across_two_pools_makes_no_other_tenant_of_either_pool_wait_for_it() -> None:
    # A carve-out's write charges its own pool and its parent's. Holding the parent while the
    # child's write was in flight made every other tenant of the parent wait for that write.
    cluster = Cluster()
    a = Replica(cluster, "a", {**TWO_POOLS, "tenant-acme-ops": None})
    child = cluster.stall("tenant-acme-dev")
    carved = asyncio.create_task(a.ledger.admit(across("vm", uid="req-1"), POLICY))
    other = create("db", "1Gi", namespace="tenant-acme-ops", uid="ops")
    decision = await asyncio.wait_for(a.admit(other), timeout=10)
    assert decision.allowed, decision.message
    assert not carved.done(), "still waiting for the child pool's write"
    assert {e["id"] for e in cluster.entries("tenant-acme")} == {"req-1", "ops"}
    child.set()
    assert (await carved).allowed
    assert [e["id"] for e in cluster.entries("tenant-acme-dev")] == ["req-1"]
    assert usage(a, "tenant-acme").get("memory") == 2 * 1024**3


async def test_a_write_across_two_pools_whose_caller_goes_away_leaves_nothing_behind() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", TWO_POOLS)
    child = cluster.stall("tenant-acme-dev")
    carved = asyncio.create_task(a.ledger.admit(across("vm", uid="req-1"), POLICY))
    await eventually(lambda: bool(cluster.entries("tenant-acme")))
    carved.cancel()  # the webhook's deadline: no answer, so nothing will be stored
    with pytest.raises(asyncio.CancelledError):
        await carved
    child.set()
    await eventually(lambda: cluster.entries("tenant-acme") == [])
    assert cluster.entries("tenant-acme-dev") == []
    assert len(a.state.pending) == 0


async def test_a_write_across_two_pools_cancelled_while_removing_its_entries_leaves_none() -> None:
    # Refused in the second pool, the request removes what its first part wrote; its caller's
    # deadline may cancel it during that removal, which must still finish.
    cluster = Cluster()
    a = Replica(cluster, "a", TWO_POOLS)
    cluster.faults.extend([("tenant-acme-dev", 409)] * 3)  # the second part is refused
    parent, child = cluster.stall("tenant-acme"), cluster.stall("tenant-acme-dev")
    parent.set()
    carved = asyncio.create_task(a.ledger.admit(across("vm", uid="req-1"), POLICY))
    await eventually(lambda: bool(cluster.entries("tenant-acme")))
    parent.clear()  # the removal's write to the first pool waits
    child.set()
    await eventually(lambda: not cluster.faults)
    await asyncio.sleep(0.05)
    assert not carved.done(), "removing its entry"
    carved.cancel()
    with pytest.raises(asyncio.CancelledError):
        await carved
    parent.set()
    await eventually(lambda: cluster.entries("tenant-acme") == [])
    assert len(a.state.pending) == 0


# A carve-out whose own pool has room for two: a burst of twenty writes twenty parts in the
# parent pool and is refused eighteen times in the child's batch.
ROOMY_PARENT: dict[str, dict[str, str] | None] = {
    "tenant-acme": {"memory": "100Gi"},
    "tenant-acme-dev": {"cpu": "2"},
    "tenant-acme-ops": None,
}


async def carve_out_burst(
    cluster: Cluster, replica: Replica, count: int
) -> tuple[list[AdmissionRequest], list[asyncio.Task[Decision]], asyncio.Event]:
    """``count`` carve-out creates, their parts written in the parent pool and their child
    pool's write held back (set the event returned to let it through)."""
    child = cluster.stall("tenant-acme-dev")
    burst = [across(f"vm{i}", uid=f"x{i}") for i in range(count)]
    tasks = [asyncio.create_task(replica.ledger.admit(q, POLICY)) for q in burst]
    # Their parts stored in the parent pool is not enough: the child pool's batch starts its
    # write a few turns of the loop later (counted in the ledger's writes), so wait until that
    # write is held at the child's stall, and no write of the burst is still to start.
    await eventually(
        lambda: (
            len(cluster.entries("tenant-acme")) == count
            and cluster.held.get("tenant-acme-dev") == 1
        )
    )
    return burst, tasks, child


async def test_refused_carve_out_roll_backs_share_one_write() -> None:
    # Each refused carve-out removes the part it wrote in the parent pool. A removal of its
    # own per request (the first alone, then the rest behind it) costs the parent pool, and
    # every other tenant of it, writes for a burst of creates its own pool refuses; the
    # removals waiting share one.
    cluster = Cluster()
    a = Replica(cluster, "a", ROOMY_PARENT)
    b = Replica(cluster, "b", ROOMY_PARENT)  # another replica, following the parent's object
    burst, tasks, child = await carve_out_burst(cluster, a, 20)
    b.deliver("tenant-acme")
    parts = cluster.written["tenant-acme"]
    child.set()
    decisions = await asyncio.gather(*tasks)
    allowed = {q.uid for q, d in zip(burst, decisions, strict=True) if d.allowed}
    refused = [d for d in decisions if not d.allowed]
    assert len(allowed) == 2, "cpu: 2 in tenant-acme-dev"
    assert len(refused) == 18
    assert all((d.reason, d.pool) == ("exceeded", "tenant-acme-dev") for d in refused)
    assert cluster.written["tenant-acme"] - parts == 1, "eighteen removals, one write"
    assert {e["id"] for e in cluster.entries("tenant-acme")} == allowed
    assert {e["id"] for e in cluster.entries("tenant-acme-dev")} == allowed
    assert len(a.state.pending) == 4, "the two allowed, in both pools"
    parent = a.state.tree.get("tenant-acme")
    assert parent is not None
    assert parent.usage.get("memory") == 2 * 1024**3
    # Another replica counts the removed parts until its state has passed their removal (they
    # may be stored as far as it knows): never less than is held.
    b.deliver("tenant-acme")
    assert len(b.state.pending) == 20
    b.seen = cluster.revision
    await b.ledger.admit(create("db", "1Gi", namespace="tenant-acme-ops", uid="ops"), POLICY)
    assert {h.id for h in b.state.pending.holds()} == {*allowed, "ops"}


async def test_refused_carve_out_roll_backs_ride_on_the_parent_pools_next_batch() -> None:
    # Removals waiting while the parent pool's batch is written go with its next batch, the
    # write made anyway: no write of their own, taking the parent's lock ahead of that batch.
    cluster = Cluster()
    a = Replica(cluster, "a", ROOMY_PARENT)
    burst, tasks, child = await carve_out_burst(cluster, a, 10)
    parent = cluster.stall("tenant-acme")  # the parent's next writes wait
    before, written = cluster.written["tenant-acme"], a.ledger.writes
    first = asyncio.create_task(a.admit(create("db1", "1Gi", namespace="tenant-acme-ops")))
    # db1's batch, its write held at the parent's stall (and the only write since the burst).
    await eventually(lambda: cluster.held.get("tenant-acme") == 1)
    assert a.ledger.writes == written + 1
    second = asyncio.create_task(a.admit(create("db2", "1Gi", namespace="tenant-acme-ops")))
    child.set()  # eight refused: their removals queue behind db1's batch, with db2
    # The child's write answered: the two allowed are done, and the eight refused, woken in
    # the same turn of the loop, have queued their removals.
    await eventually(lambda: sum(t.done() for t in tasks) >= 2)
    assert sum(not t.done() for t in tasks) == 8, "their removals wait for the parent's write"
    assert cluster.held.get("tenant-acme") == 1, "db1's write only: none for the removals"
    parent.set()
    assert (await first).allowed
    assert (await second).allowed
    decisions = await asyncio.gather(*tasks)
    allowed = {q.uid for q, d in zip(burst, decisions, strict=True) if d.allowed}
    assert len(allowed) == 2
    assert cluster.written["tenant-acme"] - before == 2, "db1's batch, then db2's with them"
    assert {e["id"] for e in cluster.entries("tenant-acme")} == {*allowed, "uid-db1", "uid-db2"}
    assert usage(a, "tenant-acme").get("memory") == 4 * 1024**3


async def test_refused_carve_outs_cancelled_while_their_removals_wait_leave_none() -> None:
    # A deadline cancelling the requests while their shared removal waits for the parent's
    # write: the removal is queued, and made, all the same.
    cluster = Cluster()
    a = Replica(cluster, "a", ROOMY_PARENT)
    burst, tasks, child = await carve_out_burst(cluster, a, 6)
    parent = cluster.stall("tenant-acme")
    before = cluster.written["tenant-acme"]
    child.set()
    # The child's write answered (the two allowed done) and the four refused's one removal
    # write started, held at the parent's stall.
    await eventually(
        lambda: sum(t.done() for t in tasks) >= 2 and cluster.held.get("tenant-acme") == 1
    )
    waiting = [t for t in tasks if not t.done()]
    assert len(waiting) == 4, "the four refused, removing their parts"
    for task in waiting:
        task.cancel()
    for task in waiting:
        with pytest.raises(asyncio.CancelledError):
            await task
    parent.set()
    allowed = {q.uid for q, t in zip(burst, tasks, strict=True) if t not in waiting}
    await eventually(lambda: {e["id"] for e in cluster.entries("tenant-acme")} == allowed)
    await _yielded()  # any write still to come has started (none should)
    assert cluster.written["tenant-acme"] - before == 1
    assert len(a.state.pending) == 4, "the two allowed, in both pools"


async def _yielded(turns: int = 200) -> None:
    """Let every task run until it waits on something the test holds back (the stub answers
    each call after one turn of the loop)."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def _refused_carve_outs_beside_the_parents_traffic(
    carve_outs: int, child_cpu: int, parent_gi: int, others: int, cancelled: list[bool]
) -> None:
    cluster = Cluster()
    tenants: dict[str, dict[str, str] | None] = {
        "tenant-acme": {"memory": f"{parent_gi}Gi"},
        "tenant-acme-dev": {"cpu": str(child_cpu)},
        "tenant-acme-ops": None,
    }
    a = Replica(cluster, "a", tenants)
    child = cluster.stall("tenant-acme-dev")
    burst = [across(f"vm{i}", uid=f"x{i}") for i in range(carve_outs)]
    carved = [asyncio.create_task(a.ledger.admit(q, POLICY)) for q in burst]
    await _yielded()  # their parts written in the parent pool, the child's write held back
    parent = cluster.stall("tenant-acme")
    before = cluster.written.get("tenant-acme", 0)
    ops = [create(f"db{i}", "1Gi", namespace="tenant-acme-ops") for i in range(others)]
    own: list[asyncio.Task[Decision]] = []
    for request in ops:  # the first one's batch being written, the others queued behind it
        own.append(asyncio.create_task(a.admit(request)))
        await _yielded()
    child.set()
    await _yielded()  # the refused queue their removals behind the parent's write
    gone = {
        q.uid
        for q, task, cancel in zip(burst, carved, cancelled, strict=False)
        if cancel and not task.done() and task.cancel()
    }
    parent.set()
    outcomes = await asyncio.gather(*carved, *own, return_exceptions=True)
    await _yielded()
    admitted = {
        q.uid
        for q, d in zip([*burst, *ops], outcomes, strict=True)
        if isinstance(d, Decision) and d.allowed
    }
    assert not admitted & gone
    carved_in = {uid for uid in admitted if uid.startswith("x")}
    assert {e["id"] for e in cluster.entries("tenant-acme")} == admitted
    assert {e["id"] for e in cluster.entries("tenant-acme-dev")} == carved_in
    assert {(h.namespace, h.id) for h in a.state.pending.holds()} == {
        *(("tenant-acme", uid) for uid in admitted),
        *(("tenant-acme-dev", uid) for uid in carved_in),
    }
    node = a.state.tree.get("tenant-acme")
    assert node is not None
    assert node.usage.get("memory", 0) == len(admitted) * 1024**3 <= parent_gi * 1024**3
    # The parent pool's own batches (the first, then the rest together), and one write for
    # the removals only when no batch of its own came after them.
    batches = min(others, 2)
    assert cluster.written.get("tenant-acme", 0) - before <= batches + (batches < 2)


@settings(max_examples=60, deadline=None)
@given(
    carve_outs=st.integers(1, 8),
    child_cpu=st.integers(1, 3),
    parent_gi=st.integers(1, 12),
    others=st.integers(0, 3),
    cancelled=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_refused_carve_out_roll_backs_riding_on_the_parents_writes_leave_exactly_the_admitted(
    carve_outs: int, child_cpu: int, parent_gi: int, others: int, cancelled: list[bool]
) -> None:
    # Whatever refuses a burst of carve-outs (their own pool, or the parent's budget), whatever
    # else the parent pool admits meanwhile and whichever callers their deadline cancels while
    # their removals wait: the parent lists exactly the admitted (none removed that was
    # admitted, none of the refused left), counts exactly those, and writes no more than its
    # own batches and one write for the removals.
    asyncio.run(
        _refused_carve_outs_beside_the_parents_traffic(
            carve_outs, child_cpu, parent_gi, others, cancelled
        )
    )


async def test_concurrent_writes_across_two_pools_and_within_one_never_pass_either_budget() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {**TWO_POOLS, "tenant-acme-ops": None})
    b = Replica(cluster, "b", {**TWO_POOLS, "tenant-acme-ops": None})
    requests = [(a if i % 2 else b, across(f"vm{i}", uid=f"x{i}")) for i in range(8)]
    requests += [
        (b if i % 2 else a, create(f"db{i}", "1Gi", namespace="tenant-acme-ops", uid=f"o{i}"))
        for i in range(8)
    ]

    async def admit(replica: Replica, request: AdmissionRequest) -> Decision:
        decision = await replica.admit(request)
        for pool in cluster.objects:  # every replica's watch delivers every write
            a.deliver(pool)
            b.deliver(pool)
        return decision

    decisions = await asyncio.gather(*(admit(r, q) for r, q in requests))
    allowed = [q for (_, q), d in zip(requests, decisions, strict=True) if d.allowed]
    across_allowed = sum(1 for q in allowed if q.namespace == "tenant-acme-dev")
    assert 1 <= across_allowed <= 2, "cpu: 2 in tenant-acme-dev"
    assert 1 <= len(allowed) <= 4, "memory: 4Gi in tenant-acme, 1Gi each"
    held = {e["id"] for e in cluster.entries("tenant-acme")}
    assert held == {q.uid for q in allowed}, "the refused hold nothing; the allowed are held"
    assert {e["id"] for e in cluster.entries("tenant-acme-dev")} == {
        q.uid for q in allowed if q.namespace == "tenant-acme-dev"
    }


async def test_a_tenant_past_its_share_through_requests_charging_two_pools_is_refused_alone() -> (
    None
):
    cluster = Cluster()
    pools = {"tenant-acme": {"memory": "500Gi"}, "tenant-acme-dev": {"cpu": "500"}}
    a = Replica(cluster, "a", {**pools, "tenant-acme-ops": None})  # the default share: 100
    answers = [await a.ledger.admit(across(f"vm{i}", uid=f"r{i}"), POLICY) for i in range(101)]
    assert all(d.allowed for d in answers[:100])
    refused = answers[-1]
    assert (refused.code, refused.reason) == (429, "ledger-share"), refused.message
    assert "tenant-acme-dev already has 100" in refused.message
    for pool in ("tenant-acme", "tenant-acme-dev"):  # nothing of the refused request stays
        assert "r100" not in [e["id"] for e in cluster.entries(pool)]
    other = await a.admit(create("db", "1Gi", namespace="tenant-acme-ops", uid="ops"))
    assert other.allowed, "another tenant of the pool is not refused"


async def test_creates_refused_downstream_hold_only_their_tenants_share_for_the_whole_grace() -> (
    None
):
    # A tenant's creates admitted and then refused after admission (another webhook, a name
    # its storage refuses) are never observed: each is held for the grace (the API server's
    # request timeout plus the skew, 65 s). Repeating them fills only that tenant's share of
    # the pool's ledger, for that long; a sibling sharing the pool is never refused for it.
    cluster = Cluster()
    clock = Clock()
    tenants = {POOL: {"memory": "1000Gi"}, "tenant-acme-a": None, "tenant-acme-b": None}
    a = Replica(cluster, "a", tenants, clock=clock, catch_up_seconds=0.05)
    share = a.ledger.settings.share_limit
    for i in range(share):
        ghost = create(f"ghost{i}", "1Gi", namespace="tenant-acme-a", uid=f"g{i}")
        assert (await a.admit(ghost)).allowed
    refused = await a.admit(create("more", "1Gi", namespace="tenant-acme-a", uid="more-1"))
    assert (refused.code, refused.reason) == (429, "ledger-share"), refused.message
    sibling = await a.admit(create("db", "1Gi", namespace="tenant-acme-b", uid="b-1"))
    assert sibling.allowed, sibling.message
    clock.now += PAST_GRACE - 2  # still within the grace: the request may yet be stored
    a.seen = cluster.revision
    late = await a.admit(create("more", "1Gi", namespace="tenant-acme-a", uid="more-2"))
    assert (late.code, late.reason) == (429, "ledger-share"), late.message
    held = [e for e in cluster.entries() if "/tenant-acme-a/" in e["application"]]
    assert len(held) == share, "never more than the tenant's share listed"
    clock.now += 2  # past the grace, and the state has seen past the admissions
    a.seen = cluster.revision
    again = await a.admit(create("more", "1Gi", namespace="tenant-acme-a", uid="more-3"))
    assert again.allowed, again.message
    assert len(cluster.entries()) <= share + 2


# ---------------------------------------------------------------------------------------------
# Who can be held at all


async def test_a_request_for_a_namespace_no_tenant_owns_is_never_held() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "1Gi"}})
    decision = await a.admit(create("x", "1Gi", namespace="tenant-acme-ghost"))
    assert not decision.allowed
    assert "tenant-acme-ghost is not known yet" in decision.message
    assert cluster.writes == 0
    assert (await a.admit(create("y", "1Gi"))).allowed


async def test_reposting_one_request_holds_its_charge_once() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "2Gi"}})
    for _ in range(5):
        assert (await a.admit(create("x", "1Gi", uid="same"))).allowed
    assert [e["id"] for e in cluster.entries()] == ["same"]
    assert (await a.admit(create("y", "1Gi"))).allowed


# ---------------------------------------------------------------------------------------------
# Dry runs: held as previews, since an API server may store them (cozystack-api does)


def preview(name: str, memory: str, *, uid: str = "") -> AdmissionRequest:
    return parse_review(
        review("Thing", POOL, name, {"memory": memory}, dry_run=True, uid=uid or f"dry-{name}")
    )


async def test_concurrent_dry_runs_the_server_stores_never_overshoot_the_pool() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    answers = await asyncio.gather(*(a.admit(preview(f"vm{i}", "1Gi")) for i in range(12)))
    assert sum(d.allowed for d in answers) == 4, "what the server stores fits the budget"
    assert {d.reason for d in answers if not d.allowed} == {"exceeded"}
    assert len(cluster.entries()) == 4
    assert all(e.get("dryRun") is True for e in cluster.entries())


async def test_dry_runs_stored_through_two_replicas_never_overshoot_the_pool() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    b = Replica(cluster, "b", {POOL: {"memory": "4Gi"}})
    answers = await asyncio.gather(
        *(r.admit(preview(f"vm{i}", "1Gi")) for i in range(12) for r in (a, b))
    )
    allowed = {f"vm{i // 2}" for i, d in enumerate(answers) if d.allowed}
    assert len(allowed) == 4, "the same name previewed on both replicas is one object"
    assert len(cluster.entries()) == 4
    more = await asyncio.gather(*(b.admit(preview(f"b{i}", "1Gi")) for i in range(4)))
    assert not any(d.allowed for d in more)


async def test_a_held_dry_run_says_it_is_held_and_for_how_long() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}}, grace_seconds=25.0)
    decision = await a.admit(preview("x", "1Gi"))
    assert decision.allowed
    assert "dry run: nothing was reserved" not in decision.warnings
    assert any("held like a write for up to 25s" in w for w in decision.warnings)
    assert decision.audit["dry-run"] == "held"


async def test_a_preview_followed_by_the_same_write_is_not_refused_for_its_preview() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    for name in ("a", "b", "c"):
        a.observe(thing(cluster, name, "1Gi"))
    assert (await a.admit(preview("x", "1Gi"))).allowed  # the pool is now full, with x held
    assert (await a.admit(create("x", "1Gi"))).allowed, "x's own preview makes no room for x"
    assert [e["id"] for e in cluster.entries()] == ["uid-x"], "the write replaced the preview"
    assert not (await a.admit(create("y", "1Gi"))).allowed


async def test_a_preview_and_the_write_that_follows_it_hold_the_larger_of_the_two() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    assert (await a.admit(preview("x", "4Gi"))).allowed  # the server may have stored 4Gi
    assert (await a.admit(create("x", "1Gi"))).allowed
    (entry,) = cluster.entries()
    assert entry["charge"] == {"memory": "4Gi"}, "the preview's 4Gi stays held until observed"
    assert not (await a.admit(create("y", "1Gi"))).allowed
    a.observe(thing(cluster, "x", "1Gi"))  # the write for real is what was stored
    assert (await a.admit(create("y", "1Gi", uid="uid-y2"))).allowed


async def test_repeated_previews_of_one_name_hold_it_once() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    for i in range(20):
        assert (await a.admit(preview("x", "1Gi", uid=f"dry-{i}"))).allowed
    assert [e["id"] for e in cluster.entries()] == ["dry-19"]
    for name in ("y", "z", "w"):
        assert (await a.admit(create(name, "1Gi"))).allowed, "previews did not fill the pool"


async def test_repeated_previews_of_one_name_never_use_up_the_tenants_share() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}}, namespace_share=0.001)  # 1 entry
    for i in range(3):
        decision = await a.admit(preview("x", "1Gi", uid=f"dry-{i}"))
        assert decision.allowed, decision.message
    assert [e["id"] for e in cluster.entries()] == ["dry-2"]
    assert (await a.admit(create("x", "1Gi"))).allowed, "the write replaces its preview"


async def test_concurrent_previews_of_one_name_hold_it_once() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    answers = await asyncio.gather(
        *(a.admit(preview("x", "1Gi", uid=f"dry-{i}")) for i in range(20))
    )
    assert all(d.allowed for d in answers)
    assert len(cluster.entries()) == 1
    assert (await a.admit(create("y", "3Gi"))).allowed


async def test_a_preview_on_one_replica_is_replaced_by_the_write_on_another() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    b = Replica(cluster, "b", {POOL: {"memory": "4Gi"}})
    assert (await a.admit(preview("x", "4Gi"))).allowed
    b.deliver()
    assert (await b.admit(create("x", "4Gi"))).allowed
    assert [e["id"] for e in cluster.entries()] == ["uid-x"]
    a.deliver()
    assert not (await a.admit(create("y", "1Gi"))).allowed


async def test_a_replaced_preview_stops_counting_at_once_on_another_replica() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    b = Replica(cluster, "b", {POOL: {"memory": "4Gi"}})
    assert (await a.admit(preview("x", "2Gi"))).allowed
    b.deliver()
    assert (await a.admit(create("x", "2Gi"))).allowed
    b.deliver()  # b's watch of Things is silent: only the ledger tells it the preview was taken
    assert (await b.admit(create("y", "2Gi"))).allowed, "x is held once, not twice"
    assert not (await b.admit(create("z", "1Gi"))).allowed


def across_preview(name: str, *, uid: str) -> AdmissionRequest:
    spec = {"cpu": "1", "memory": "1Gi"}
    return parse_review(review("Thing", "tenant-acme-dev", name, spec, dry_run=True, uid=uid))


async def test_a_write_across_two_pools_is_not_refused_for_its_own_preview() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", TWO_POOLS)
    assert (await a.ledger.admit(across_preview("vm", uid="dry-vm"), POLICY)).allowed
    assert (await a.ledger.admit(across_preview("vm2", uid="dry-vm2"), POLICY)).allowed
    assert (await a.ledger.admit(across("vm", uid="req-1"), POLICY)).allowed, "cpu 2 of 2 held"
    # Both stay held beside each other: whichever of the two the server stores is covered.
    assert not (await a.ledger.admit(across("vm2", uid="req-2"), POLICY)).allowed


async def test_repeated_previews_across_two_pools_never_hold_past_the_budget() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", TWO_POOLS)
    answers = [await a.ledger.admit(across_preview("vm", uid=f"dry-{i}"), POLICY) for i in range(5)]
    assert [d.allowed for d in answers] == [True, True, False, False, False], "cpu: 2"
    assert len(cluster.entries("tenant-acme-dev")) == 2


async def test_an_entry_claiming_to_replace_a_real_hold_does_not_release_it() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "2Gi"}})
    b = Replica(cluster, "b", {POOL: {"memory": "2Gi"}})
    assert (await a.admit(create("x", "2Gi"))).allowed
    b.deliver()
    obj = cluster.objects[POOL]  # a ledger object rewritten by anyone but the webhook
    (real,) = obj["status"]["pending"]
    obj["status"]["pending"] = [{**real, "id": "other", "replaces": ["uid-x"]}]
    obj["status"]["released"] = {"Thing": 1}
    obj["metadata"]["resourceVersion"] = str(cluster.bump())
    b.deliver()
    assert len(b.state.pending) == 2, "x leaves as departed, counted until the state catches up"


async def test_a_preview_never_replaces_a_real_hold() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "5Gi"}})
    assert (await a.admit(create("x", "4Gi"))).allowed  # stored at 4Gi, not yet observed
    assert (await a.admit(preview("x", "1Gi"))).allowed  # a smaller preview of the same name
    assert sorted(e["id"] for e in cluster.entries()) == ["dry-x", "uid-x"]
    assert not (await a.admit(create("y", "1Gi"))).allowed, "x's 4Gi is still held"


async def test_a_refused_write_after_a_preview_leaves_the_preview_held() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    assert (await a.admit(preview("x", "2Gi"))).allowed
    assert not (await a.admit(create("x", "8Gi"))).allowed
    assert [e["id"] for e in cluster.entries()] == ["dry-x"]
    assert not (await a.admit(create("y", "3Gi"))).allowed


async def test_a_preview_of_another_name_is_never_replaced() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    assert (await a.admit(preview("x", "2Gi"))).allowed
    assert (await a.admit(create("y", "2Gi"))).allowed
    assert not (await a.admit(create("z", "1Gi"))).allowed


async def test_an_unobserved_preview_is_released_after_its_grace() -> None:
    cluster = Cluster()
    clock = Clock()
    a = Replica(cluster, "a", {POOL: {"memory": "1Gi"}}, clock=clock, catch_up_seconds=0.05)
    assert (await a.admit(preview("x", "1Gi"))).allowed  # a server that honours dry runs
    assert not (await a.admit(create("y", "1Gi"))).allowed
    clock.now += PAST_GRACE
    a.seen = 0  # silent watch: dropped from the ledger, still counted until the state catches up
    assert not (await a.admit(create("y", "1Gi", uid="uid-y2"))).allowed
    assert cluster.entries() == []
    a.seen = cluster.revision
    assert (await a.admit(create("y", "1Gi", uid="uid-y3"))).allowed
    assert [e["id"] for e in cluster.entries()] == ["uid-y3"]


async def test_a_preview_the_server_stored_settles_once_observed() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "2Gi"}})
    assert (await a.admit(preview("x", "1Gi"))).allowed
    a.observe(thing(cluster, "x", "1Gi"))  # cozystack-api stored it
    assert len(a.state.pending) == 0
    assert (await a.admit(create("y", "1Gi"))).allowed
    assert not (await a.admit(create("z", "1Gi"))).allowed


async def test_with_dry_run_holds_off_a_dry_run_never_touches_the_ledger() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}}, dry_run_holds=False)
    answers = await asyncio.gather(*(a.admit(preview(f"vm{i}", "1Gi")) for i in range(12)))
    assert all(d.allowed for d in answers)
    assert answers[0].warnings[-1] == "dry run: nothing was reserved"
    assert cluster.writes == 0
    assert cluster.entries() == []


# ---------------------------------------------------------------------------------------------
# Group commit


async def test_concurrent_admissions_are_decided_together_and_written_in_few_writes() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "17Gi"}})
    answers = await asyncio.gather(*(a.admit(create(f"vm{i}", "1Gi")) for i in range(200)))
    allowed = [i for i, d in enumerate(answers) if d.allowed]
    assert allowed == list(range(17)), "each all or nothing, in arrival order"
    assert {d.reason for d in answers if not d.allowed} == {"exceeded"}
    assert len(cluster.entries()) == 17
    assert cluster.writes <= 3


THINGS = "count/things.apps.cozystack.io"


async def test_a_burst_at_a_counts_edge_admits_exactly_the_remaining_number() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {THINGS: "20"}})
    for i in range(3):  # three things already stored: 17 left
        a.observe(thing(cluster, f"old{i}", "0"))
    answers = await asyncio.gather(*(a.admit(create(f"vm{i}", "0")) for i in range(200)))
    assert sum(d.allowed for d in answers) == 17
    refused = [d for d in answers if not d.allowed]
    assert {d.reason for d in refused} == {"exceeded"}
    assert f"requested: {THINGS}=1, used: {THINGS}=20, limited: {THINGS}=20" in refused[0].message
    assert len(cluster.entries()) == 17


async def test_two_replicas_bursting_at_a_counts_edge_admit_exactly_the_remaining_number() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {THINGS: "20"}})
    b = Replica(cluster, "b", {POOL: {THINGS: "20"}})
    for i in range(5):  # five things stored, seen by both: 15 left
        stored = thing(cluster, f"old{i}", "0")
        a.observe(stored)
        b.observe(stored)

    async def through(replica: Replica, i: int) -> Decision:
        if i % 7 == 0 and POOL in cluster.objects:  # the pool's watch delivers mid-burst
            replica.deliver()
        return await replica.admit(create(f"vm{i}", "0"))

    answers = await asyncio.gather(*(through(a if i % 2 else b, i) for i in range(200)))
    assert sum(d.allowed for d in answers) == 15
    assert {d.reason for d in answers if not d.allowed} <= {"exceeded", "conflict"}
    assert len(cluster.entries()) == 15


async def test_a_full_ledger_answers_try_again_and_never_writes_past_its_bound() -> None:
    cluster = Cluster()
    # One tenant may take the whole ledger here, so that its own bound is what is met.
    a = Replica(cluster, "a", {POOL: {"memory": "100000Gi"}}, namespace_share=1.0)
    answers = await asyncio.gather(
        *(a.admit(create(f"vm{i}", "1Gi")) for i in range(MAX_ENTRIES + 50))
    )
    assert sum(d.allowed for d in answers) == MAX_ENTRIES
    full = [d for d in answers if not d.allowed]
    assert {(d.code, d.reason) for d in full} == {(429, "ledger-full")}
    assert "try again" in full[0].message
    assert len(cluster.entries()) == MAX_ENTRIES


# ---------------------------------------------------------------------------------------------
# A burst against the emulated API server


async def test_a_burst_of_five_thousand_admissions_stays_under_the_bound_with_no_failed_write(
    tmp_path: Path,
) -> None:
    """64 clients, 5,000 CREATEs into one pool; each admitted object is stored and observed
    right after its answer, as the API server and the watch would."""
    async with cluster(tmp_path, load=False) as (server, kubeconfig):
        server.resource("apps.cozystack.io", "v1alpha1", "things", "Thing")
        client = KubeClient.from_kubeconfig(str(kubeconfig))
        try:
            replica = Replica(Cluster(), "a", {POOL: {"memory": "10000Gi"}})
            replica.ledger = Ledger(client, replica, LedgerSettings(replica="a"))
            names = iter(range(5000))
            answers: list[Decision] = []
            sizes: list[int] = []

            async def one_client() -> None:
                for i in names:
                    decision = await replica.admit(create(f"vm{i}", "1Gi"))
                    answers.append(decision)
                    if decision.allowed:
                        stored = server.create(app("Thing", POOL, f"vm{i}", {"memory": "1Gi"}))
                        version = int(stored["metadata"]["resourceVersion"])
                        replica.observe(
                            Application("Thing", POOL, f"vm{i}", {"memory": "1Gi"}, version=version)
                        )
                    tres = server.get("reservation.cozystack.io", "tenantreservations", POOL, POOL)
                    sizes.append(len(json.dumps(tres)) if tres else 0)

            await asyncio.gather(*(one_client() for _ in range(64)))
        finally:
            await client.close()
    assert len(answers) == 5000
    assert all(d.allowed for d in answers), {d.message for d in answers if not d.allowed}
    assert replica.ledger.conflicts == 0
    assert replica.ledger.failures == 0
    assert max(sizes) < MAX_ENTRIES * MAX_ENTRY_BYTES
    tres = server.get("reservation.cozystack.io", "tenantreservations", POOL, POOL)
    assert tres is not None
    assert len(tres["status"]["pending"]) <= 64
    assert replica.ledger.writes < 5000 * 0.2, "group commit: fewer writes than admissions"


# ---------------------------------------------------------------------------------------------
# The commit decides again: what changed while a request waited in its pool's queue


async def queued_while(replica: Replica, request: AdmissionRequest, meanwhile: Any) -> Decision:
    """``request`` decided on ``replica`` and queued for its pool's batch; ``meanwhile`` (a
    coroutine function) runs before the batch is decided, then the answer is awaited."""
    lock = replica.ledger._book.lock(POOL)  # the batch waits for the pool's lock
    await lock.acquire()
    try:
        answer = asyncio.create_task(replica.admit(request))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not answer.done(), "queued for the batch, not answered yet"
        await meanwhile()
    finally:
        lock.release()
    return await answer


def micro(name: str) -> AdmissionRequest:
    return parse_review(review("VMInstance", POOL, name, {"instanceType": "u1.micro"}, uid=name))


def resized_platform(memory: str) -> Platform:
    """The tests' platform after an administrator resized u1.micro (1Gi) to ``memory``."""
    builder = PlatformBuilder(default_contracts(), default_presets())
    for manifest in read_manifests([FIXTURES / "cozystack"]):
        body = copy.deepcopy(dict(manifest.body))
        name = (body.get("metadata") or {}).get("name")
        if body.get("kind") == "VirtualMachineClusterInstancetype" and name == "u1.micro":
            body["spec"]["memory"]["guest"] = memory
        builder.add(body, source=manifest.source)
    builder.add(THING_DEFINITION, source="tests/builders.py")
    return builder.build()


async def test_a_budget_lowered_while_a_request_waits_in_its_pools_queue_is_checked_against_the_new_budget() -> (  # noqa: E501
    None
):
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})

    async def lower() -> None:
        a.observe(
            Application("Tenant", "tenant-root", "acme", {"resourceQuotas": {"memory": "1Gi"}})
        )

    decision = await queued_while(a, create("x", "2Gi"), lower)
    assert not decision.allowed, "2Gi fitted the 4Gi budget it was first decided on, not 1Gi"
    assert decision.reason == "exceeded"
    assert cluster.entries() == []


@pytest.mark.parametrize("swap", [True, False], ids=["re-priced-into-a-new-state", "in-place"])
async def test_an_instance_type_resized_while_a_request_waits_in_its_pools_queue_is_priced_at_the_new_size(  # noqa: E501
    swap: bool,
) -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    resized = resized_platform("8Gi")

    async def resize() -> None:
        if swap:  # as the live state re-prices: a new state, the pending charges carried over
            fresh = ReservationState(resized, keys=a.state.keys)
            fresh.observe(
                Application("Tenant", "tenant-root", "acme", {"resourceQuotas": {"memory": "4Gi"}})
            )
            fresh.pending.carry_over(a.state.pending)
            a.state = fresh
        else:
            a.state.platform = resized

    decision = await queued_while(a, micro("vm"), resize)
    assert not decision.allowed, "u1.micro is 8Gi now, past the 4Gi budget"
    assert decision.reason == "exceeded"
    assert cluster.entries() == []


async def test_a_request_waiting_in_its_pools_queue_while_a_siblings_hold_lands_first_is_checked_against_the_siblings_hold() -> (  # noqa: E501
    None
):
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "3Gi"}})
    b = Replica(cluster, "b", {POOL: {"memory": "3Gi"}})

    async def sibling() -> None:
        assert (await b.admit(create("y", "2Gi"))).allowed  # b's hold lands first
        a.deliver()

    decision = await queued_while(a, create("x", "2Gi"), sibling)
    assert not decision.allowed, "2Gi (y, held) + 2Gi (x) > 3Gi"
    assert decision.reason == "exceeded"
    assert [e["id"] for e in cluster.entries()] == ["uid-y"]


async def test_an_admission_nothing_changed_under_is_priced_once_and_its_pool_checked_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = {"price": 0, "check": 0}

    def counting(name: str) -> None:
        real = getattr(decisions, name)

        def counted(*args: Any) -> Any:
            calls[name if name == "price" else "check"] += 1
            return real(*args)

        monkeypatch.setattr(decisions, name, counted)

    counting("price")
    counting("check_pools")
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "17Gi"}})
    answers = await asyncio.gather(*(a.admit(create(f"vm{i}", "1Gi")) for i in range(20)))
    assert sum(d.allowed for d in answers) == 17
    assert calls == {"price": 20, "check": 40}, "priced before queueing, checked at both"


def count_prices(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"price": 0}
    real = price

    def counted(*args: Any) -> Any:
        calls["price"] += 1
        return real(*args)

    monkeypatch.setattr(decisions, "price", counted)
    return calls


async def test_requests_across_two_pools_are_not_priced_again_in_each_pools_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pool's batch runs on the loop outside every tenant's fair turn: a request across two
    # pools priced again there, once per pool, cost its pools' other tenants two prices of its
    # values (the costliest values take tens of milliseconds each) charged to nobody. Priced
    # before it queued, in its own turn; each batch checks the pools only.
    calls = count_prices(monkeypatch)
    cluster = Cluster()
    a = Replica(cluster, "a", TWO_POOLS)
    answers = await asyncio.gather(
        *(a.ledger.admit(across(f"vm{i}", uid=f"x{i}"), POLICY) for i in range(3))
    )
    assert sum(d.allowed for d in answers) == 2, "cpu: 2 in tenant-acme-dev"
    assert calls["price"] == 3, "priced once each, before queueing"
    for pool in ("tenant-acme", "tenant-acme-dev"):
        assert {e["id"] for e in cluster.entries(pool)} == {
            q for q, d in zip(("x0", "x1", "x2"), answers, strict=True) if d.allowed
        }


@pytest.mark.parametrize("observed", ["x", "y"])
async def test_a_stored_object_observed_while_its_update_waits_in_the_queue_is_priced_again(
    monkeypatch: pytest.MonkeyPatch, observed: str
) -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}})
    a.observe(thing(cluster, "x", "1Gi"))
    a.observe(thing(cluster, "y", "1Gi"))
    calls = count_prices(monkeypatch)

    async def store() -> None:  # x's own record (its price reads it), or another object's
        a.observe(thing(cluster, observed, "1Gi", note="changed"))

    decision = await queued_while(a, grow("x", "1Gi", "2Gi", uid="grow"), store)
    assert decision.allowed
    assert calls["price"] == (2 if observed == "x" else 1)


async def test_a_tenant_factor_withdrawn_while_a_request_waits_in_its_pools_queue_is_priced_at_the_new_factor() -> (  # noqa: E501
    None
):
    cluster = Cluster()
    a = Replica(cluster, "a", {})
    spec = {"resourceQuotas": {"memory": "4Gi"}}
    values = a.state.values_digest("Tenant", spec)
    key = ("Tenant", "tenant-root", "acme")
    overcommitted = sign(KEYS, key, values, {}, "sha256:t", own={"memory": Decimal(2)})
    a.observe(Application(*key, spec, parse_recorded_charge(record_annotation(overcommitted))))

    async def withdraw() -> None:  # the platform sets the Tenant's factor back to 1
        a.observe(Application(*key, spec, version=cluster.bump()))

    decision = await queued_while(a, create("x", "6Gi"), withdraw)
    assert not decision.allowed, "6Gi at factor 2 reserves 3Gi; at factor 1, 6Gi > 4Gi"
    assert decision.reason == "exceeded"
    assert cluster.entries() == []

"""Escrow's metrics move when the thing they count happens: a slice granted shows its room, a
spend takes it down, a refusal near the bound returns it, and each admission the slices did not
answer is counted under why (no slice yet, no room, the lease deadline passed, an update)."""

from __future__ import annotations

import math

from tests.admission.test_ledger import POOL, Cluster, Replica, create, grow
from tests.builders import state
from tests.http.test_metrics import samples
from webhook.http.fair_metrics import MAX_TENANT_LABELS, OTHER_TENANT
from webhook.http.metrics import Metrics


def _watched(replica: Replica) -> Metrics:
    """The metrics a server wires for this replica's ledger."""
    metrics = Metrics(lambda: replica.state)
    ledger = replica.ledger
    assert ledger.escrowing
    metrics.escrow.watch(ledger.slices)
    ledger.on_fallback = metrics.escrow.fell_back
    ledger.on_escrow_write = metrics.escrow.wrote
    return metrics


def _fallbacks(metrics: Metrics) -> dict[str, float]:
    return {
        labels[0]: v for labels, v in samples(metrics, "reservation_escrow_fallbacks_total").items()
    }


def _room(metrics: Metrics) -> float:
    return samples(metrics, "reservation_escrow_slice_room").get((POOL, "memory"), 0.0)


async def test_a_granted_slice_shows_its_room_and_a_spend_takes_it_down() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    metrics = _watched(a)
    for index in range(3):
        assert (await a.admit(create(f"warm{index}", "1Gi"))).allowed
    assert _fallbacks(metrics) == {"no-slice": 3}
    assert _room(metrics) == 0
    assert await a.ledger.escrow() == 1
    assert samples(metrics, "reservation_escrow_refills_total") == {(POOL,): 1}
    held = _room(metrics)
    assert held >= 1024**3
    assert (await a.admit(create("x", "1Gi"))).allowed
    assert _room(metrics) == held - 1024**3
    assert _fallbacks(metrics) == {"no-slice": 3}, "answered from the slice: no fallback"


async def test_a_charge_the_slice_cannot_hold_is_counted_as_no_room() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    metrics = _watched(a)
    for index in range(3):
        assert (await a.admit(create(f"warm{index}", "1Gi"))).allowed
    await a.ledger.escrow()
    held = int(_room(metrics))
    assert (await a.admit(create("big", str(held + 1)))).allowed
    assert _fallbacks(metrics)["no-room"] == 1
    waited = samples(metrics, "reservation_escrow_fallback_seconds_count")
    assert waited[("no-room",)] == 1


async def test_a_slice_past_its_deadline_is_counted_as_deadline() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    metrics = _watched(a)
    for index in range(3):
        assert (await a.admit(create(f"warm{index}", "1Gi"))).allowed
    await a.ledger.escrow()
    escrowed = a.escrowed
    escrowed.monotonic = lambda: math.inf  # the lease deadline has passed
    assert (await a.admit(create("late", "1Gi"))).allowed
    assert _fallbacks(metrics)["deadline"] == 1


async def test_an_update_is_counted_as_update() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    metrics = _watched(a)
    assert (await a.admit(create("x", "1Gi"))).allowed
    await a.admit(grow("x", "1Gi", "2Gi", uid="uid-grow"))
    assert _fallbacks(metrics) == {"no-slice": 1, "update": 1}


async def test_a_refusal_near_the_bound_returns_the_slice_and_counts_the_return() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    metrics = _watched(a)
    for index in range(3):
        assert (await a.admit(create(f"warm{index}", "1Gi"))).allowed
    await a.ledger.escrow()
    held = int(_room(metrics))
    free = 64 * 1024**3 - 3 * 1024**3 - held
    # More than the free room, but within it once the slice's room is back: allowed.
    assert (await a.admit(create("last", str(free + 1)))).allowed
    assert samples(metrics, "reservation_escrow_returns_total") == {(POOL,): 1}
    assert _room(metrics) == 0


def test_pool_labels_are_bounded_like_tenant_labels() -> None:
    # A platform with more pools than the bound: the pools past it share one label.
    count = MAX_TENANT_LABELS + 44
    current = state({f"tenant-t{i:04d}": {"memory": "1Gi"} for i in range(count)})
    metrics = Metrics(lambda: current)
    for i in range(count):
        metrics.escrow.wrote(f"tenant-t{i:04d}", True, False)
    metrics.escrow.wrote("tenant-nobody", True, False)  # a pool no Tenant declares
    refills = samples(metrics, "reservation_escrow_refills_total")
    assert len(refills) == MAX_TENANT_LABELS + 1
    assert refills[(OTHER_TENANT,)] == 44 + 1

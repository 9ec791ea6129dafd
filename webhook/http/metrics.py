"""Prometheus metrics, in a registry of the application's own (no process-wide globals).

Request latency by endpoint and decision; decisions by kind, reason and mode; pool budget and
reserved figures (at most ``MAX_BUDGET_KEYS`` keys a pool), read from the state at scrape time;
state readiness; certificate expiry; and the pod-level guard per namespace with a ResourceQuota
(need, room, unknown applications).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from webhook.core.counts import MAX_BUDGET_KEYS
from webhook.core.guard import QuotaBook, guard_room, namespace_need
from webhook.core.state import ReservationState

__all__ = ["Metrics"]

_ZERO = Decimal(0)

# Admission is on every tenant write: most answers take well under 10 ms; the tail buckets show
# time spent waiting (locks, ledger writes) up to the API server's 30 s ceiling.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# A pool's queue while one write is in flight: 1 when idle; the tail shows bursts.
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class _PoolCollector(Collector):
    def __init__(self, state: Callable[[], ReservationState]) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        budget = GaugeMetricFamily(
            "reservation_pool_budget", "A pool's declared quota.", labels=["pool", "resource"]
        )
        reserved = GaugeMetricFamily(
            "reservation_pool_reserved",
            "What a pool's applications and carve-outs reserve.",
            labels=["pool", "resource"],
        )
        committed = GaugeMetricFamily(
            "reservation_pool_committed",
            "What a pool's applications declare before overcommit factors (reserved + discount).",
            labels=["pool", "resource"],
        )
        discount = GaugeMetricFamily(
            "reservation_pool_discount",
            "What overcommit factors take off a pool's reserved figure (committed - reserved).",
            labels=["pool", "resource"],
        )
        beyond = GaugeMetricFamily(
            "reservation_pool_sold_beyond_budget_ratio",
            "Share of a pool's budget committed beyond it: max(committed - budget, 0) / budget.",
            labels=["pool", "resource"],
        )
        state = self._state()
        discounts = state.pool_discounts()
        for pool in state.tree.pools():
            off = discounts.get(pool.namespace, {})
            for key, value in _shown_keys(pool.budget, pool.reserved):
                labels = [pool.namespace, key]
                used = pool.reserved.get(key, _ZERO)
                total = used + off.get(key, _ZERO)
                budget.add_metric(labels, float(value))
                reserved.add_metric(labels, float(used))
                committed.add_metric(labels, float(total))
                discount.add_metric(labels, float(off.get(key, _ZERO)))
                share = max(total - value, _ZERO) / value if value else _ZERO
                beyond.add_metric(labels, float(share))
        yield budget
        yield reserved
        yield committed
        yield discount
        yield beyond


def _shown_keys(
    budget: Mapping[str, Decimal], reserved: Mapping[str, Decimal]
) -> list[tuple[str, Decimal]]:
    """The budget keys a pool's series carry: at most :data:`MAX_BUDGET_KEYS`, over-budget ones
    first. Admission refuses more, but a Tenant stored before keeps its keys, and one pool's
    thousands of series would push a scrape past a scraper's sample limit for every tenant."""
    items = list(budget.items())
    if len(items) <= MAX_BUDGET_KEYS:
        return items
    items.sort(key=lambda item: (reserved.get(item[0], _ZERO) <= item[1], item[0]))
    return items[:MAX_BUDGET_KEYS]


class _HealthCollector(Collector):
    def __init__(
        self,
        unavailable: Callable[[], Mapping[str, str]],
        problems: Callable[[], Mapping[str, int]],
    ) -> None:
        self._unavailable = unavailable
        self._problems = problems

    def collect(self) -> Iterator[GaugeMetricFamily]:
        kinds = GaugeMetricFamily(
            "reservation_kind_unavailable",
            "1 for a kind whose applications cannot be listed: its writes are denied.",
            labels=["kind"],
        )
        for kind in sorted(self._unavailable()):
            kinds.add_metric([kind], 1.0)
        problems = GaugeMetricFamily(
            "reservation_platform_problems",
            "Platform objects left out or replaced by their last good version, by store "
            "(definitions, cluster-types, namespaced-types, presets).",
            labels=["store"],
        )
        for store, count in sorted(self._problems().items()):
            problems.add_metric([store], float(count))
        yield kinds
        yield problems


class _GuardCollector(Collector):
    """The pod-level guard per namespace with a ResourceQuota, computed at scrape time."""

    def __init__(self, state: Callable[[], ReservationState], quotas: QuotaBook) -> None:
        self._state = state
        self._quotas = quotas

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["namespace", "resource"]
        need_family = GaugeMetricFamily(
            "reservation_guard_need",
            "What admitted applications' pods will request (ResourceQuota keys).",
            labels=labels,
        )
        room_family = GaugeMetricFamily(
            "reservation_guard_room",
            "What the tightest ResourceQuota leaves: hard - max(used, need); negative: short.",
            labels=labels,
        )
        unknown_family = GaugeMetricFamily(
            "reservation_guard_unknown_applications",
            "Applications whose pod-level need the webhook cannot tell.",
            labels=["namespace"],
        )
        state = self._state()
        for namespace in self._quotas.namespaces():
            need, unknown = namespace_need(
                (key, record.resources if record else None)
                for key, record in state.records_in(namespace)
            )
            for key, value in need.items():
                need_family.add_metric([namespace, key], float(value))
            room = guard_room(self._quotas.quotas(namespace), need)
            for key, value in room.items():
                room_family.add_metric([namespace, key], float(value))
            unknown_family.add_metric([namespace], len(unknown))
        yield need_family
        yield room_family
        yield unknown_family


class Metrics:
    def __init__(self, state: Callable[[], ReservationState]) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "reservation_admission_duration_seconds",
            "Time to answer an AdmissionReview.",
            ["endpoint", "decision"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "reservation_decisions",
            "Admission decisions.",
            ["kind", "decision", "reason", "mode"],
            registry=self.registry,
        )
        self.state_ready = Gauge(
            "reservation_state_ready", "1 when the state is synced.", registry=self.registry
        )
        self.state_ready.set_function(lambda: 1.0 if state().synced else 0.0)
        self.certificate_expiry = Gauge(
            "reservation_certificate_expiry_timestamp_seconds",
            "When the serving certificate expires (Unix time).",
            registry=self.registry,
        )
        self.background_failures = Counter(
            "reservation_background_failures",
            "Periodic duties (certificates, expiry, recount, pool statuses) that raised; each "
            "is logged and retried on its next round.",
            ["duty"],
            registry=self.registry,
        )
        self.registry.register(_PoolCollector(state))

    def watch_live(
        self,
        *,
        first_sync: Callable[[], float],
        drift: Callable[[], float],
        conflicts: Callable[[], float],
        leader: Callable[[], bool],
    ) -> None:
        """Expose the live side: time to first sync, drift, ledger conflicts, leadership."""
        gauges = [
            (
                "reservation_state_first_sync_seconds",
                "Seconds from start to the first complete sync of the cluster state.",
                first_sync,
            ),
            (
                "reservation_pool_drift",
                "Pool figures whose incremental value differs from a full recount (should be 0).",
                drift,
            ),
            (
                "reservation_ledger_conflicts",
                "Ledger writes that lost a race and were retried, since start.",
                conflicts,
            ),
            (
                "reservation_leader",
                "1 while this replica holds the Lease.",
                lambda: 1.0 if leader() else 0.0,
            ),
        ]
        for name, description, read in gauges:
            Gauge(name, description, registry=self.registry).set_function(read)

    def watch_health(
        self,
        *,
        unavailable: Callable[[], Mapping[str, str]],
        problems: Callable[[], Mapping[str, int]],
    ) -> None:
        """Expose kinds whose writes are denied because they cannot be listed, and platform
        objects left out or replaced by their last good version (by store)."""
        self.registry.register(_HealthCollector(unavailable, problems))

    def watch_guard(self, state: Callable[[], ReservationState], quotas: QuotaBook) -> None:
        """Expose the pod-level guard: need, room and unknown applications per namespace."""
        self.registry.register(_GuardCollector(state, quotas))

    def watch_operations(
        self,
        *,
        holds: Callable[[], float],
        record_keys_read: Callable[[], float],
        previous_keys: Callable[[], float],
    ) -> Callable[[int], None]:
        """Expose what the alerts and the dashboard need beyond the rest: pending holds in the
        ledger, when the record keys were last read and how many previous keys are still
        accepted. Returns the function that observes one ledger batch's size."""
        batches = Histogram(
            "reservation_ledger_batch_size",
            "Admissions decided together in one ledger write (group commit).",
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        gauges = [
            (
                "reservation_ledger_holds",
                "Admitted charges held as pending in the ledger, not yet observed as objects.",
                holds,
            ),
            (
                "reservation_record_keys_read_timestamp_seconds",
                "When this replica last read the record-key Secret (Unix time; 0: never).",
                record_keys_read,
            ),
            (
                "reservation_record_keys_previous",
                "Previous record keys still accepted (a rotation not yet finished).",
                previous_keys,
            ),
        ]
        for name, description, read in gauges:
            Gauge(name, description, registry=self.registry).set_function(read)
        return batches.observe

    def expose(self) -> bytes:
        return generate_latest(self.registry)

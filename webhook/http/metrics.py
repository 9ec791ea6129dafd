"""Prometheus metrics, in a registry of the application's own (no process-wide globals).

Request latency by endpoint and decision; decisions by kind, reason and mode; pool budget and
reserved figures, read from the state at scrape time; state readiness; certificate expiry; and
the pod-level guard per namespace with a ResourceQuota (need, room, unknown applications).
Resource labels carry only keys the platform knows (:mod:`webhook.core.pricing.metric_keys`);
whatever else tenants write into budgets or ResourceQuotas is summed under ``other``, so no write
grows the number of series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from webhook.core.admission.state import ReservationState
from webhook.core.capacity.guard import QuotaBook, guard_room, namespace_need
from webhook.core.pricing.metric_keys import fold, known_keys, label, quota_keys
from webhook.core.pricing.platform import Platform
from webhook.http.escrow_metrics import EscrowMetrics
from webhook.http.fair_metrics import FairMetrics

__all__ = ["Metrics"]

_ZERO = Decimal(0)

# Admission is on every tenant write: most answers take well under 10 ms; the tail buckets show
# time spent waiting (locks, ledger writes) up to the API server's 30 s ceiling.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# A pool's queue while one write is in flight: 1 when idle; the tail shows bursts.
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class _KnownKeys:
    """The platform's keys, worked out once per platform (a new state brings a new one)."""

    def __init__(self) -> None:
        self._platform: Platform | None = None
        self._keys: frozenset[str] = frozenset()
        self._quota: frozenset[str] = frozenset()

    def of(self, platform: Platform) -> tuple[frozenset[str], frozenset[str]]:
        """(budget and charge keys, ResourceQuota keys)."""
        if platform is not self._platform:
            self._keys = known_keys(platform)
            self._quota = quota_keys(self._keys)
            self._platform = platform
        return self._keys, self._quota


class _PoolCollector(Collector):
    def __init__(self, state: Callable[[], ReservationState]) -> None:
        self._state = state
        self._known = _KnownKeys()

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
        known, _ = self._known.of(state.platform)
        discounts = state.pool_discounts()
        for pool in state.tree.pools():
            off = discounts.get(pool.namespace, {})
            rows: dict[str, tuple[Decimal, Decimal, Decimal]] = {}
            for key, value in pool.budget.items():
                shown = label(key, known)
                b, u, o = rows.get(shown, (_ZERO, _ZERO, _ZERO))
                used, less = pool.reserved.get(key, _ZERO), off.get(key, _ZERO)
                rows[shown] = (b + value, u + used, o + less)
            for shown, (value, used, less) in rows.items():
                labels = [pool.namespace, shown]
                total = used + less
                budget.add_metric(labels, float(value))
                reserved.add_metric(labels, float(used))
                committed.add_metric(labels, float(total))
                discount.add_metric(labels, float(less))
                share = max(total - value, _ZERO) / value if value else _ZERO
                beyond.add_metric(labels, float(share))
        yield budget
        yield reserved
        yield committed
        yield discount
        yield beyond


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
        self._known = _KnownKeys()

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
        _, known = self._known.of(state.platform)
        for namespace in self._quotas.namespaces():
            need, unknown = namespace_need(
                (key, record.resources if record else None)
                for key, record in state.records_in(namespace)
            )
            for key, value in fold(need, known).items():
                need_family.add_metric([namespace, key], float(value))
            room = guard_room(self._quotas.quotas(namespace), need)
            for key, value in fold(room, known).items():
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
        # Each request's two children, looked up once per label set (``labels()`` checks and
        # joins its arguments under a lock every time). Every label value is one of a known
        # few (an endpoint, an outcome, a reason, a mode, a declared kind or ``other``), so
        # these hold no more entries than the metrics hold series.
        self._latency: dict[tuple[str, str], Histogram] = {}
        self._decisions: dict[tuple[str, str, str, str], Counter] = {}
        self.fair = FairMetrics(self.registry)
        self.escrow = EscrowMetrics(self.registry, state)

    def observe_latency(self, endpoint: str, decision: str, seconds: float) -> None:
        """``latency.labels(endpoint, decision).observe(seconds)``, the child looked up once."""
        key = (endpoint, decision)
        child = self._latency.get(key)
        if child is None:
            child = self._latency[key] = self.latency.labels(endpoint, decision)
        child.observe(seconds)

    def count_decision(self, kind: str, decision: str, reason: str, mode: str) -> None:
        """``decisions.labels(kind, decision, reason, mode).inc()``, the child looked up once."""
        key = (kind, decision, reason, mode)
        child = self._decisions.get(key)
        if child is None:
            child = self._decisions[key] = self.decisions.labels(kind, decision, reason, mode)
        child.inc()

    def watch_live(
        self,
        *,
        first_sync: Callable[[], float],
        drift: Callable[[], float],
        conflicts: Callable[[], float],
        leader: Callable[[], bool],
        unreadable: Callable[[], float],
    ) -> None:
        """Expose the live side: time to first sync, drift, ledger conflicts, leadership, and
        the watch events that could not be read (each made its watch list again)."""
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
            (
                "reservation_watch_events_unreadable",
                "Watch events longer than the event bound or not JSON, since start; each made "
                "its watch list again rather than meet the event again (should be 0).",
                unreadable,
            ),
        ]
        for name, description, read in gauges:
            Gauge(name, description, registry=self.registry).set_function(read)

    def watch_ledger(
        self,
        *,
        limits: Mapping[str, int],
        share: float,
        largest: Callable[[], float],
        capped: Callable[[], float],
        reads: Callable[[], float],
        repairs: Callable[[], float],
    ) -> None:
        """Expose the ledger's bounds (entries per pool, per tenant in a pool, the share) and
        the largest share one tenant's unsettled admissions take in any pool now. No label
        names a pool or a tenant, so no request adds a series."""
        bounds = Gauge(
            "reservation_ledger_entries_limit",
            "Entries a pool's ledger lists at most (scope=pool), and one tenant's unsettled "
            "admissions in one pool (scope=tenant).",
            ["scope"],
            registry=self.registry,
        )
        for scope, value in sorted(limits.items()):
            bounds.labels(scope).set(value)
        Gauge(
            "reservation_ledger_tenant_share",
            "The share of a pool's ledger one tenant's unsettled admissions may take.",
            registry=self.registry,
        ).set(share)
        Gauge(
            "reservation_ledger_largest_tenant_share",
            "The largest share of a pool's ledger one tenant's unsettled admissions take now.",
            registry=self.registry,
        ).set_function(largest)
        Gauge(
            "reservation_capped_carve_outs",
            "Sub-tenants admitted in warn mode beyond what fits: counted below their quota.",
            registry=self.registry,
        ).set_function(capped)
        Gauge(
            "reservation_consistent_reads",
            "Consistent reads made to confirm a kind whose watch had not reached a revision "
            "the ledger waits for, since start.",
            registry=self.registry,
        ).set_function(reads)
        Gauge(
            "reservation_watch_repairs",
            "Applications whose change a watch lost, put right from a consistent read, since "
            "start (cozystack-api's watches can lose events).",
            registry=self.registry,
        ).set_function(repairs)

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

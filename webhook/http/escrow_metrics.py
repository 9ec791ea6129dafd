"""What escrow reports per replica (``docs/escrow.md``): the room its slices hold, the writes
that refill and return it, and the admissions that took the exact path, why and for how long.

Series naming a pool are labelled like the fair queue's tenants (:func:`.fair_metrics.tenant_label`,
at most :data:`.fair_metrics.MAX_TENANT_LABELS` pools, the rest summed under ``other``), and
resource labels carry only the platform's keys, so no request or budget adds a series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from webhook.core.admission.state import ReservationState
from webhook.core.pricing.metric_keys import known_keys, label
from webhook.http.fair_metrics import BoundedLabels, tenant_label

__all__ = ["EscrowMetrics"]

# The exact path's answer: a few milliseconds for one batched write, more behind a busy pool.
_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Slices = Callable[[], Mapping[str, Mapping[str, Decimal]]]


class _SliceCollector(Collector):
    """The room this replica's slices hold unspent, read at scrape time."""

    def __init__(
        self, state: Callable[[], ReservationState], slices: Slices, pool: Callable[[str], str]
    ) -> None:
        self._state, self._slices, self._pool = state, slices, pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "reservation_escrow_slice_room",
            "Room this replica's slice of a pool holds unspent now (what it may admit with no "
            "API call).",
            labels=["pool", "resource"],
        )
        known = known_keys(self._state().platform)
        rows: dict[tuple[str, str], Decimal] = {}
        for pool, room in self._slices().items():
            shown = self._pool(pool)
            for key, value in room.items():
                at = (shown, label(key, known))
                rows[at] = rows.get(at, Decimal(0)) + value
        for (pool, key), value in sorted(rows.items()):
            family.add_metric([pool, key], float(value))
        yield family


class EscrowMetrics:
    """Escrow's series, in the application's registry; exposed once :meth:`watch` is called."""

    def __init__(self, registry: CollectorRegistry, state: Callable[[], ReservationState]) -> None:
        self.registry = registry
        self._state = state
        self._bound = BoundedLabels()
        self.refills = Counter(
            "reservation_escrow_refills",
            "Stored writes that granted this replica's slice of a pool more room.",
            ["pool"],
            registry=registry,
        )
        self.returns = Counter(
            "reservation_escrow_returns",
            "Stored writes that gave unspent room of this replica's slice back to the pool "
            "(idle, over budget, or a refusal near the bound).",
            ["pool"],
            registry=registry,
        )
        self.fallbacks = Counter(
            "reservation_escrow_fallbacks",
            "Admissions the slices did not answer, decided by the exact path, by reason "
            "(update, dry-run, denied, warn, uncharged, fenced, no-slice, slices-full, "
            "deadline, kind, no-room, other).",
            ["reason"],
            registry=registry,
        )
        self.waited = Histogram(
            "reservation_escrow_fallback_seconds",
            "Time the exact path took to answer an admission the slices did not answer.",
            ["reason"],
            buckets=_BUCKETS,
            registry=registry,
        )

    def pool_label(self, pool: str) -> str:
        return self._bound(tenant_label(self._state(), pool))

    def fell_back(self, reason: str, seconds: float) -> None:
        self.fallbacks.labels(reason).inc()
        self.waited.labels(reason).observe(seconds)

    def wrote(self, pool: str, refilled: bool, returned: bool) -> None:
        if refilled:
            self.refills.labels(self.pool_label(pool)).inc()
        if returned:
            self.returns.labels(self.pool_label(pool)).inc()

    def watch(self, slices: Slices) -> None:
        """Expose the room each pool's slice holds now."""
        self.registry.register(_SliceCollector(self._state, slices, self.pool_label))

"""What the fair queue reports: who is queued, what each tenant's decisions cost, who is refused.

Series are labelled by tenant, the top-level tenant a flow is: a label is a tenant the state holds
a Tenant for (tenants, like pools, are what the platform declares, so no request adds one), at
most :data:`MAX_TENANT_LABELS` of them; anything else (a namespace no Tenant owns, an unread one,
the tenants past the bound) is summed under ``other``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from webhook.core.admission.state import ReservationState

__all__ = ["MAX_TENANT_LABELS", "OTHER_TENANT", "BoundedLabels", "FairMetrics", "tenant_label"]

OTHER_TENANT: Final = "other"
MAX_TENANT_LABELS: Final = 256

# A turn's wait: well under a millisecond when nothing is queued; up to the wait limit (a
# quarter of the deadline, at most 7.25 s) when a tenant is past its share.
_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def tenant_label(state: ReservationState, flow: str) -> str:
    """The label of a flow's series: the flow when a Tenant the state holds owns it, else
    ``other``."""
    node = state.tree.get(flow)
    return flow if node is not None and node.declared else OTHER_TENANT


class BoundedLabels:
    """The label values a family of series may use: the first :data:`MAX_TENANT_LABELS` seen,
    then ``other`` for the rest (a label, once given, stays given)."""

    def __init__(self, limit: int = MAX_TENANT_LABELS) -> None:
        self.limit = limit
        self._given: set[str] = set()

    def __call__(self, label: str) -> str:
        if label in self._given or label == OTHER_TENANT:
            return label
        if len(self._given) >= self.limit:
            return OTHER_TENANT
        self._given.add(label)
        return label


class FairMetrics:
    """The fair queue's series, in the application's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.turn_wait = Histogram(
            "reservation_fair_queue_wait_seconds",
            "Time a review that waited for its tenant's turn (past a millisecond) waited.",
            buckets=_BUCKETS,
            registry=registry,
        )
        self.tenant_queued = Counter(
            "reservation_fair_queued",
            "Reviews that waited for their turn behind another review, by tenant (a top-level "
            "tenant's subtree; other: the rest).",
            ["tenant"],
            registry=registry,
        )
        self.tenant_cpu = Counter(
            "reservation_fair_cpu_seconds",
            "CPU the event loop spent deciding each tenant's reviews (what the queue charges).",
            ["tenant"],
            registry=registry,
        )
        self.tenant_throttled = Counter(
            "reservation_fair_throttled",
            "Reviews denied with 429 before being decided: their tenant's queue was full "
            "(queue-full) or they waited past the limit (wait).",
            ["tenant", "reason"],
            registry=registry,
        )
        self._tenants: dict[str, tuple[Counter, Counter]] = {}  # label -> (queued, cpu)
        self._bound = BoundedLabels()

    def _tenant(self, label: str) -> tuple[str, tuple[Counter, Counter]]:
        """The label a tenant's series use (at most :data:`MAX_TENANT_LABELS`, then ``other``)
        and its two children, looked up once."""
        label = self._bound(label)
        children = self._tenants.get(label)
        if children is None:
            children = (self.tenant_queued.labels(label), self.tenant_cpu.labels(label))
            self._tenants[label] = children
        return label, children

    def observe_turn(self, tenant: str, waited: float, cpu: float) -> None:
        """One review's turn: how long it waited (counted as queued past a millisecond) and
        the CPU its decision took, under ``tenant`` (from :func:`tenant_label`)."""
        _, (queued, spent) = self._tenant(tenant)
        if waited > 0.001:  # most reviews wait for nothing: their answer's latency says it all
            self.turn_wait.observe(waited)
            queued.inc()
        spent.inc(cpu)

    def count_throttled(self, tenant: str, reason: str) -> None:
        label, _ = self._tenant(tenant)
        self.tenant_throttled.labels(label, reason).inc()

    def watch_queue(self, waiting: Callable[[], float]) -> None:
        """Expose how many reviews wait for their turn now."""
        Gauge(
            "reservation_fair_queue_waiting",
            "Reviews waiting for their tenant's turn now.",
            registry=self.registry,
        ).set_function(waiting)

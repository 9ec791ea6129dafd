"""The reservation state: what every application reserves, and the tenant tree it adds up in.

A small, incremental, in-memory model fed by observed applications (from a manifest directory,
a cache of the cluster, or the ``review`` command applying what it admitted). It keeps charges,
not objects: per application its charge, the digest that produced it, and whether the current
contract would price it differently (drift). Observing or forgetting an application costs time
proportional to the tenant depth.

Applications that cannot be evaluated keep their last recorded charge; one with no recorded
charge is *unknown*, and a pool holding an unknown application cannot grant more for the kinds
it could hold. Observing never raises: whatever an object holds (a value no evaluation can read,
a nesting too deep to walk), the object is recorded as unknown with the reason and reported, so
one poisoned object never stops the source that feeds the state.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal

from webhook.core import resources as rl
from webhook.core.applications import AppKey, Application
from webhook.core.errors import UNEVALUABLE, EvaluationError
from webhook.core.pending import Hold, PendingCharges
from webhook.core.platform import Platform
from webhook.core.pools import TenantTree
from webhook.core.tenants import TENANT_KIND, owned_namespace, parse_budget

__all__ = ["AppRecord", "ReservationState", "recount"]


@dataclass(slots=True)
class AppRecord:
    """What one application reserves."""

    namespace: str
    resources: dict[str, Decimal]
    digest: str
    current_digest: str = ""  # set only when today's evaluation differs from the record
    problem: str = ""  # why today's evaluation failed, if it did
    version: int = 0  # the stored object's resourceVersion, when the source has one

    @property
    def drifted(self) -> bool:
        return bool(self.current_digest)


class ReservationState:
    """Applications' charges and the tenant tree, for one platform."""

    def __init__(
        self,
        platform: Platform,
        *,
        synced: bool = True,
        readiness: Callable[[], bool] | None = None,
    ) -> None:
        self.platform = platform
        self.tree = TenantTree()
        self.pending = PendingCharges(self.tree, shows=self._shows)
        self._synced = synced
        self._readiness = readiness  # a live source's own check, asked on every read
        self._apps: dict[AppKey, AppRecord] = {}
        self._unknown: dict[AppKey, str] = {}  # key -> why it has no charge
        self._owned: dict[AppKey, str] = {}  # Tenant application -> namespace it owns
        self._tenant_versions: dict[AppKey, int] = {}  # Tenant application -> resourceVersion
        self._by_namespace: dict[str, set[AppKey]] = {}  # for the pod-level guard

    def __len__(self) -> int:
        return len(self._apps) + len(self._unknown)

    @property
    def synced(self) -> bool:
        """Whether decisions may trust this state: set, and (live) the source says so now."""
        return self._synced and (self._readiness is None or self._readiness())

    @synced.setter
    def synced(self, value: bool) -> None:
        self._synced = value

    # -- observing ---------------------------------------------------------------------------

    def observe(self, app: Application) -> None:
        """Apply an application as stored: created or updated."""
        key = _interned(app.key)
        namespace = key[1]
        budget = self._observe_tenant(key, app) if app.kind == TENANT_KIND else None
        record, problem = self._price(app, namespace)
        if record is not None:
            record.version = app.version
        previous = self._apps.pop(key, None)
        self._unknown.pop(key, None)
        if record is None:
            self._unknown[key] = problem
        else:
            self._apps[key] = record
        self._by_namespace.setdefault(namespace, set()).add(key)
        before = previous.resources if previous else {}
        after = record.resources if record else {}
        self.tree.add_usage(namespace, rl.subtract(after, before))
        if self.pending and (record is not None or budget is not None):
            observed = budget if budget is not None else record.resources if record else {}
            self.pending.settle(key, observed, app.version)

    def forget(self, key: AppKey, *, version: int = 0) -> None:
        """Apply the deletion of an application (seen at resourceVersion ``version``)."""
        previous = self._apps.pop(key, None)
        self._unknown.pop(key, None)
        members = self._by_namespace.get(key[1])
        if members is not None:
            members.discard(key)
            if not members:
                del self._by_namespace[key[1]]
        if previous is not None:
            self.tree.add_usage(key[1], rl.scale(previous.resources, Decimal(-1)))
        if self.pending:
            self.pending.settle(key, None, version)
        self._tenant_versions.pop(key, None)
        owned = self._owned.pop(key, None)
        if owned is not None:
            self.tree.set_budget(owned, {})
            self.tree.declare(owned, declared=False)

    def replace_kind(self, kind: str, apps: list[Application], *, version: int = 0) -> None:
        """Make ``kind``'s applications exactly ``apps`` (after a full list at ``version``)."""
        present = {app.key for app in apps}
        stale = [k for k in [*self._apps, *self._unknown] if k[0] == kind and k not in present]
        for key in stale:
            self.forget(key, version=version)
        for app in apps:
            self.observe(app)

    def _observe_tenant(self, key: AppKey, app: Application) -> dict[str, Decimal]:
        owned = owned_namespace(key[1], key[2])
        self._owned[key] = owned
        self._tenant_versions[key] = app.version
        kind = self.platform.kind(TENANT_KIND)
        try:
            values = kind.defaulted(app.spec) if kind else app.spec
            budget = parse_budget(values)
        except UNEVALUABLE:
            # A budget Cozystack would not render cannot be trusted either way: keep the last
            # one; a new tenant stays unbounded and is reported through its problem.
            node = self.tree.get(owned)
            budget = node.budget if node is not None else {}
        self.tree.declare(owned, declared=True)
        self.tree.set_budget(owned, budget)
        return dict(budget)

    def _price(self, app: Application, namespace: str) -> tuple[AppRecord | None, str]:
        """The record to keep (``None``: unknown), and why today's evaluation failed."""
        try:
            charge = self.platform.charge(app.kind, app.spec, namespace=namespace)
        except UNEVALUABLE as exc:
            if app.recorded is None:
                return None, _reason(exc)
            record = AppRecord(
                namespace,
                dict(app.recorded.resources),
                sys.intern(app.recorded.digest),
                problem=_reason(exc),
            )
            return record, _reason(exc)
        if app.recorded is None:
            return AppRecord(namespace, dict(charge.resources), sys.intern(charge.digest)), ""
        drift = "" if app.recorded.digest == charge.digest else sys.intern(charge.digest)
        record = AppRecord(
            namespace, dict(app.recorded.resources), sys.intern(app.recorded.digest), drift
        )
        return record, ""

    def _shows(self, hold: Hold) -> bool:
        """Whether the state shows ``hold``'s application as admitted, newer than the admission
        (a copy that only matches the figures may predate it, and settles nothing)."""
        if hold.key[0] == TENANT_KIND:
            node = self.tree.get(owned_namespace(hold.key[1], hold.key[2]))
            return (
                self._tenant_versions.get(hold.key, 0) > hold.after
                and node is not None
                and node.declared
                and node.budget == dict(hold.charge)
            )
        record = self._apps.get(hold.key)
        return (
            record is not None
            and record.version > hold.after
            and dict(record.resources) == dict(hold.charge)
        )

    # -- questions ---------------------------------------------------------------------------

    def record(self, key: AppKey) -> AppRecord | None:
        return self._apps.get(key)

    def owned_namespace(self, key: AppKey) -> str | None:
        return self._owned.get(key)

    def records(self) -> Iterator[tuple[AppKey, AppRecord]]:
        return iter(self._apps.items())

    def records_in(self, namespace: str) -> Iterator[tuple[AppKey, AppRecord | None]]:
        """The applications stored in one namespace; ``None`` for those with no charge."""
        for key in self._by_namespace.get(namespace, ()):
            yield key, self._apps.get(key)

    def unknown(self) -> Mapping[AppKey, str]:
        return self._unknown

    def unknown_in_pool(self, pool_namespace: str, key: str) -> list[AppKey]:
        """Unknown applications whose usage of ``key`` would land in that pool."""
        found = []
        for app_key in self._unknown:
            bounder = self.tree.bounder(app_key[1], key)
            if bounder is not None and bounder.namespace == pool_namespace:
                found.append(app_key)
        return sorted(found)


def recount(state: ReservationState) -> dict[tuple[str, str], tuple[Decimal, Decimal]]:
    """Pool usage recomputed from scratch, compared with the incremental figures.

    Returns every (namespace, key) whose two figures differ: empty when the incremental
    bookkeeping is right. Costs a walk over every application: for a periodic check only.
    """
    # Sum per namespace first (plain additions), then walk the tree once per namespace.
    own: dict[str, dict[str, Decimal]] = {}
    for app_key, record in state.records():
        totals = own.setdefault(app_key[1], {})
        for key, value in record.resources.items():
            totals[key] = totals.get(key, Decimal(0)) + value
    for node in state.tree.nodes():
        remote = state.pending.remote(node.namespace)
        if remote:
            own[node.namespace] = rl.add(own.get(node.namespace, {}), remote)
    fresh = TenantTree()
    for node in state.tree.nodes():
        if node.budget:
            fresh.set_budget(node.namespace, node.budget)
    for namespace, totals in own.items():
        fresh.add_usage(namespace, totals)
    differences: dict[tuple[str, str], tuple[Decimal, Decimal]] = {}
    for node in state.tree.nodes():
        other = fresh.get(node.namespace)
        recounted = other.usage if other is not None else {}
        for resource in set(node.usage) | set(recounted):
            kept = node.usage.get(resource, Decimal(0))
            counted = recounted.get(resource, Decimal(0))
            if kept != counted:
                differences[(node.namespace, resource)] = (kept, counted)
    return differences


def _reason(exc: Exception) -> str:
    if isinstance(exc, EvaluationError):
        return str(exc)
    if isinstance(exc, RecursionError):
        return "values nested too deeply to evaluate"
    return f"values cannot be evaluated ({type(exc).__name__})"


def _interned(key: AppKey) -> AppKey:
    return (sys.intern(key[0]), sys.intern(key[1]), key[2])

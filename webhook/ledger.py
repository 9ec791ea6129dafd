"""The reservation ledger: pending charges shared by every replica, so no pool overshoots.

Kubernetes' ResourceQuota admission is the model. Each tenant pool has a ``TenantReservation``
object (in the pool's namespace, named after it) whose status lists the *pending* entries:
admitted increases not yet observed as objects, each with an expiry. To admit an increase, a
replica, holding its in-process lock on the pools involved (taken in sorted order):

1. counts every other replica's live entries into the pool's usage;
2. decides;
3. appends its entry with an update conditional on the object's resourceVersion. A conflict
   means another replica wrote first: re-read, go back to 1; after a few conflicts, deny with
   "try again" rather than guess. Two requests that each fit alone but not together can never
   both pass.

The replica that writes keeps the written object as the newest copy (a look-aside cache), so its
next write does not conflict with its own stale informer copy. A dry run never touches the
ledger. Entries settle when the state observes the object with the expected charge and expire
after the grace period otherwise. The replica holding the Lease keeps every pool's status true:
reserved and budget figures, expired and settled entries removed, the ``Overcommitted`` condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from webhook.core import resources as rl
from webhook.core.applications import AppKey
from webhook.core.decisions import Decision, Policy, decide, errored
from webhook.core.pending import Hold
from webhook.core.quantities import parse_quantity
from webhook.core.reviews import AdmissionRequest
from webhook.core.state import ReservationState
from webhook.core.tenants import TENANT_KIND, owned_namespace
from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.kube.reflector import Reflector
from webhook.state.live import LiveState

__all__ = ["TENANT_RESERVATIONS", "Ledger", "LedgerSettings"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]

TENANT_RESERVATIONS: Final = ResourceRef(
    "reservation.cozystack.io", "v1alpha1", "tenantreservations"
)
_TIME = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class LedgerSettings:
    replica: str
    grace_seconds: float = 25.0  # twice the default webhook timeout, plus a margin
    attempts: int = 3  # conflicting writes retried, as Kubernetes' quota admission does
    reconcile_seconds: float = 2.0
    read_timeout: float = 90.0
    watch_timeout: int = 300


class _Conflict(Exception):
    pass


class Ledger:
    """Admits increases through the cluster-wide ledger; one per replica."""

    def __init__(
        self,
        client: KubeClient,
        live: LiveState,
        settings: LedgerSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.live = live
        self.settings = settings
        self.clock = clock
        self._objects: dict[str, Obj] = {}  # pool -> newest TenantReservation seen or written
        self._locks: dict[str, asyncio.Lock] = {}
        self.conflicts = 0
        self.reflector = Reflector(
            client,
            TENANT_RESERVATIONS,
            on_replace=self._replace,
            on_event=self._event,
            read_timeout=settings.read_timeout,
            watch_timeout=settings.watch_timeout,
        )

    @property
    def synced(self) -> bool:
        return self.reflector.synced

    # -- admission ---------------------------------------------------------------------------

    async def admit(self, request: AdmissionRequest, policy: Policy) -> Decision:
        state = self.live.state
        state.pending.expire(self.clock())
        decision = decide(request, state, policy)
        if (
            not decision.allowed
            or request.dry_run
            or request.operation not in ("CREATE", "UPDATE")
            or not decision.charged_pools
        ):
            return decision
        pools = sorted(decision.charged_pools)
        async with self._locked(pools):
            for _ in range(self.settings.attempts):
                state = self.live.state
                state.pending.expire(self.clock())
                for pool in pools:
                    self._count_others(state, pool)
                decision = decide(request, state, policy)
                if not decision.allowed:
                    return decision
                if not set(decision.charged_pools) <= set(pools):
                    break  # the tree changed under us; the caller may simply retry
                try:
                    await self._record(request, decision)
                except _Conflict:
                    self.conflicts += 1
                    continue
                except ApiError as exc:
                    log.warning("ledger write failed", extra={"fields": {"error": str(exc)}})
                    return errored(
                        503,
                        "ServiceUnavailable",
                        "ledger-unavailable",
                        "tenant reservations: the reservation ledger cannot be written "
                        "right now; try again",
                    )
                self._hold(state, request, decision)
                return decision
        return errored(
            409,
            "Conflict",
            "contention",
            f"tenant reservations: too many concurrent changes in pool {', '.join(pools)}; "
            "try again",
        )

    @contextlib.asynccontextmanager
    async def _locked(self, pools: list[str]) -> AsyncIterator[None]:
        # A fixed order (sorted) so that two requests touching the same two pools cannot
        # deadlock, as OpenShift's ClusterResourceQuota admission does.
        locks = [self._locks.setdefault(pool, asyncio.Lock()) for pool in pools]
        async with contextlib.AsyncExitStack() as stack:
            for lock in locks:
                await stack.enter_async_context(lock)
            yield

    def _hold(self, state: ReservationState, request: AdmissionRequest, decision: Decision) -> None:
        increase = rl.total(decision.charged_pools.values())
        key: AppKey = (request.kind, request.namespace, request.name)
        state.pending.hold(
            Hold(
                id=request.uid,
                key=key,
                namespace=request.namespace,
                increase=increase,
                charge=decision.expected or {},
                expires=self.clock() + self.settings.grace_seconds,
            )
        )

    async def _record(self, request: AdmissionRequest, decision: Decision) -> None:
        expires = datetime.fromtimestamp(self.clock() + self.settings.grace_seconds, UTC)
        for pool, increase in sorted(decision.charged_pools.items()):
            entry = {
                "id": request.uid,
                "application": f"{request.kind}/{request.namespace}/{request.name}",
                "charge": rl.to_strings(increase),
                "expected": rl.to_strings(decision.expected or {}),
                "expires": expires.strftime(_TIME),
                "replica": self.settings.replica,
            }
            current = self._objects.get(pool) or await self._ensure(pool)
            status = dict(current.get("status") or {})
            entries = [e for e in status.get("pending") or [] if not self._expired(e)]
            status["pending"] = [*entries, entry]
            await self._write_status(pool, current, status)

    async def _write_status(self, pool: str, current: Obj, status: Obj) -> Obj:
        body = {**current, "status": status}
        try:
            written = await self.client.replace(TENANT_RESERVATIONS, body, status=True)
        except ApiError as exc:
            if exc.status == 409:
                with contextlib.suppress(ApiError):
                    self._remember(await self.client.get(TENANT_RESERVATIONS, pool, pool))
                raise _Conflict() from None
            raise
        self._remember(written)
        return written

    async def _ensure(self, pool: str) -> Obj:
        body = {
            "apiVersion": TENANT_RESERVATIONS.api_version,
            "kind": "TenantReservation",
            "metadata": {"name": pool, "namespace": pool},
            "spec": {"pool": pool},
        }
        try:
            created = await self.client.create(TENANT_RESERVATIONS, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            created = await self.client.get(TENANT_RESERVATIONS, pool, pool)
        self._remember(created)
        return created

    # -- what other replicas hold ------------------------------------------------------------

    def _count_others(self, state: ReservationState, pool: str) -> None:
        """Put the live entries of other replicas (and our own not held here) into usage."""
        mine = {hold.id for hold in state.pending.holds()}
        total: dict[str, Decimal] = {}
        obj = self._objects.get(pool) or {}
        for entry in (obj.get("status") or {}).get("pending") or []:
            if entry.get("id") in mine or self._expired(entry) or self._settled(state, entry):
                continue
            total = rl.add(total, _quantities(entry.get("charge")))
        state.pending.set_remote(pool, total)

    def _expired(self, entry: Mapping[str, Any]) -> bool:
        return _expiry(entry) <= self.clock()

    def _settled(self, state: ReservationState, entry: Mapping[str, Any]) -> bool:
        """Settled now, or seen settled before (the object may have been deleted since)."""
        entry_id = str(entry.get("id") or "")
        if state.pending.resolved(entry_id):
            return True
        if _shows(state, entry):
            state.pending.resolve(entry_id, _expiry(entry))
            return True
        return False

    # -- the informer and the look-aside cache -----------------------------------------------

    def _remember(self, obj: Obj) -> None:
        pool = str((obj.get("metadata") or {}).get("name") or "")
        known = self._objects.get(pool)
        if known is None or _version(obj) >= _version(known):
            self._objects[pool] = obj

    def _replace(self, items: list[Obj]) -> None:
        for item in items:
            self._remember(item)

    def _event(self, kind: str, obj: Obj) -> None:
        if kind == "DELETED":
            self._objects.pop(str((obj.get("metadata") or {}).get("name") or ""), None)
        else:
            self._remember(obj)

    # -- the leader's duty -------------------------------------------------------------------

    async def reconcile(self) -> int:
        """Make every pool's TenantReservation status true; returns how many were written."""
        state = self.live.state
        if not state.synced:
            return 0
        written = 0
        now = datetime.fromtimestamp(self.clock(), UTC).strftime(_TIME)
        state.pending.expire(self.clock())
        for root in [n.namespace for n in state.tree.nodes() if n.bounded]:
            self._count_others(state, root)
        discounts = state.pool_discounts()
        for pool in state.tree.pools():
            try:
                current = self._objects.get(pool.namespace) or await self._ensure(pool.namespace)
                old = dict(current.get("status") or {})
                entries = [
                    e
                    for e in old.get("pending") or []
                    if not self._expired(e) and not self._settled(state, e)
                ]
                over = pool.overcommitted
                status = {
                    "budget": rl.to_strings(pool.budget),
                    "reserved": rl.to_strings(pool.reserved),
                    "budgetSummary": rl.format_resources(pool.budget),
                    "reservedSummary": rl.format_resources(pool.reserved),
                    "overcommitted": rl.to_strings(over),
                    "pending": entries,
                    "conditions": [_condition(old, over, now)],
                }
                discount = discounts.get(pool.namespace)
                if discount:  # overcommit factors apply: committed beside reserved
                    status["committed"] = rl.to_strings(rl.add(pool.reserved, discount))
                    status["discount"] = rl.to_strings(discount)
                if _comparable(status) != _comparable(old):
                    await self._write_status(pool.namespace, current, status)
                    written += 1
            except (_Conflict, ApiError) as exc:
                log.info(
                    "reconcile deferred",
                    extra={"fields": {"pool": pool.namespace, "error": repr(exc)}},
                )
        return written


def _expiry(entry: Mapping[str, Any]) -> float:
    try:
        expires = datetime.strptime(str(entry.get("expires")), _TIME).replace(tzinfo=UTC)
    except ValueError:
        return 0.0
    return expires.timestamp()


def _shows(state: ReservationState, entry: Mapping[str, Any]) -> bool:
    """Whether the state already shows the application with the entry's expected figures."""
    kind, _, rest = str(entry.get("application") or "").partition("/")
    namespace, _, name = rest.partition("/")
    expected = _quantities(entry.get("expected"))
    if kind == TENANT_KIND:
        node = state.tree.get(owned_namespace(namespace, name))
        return node is not None and node.declared and node.budget == expected
    record = state.record((kind, namespace, name))
    return record is not None and dict(record.resources) == expected


def _quantities(values: object) -> dict[str, Decimal]:
    if not isinstance(values, Mapping):
        return {}
    result = {}
    for key, value in values.items():
        with contextlib.suppress(Exception):
            result[str(key)] = parse_quantity(value)
    return result


def _version(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _condition(old: Mapping[str, Any], over: Mapping[str, Decimal], now: str) -> Obj:
    status = "True" if over else "False"
    previous = next(
        (c for c in old.get("conditions") or [] if c.get("type") == "Overcommitted"), None
    )
    since = (
        previous.get("lastTransitionTime") if previous and previous.get("status") == status else now
    )
    message = (
        f"reserved exceeds the budget by {rl.format_resources(over)}; lower a sub-tenant quota "
        "or raise this tenant's quota (nothing is evicted)"
        if over
        else "reserved is within the budget"
    )
    return {
        "type": "Overcommitted",
        "status": status,
        "reason": "BudgetExceeded" if over else "WithinBudget",
        "message": message,
        "lastTransitionTime": since,
    }


def _comparable(status: Mapping[str, Any]) -> Obj:
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or []
    ]
    return {**status, "conditions": conditions}

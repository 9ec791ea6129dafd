"""The reservation ledger: pending charges shared by every replica, so no pool overshoots.

Kubernetes' ResourceQuota admission is the model. Each tenant pool has a ``TenantReservation``
(in the pool's namespace, named after it) whose ``status.pending`` lists the admitted increases
not yet observed as objects. Every replica counts those entries into its pools' usage, derived
from its newest copy of each object (see :mod:`webhook.core.admission.pending` for the settle and
release rules), and admits an increase only by adding its entry with a write conditional on the
object's resourceVersion: two requests that each fit alone but not together never both pass.

**Group commit.** Admissions for one pool queue while a write for that pool is in flight; the
queue is then decided as one batch against the pool (each request still all or nothing, in
arrival order, with a running total), and committed in one conditional write that also drops
the entries this replica has seen settled and those past their grace period. A conflict
(another replica wrote first) re-reads the object and decides the batch again; after
``attempts`` conflicts the batch is denied with "try again" rather than guessed. A request
charging several pools takes their locks in sorted order (as OpenShift's ClusterResourceQuota
does) and writes them one after another: its entries carry its request uid, so a retry
recognises and reuses them, a failure removes them, and none is ever written twice.

**Revisions.** Each entry records the ledger revision that admitted it: a new entry is
unstamped (it was added by the write that produced the object's current resourceVersion) and
every later write stamps it with that revision. So every reader knows exactly which
observations are newer than the admission; only those settle it.

**Missed entries.** Every write that removes entries adds them, per kind, to the object's
``status.released`` counts. A replica whose copy jumps past entries it never saw (admitted and
removed between two versions it read, their objects perhaps stored where its state has not
looked yet) finds the count grown by more than it saw leave, and decides nothing for the pool
until its state has reached that version (a bounded wait, then "try again"). Neither that wait
nor the release of an expired entry depends on the kind's own traffic: the state is asked to
confirm the kind by a consistent read (``LiveState.confirm``) when its watch lags.

**Bounds.** A pool's object holds at most :data:`MAX_ENTRIES` entries of at most
:data:`MAX_ENTRY_BYTES` each, well under etcd's 1.5 MiB object limit: at the bound, a request is
denied with 429 "try again" (settled and expired entries make room within seconds), and no
write is ever attempted that the API server would refuse for its size. One tenant (the tenant
namespace directly below the pool, with its sub-tenants) may have at most
``LedgerSettings.namespace_share`` of those entries listed: past it only that tenant is told to
try again. Expiries are RFC 3339 in one fixed UTC form, so comparing one costs a string
comparison, not a parse.

**Caps.** A sub-Tenant allowed only because Tenant is in warn, beyond what fits, is recorded in
the pool's ``status.capped`` before the answer (:mod:`webhook.core.admission.carveouts`): it then
counts no more than before the write, and nothing is held for it.

**Dry runs.** An API server that ignores ``dryRun`` stores what it calls a dry run (cozystack-api
does: its HelmRelease writes drop the option), so with ``dry_run_holds`` (the default) a dry run
is held like any other admission, as a *preview* entry keyed by its object. The next admitted
write of the same object in the pool (a real one, or another preview) is decided without the
preview's hold and replaces it in the same conditional write, holding the key-wise maximum of
both (whichever of the two the server ends up storing is covered until it is observed or the
grace period passes): a preview followed by the same write for real is never refused because of
its preview, and repeated previews of one name hold once. A real entry is never replaced by a
preview. A request charging several pools at once adds its preview like any entry. Without
``dry_run_holds`` a dry run never touches the ledger.

The replica holding the Lease keeps every pool's summary (budget, reserved, the
``Overcommitted`` condition) true through the same per-pool lock; admission writes carry the
summary too, so a busy pool needs no separate status write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final, Protocol

from webhook.core.admission.carveouts import Cap, capped, kept_budget, overshoot
from webhook.core.admission.decisions import (
    WARNING_LIMIT,
    Decision,
    Policy,
    decide,
    errored,
    held_dry_run,
)
from webhook.core.admission.pending import Hold, PendingCharges
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.errors import UNEVALUABLE
from webhook.core.base.quantities import parse_quantity
from webhook.core.tenancy.applications import AppKey, resource_version
from webhook.core.tenancy.tenants import (
    TENANT_KIND,
    ancestors,
    owned_namespace,
    parent_namespace,
    parse_budget,
)
from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.kube.reflector import Reflector

__all__ = [
    "MAX_ENTRIES",
    "MAX_ENTRY_BYTES",
    "TENANT_RESERVATIONS",
    "Ledger",
    "LedgerSettings",
    "holder",
]

log = logging.getLogger(__name__)
Obj = dict[str, Any]

TENANT_RESERVATIONS: Final = ResourceRef(
    "reservation.cozystack.io", "v1alpha1", "tenantreservations"
)
_TIME: Final = "%Y-%m-%dT%H:%M:%SZ"  # metav1.Time, for conditions
# Expiries: RFC 3339 with microseconds, always this width, UTC: they compare in time order as
# strings (whole seconds would expire an entry up to a second early).
_EXPIRY: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
# 1,000 entries of at most 1 KiB (a real one is about 300 bytes: a uid, kind/namespace/name,
# two small charges, an expiry, a replica name) stay under 1 MiB, against etcd's 1.5 MiB.
# At 1,000 admissions/s with objects observed within 100 ms, about 100 entries are listed.
MAX_ENTRIES: Final = 1_000
MAX_ENTRY_BYTES: Final = 1_024
# Previews one entry replaces: in one batch a write replaces at most the previews of its object
# (each preview replaces the one before it, so there is one at a time, or a few in flight).
MAX_REPLACES: Final = 16
# Sub-tenants admitted in warn beyond what fits, per pool: about 200 bytes each.
MAX_CAPS: Final = 200


@dataclass(frozen=True)
class LedgerSettings:
    replica: str
    grace_seconds: float = 25.0  # twice the default webhook timeout, plus a margin
    attempts: int = 3  # conflicting writes retried, as Kubernetes' quota admission does
    reconcile_seconds: float = 2.0
    read_timeout: float = 90.0
    watch_timeout: int = 300
    catch_up_seconds: float = 2.0  # how long a denial waits for the state to pass an expiry
    # Hold dry runs like writes: the API server may store them (cozystack-api does).
    dry_run_holds: bool = True
    # The share of a pool's ledger one tenant's listed entries may take (see :func:`holder`).
    namespace_share: float = 0.1

    @property
    def share_limit(self) -> int:
        """How many entries one tenant may have listed in one pool's ledger."""
        return max(1, int(MAX_ENTRIES * self.namespace_share))

    @property
    def cap_share_limit(self) -> int:
        """How many caps one tenant's sub-tenants may have listed in one pool's ledger."""
        return max(1, int(MAX_CAPS * self.namespace_share))


class StateSource(Protocol):
    """The live state as the ledger needs it (``webhook.state.live.LiveState``)."""

    @property
    def state(self) -> ReservationState: ...

    def observed_version(self, kind: str) -> int: ...

    def confirm(self, kind: str, revision: int) -> None:
        """Make ``observed_version(kind)`` reach ``revision`` without waiting for the kind's
        own traffic (a consistent read); returns at once."""


class _Conflict(Exception):
    pass


class _ShareFull(Exception):
    """One tenant's entries already take its whole share of a pool's ledger."""

    def __init__(self, pool: str, holder: str) -> None:
        super().__init__(pool, holder)
        self.pool = pool
        self.holder = holder


@dataclass
class _Waiter:
    request: AdmissionRequest
    policy: Policy
    future: asyncio.Future[Decision]


@dataclass
class _Pool:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: list[_Waiter] = field(default_factory=list)
    draining: asyncio.Task[None] | None = None


class Ledger:
    """Admits increases through the cluster-wide ledger; one per replica."""

    def __init__(
        self,
        client: KubeClient,
        live: StateSource,
        settings: LedgerSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.live = live
        self.settings = settings
        self.clock = clock
        self._objects: dict[str, Obj] = {}  # pool -> newest TenantReservation seen or written
        self._parsed: dict[str, dict[str, tuple[Obj, Hold]]] = {}  # pool -> id -> entry, hold
        self._pools: dict[str, _Pool] = {}
        self._state: ReservationState | None = None  # the state the objects were tracked into
        self.conflicts = 0
        self.writes = 0
        self.failures = 0  # writes refused for anything but a conflict
        self.on_batch: Callable[[int], None] = lambda size: None  # e.g. observe in a metric
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

    def holds(self) -> int:
        """Pending charges held in every pool's ledger object, as this replica last saw them."""
        return sum(len(entries) for entries in self._parsed.values())

    def largest_share(self) -> float:
        """The largest share of a pool's ledger (of :data:`MAX_ENTRIES`) that one tenant's
        listed entries take now, over every pool (for metrics: one figure, no labels)."""
        largest = 0
        for pool, obj in self._objects.items():
            counts = _holders(pool, self._current_entries(obj))
            largest = max(largest, *counts.values()) if counts else largest
        return largest / MAX_ENTRIES

    # -- admission ---------------------------------------------------------------------------

    async def admit(self, request: AdmissionRequest, policy: Policy) -> Decision:
        state = self._current()
        if request.operation not in ("CREATE", "UPDATE") or (
            request.dry_run and not self.settings.dry_run_holds
        ):
            return decide(request, state, policy)
        decision = _decide_replacing(request, state, policy)
        expired = not decision.allowed and decision.reason == "exceeded" and decision.pool
        if expired and await self._sweep(decision.pool):
            state = self._current()
            decision = _decide_replacing(request, state, policy)
        if _over_in_warn(request, decision):
            return await self._admit_capped(request, policy, decision)
        if not decision.allowed and decision.reason == "exceeded":
            decision = _explain_cap(decision, state)
        if not decision.allowed or not decision.charged_pools:
            return decision
        node = state.tree.get(request.namespace)
        if node is None or not node.declared:
            # A namespace no Tenant owns: the API server would not store the object (Cozystack
            # creates tenant namespaces from Tenants), so nothing is held for it: an
            # unauthenticated caller cannot fill a pool through namespaces that do not exist.
            if decision.mode != "enforce":
                return decision
            return errored(
                403,
                "Forbidden",
                "no-tenant",
                f"tenant reservations: namespace {request.namespace} belongs to no tenant the "
                "webhook knows of; if it was just created, try again",
            )
        if len(request.uid) > 128 or not request.uid:
            return errored(400, "BadRequest", "invalid", "tenant reservations: invalid uid")
        pools = sorted(decision.charged_pools)
        if len(pools) == 1:
            answer = await self._enqueue(pools[0], request, policy)
        else:
            answer = await self._admit_across(pools, request, policy)
        if request.dry_run and answer.allowed and answer.charged_pools:
            return held_dry_run(answer, self.settings.grace_seconds)
        return answer

    def _current(self) -> ReservationState:
        """The live state, following every pool's newest ledger object, caught up."""
        state = self.live.state
        if state is not self._state:
            self._state = state
            for obj in list(self._objects.values()):
                self._track(obj)
        state.pending.catch_up(self.live.observed_version)
        return state

    # -- a carve-out admitted in warn: only what fits is counted ----------------------------

    async def _admit_capped(
        self, request: AdmissionRequest, policy: Policy, warned: Decision
    ) -> Decision:
        """A Tenant whose quota does not fit, allowed only because Tenant is in warn: record in
        the pool above, before answering, that it counts no more than before the write (a
        cap), so nothing is held and nobody else's room is taken; the answer is still the
        warning with the full overshoot (see :mod:`webhook.core.admission.carveouts`)."""
        state = self._current()
        declared = _declared_budget(request.object, state)
        pool_node = state.tree.pool_root(request.namespace)
        if declared is None or pool_node is None:
            return warned
        old = _declared_budget(request.old_object, state) if request.operation == "UPDATE" else None
        owned = owned_namespace(request.namespace, request.name)
        cap = capped(declared, kept_budget(state.tree, owned, declared, old))
        refused = await self._write_cap(pool_node.namespace, owned, cap)
        if refused is not None:
            return refused
        return _with_cap_warning(warned, cap, pool_node.namespace)

    async def _write_cap(self, pool: str, owned: str, cap: Cap) -> Decision | None:
        """Make ``pool``'s ledger list ``cap`` for ``owned``; ``None`` once written, else the
        answer to give. A cap whose Tenant is not stored with its quota within the grace
        period is dropped by the next write (see :meth:`_status`). One tenant's caps take at
        most its share of :data:`MAX_CAPS`, as its entries do of :data:`MAX_ENTRIES`: past it
        only that tenant is refused."""
        who = _cap_holder(pool, owned)
        raw = {
            "digest": cap.digest,
            "declared": rl.to_strings(cap.declared),
            "counted": rl.to_strings(cap.counted),
            "expires": datetime.fromtimestamp(
                self.clock() + self.settings.grace_seconds, UTC
            ).strftime(_EXPIRY),
        }
        if _size(raw) > MAX_ENTRY_BYTES:
            return _too_large()
        async with self._locked([pool]):
            for _ in range(self.settings.attempts):
                try:
                    current = self._objects.get(pool) or await self._ensure(pool)
                except ApiError:
                    return _unavailable()
                state = self._current()
                kept = self._kept(pool, current, state, without=set())
                status = self._status(pool, current, state, kept)
                caps = {**_raw_caps(status), owned: raw}
                if len(caps) > MAX_CAPS:
                    return _too_many_caps(pool)
                mine = sum(1 for other in caps if _cap_holder(pool, str(other)) == who)
                if mine > self.settings.cap_share_limit:
                    return _cap_share_full(pool, who, self.settings)
                outcome = await self._attempt(pool, current, {**status, "capped": caps})
                if outcome == "written":
                    return None
                if outcome == "failed":
                    return _unavailable()
        return _contention([pool])

    # -- one pool: the group commit ------------------------------------------------------------

    async def _enqueue(self, pool: str, request: AdmissionRequest, policy: Policy) -> Decision:
        queue = self._pools.setdefault(pool, _Pool())
        waiter = _Waiter(request, policy, asyncio.get_running_loop().create_future())
        queue.waiting.append(waiter)
        if queue.draining is None:
            queue.draining = asyncio.create_task(self._drain(pool, queue))
        return await waiter.future

    async def _drain(self, pool: str, queue: _Pool) -> None:
        try:
            while queue.waiting:
                batch, queue.waiting = queue.waiting, []
                self.on_batch(len(batch))
                async with queue.lock:
                    try:
                        await self._commit(pool, batch)
                    except Exception:  # one bad batch must not stop the pool's queue
                        log.exception("ledger batch failed", extra={"fields": {"pool": pool}})
                    for waiter in batch:
                        if not waiter.future.done():
                            waiter.future.set_result(_unavailable())
        finally:
            queue.draining = None

    async def _commit(self, pool: str, batch: list[_Waiter]) -> None:
        """Decide ``batch`` against ``pool`` and commit the allowed ones in one write."""
        deadline = asyncio.get_running_loop().time() + self.settings.catch_up_seconds
        for _ in range(self.settings.attempts):
            while True:  # decide only once the state has passed what the ledger removed
                current = self._objects.get(pool) or await self._ensure(pool)
                state = self._current()
                if not state.pending.fenced(pool):
                    break
                if not await self._wait_unfenced([pool], deadline):
                    for waiter in batch:
                        if not waiter.future.done():
                            waiter.future.set_result(_behind(pool))
                    return
            pending = state.pending
            ids = {w.request.uid for w in batch}
            kept = self._kept(pool, current, state, without=ids)
            held = _holders(pool, kept)
            limit = self.settings.share_limit
            try:
                for hold_id in ids:  # a retried request's own entry is not somebody else's
                    own = pending.counted(pool, hold_id)
                    if own is not None:
                        pending.adjust(pool, rl.scale(own.increase, Decimal(-1)))
                answers: list[tuple[_Waiter, Decision]] = []
                added: list[Obj] = []
                replaced: set[str] = set()  # previews the write drops, absorbed by a later write
                # Only previews can be replaced: looked up among these, not every entry, so a
                # batch costs O(entries + previews x batch), not O(entries x batch).
                listed = [e for e in kept if e.get("dryRun") is True]
                fresh: list[Obj] = []  # previews this batch adds
                for waiter in batch:
                    if waiter.future.done():
                        continue  # the caller is gone: hold nothing for it
                    previews = _previews(waiter.request, [*listed, *fresh], replaced)
                    floor = self._absorb(pool, previews, added, pending)
                    decision = decide(waiter.request, state, waiter.policy)
                    if decision.allowed and decision.charged_pools:
                        who = holder(pool, waiter.request.namespace)
                        if set(decision.charged_pools) != {pool}:
                            decision = _changed(pool)
                        elif len(kept) + len(added) - len(previews) >= MAX_ENTRIES:
                            decision = _full(pool)
                        elif held.get(who, 0) - len(previews) >= limit:
                            decision = _share_full(pool, who, self.settings)
                        else:
                            held[who] = held.get(who, 0) + 1 - len(previews)  # replaced: theirs
                            taken = set(previews)
                            for earlier in added:  # a preview of this batch: its own too
                                if earlier["id"] in taken:
                                    taken.update(earlier.get("replaces") or ())
                            entry = self._entry(
                                waiter.request, decision, pool, floor=floor, replaces=taken
                            )
                            if _size(entry) > MAX_ENTRY_BYTES:
                                decision = _too_large()
                            else:
                                hold = _hold_of(entry, decision, pool)
                                replaced.update(previews)
                                if previews:
                                    added[:] = [e for e in added if e["id"] not in previews]
                                    fresh[:] = [e for e in fresh if e["id"] not in previews]
                                pending.adjust(pool, hold.increase)
                                added.append(entry)
                                if hold.preview:
                                    fresh.append(entry)
                                self._parsed.setdefault(pool, {})[entry["id"]] = (entry, hold)
                                floor = {}
                    pending.adjust(pool, floor)  # not absorbed: the previews count again
                    answers.append((waiter, decision))
                kept = [e for e in kept if e["id"] not in replaced]
                entries = self._current_entries(current)
                if not added and len(kept) == len(entries):
                    _answer(answers)
                    return
                status = self._status(pool, current, state, [*kept, *added])
                outcome = await self._attempt(pool, current, status)
                if outcome == "conflict":
                    continue
                if outcome == "failed":
                    for waiter, _ in answers:
                        waiter.future.set_result(_unavailable())
                    return
                _answer(answers)
                return
            finally:
                pending.clear_adjustments(pool)
        for waiter in batch:
            if not waiter.future.done():
                waiter.future.set_result(_contention([pool]))

    def _absorb(
        self, pool: str, previews: Iterable[str], added: list[Obj], pending: PendingCharges
    ) -> dict[str, Decimal]:
        """Take the holds of ``previews`` (ids listed in ``pool``'s ledger, or just ``added`` by
        this batch) out of the pool's usage while a write of their object is decided; returns
        their key-wise maximum, which the write's entry holds at least, or the caller adds back."""
        floor: dict[str, Decimal] = {}
        fresh = {str(e["id"]): e for e in added}
        for hold_id in previews:
            counted = pending.counted(pool, hold_id)
            if hold_id in fresh:
                increase = _quantities(fresh[hold_id].get("charge"))
            elif counted is not None:
                increase = dict(counted.increase)
            else:
                continue  # listed but no longer counted (seen settled): nothing to carry
            floor = rl.maximum(floor, increase)
            pending.adjust(pool, rl.scale(increase, Decimal(-1)))
        return floor

    # -- several pools: one request at a time, its entries known by its uid ----------------

    async def _admit_across(
        self, pools: list[str], request: AdmissionRequest, policy: Policy
    ) -> Decision:
        uid = request.uid
        deadline = asyncio.get_running_loop().time() + self.settings.catch_up_seconds
        async with self._locked(pools):
            for _ in range(self.settings.attempts):
                # Decide against each pool's ledger object exactly as it will be written: an
                # object fetched (or changed) after the decision would list entries it missed.
                try:
                    for pool in pools:
                        if pool not in self._objects:
                            await self._ensure(pool)
                except ApiError as exc:
                    log.warning("ledger read failed", extra={"fields": {"error": str(exc)}})
                    await self._roll_back(pools, uid)
                    return _unavailable()
                basis = {pool: self._objects.get(pool) for pool in pools}
                state = self._current()
                if any(state.pending.fenced(pool) for pool in pools):
                    if not await self._wait_unfenced(pools, deadline):
                        await self._roll_back(pools, uid)
                        return _behind(", ".join(pools))
                    continue
                for pool in pools:
                    own = state.pending.counted(pool, uid)
                    if own is not None:
                        state.pending.adjust(pool, rl.scale(own.increase, Decimal(-1)))
                try:
                    if request.dry_run:  # checked like a write of another name: no replacing
                        decision = decide(request, state, policy)
                    else:
                        # Never refused for the object's own previews; they stay held beside
                        # this entry (whichever the server stores is covered) until observed
                        # or expired.
                        decision = _decide_replacing(request, state, policy)
                finally:
                    for pool in pools:
                        state.pending.clear_adjustments(pool)
                if not decision.allowed or not decision.charged_pools:
                    await self._roll_back(pools, uid)
                    return decision
                if set(decision.charged_pools) != set(pools):
                    await self._roll_back(pools, uid)
                    return _changed(", ".join(pools))
                try:
                    for pool in pools:
                        entry = self._entry(request, decision, pool)
                        await self._put_entry(pool, entry, state, basis[pool])
                except _Conflict:
                    self.conflicts += 1
                    continue  # what was written is ours (by uid): reused or replaced next time
                except _ShareFull as exc:
                    await self._roll_back(pools, uid)
                    return _share_full(exc.pool, exc.holder, self.settings)
                except ApiError as exc:
                    log.warning("ledger write failed", extra={"fields": {"error": str(exc)}})
                    await self._roll_back(pools, uid)
                    return _unavailable()
                return decision
            await self._roll_back(pools, uid)
        return _contention(pools)

    async def _put_entry(
        self, pool: str, entry: Obj, state: ReservationState, current: Obj | None
    ) -> None:
        """Make ``pool``'s ledger list ``entry`` (replacing one with its id); one write at most,
        conditional on ``current``, the version the decision counted (a newer one conflicts)."""
        if current is None:
            raise _Conflict()
        for known in self._current_entries(current):
            if known.get("id") == entry["id"] and _same(known, entry):
                return  # written by an earlier attempt of this request: reuse it
        kept = self._kept(pool, current, state, without={entry["id"]})
        if len(kept) >= MAX_ENTRIES:
            raise _Conflict()
        who = holder(pool, entry["application"].split("/", 2)[1])
        if _holders(pool, kept).get(who, 0) >= self.settings.share_limit:
            raise _ShareFull(pool, who)
        await self._write_status(pool, current, self._status(pool, current, state, [*kept, entry]))

    async def _roll_back(self, pools: list[str], uid: str) -> None:
        """Remove ``uid``'s entries (a request that failed holds nothing); best effort: an entry
        left behind is dropped with its grace period like any other."""
        self._current().pending.withdraw(uid)  # never answered "allowed": nothing to wait for
        for pool in pools:
            for _ in range(self.settings.attempts):
                current = self._objects.get(pool)
                if current is None or not any(
                    e.get("id") == uid for e in self._current_entries(current)
                ):
                    break
                state = self._current()
                kept = self._kept(pool, current, state, without={uid})
                try:
                    await self._write_status(
                        pool, current, self._status(pool, current, state, kept)
                    )
                    break
                except _Conflict:
                    continue
                except ApiError as exc:
                    log.warning("ledger roll-back failed", extra={"fields": {"error": str(exc)}})
                    break

    @contextlib.asynccontextmanager
    async def _locked(self, pools: list[str]) -> AsyncIterator[None]:
        # A fixed order (sorted) so that two requests touching the same two pools cannot
        # deadlock, as OpenShift's ClusterResourceQuota admission does.
        async with contextlib.AsyncExitStack() as stack:
            for pool in sorted(pools):
                await stack.enter_async_context(self._pools.setdefault(pool, _Pool()).lock)
            yield

    async def _wait_unfenced(self, pools: list[str], deadline: float) -> bool:
        """Wait (until ``deadline``, loop time) for the state to pass every fence on ``pools``;
        whether it did. A quiet kind is confirmed by a consistent read, not awaited."""
        loop = asyncio.get_running_loop()
        while True:
            pending = self._current().pending
            if not any(pending.fenced(pool) for pool in pools):
                return True
            if loop.time() >= deadline:
                return False
            for pool in pools:
                self._confirm(pending.awaiting(pool))
            await asyncio.sleep(0.02)

    def _confirm(self, wanted: Mapping[str, int]) -> None:
        """Ask the state to confirm each kind up to its revision (see ``LiveState.confirm``)."""
        for kind, revision in wanted.items():
            if self.live.observed_version(kind) < revision:
                self.live.confirm(kind, revision)

    # -- expiry ----------------------------------------------------------------------------

    async def _sweep(self, pool: str) -> bool:
        """Drop ``pool``'s entries past their grace period and wait (bounded) until the state
        has seen every write up to their removal (and that of entries already gone from the
        ledger but still counted); whether anything may have been released."""
        current = self._objects.get(pool)
        if current is None:
            return False
        now = self._now_text()
        if not any(_expired(e, now) for e in self._current_entries(current)):
            if not self._current().pending.departed(pool):
                return False
            return await self._wait_departed(pool)
        async with self._locked([pool]):
            current = self._objects.get(pool)
            state = self._current()
            if current is not None:
                kept = self._kept(pool, current, state, without=set())
                if len(kept) < len(self._current_entries(current)):
                    with contextlib.suppress(_Conflict, ApiError):
                        await self._write_status(
                            pool, current, self._status(pool, current, state, kept)
                        )
        return await self._wait_departed(pool)

    async def _wait_departed(self, pool: str) -> bool:
        """Wait (bounded) until no entry that left ``pool``'s ledger is still counted."""
        loop = asyncio.get_running_loop()  # a bounded real wait, whatever the ledger's clock
        deadline = loop.time() + self.settings.catch_up_seconds
        while loop.time() < deadline:
            pending = self._current().pending
            if not pending.departed(pool):
                break
            self._confirm(pending.awaiting(pool))
            await asyncio.sleep(0.02)
        return True

    # -- building the object ---------------------------------------------------------------

    def _entry(
        self,
        request: AdmissionRequest,
        decision: Decision,
        pool: str,
        *,
        floor: Mapping[str, Decimal] | None = None,
        replaces: Iterable[str] = (),
    ) -> Obj:
        """``request``'s entry in ``pool``, holding at least ``floor`` (previews it replaces)."""
        expires = datetime.fromtimestamp(self.clock() + self.settings.grace_seconds, UTC)
        entry: Obj = {
            "id": request.uid,
            "application": f"{request.kind}/{request.namespace}/{request.name}",
            "charge": rl.to_strings(rl.maximum(decision.charged_pools[pool], floor or {})),
            "expected": rl.to_strings(decision.expected or {}),
            "expires": expires.strftime(_EXPIRY),
            "replica": self.settings.replica,
        }
        if request.dry_run:
            entry["dryRun"] = True
        if replaces:
            entry["replaces"] = sorted(replaces)
        return entry

    def _kept(
        self, pool: str, current: Obj, state: ReservationState, *, without: set[str]
    ) -> list[Obj]:
        """The entries of ``current`` the next write keeps, each stamped with its revision:
        not ``without``, not seen settled here, not past its grace period."""
        now = self._now_text()
        revision = str(resource_version((current.get("metadata") or {}).get("resourceVersion")))
        kept = []
        for entry in self._current_entries(current):
            hold_id = str(entry.get("id") or "")
            if hold_id in without or _expired(entry, now) or state.pending.resolved(hold_id):
                continue
            kept.append(entry if entry.get("revision") else {**entry, "revision": revision})
        return kept

    def _status(self, pool: str, current: Obj, state: ReservationState, entries: list[Obj]) -> Obj:
        old = current.get("status") or {}
        status = {**old, **self._summary(pool, state, old), "pending": entries}
        caps = _raw_caps(old)
        if caps:  # a cap stays while its Tenant declares its quota, or within its grace
            now = self._now_text()
            status["capped"] = {
                owned: raw
                for owned, raw in caps.items()
                if isinstance(raw, Mapping)
                and (not _expired(raw, now) or state.declares(str(owned), str(raw.get("digest"))))
            } or None
        kept = {str(e.get("id") or "") for e in entries}
        removed = [e for e in self._current_entries(current) if str(e.get("id") or "") not in kept]
        if removed:  # every removal counted, so a replica that never saw one knows to wait
            released = _released(old)
            for entry in removed:
                kind = _kind(entry)
                released[kind] = released.get(kind, 0) + 1
            status["released"] = released
        return {k: v for k, v in status.items() if v is not None}

    def _summary(self, pool: str, state: ReservationState, old: Mapping[str, Any]) -> Obj:
        node = state.tree.get(pool)
        if node is None or not node.bounded:
            return {}
        view = state.tree.view(node)
        over = view.overcommitted
        summary: Obj = {
            "budget": rl.to_strings(view.budget),
            "reserved": rl.to_strings(view.reserved),
            "budgetSummary": rl.format_resources(view.budget),
            "reservedSummary": rl.format_resources(view.reserved),
            "overcommitted": rl.to_strings(over),
            "conditions": [
                _condition(old, over, datetime.fromtimestamp(self.clock(), UTC).strftime(_TIME))
            ],
            "committed": None,
            "discount": None,
        }
        discount = state.pool_discounts().get(pool)
        if discount:  # overcommit factors apply: committed beside reserved
            summary["committed"] = rl.to_strings(rl.add(view.reserved, discount))
            summary["discount"] = rl.to_strings(discount)
        return summary

    async def _attempt(self, pool: str, current: Obj, status: Obj) -> str:
        """One conditional write: ``written``, ``conflict`` (counted; decide again) or
        ``failed`` (logged)."""
        try:
            await self._write_status(pool, current, status)
        except _Conflict:
            self.conflicts += 1
            return "conflict"
        except ApiError as exc:
            log.warning("ledger write failed", extra={"fields": {"error": str(exc)}})
            return "failed"
        return "written"

    async def _write_status(self, pool: str, current: Obj, status: Obj) -> Obj:
        body = {**current, "status": status}
        self.writes += 1
        try:
            written = await self.client.replace(TENANT_RESERVATIONS, body, status=True)
        except ApiError as exc:
            if exc.status == 409:
                with contextlib.suppress(ApiError):
                    self._remember(await self.client.get(TENANT_RESERVATIONS, pool, pool))
                raise _Conflict() from None
            self.failures += 1
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

    def _now_text(self) -> str:
        """Now, as expiries are written."""
        return datetime.fromtimestamp(self.clock(), UTC).strftime(_EXPIRY)

    @staticmethod
    def _current_entries(obj: Mapping[str, Any]) -> list[Obj]:
        entries = (obj.get("status") or {}).get("pending") or []
        return [e for e in entries if isinstance(e, dict)]

    # -- following the objects: the informer and the look-aside cache ------------------------

    def _remember(self, obj: Obj) -> None:
        pool = str((obj.get("metadata") or {}).get("name") or "")
        known = self._objects.get(pool)
        if known is None or _version(obj) >= _version(known):
            self._objects[pool] = obj
            self._track(obj)

    def _track(self, obj: Obj) -> None:
        """Count what ``obj`` lists (it is the newest copy of its pool's ledger)."""
        if self.live.state is not self._state:
            self._current()  # a rebuilt state: follow every object into it first
        assert self._state is not None
        pool = str((obj.get("metadata") or {}).get("name") or "")
        version = _version(obj)
        known = self._parsed.get(pool, {})
        parsed: dict[str, tuple[Obj, Hold]] = {}
        replaced: set[str] = set()
        for entry in self._current_entries(obj):
            hold = self._hold(pool, entry, version, known)
            parsed[hold.id] = (entry, hold)
            taken = entry.get("replaces")
            if isinstance(taken, list):
                replaced.update(str(t) for t in taken[:MAX_REPLACES])
        self._state.pending.track(
            pool,
            [h for _, h in parsed.values()],
            version=version,
            released=_released(obj.get("status") or {}),
            replaced=replaced,
        )
        self._state.set_caps(pool, _caps(obj.get("status") or {}))
        if parsed:
            self._parsed[pool] = parsed
        else:
            self._parsed.pop(pool, None)

    @staticmethod
    def _hold(pool: str, entry: Obj, version: int, known: Mapping[str, tuple[Obj, Hold]]) -> Hold:
        """The entry as a hold; parsed once per entry, not once per version of the object."""
        hold_id = str(entry.get("id") or "")
        after = resource_version(entry.get("revision")) or version
        cached = known.get(hold_id)
        if cached is not None and _same(cached[0], entry):
            hold = cached[1]
            return hold if hold.after == after else _with_after(hold, after)
        _, _, rest = str(entry.get("application") or "").partition("/")
        namespace, _, name = rest.partition("/")
        key: AppKey = (_kind(entry), namespace, name)
        return Hold(
            id=hold_id,
            key=key,
            namespace=pool,
            increase=_quantities(entry.get("charge")),
            charge=_quantities(entry.get("expected")),
            after=after,
            preview=entry.get("dryRun") is True,
        )

    def _replace(self, items: list[Obj]) -> None:
        names = set()
        for item in items:
            names.add(str((item.get("metadata") or {}).get("name") or ""))
            self._remember(item)
        for pool in [p for p in self._objects if p not in names]:
            self._gone(self._objects.pop(pool), resource_version(self.reflector.resource_version))

    def _event(self, kind: str, obj: Obj) -> None:
        if kind == "DELETED":
            pool = str((obj.get("metadata") or {}).get("name") or "")
            known = self._objects.pop(pool, None)
            if known is not None:
                self._gone(known, _version(obj))
        else:
            self._remember(obj)

    def _gone(self, obj: Obj, version: int) -> None:
        pool = str((obj.get("metadata") or {}).get("name") or "")
        if self._state is not None:
            self._state.pending.track(pool, [], version=version)
            self._state.set_caps(pool, {})

    # -- the leader's duty -------------------------------------------------------------------

    def sweep(self) -> None:
        """Release what the state has caught up with, and have the state confirm the kinds
        that still hold something back (every replica, periodically)."""
        self._confirm(self._current().pending.awaiting())

    async def reconcile(self) -> int:
        """Make every pool's TenantReservation status true; returns how many were written."""
        state = self._current()
        if not state.synced:
            return 0
        written = 0
        for view in state.tree.pools():
            pool = view.namespace
            try:
                async with self._locked([pool]):
                    current = self._objects.get(pool) or await self._ensure(pool)
                    state = self._current()
                    old = current.get("status") or {}
                    kept = self._kept(pool, current, state, without=set())
                    status = self._status(pool, current, state, kept)
                    if _comparable(status) != _comparable(old):
                        await self._write_status(pool, current, status)
                        written += 1
            except (_Conflict, ApiError) as exc:
                log.info(
                    "reconcile deferred",
                    extra={"fields": {"pool": pool, "error": repr(exc)}},
                )
        return written


def _answer(answers: Iterable[tuple[_Waiter, Decision]]) -> None:
    for waiter, decision in answers:
        if not waiter.future.done():
            waiter.future.set_result(decision)


def _unavailable() -> Decision:
    return errored(
        503,
        "ServiceUnavailable",
        "ledger-unavailable",
        "tenant reservations: the reservation ledger cannot be written right now; try again",
    )


def _contention(pools: Iterable[str]) -> Decision:
    return errored(
        409,
        "Conflict",
        "contention",
        f"tenant reservations: too many concurrent changes in pool {', '.join(pools)}; try again",
    )


def _changed(pool: str) -> Decision:
    return errored(
        409,
        "Conflict",
        "contention",
        f"tenant reservations: the tenant tree changed while pool {pool} was decided; try again",
    )


def _full(pool: str) -> Decision:
    return errored(
        429,
        "TooManyRequests",
        "ledger-full",
        f"tenant reservations: pool {pool} has {MAX_ENTRIES} admissions not yet observed; "
        "try again in a few seconds",
    )


def _over_in_warn(request: AdmissionRequest, decision: Decision) -> bool:
    """A Tenant write allowed only because Tenant is in warn, over its parent's budget."""
    return (
        request.kind == TENANT_KIND
        and decision.outcome == "warned"
        and decision.reason == "exceeded"
        and not request.dry_run
    )


def _declared_budget(
    obj: Mapping[str, Any] | None, state: ReservationState
) -> dict[str, Decimal] | None:
    """The quota a Tenant object declares (``None``: none given, or it does not parse)."""
    if obj is None:
        return None
    kind = state.platform.kind(TENANT_KIND)
    spec = obj.get("spec")
    try:
        values = kind.defaulted(spec) if kind is not None else spec
        return parse_budget(values)
    except UNEVALUABLE:
        return None


def _with_cap_warning(warned: Decision, cap: Cap, pool: str) -> Decision:
    over = overshoot(cap)
    if not over:
        return warned
    counted = rl.format_resources(cap.counted, sorted(over)) or "nothing"
    note = (
        f"not reserved: pool {pool} counts this quota as {counted} (what it had before) and "
        f"its subtree may use no more until the quota fits ({rl.format_resources(over)} over)"
    )
    return replace(warned, warnings=(*warned.warnings, note[:WARNING_LIMIT]))


def _explain_cap(decision: Decision, state: ReservationState) -> Decision:
    """Say so when the pool that refused is a carve-out counted below its declared quota."""
    cap = state.capped().get(decision.pool)
    if cap is None:
        return decision
    message = (
        f"{decision.message} (its quota, {rl.format_resources(cap.declared)}, was admitted "
        f"in warn mode beyond what fits above it: it counts "
        f"{rl.format_resources(cap.counted, cap.declared) or 'nothing'} until it fits)"
    )
    return replace(decision, message=message, audit={**decision.audit, "message": message})


def _too_many_caps(pool: str) -> Decision:
    return errored(
        429,
        "TooManyRequests",
        "ledger-full",
        f"tenant reservations: pool {pool} has {MAX_CAPS} sub-tenants admitted in warn mode "
        "beyond what fits; fix their quotas, then try again",
    )


def _cap_share_full(pool: str, who: str, settings: LedgerSettings) -> Decision:
    return errored(
        429,
        "TooManyRequests",
        "ledger-share",
        f"tenant reservations: {who} already has {settings.cap_share_limit} sub-tenants "
        f"admitted in warn mode beyond what fits in pool {pool}, its share "
        f"({settings.namespace_share * 100:g}% of {MAX_CAPS}); fix their quotas, then try again",
    )


def _cap_holder(pool: str, owned: str) -> str:
    """Whose share of ``pool``'s caps a cap for the Tenant owning ``owned`` takes: that of
    the tenant it was created in (see :func:`holder`)."""
    return holder(pool, parent_namespace(owned) or owned)


def _raw_caps(status: Mapping[str, Any]) -> dict[str, Any]:
    caps = status.get("capped")
    return dict(caps) if isinstance(caps, Mapping) else {}


def _caps(status: Mapping[str, Any]) -> dict[str, Cap]:
    """The caps a ledger object lists (a malformed one is left out)."""
    found = {}
    for owned, raw in _raw_caps(status).items():
        if isinstance(raw, Mapping) and isinstance(raw.get("digest"), str):
            declared, counted = _quantities(raw.get("declared")), _quantities(raw.get("counted"))
            found[str(owned)] = Cap(raw["digest"], declared, counted)
    return found


def _share_full(pool: str, who: str, settings: LedgerSettings) -> Decision:
    return errored(
        429,
        "TooManyRequests",
        "ledger-share",
        f"tenant reservations: {who} already has {settings.share_limit} admissions not yet "
        f"observed in pool {pool}, its share ({settings.namespace_share * 100:g}% of "
        f"{MAX_ENTRIES}); try again in a few seconds",
    )


def holder(pool: str, namespace: str) -> str:
    """Whose share of ``pool``'s ledger an entry for ``namespace`` takes: the tenant directly
    below the pool on the way to ``namespace`` (the pool's own namespace for its own
    applications). Sub-tenants share their tenant's share, so a tenant admin cannot multiply
    it by creating namespaces."""
    chain = ancestors(namespace)
    if pool in chain:
        index = chain.index(pool)
        return chain[index - 1] if index > 0 else pool
    return namespace


def _holders(pool: str, entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many of ``entries`` each tenant holds in ``pool``'s ledger."""
    counts: dict[str, int] = {}
    for entry in entries:
        parts = str(entry.get("application") or "").split("/", 2)
        who = holder(pool, parts[1] if len(parts) == 3 else "")
        counts[who] = counts.get(who, 0) + 1
    return counts


def _behind(pool: str) -> Decision:
    return errored(
        503,
        "ServiceUnavailable",
        "ledger-catching-up",
        f"tenant reservations: this replica has not yet seen every application the ledger of "
        f"pool {pool} accounted for; try again",
    )


def _too_large() -> Decision:
    return errored(
        400,
        "BadRequest",
        "invalid",
        f"tenant reservations: the request's ledger entry exceeds {MAX_ENTRY_BYTES} bytes",
    )


def _expired(entry: Mapping[str, Any], now: str) -> bool:
    expires = entry.get("expires")
    return not isinstance(expires, str) or len(expires) != len(now) or expires <= now


def _kind(entry: Mapping[str, Any]) -> str:
    return str(entry.get("application") or "").partition("/")[0]


def _released(status: Mapping[str, Any]) -> dict[str, int]:
    """The object's removal counts by kind (a hostile or missing value counts as none)."""
    counts = status.get("released")
    if not isinstance(counts, Mapping):
        return {}
    return {
        str(kind): count
        for kind, count in counts.items()
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0
    }


def _hold_of(entry: Obj, decision: Decision, pool: str) -> Hold:
    """The hold for an entry this replica writes, without parsing back what it formatted
    (an entry replacing previews holds more than the decision charged: it is parsed)."""
    kind, namespace, name = str(entry["application"]).split("/", 2)
    increase = dict(decision.charged_pools[pool])
    if entry["charge"] != rl.to_strings(increase):
        increase = _quantities(entry["charge"])
    return Hold(
        id=str(entry["id"]),
        key=(kind, namespace, name),
        namespace=pool,
        increase=increase,
        charge=dict(decision.expected or {}),
        preview=entry.get("dryRun") is True,
    )


def _key(request: AdmissionRequest) -> AppKey:
    return (request.kind, request.namespace, request.name)


def _decide_replacing(
    request: AdmissionRequest, state: ReservationState, policy: Policy
) -> Decision:
    """``decide``, without the holds of the object's own previews (the write replaces them)."""
    previews = state.pending.previews(_key(request))
    for hold in previews:
        state.pending.adjust(hold.namespace, rl.scale(hold.increase, Decimal(-1)))
    try:
        return decide(request, state, policy)
    finally:
        for hold in previews:  # undone exactly: a batch being written keeps its adjustments
            state.pending.adjust(hold.namespace, hold.increase)


def _previews(request: AdmissionRequest, entries: Iterable[Obj], taken: set[str]) -> list[str]:
    """The ids of the preview entries among ``entries`` that ``request`` replaces: dry-run
    entries of the same object (never a real one, never the request's own, never ``taken``)."""
    application = f"{request.kind}/{request.namespace}/{request.name}"
    return [
        str(entry["id"])
        for entry in entries
        if entry.get("dryRun") is True
        and entry.get("application") == application
        and entry.get("id") != request.uid
        and entry.get("id") not in taken
    ]


def _size(entry: Mapping[str, Any]) -> int:
    """An entry's size as JSON, closely over-estimated without serialising it."""
    size = 128  # the keys, quotes and punctuation of a full entry
    for value in entry.values():
        if isinstance(value, Mapping):
            size += sum(len(str(k)) + len(str(v)) + 6 for k, v in value.items())
        else:
            size += len(str(value))
    return size


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("application", "charge", "expected", "dryRun"))


def _with_after(hold: Hold, after: int) -> Hold:
    return Hold(
        id=hold.id,
        key=hold.key,
        namespace=hold.namespace,
        increase=hold.increase,
        charge=hold.charge,
        expires=hold.expires,
        after=after,
        preview=hold.preview,
    )


def _quantities(values: object) -> dict[str, Decimal]:
    if not isinstance(values, Mapping):
        return {}
    result = {}
    for key, value in values.items():
        with contextlib.suppress(Exception):
            result[str(key)] = parse_quantity(value)
    return result


def _version(obj: Mapping[str, Any]) -> int:
    return resource_version((obj.get("metadata") or {}).get("resourceVersion"))


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
    pending = [{k: v for k, v in e.items() if k != "revision"} for e in status.get("pending") or []]
    return {**status, "conditions": conditions, "pending": pending}

"""The live cluster state: reflectors feeding a reservation state.

Platform reflectors watch ApplicationDefinitions, KubeVirt instance types and the optional
preset ConfigMap, keeping of each object only what charges depend on (an event changing none of
it changes nothing). A change that matters rebuilds the :class:`Platform` (debounced) and
re-prices the applications already held, in the background and without listing them again; the
previous state keeps serving until the new one is complete, then the two are swapped at once.
An object that cannot be read never empties or reverts the platform: its last good version is
kept, or, with none, it is left out (preset-based charges then fail closed, never the built-in
figures); each such problem is reported (log, :attr:`LiveState.problems`, readiness, metrics).

Application reflectors, one per kind the definitions declare, feed the
:class:`ReservationState`; they start and stop as kinds come and go. A kind whose list fails
(``404``: a mistyped plural), or lists again for longer than a request's deadline, is
*unavailable*: its writes fail closed, the reason is reported, its list retried with backoff,
and every other kind keeps working. Tenants are the exception: without them no pool is known.
Of each application only its canonical spec and charge annotation are held (to re-price it).

This module holds readiness, the run loop and the application reflectors; beside it:
``platform_objects`` (what of each platform object is kept, and the platform built from it),
``platform_rebuilds`` (debounced rebuilds, the re-price), ``held_applications``, ``restamps``
(events changing none of it), ``consistent_reads`` (the barrier proving a quiet kind
complete), ``watch_repairs`` (what a watch lost), ``readiness`` (its answer, kept).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from webhook.core.admission.state import ReservationState
from webhook.core.pricing.platform import PRESETS_CONFIGMAP, Platform
from webhook.core.tenancy.applications import APPS_API_VERSION, resource_version
from webhook.core.tenancy.records import RecordKeys
from webhook.core.tenancy.tenants import TENANT_KIND
from webhook.kube.client import REQUEST_TIMEOUT, KubeClient, ResourceRef
from webhook.kube.reflector import Reflector
from webhook.state.consistent_reads import ConsistentReads
from webhook.state.held_applications import Held, held_application, held_from_object, settle_memory
from webhook.state.platform_objects import (
    CLUSTER_TYPES,
    CONFIGMAPS,
    DEFINITIONS,
    NAMESPACED_TYPES,
    STORES,
    reduce_configmap,
    reduce_definition,
    reduce_instance_type,
)
from webhook.state.platform_rebuilds import PlatformRebuilds
from webhook.state.readiness import (
    Readiness,
    WatchedReflector,
    first_to_go_silent,
    patience_ends,
    relisting_long,
    why_not_synced,
)
from webhook.state.restamps import Restamps
from webhook.waits import sleep_unless_stopped

__all__ = ["LiveSettings", "LiveState"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]
APPS_GROUP, APPS_VERSION = APPS_API_VERSION.split("/")


@dataclass(frozen=True)
class LiveSettings:
    namespace: str = "cozy-reservation"  # where the preset ConfigMap is looked for
    watch_timeout: int = 300  # the server closes a watch after this; it is reopened
    read_timeout: float = 90.0  # a watch silent this long (no event, no bookmark) is dead
    debounce: float = 0.2  # platform changes within this window rebuild once
    reprice_batch: int = 2000  # applications re-priced between yields to the event loop
    # Proving a quiet kind's state complete (see :meth:`LiveState.confirm`): how long a watch
    # gets to arrive by itself, the least time between two consistent reads of one kind, how
    # many reads one request for a revision makes at most, and how long a read waits for the
    # watch to deliver objects it shows.
    confirm_delay: float = 0.1
    confirm_interval: float = 0.5
    confirm_reads: int = 3
    confirm_wait: float = 2.0
    # Objects and bytes the consistent reads of one kind list a second at most, on average: a
    # read lists every object of the kind, and a tenant can make reads wanted at every interval:
    # 100,000 objects are read every 20 s, 124 MB (fat annotations) every 30 s, not twice a second.
    confirm_objects: float = 5_000.0
    confirm_bytes: float = 4 * 2**20
    repair_objects: int = 100  # fetched at most per read to repair a watch's losses
    resync_seconds: float = 300.0  # every kind read this often for them (0: only on demand)
    relist_patience: float = REQUEST_TIMEOUT  # a kind relisting stops all this long, then itself


@dataclass
class AppWatch:
    kind: str
    reflector: Reflector
    task: asyncio.Task[None]
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class LiveState(PlatformRebuilds, ConsistentReads, Restamps):
    """Keeps a :class:`ReservationState` in step with the cluster."""

    def __init__(
        self,
        client: KubeClient,
        settings: LiveSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        keys: RecordKeys | None = None,
    ) -> None:
        settings = settings or LiveSettings()
        self.client = client
        self.settings = settings
        self.clock = clock
        self.started = clock()
        self.first_sync_seconds: float | None = None
        self._readiness: Readiness | None = None  # the last walk's answer, while it holds
        self._init_platform_rebuilds()
        self._platform_reflectors = [
            self._platform_reflector("definitions", DEFINITIONS, reduce_definition),
            self._platform_reflector("cluster-types", CLUSTER_TYPES, reduce_instance_type),
            self._platform_reflector("namespaced-types", NAMESPACED_TYPES, reduce_instance_type),
            self._platform_reflector(
                "presets",
                CONFIGMAPS,
                reduce_configmap,
                namespace=settings.namespace,
                params={"fieldSelector": f"metadata.name={PRESETS_CONFIGMAP}"},
            ),
        ]
        self._apps: dict[str, AppWatch] = {}  # by plural
        self._held: dict[str, dict[tuple[str, str], Held]] = {}  # kind -> (ns, name) -> held
        self.keys = keys if keys is not None else RecordKeys.generate()
        self.state = self._new_state(Platform())
        self.platform_generation = 0
        self.reprices = 0
        self.problems: list[str] = []
        # More that must hold to be synced, by what it is (e.g. the ledger's own list).
        self.required: dict[str, Callable[[], bool]] = {}
        self._first_synced = False
        self._init_consistent_reads()

    def _new_state(self, platform: Platform) -> ReservationState:
        return ReservationState(
            platform,
            readiness=lambda: self.synced,
            unavailable=self.kind_unavailable,
            keys=self.keys,
        )

    def use_keys(self, keys: RecordKeys) -> None:
        """Verify and sign records with ``keys`` from now on (the record-key Secret changed)."""
        self.keys = keys
        self.state.keys = keys

    # -- readiness -----------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Whether admission may trust the state (a kind that cannot be listed aside).

        Asked on every read: the reflectors' part is the kept answer (see
        :mod:`webhook.state.readiness`), the required checks are asked each time."""
        if self.platform_generation == 0:
            return False
        if not self._readiness_now().reflectors_synced:
            return False
        return all(check() for check in self.required.values())

    def kind_unavailable(self, kind: str) -> str:
        """Why writes of ``kind`` cannot be decided now; empty when they can."""
        return self._readiness_now().unavailable.get(kind, "")

    def unavailable_kinds(self) -> dict[str, str]:
        """Kinds whose writes are denied, each with why."""
        return dict(self._readiness_now().unavailable)

    def _readiness_changed(self) -> None:
        """Something readiness reads changed: the next ask walks again."""
        self._readiness = None

    def _readiness_now(self) -> Readiness:
        kept = self._readiness
        if kept is not None and kept.current():
            return kept
        kept = self._walk_readiness()
        self._readiness = kept
        return kept

    def _walk_readiness(self) -> Readiness:
        """Every reflector asked once: whether they let the state be trusted, and why each
        unavailable kind is (by kind, in the order of each kind's first watch)."""
        watches = list(self._apps.values())
        synced = all(r.synced for r in self._platform_reflectors) and all(
            self._kind_excused(watch) for watch in watches
        )
        reasons: dict[str, str] = {}
        for watch in watches:  # a kind's first reason, among its watches, counts
            reasons[watch.kind] = reasons.get(watch.kind, "") or self._unavailable(watch)
        return Readiness(
            reflectors_synced=synced,
            unavailable={kind: reason for kind, reason in reasons.items() if reason},
            sentinels=first_to_go_silent(
                [*self._platform_reflectors, *(watch.reflector for watch in watches)]
            ),
            until=patience_ends([w.reflector for w in watches], self.settings.relist_patience),
        )

    def _kind_excused(self, watch: AppWatch) -> bool:
        """Whether this kind's reflector does not hold back the whole state."""
        reflector = watch.reflector
        if reflector.synced:
            return True
        if watch.kind == TENANT_KIND:
            return False  # without tenants no pool is known: nothing can be decided
        if reflector.list_error or relisting_long(reflector, self.settings.relist_patience):
            return True  # cannot be listed (in time): unavailable for that kind only
        # A kind that appeared after the first sync, listing for the first time, holds nothing
        # yet: it waits alone. One listed before counts in shared pools: stale, it stops all.
        return self._first_synced and reflector.first_sync_seconds is None

    def _unavailable(self, watch: AppWatch) -> str:
        """Why this watch's kind cannot be decided now; empty when it can."""
        reflector = watch.reflector
        if reflector.synced:
            return ""
        if reflector.list_error:
            return f"cannot be listed ({reflector.list_error})"
        if running := relisting_long(reflector, self.settings.relist_patience):
            return f"listing again for {running:.0f} s"
        if reflector.first_sync_seconds is None and self._first_synced:
            return "not listed yet"  # a kind that appeared after the first sync
        return ""

    def explain(self) -> tuple[list[str], list[str]]:
        """What keeps the state from being synced, and what only degrades it (one kind, one
        object), one line each: readiness's body."""
        blocking: list[str] = []
        if self.platform_generation == 0:
            blocking.append("platform: not built yet (waiting for its first lists)")
        for reflector in self._platform_reflectors:
            if not reflector.synced:
                blocking.append(f"{reflector.resource.plural}: {why_not_synced(reflector)}")
        for name, check in self.required.items():
            if not check():
                blocking.append(f"{name}: not synced")
        for plural, watch in sorted(self._apps.items()):
            if not self._kind_excused(watch):
                why = why_not_synced(watch.reflector)
                blocking.append(f"applications {plural} ({watch.kind}): {why}")
        degraded = [
            f"kind {kind}: {reason}; its writes are denied"
            for kind, reason in sorted(self.unavailable_kinds().items())
        ]
        degraded += [f"platform: {problem}" for problem in self.problems]
        if self._repricing is not None:
            degraded.append("platform change: re-pricing; the previous state serves meanwhile")
        return blocking, degraded

    def problem_counts(self) -> dict[str, int]:
        """Platform problems by the store they come from, for metrics."""
        counts = dict.fromkeys(STORES, 0)
        for problem in self.problems:
            store = problem.partition(":")[0]
            if store in counts:
                counts[store] += 1
        return counts

    def _note_first_sync(self) -> None:
        if self._first_synced or not self.synced:
            return
        self._first_synced = True
        self._readiness_changed()
        self.first_sync_seconds = self.clock() - self.started
        settle_memory(first=True)
        log.info(
            "state synced",
            extra={"fields": {"seconds": self.first_sync_seconds, "applications": len(self.state)}},
        )

    # -- running ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run every reflector until ``stop``. The state asks :attr:`synced` on every read."""
        tasks = [asyncio.create_task(r.run(stop)) for r in self._platform_reflectors]
        try:
            while not stop.is_set():
                if self.platform_generation == 0:
                    self._schedule_rebuild()  # the first build, once every list is in
                self._note_first_sync()
                self.resync_due(asyncio.get_running_loop().time())
                await sleep_unless_stopped(0.05, stop)
        finally:
            if self._repricing is not None:
                self._repricing.cancel()
            reads = [*self._confirming.values(), *self._resyncing.values()]
            for read in reads:
                read.cancel()
            for watch in list(self._apps.values()):
                watch.stop.set()
                watch.task.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(
                *tasks,
                *(w.task for w in self._apps.values()),
                *([self._repricing] if self._repricing is not None else []),
                *reads,
                return_exceptions=True,
            )
            self.state.synced = False

    # -- applications ----------------------------------------------------------------------

    def _sync_app_watches(self, platform: Platform, *, stop: bool = True) -> None:
        """Start a reflector for each new kind and (with ``stop``) stop those of kinds gone;
        leave the rest running."""
        wanted = {kind.plural: kind.kind for kind in platform.kinds.values()}
        for plural, watch in list(self._apps.items()):
            if stop and wanted.get(plural) != watch.kind:
                watch.stop.set()
                watch.task.cancel()
                del self._apps[plural]
                if watch.kind not in wanted.values():
                    self._held.pop(watch.kind, None)
        for plural, kind in wanted.items():
            if plural not in self._apps:
                reflector = self._app_reflector(ResourceRef(APPS_GROUP, APPS_VERSION, plural), kind)
                stopped = asyncio.Event()
                task = asyncio.create_task(reflector.run(stopped))
                self._apps[plural] = AppWatch(kind, reflector, task, stopped)
        self._readiness_changed()  # kinds came or went

    def _app_reflector(self, ref: ResourceRef, kind: str) -> Reflector:
        def replace_all(items: list[tuple[tuple[str, str], Held]]) -> None:
            before = self._held.get(kind, {})
            fresh = dict(items)
            self.forget_repairs(kind)
            self._held[kind] = fresh
            if self._dirty is not None:
                self._dirty.update((kind, ns, name) for ns, name in before.keys() | fresh.keys())
            state = self.state
            if state.platform.kind(kind) is None:
                return  # a kind the serving platform does not know yet: the re-price takes it
            stale = [
                key
                for key in [*(k for k, _ in state.records()), *state.unknown()]
                if key[0] == kind and (key[1], key[2]) not in fresh
            ]
            listed = resource_version(reflector.resource_version)
            for key in stale:
                state.forget(key, version=listed)
            for (namespace, name), held in fresh.items():
                state.observe(held_application(kind, namespace, name, held))

        def event(event_type: str, obj: Obj) -> None:
            if event_type != "DELETED" and self.restamped(kind, obj):
                return  # nothing the state reads changed (a label): see restamps
            reduced = held_from_object(kind, obj)
            if reduced is None:
                return
            (namespace, name), held = reduced
            if self.stale_event(kind, (namespace, name), held[2], event_type):
                return  # a repair ran ahead of the watch
            held_now = self._held.setdefault(kind, {})
            key = (kind, namespace, name)
            if self._dirty is not None:
                self._dirty.add(key)
            state = self.state
            known = state.platform.kind(kind) is not None
            if event_type == "DELETED":
                self.deleted(kind, (namespace, name), held[2])
                if known:
                    state.forget(key, version=held[2])
            else:
                held_now[(namespace, name)] = held
                if known:
                    state.observe(held_application(kind, namespace, name, held))

        reflector = WatchedReflector(
            self.client,
            ref,
            on_replace=replace_all,
            on_event=event,
            reduce=partial(held_from_object, kind),
            watch_timeout=self.settings.watch_timeout,
            read_timeout=self.settings.read_timeout,
            clock=self.clock,
            changed=self._readiness_changed,
            kept=lambda: self._readiness,
        )
        return reflector

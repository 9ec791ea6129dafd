"""Platform rebuilds: a change that matters rebuilds the platform and re-prices what is held.

Each platform reflector keeps its store of reduced objects; a change to one schedules a rebuild
(debounced: changes within :attr:`LiveSettings.debounce` rebuild once, and the first build waits
for every initial list). A rebuild whose inputs are unchanged only updates the problems
reported; otherwise the applications already held are re-priced into a new state, in the
background, yielding between batches and without listing them again, while the previous state
keeps serving; the two are then swapped at once. Part of :class:`LiveState`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from webhook.core.pricing.platform import Platform
from webhook.kube.client import KubeClient, ResourceRef
from webhook.kube.reflector import Reflector
from webhook.state.held_applications import Held, held_application, settle_memory
from webhook.state.platform_objects import STORES, build_platform, uid_of
from webhook.state.readiness import WatchedReflector

if TYPE_CHECKING:
    from webhook.core.admission.state import ReservationState
    from webhook.core.tenancy.applications import AppKey
    from webhook.state.live import LiveSettings

__all__ = ["PlatformRebuilds"]

log = logging.getLogger("webhook.state.live")  # the live state's log, whichever part writes
Obj = dict[str, Any]


class PlatformRebuilds:
    """The platform half of :class:`~webhook.state.live.LiveState` (a mixin)."""

    client: KubeClient
    settings: LiveSettings
    clock: Callable[[], float]
    state: ReservationState
    problems: list[str]
    platform_generation: int
    reprices: int
    _held: dict[str, dict[tuple[str, str], Held]]
    _platform_reflectors: list[Reflector]

    if TYPE_CHECKING:

        def _new_state(self, platform: Platform) -> ReservationState: ...

        def _sync_app_watches(self, platform: Platform, *, stop: bool = True) -> None: ...

        def _readiness_changed(self) -> None: ...

    def _init_platform_rebuilds(self) -> None:
        # Per store, uid -> the object reduced to what the platform depends on.
        self._objects: dict[str, dict[str, Obj]] = {store: {} for store in STORES}
        self._good: dict[tuple[str, str], Obj] = {}  # (store, uid) -> its last usable version
        self._inputs = ""  # what the current platform was built from (canonical JSON)
        self._rebuild_due: asyncio.TimerHandle | None = None
        self._repricing: asyncio.Task[None] | None = None
        self._dirty: set[AppKey] | None = None  # applications changed while re-pricing

    def _platform_reflector(
        self,
        store: str,
        ref: ResourceRef,
        reduce: Callable[[Obj], Obj],
        *,
        namespace: str = "",
        params: dict[str, str] | None = None,
    ) -> Reflector:
        def keyed(obj: Obj) -> tuple[str, Obj]:
            return uid_of(obj), reduce(obj)

        def replace_all(items: list[tuple[str, Obj]]) -> None:
            fresh = dict(items)
            if fresh != self._objects[store] or self.platform_generation == 0:
                self._objects[store] = fresh
                self._schedule_rebuild()

        def event(kind: str, obj: Obj) -> None:
            objects = self._objects[store]
            uid = uid_of(obj)
            if kind == "DELETED":
                if objects.pop(uid, None) is None:
                    return
            else:
                reduced = reduce(obj)
                if objects.get(uid) == reduced:
                    return  # nothing a charge depends on changed (a label, a status ...)
                objects[uid] = reduced
            self._schedule_rebuild()

        return WatchedReflector(
            self.client,
            ref,
            on_replace=replace_all,
            on_event=event,
            reduce=keyed,
            namespace=namespace,
            params=params,
            watch_timeout=self.settings.watch_timeout,
            read_timeout=self.settings.read_timeout,
            clock=self.clock,
            changed=self._readiness_changed,
        )

    def _schedule_rebuild(self) -> None:
        if not all(r.listed for r in self._platform_reflectors):
            return  # wait for every initial list: one build, not four
        if self._rebuild_due is not None:
            return
        loop = asyncio.get_running_loop()
        self._rebuild_due = loop.call_later(self.settings.debounce, self._rebuild)

    def _rebuild(self) -> None:
        self._rebuild_due = None
        platform, inputs = self._build()
        for problem in platform.problems:
            if problem not in self.problems:
                log.warning("platform object ignored", extra={"fields": {"reason": problem}})
        self.problems = list(platform.problems)
        if self.platform_generation > 0 and inputs == self._inputs:
            # Same content (an object broke and its last good version stands in): only the
            # report changes; nothing is re-priced.
            self.state.platform = replace(self.state.platform, problems=platform.problems)
            return
        self._inputs = inputs
        if self.platform_generation == 0:
            self.state = self._new_state(platform)
            self.platform_generation = 1
            self._sync_app_watches(platform)
            self._log_platform(platform)
            return
        if self._repricing is not None:
            self._repricing.cancel()  # a newer platform supersedes the one being priced
        self._sync_app_watches(platform, stop=False)  # new kinds list while the rest is priced
        self._dirty = set()
        self._repricing = asyncio.get_running_loop().create_task(self._reprice(platform))

    def _build(self) -> tuple[Platform, str]:
        return build_platform(self._objects, self._good)

    def _log_platform(self, platform: Platform) -> None:
        log.info(
            "platform loaded",
            extra={
                "fields": {
                    "kinds": len(platform.kinds),
                    "generation": self.platform_generation,
                    "problems": len(platform.problems),
                }
            },
        )

    async def _reprice(self, platform: Platform) -> None:
        """Price every held application against ``platform`` into a new state, yielding to
        the event loop between batches; then swap it in (the old one serves until then)."""
        started = time.perf_counter()
        fresh = self._new_state(platform)
        count = 0
        for kind in list(self._held):
            if platform.kind(kind) is None:
                continue
            for (namespace, name), held in list(self._held.get(kind, {}).items()):
                fresh.observe(held_application(kind, namespace, name, held))
                count += 1
                if count % self.settings.reprice_batch == 0:
                    await asyncio.sleep(0)
        # From here to the swap nothing awaits: readers see the old state or the new one.
        for key in self._dirty or ():
            kind, namespace, name = key
            found = self._held.get(kind, {}).get((namespace, name))
            if found is not None and platform.kind(kind) is not None:
                fresh.observe(held_application(kind, namespace, name, found))
            else:
                fresh.forget(key)
        self._dirty = None
        fresh.pending.carry_over(self.state.pending)
        fresh.carry_caps(self.state)
        fresh.carry_kept(self.state)
        self.state = fresh
        self._sync_app_watches(platform)  # kinds gone stop with the state that knew them
        self.platform_generation += 1
        self.reprices += 1
        self._repricing = None
        settle_memory(first=False)
        self._log_platform(platform)
        log.info(
            "applications re-priced",
            extra={
                "fields": {
                    "applications": count,
                    "seconds": round(time.perf_counter() - started, 3),
                }
            },
        )

"""The live cluster state: reflectors feeding a reservation state.

Platform reflectors watch ApplicationDefinitions, KubeVirt instance types (cluster and
namespaced) and the optional preset ConfigMap; each change rebuilds the :class:`Platform`
(debounced). Application reflectors, one per kind the definitions declare, watch the
``apps.cozystack.io`` API and feed the :class:`ReservationState`; they start and stop as
definitions come and go. A platform change re-lists the applications into a fresh state (a
recorded charge stays authoritative, so nothing is re-priced silently), carrying pending holds
over; until the new state has synced, admissions are denied as not synced.

Only charges, digests, budgets and the tree are kept, never whole application objects.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from webhook.core.applications import APPS_API_VERSION, application_from_object, resource_version
from webhook.core.errors import ReservationError
from webhook.core.platform import PRESETS_CONFIGMAP, Platform, PlatformBuilder
from webhook.core.state import ReservationState
from webhook.defaults import default_contracts, default_presets
from webhook.kube.client import KubeClient, ResourceRef
from webhook.kube.reflector import Reflector
from webhook.waits import sleep_unless_stopped

__all__ = ["LiveSettings", "LiveState"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]

DEFINITIONS = ResourceRef("cozystack.io", "v1alpha1", "applicationdefinitions", namespaced=False)
CLUSTER_TYPES = ResourceRef(
    "instancetype.kubevirt.io", "v1beta1", "virtualmachineclusterinstancetypes", namespaced=False
)
NAMESPACED_TYPES = ResourceRef("instancetype.kubevirt.io", "v1beta1", "virtualmachineinstancetypes")
CONFIGMAPS = ResourceRef("", "v1", "configmaps")
APPS_GROUP, APPS_VERSION = APPS_API_VERSION.split("/")


@dataclass(frozen=True)
class LiveSettings:
    namespace: str = "cozy-reservation"  # where the preset ConfigMap is looked for
    watch_timeout: int = 300  # the server closes a watch after this; it is reopened
    read_timeout: float = 90.0  # a watch silent this long (no event, no bookmark) is dead
    debounce: float = 0.2  # platform changes within this window rebuild once


class LiveState:
    """Keeps a :class:`ReservationState` in step with the cluster."""

    def __init__(
        self,
        client: KubeClient,
        settings: LiveSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = settings or LiveSettings()
        self.client = client
        self.settings = settings
        self.clock = clock
        self.started = clock()
        self.first_sync_seconds: float | None = None
        self._manifests: dict[str, dict[str, Obj]] = {
            "definitions": {},
            "cluster-types": {},
            "namespaced-types": {},
            "presets": {},
        }
        self._platform_reflectors = [
            self._platform_reflector("definitions", DEFINITIONS),
            self._platform_reflector("cluster-types", CLUSTER_TYPES),
            self._platform_reflector("namespaced-types", NAMESPACED_TYPES),
            self._platform_reflector(
                "presets",
                CONFIGMAPS,
                namespace=settings.namespace,
                params={"fieldSelector": f"metadata.name={PRESETS_CONFIGMAP}"},
            ),
        ]
        self._apps: dict[str, tuple[Reflector, asyncio.Task[None], asyncio.Event]] = {}
        self.state = ReservationState(Platform(), readiness=lambda: self.synced)
        self._rebuild_due: asyncio.TimerHandle | None = None
        self._stop = asyncio.Event()
        self.platform_generation = 0
        self.problems: list[str] = []
        self.required: list[Callable[[], bool]] = []  # more that must hold to be synced

    # -- readiness -----------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        reflectors = [*self._platform_reflectors, *(a[0] for a in self._apps.values())]
        return (
            self.platform_generation > 0
            and all(r.synced for r in reflectors)
            and all(check() for check in self.required)
        )

    def _note_first_sync(self) -> None:
        if self.first_sync_seconds is None and self.synced:
            self.first_sync_seconds = self.clock() - self.started
            log.info(
                "state synced",
                extra={
                    "fields": {"seconds": self.first_sync_seconds, "applications": len(self.state)}
                },
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
                await sleep_unless_stopped(0.05, stop)
        finally:
            for _, task, app_stop in list(self._apps.values()):
                app_stop.set()
                task.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(
                *tasks, *(a[1] for a in self._apps.values()), return_exceptions=True
            )
            self.state.synced = False

    # -- platform ----------------------------------------------------------------------------

    def _platform_reflector(
        self,
        store: str,
        ref: ResourceRef,
        *,
        namespace: str = "",
        params: dict[str, str] | None = None,
    ) -> Reflector:
        def replace(items: list[Obj]) -> None:
            self._manifests[store] = {_uid(item): item for item in items}
            self._schedule_rebuild()

        def event(kind: str, obj: Obj) -> None:
            if kind == "DELETED":
                self._manifests[store].pop(_uid(obj), None)
            else:
                self._manifests[store][_uid(obj)] = obj
            self._schedule_rebuild()

        return Reflector(
            self.client,
            ref,
            on_replace=replace,
            on_event=event,
            namespace=namespace,
            params=params,
            watch_timeout=self.settings.watch_timeout,
            read_timeout=self.settings.read_timeout,
            clock=self.clock,
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
        builder = PlatformBuilder(default_contracts(), default_presets())
        problems = []
        for store in ("definitions", "cluster-types", "namespaced-types", "presets"):
            for obj in self._manifests[store].values():
                source = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
                try:
                    builder.add(obj, source=source)
                except ReservationError as exc:
                    problems.append(str(exc))
        try:
            platform = builder.build()
        except ReservationError as exc:
            problems.append(str(exc))
            platform = Platform()
        for problem in problems:
            log.warning("platform object ignored", extra={"fields": {"reason": problem}})
        self.problems = problems
        previous = self.state
        self.state = ReservationState(platform, readiness=lambda: self.synced)
        self.state.pending.carry_over(previous.pending)
        self.platform_generation += 1
        self._restart_applications(platform)
        log.info(
            "platform loaded",
            extra={
                "fields": {"kinds": len(platform.kinds), "generation": self.platform_generation}
            },
        )

    # -- applications ----------------------------------------------------------------------

    def _restart_applications(self, platform: Platform) -> None:
        for plural, (_, task, app_stop) in list(self._apps.items()):
            app_stop.set()
            task.cancel()
            del self._apps[plural]
        for kind in platform.kinds.values():
            ref = ResourceRef(APPS_GROUP, APPS_VERSION, kind.plural)
            reflector = self._app_reflector(ref, kind.kind)
            app_stop = asyncio.Event()
            self._apps[kind.plural] = (
                reflector,
                asyncio.create_task(reflector.run(app_stop)),
                app_stop,
            )

    def _app_reflector(self, ref: ResourceRef, kind: str) -> Reflector:
        state = self.state

        def replace(items: list[Obj]) -> None:
            apps = []
            for item in items:
                try:
                    apps.append(application_from_object({**item, "kind": kind}))
                except ValueError as exc:
                    log.warning(
                        "application ignored", extra={"fields": {"kind": kind, "reason": str(exc)}}
                    )
            state.replace_kind(kind, apps, version=resource_version(reflector.resource_version))

        def event(event_type: str, obj: Obj) -> None:
            try:
                app = application_from_object({**obj, "kind": kind})
            except ValueError as exc:
                log.warning(
                    "application ignored", extra={"fields": {"kind": kind, "reason": str(exc)}}
                )
                return
            if event_type == "DELETED":
                state.forget(app.key, version=app.version)
            else:
                state.observe(app)

        reflector = Reflector(
            self.client,
            ref,
            on_replace=replace,
            on_event=event,
            watch_timeout=self.settings.watch_timeout,
            read_timeout=self.settings.read_timeout,
            clock=self.clock,
        )
        return reflector

    def observed_version(self, kind: str) -> int:
        """The revision up to which the state has seen every write of ``kind`` (0: none yet).

        A kind the platform does not know has no objects the state counts: every revision."""
        found = self.state.platform.kind(kind)
        if found is None:
            return sys.maxsize
        entry = self._apps.get(found.plural)
        if entry is None or not entry[0].listed:
            return 0
        return resource_version(entry[0].resource_version)


def _uid(obj: Obj) -> str:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace', '')}/{metadata.get('name')}")

"""The live cluster state: reflectors feeding a reservation state.

Platform reflectors watch ApplicationDefinitions, KubeVirt instance types (cluster and
namespaced) and the optional preset ConfigMap. Of each object only what charges depend on is
kept (a definition's kind, plural, schema, contract and release prefix; an instance type's guest
CPU, memory and GPUs; the preset table), and an event that changes none of it (a label, a
status) changes nothing. A change that matters rebuilds the :class:`Platform` (debounced) and
re-prices the applications already held, in the background and without listing them again; the
previous state keeps serving until the new one is complete, then the two are swapped at once.

An object that cannot be read (a definition without kind or plural, a malformed instance type,
a garbage preset table) never empties or reverts the platform: its last good version is kept,
or, with none, it is left out (the preset table: preset-based charges fail closed, never the
built-in figures); each such problem is reported (log, :attr:`LiveState.problems`, readiness
details, metrics and the report).

Application reflectors, one per kind the definitions declare, feed the
:class:`ReservationState`; they start and stop as kinds come and go. A kind whose list fails
(``404``: not served yet, or a mistyped plural) is *unavailable*: its writes fail closed, the
reason (with the URL) is reported, its list is retried with backoff, and every other kind keeps
working. Tenants are the exception: without them no pool is known, so they stop admission.

Of each application only its canonical spec and charge annotation are held (enough to re-price
it), reduced from each list page as it arrives; never whole objects.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from webhook.core.admission.state import ReservationState
from webhook.core.base.errors import ManifestError, ReservationError
from webhook.core.pricing.kinds import kind_from_definition
from webhook.core.pricing.platform import PRESETS_CONFIGMAP, PRESETS_KEY, Platform, PlatformBuilder
from webhook.core.tenancy.applications import (
    APPS_API_VERSION,
    CHARGE_ANNOTATION,
    AppKey,
    Application,
    parse_recorded_charge,
    resource_version,
)
from webhook.core.tenancy.records import RecordKeys
from webhook.core.tenancy.tenants import TENANT_KIND
from webhook.defaults import default_contracts, default_presets
from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.kube.reflector import Reflector, consistent_read
from webhook.waits import sleep_unless_stopped

__all__ = ["LiveSettings", "LiveState"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]
# An application's canonical spec (JSON), charge annotation, and resourceVersion (which orders
# observations for the ledger: only one newer than an admission settles its entry).
Held = tuple[str, str | None, int]

DEFINITIONS = ResourceRef("cozystack.io", "v1alpha1", "applicationdefinitions", namespaced=False)
CLUSTER_TYPES = ResourceRef(
    "instancetype.kubevirt.io", "v1beta1", "virtualmachineclusterinstancetypes", namespaced=False
)
NAMESPACED_TYPES = ResourceRef("instancetype.kubevirt.io", "v1beta1", "virtualmachineinstancetypes")
CONFIGMAPS = ResourceRef("", "v1", "configmaps")
# How cozystack-api stores applications (pkg/apis/apps/v1alpha1/types.go): a HelmRelease
# labelled with the application's kind and name.
HELM_RELEASES = ResourceRef("helm.toolkit.fluxcd.io", "v2", "helmreleases")
RELEASE_KIND_LABEL: Final = "apps.cozystack.io/application.kind"
RELEASE_NAME_LABEL: Final = "apps.cozystack.io/application.name"
RELEASE_GROUP: Final = "apps.cozystack.io/application.group=apps.cozystack.io"
APPS_GROUP, APPS_VERSION = APPS_API_VERSION.split("/")
STORES: Final = ("definitions", "cluster-types", "namespaced-types", "presets")
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


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
    # Objects the consistent reads of one kind list per second at most, on average: a read
    # lists every object of the kind in the cluster, and a tenant can make reads wanted at
    # every interval, so a kind of 100,000 objects is read every 20 s, not twice a second.
    confirm_objects: float = 5_000.0


@dataclass
class _AppWatch:
    kind: str
    reflector: Reflector
    task: asyncio.Task[None]
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class LiveState:
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
        # Per store, uid -> the object reduced to what the platform depends on.
        self._objects: dict[str, dict[str, Obj]] = {store: {} for store in STORES}
        self._good: dict[tuple[str, str], Obj] = {}  # (store, uid) -> its last usable version
        self._inputs = ""  # what the current platform was built from (canonical JSON)
        self._platform_reflectors = [
            self._platform_reflector("definitions", DEFINITIONS, _reduce_definition),
            self._platform_reflector("cluster-types", CLUSTER_TYPES, _reduce_instance_type),
            self._platform_reflector("namespaced-types", NAMESPACED_TYPES, _reduce_instance_type),
            self._platform_reflector(
                "presets",
                CONFIGMAPS,
                _reduce_configmap,
                namespace=settings.namespace,
                params={"fieldSelector": f"metadata.name={PRESETS_CONFIGMAP}"},
            ),
        ]
        self._apps: dict[str, _AppWatch] = {}  # by plural
        self._held: dict[str, dict[tuple[str, str], Held]] = {}  # kind -> (ns, name) -> held
        self.keys = keys if keys is not None else RecordKeys.generate()
        self.state = self._new_state(Platform())
        self._rebuild_due: asyncio.TimerHandle | None = None
        self._repricing: asyncio.Task[None] | None = None
        self._dirty: set[AppKey] | None = None  # applications changed while re-pricing
        self.platform_generation = 0
        self.reprices = 0
        self.problems: list[str] = []
        # More that must hold to be synced, by what it is (e.g. the ledger's own list).
        self.required: dict[str, Callable[[], bool]] = {}
        self._first_synced = False
        # kind -> a revision up to which a consistent read proved the state complete, the
        # revision asked for, and the confirmation under way.
        self._confirmed: dict[str, int] = {}
        self._wanted: dict[str, int] = {}
        self._confirming: dict[str, asyncio.Task[None]] = {}
        self._last_read: dict[str, float] = {}  # kind -> when its last consistent read began
        self._last_items: dict[str, int] = {}  # kind -> how many objects that read listed
        self._releases_readable = True  # until a HelmRelease list is refused or not served
        self.consistent_reads = 0

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
        """Whether admission may trust the state (a kind that cannot be listed aside)."""
        if self.platform_generation == 0:
            return False
        if not all(r.synced for r in self._platform_reflectors):
            return False
        if not all(check() for check in self.required.values()):
            return False
        return all(self._kind_excused(watch) for watch in self._apps.values())

    def _kind_excused(self, watch: _AppWatch) -> bool:
        """Whether this kind's reflector does not hold back the whole state."""
        reflector = watch.reflector
        if reflector.synced:
            return True
        if watch.kind == TENANT_KIND:
            return False  # without tenants no pool is known: nothing can be decided
        if reflector.list_error:
            return True  # cannot be listed: unavailable for that kind only
        # A kind that appeared after the first sync and is listing for the first time holds
        # nothing yet; it waits alone. A kind listed before counts in shared pools: stale, it
        # stops admission.
        return self._first_synced and reflector.first_sync_seconds is None

    def kind_unavailable(self, kind: str) -> str:
        """Why writes of ``kind`` cannot be decided now; empty when they can."""
        for watch in self._apps.values():
            if watch.kind != kind or watch.reflector.synced:
                continue
            reflector = watch.reflector
            if reflector.list_error:
                return f"cannot be listed ({reflector.list_error})"
            if reflector.first_sync_seconds is None and self._first_synced:
                return "not listed yet"  # a kind that appeared after the first sync
        return ""

    def unavailable_kinds(self) -> dict[str, str]:
        """Kinds whose writes are denied, each with why."""
        found = {}
        for watch in self._apps.values():
            reason = self.kind_unavailable(watch.kind)
            if reason:
                found[watch.kind] = reason
        return found

    def explain(self) -> tuple[list[str], list[str]]:
        """What keeps the state from being synced, and what only degrades it (one kind, one
        object), one line each: readiness's body."""
        blocking: list[str] = []
        if self.platform_generation == 0:
            blocking.append("platform: not built yet (waiting for its first lists)")
        for reflector in self._platform_reflectors:
            if not reflector.synced:
                blocking.append(f"{reflector.resource.plural}: {_why(reflector)}")
        for name, check in self.required.items():
            if not check():
                blocking.append(f"{name}: not synced")
        for plural, watch in sorted(self._apps.items()):
            if not self._kind_excused(watch):
                blocking.append(f"applications {plural} ({watch.kind}): {_why(watch.reflector)}")
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
        self.first_sync_seconds = self.clock() - self.started
        _settle_memory(first=True)
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
                await sleep_unless_stopped(0.05, stop)
        finally:
            if self._repricing is not None:
                self._repricing.cancel()
            for confirming in list(self._confirming.values()):
                confirming.cancel()
            for watch in list(self._apps.values()):
                watch.stop.set()
                watch.task.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(
                *tasks,
                *(w.task for w in self._apps.values()),
                *([self._repricing] if self._repricing is not None else []),
                return_exceptions=True,
            )
            self.state.synced = False

    # -- platform ----------------------------------------------------------------------------

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
            return _uid(obj), reduce(obj)

        def replace_all(items: list[tuple[str, Obj]]) -> None:
            fresh = dict(items)
            if fresh != self._objects[store] or self.platform_generation == 0:
                self._objects[store] = fresh
                self._schedule_rebuild()

        def event(kind: str, obj: Obj) -> None:
            objects = self._objects[store]
            uid = _uid(obj)
            if kind == "DELETED":
                if objects.pop(uid, None) is None:
                    return
            else:
                reduced = reduce(obj)
                if objects.get(uid) == reduced:
                    return  # nothing a charge depends on changed (a label, a status ...)
                objects[uid] = reduced
            self._schedule_rebuild()

        return Reflector(
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
        """The platform from the objects held (bad ones replaced by their last good version, or
        left out), and the canonical text of what it was built from."""
        builder = PlatformBuilder(default_contracts(), default_presets())
        problems: list[str] = []
        used: list[tuple[str, str, Obj]] = []
        present = set()
        for store in STORES:
            for uid, obj in sorted(self._objects[store].items()):
                present.add((store, uid))
                source = _source(obj)
                reason = _unusable(store, obj, source)
                if not reason:
                    self._good[(store, uid)] = obj
                    used.append((store, uid, obj))
                    continue
                good = self._good.get((store, uid))
                if good is not None:
                    problems.append(f"{store}: {reason}; its last good version is kept")
                    used.append((store, uid, good))
                elif store == "presets":
                    problems.append(
                        f"{store}: {reason}; no good table was seen, so charges that need a "
                        "preset fail closed (the built-in table is not used)"
                    )
                    builder.presets = {}
                else:
                    problems.append(f"{store}: {reason}; left out")
        for key in [k for k in self._good if k not in present]:
            del self._good[key]  # deleted objects have no last good version to fall back on
        for _, uid, obj in used:
            try:
                builder.add(obj, source=_source(obj))
            except ReservationError as exc:  # checked above; never expected
                problems.append(f"{uid}: {exc}")
        kinds = builder.kinds(skipped=problems)
        platform = Platform(kinds, builder.catalog(), tuple(problems))
        inputs = _CANONICAL.encode([[store, uid, obj] for store, uid, obj in used])
        if builder.presets == {}:
            inputs += "|presets-broken"
        return platform, inputs

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
                fresh.observe(_application(kind, namespace, name, held))
                count += 1
                if count % self.settings.reprice_batch == 0:
                    await asyncio.sleep(0)
        # From here to the swap nothing awaits: readers see the old state or the new one.
        for key in self._dirty or ():
            kind, namespace, name = key
            found = self._held.get(kind, {}).get((namespace, name))
            if found is not None and platform.kind(kind) is not None:
                fresh.observe(_application(kind, namespace, name, found))
            else:
                fresh.forget(key)
        self._dirty = None
        fresh.pending.carry_over(self.state.pending)
        fresh.carry_caps(self.state)
        self.state = fresh
        self._sync_app_watches(platform)  # kinds gone stop with the state that knew them
        self.platform_generation += 1
        self.reprices += 1
        self._repricing = None
        _settle_memory(first=False)
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
                self._apps[plural] = _AppWatch(kind, reflector, task, stopped)

    def _app_reflector(self, ref: ResourceRef, kind: str) -> Reflector:
        def reduce(obj: Obj) -> tuple[tuple[str, str], Held] | None:
            return _held_from_object(kind, obj)

        def replace_all(items: list[tuple[tuple[str, str], Held]]) -> None:
            before = self._held.get(kind, {})
            fresh = dict(items)
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
                state.observe(_application(kind, namespace, name, held))

        def event(event_type: str, obj: Obj) -> None:
            reduced = _held_from_object(kind, obj)
            if reduced is None:
                return
            (namespace, name), held = reduced
            held_now = self._held.setdefault(kind, {})
            key = (kind, namespace, name)
            if self._dirty is not None:
                self._dirty.add(key)
            state = self.state
            known = state.platform.kind(kind) is not None
            if event_type == "DELETED":
                held_now.pop((namespace, name), None)
                if known:
                    state.forget(key, version=held[2])
            else:
                held_now[(namespace, name)] = held
                if known:
                    state.observe(_application(kind, namespace, name, held))

        reflector = Reflector(
            self.client,
            ref,
            on_replace=replace_all,
            on_event=event,
            reduce=reduce,
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
        watch = self._apps.get(found.plural)
        if watch is None or not watch.reflector.listed:
            return 0
        watched = resource_version(watch.reflector.resource_version)
        return max(watched, self._confirmed.get(kind, 0))

    # -- barriers that never wait on a quiet watch -----------------------------------------

    async def _read_kind(self, kind: str, reflector: Reflector) -> tuple[str, list[Any]]:
        """Every object of ``kind`` as its key and resourceVersion, read consistently.

        cozystack-api answers lists of applications from its own cache, at the largest
        resourceVersion among the items (``0`` for none), not at the current revision; the
        HelmReleases it stores them as are read from kube-apiserver, whose list is at the
        current revision. So those are read, selected by the kind label cozystack-api sets;
        where they cannot be (403 without the RBAC rule, 404 with no such resource) the
        applications are, and their list proves only up to the version it reports."""
        if self._releases_readable:
            try:
                return await consistent_read(
                    self.client,
                    HELM_RELEASES,
                    _release_version_of,
                    params={"labelSelector": f"{RELEASE_KIND_LABEL}={kind},{RELEASE_GROUP}"},
                )
            except ApiError as exc:
                if exc.status not in (403, 404):
                    raise
                self._releases_readable = False
                log.warning(
                    "helmreleases cannot be listed; consistent reads use the applications",
                    extra={"fields": {"error": str(exc)}},
                )
        return await reflector.read(_version_of)

    def confirm(self, kind: str, revision: int) -> None:
        """Make :meth:`observed_version` of ``kind`` reach ``revision`` soon, whether or not
        anybody writes that kind: the ledger waits on it, and a kind nobody writes moves its
        watch only at its next event or bookmark (cozystack-api may send none).

        If the watch has not got there by itself after :attr:`LiveSettings.confirm_delay`, a
        consistent read of the kind (a list at the API server's current revision ``R``) is
        compared with what the state holds: once every object it shows is held at that
        version or newer (waiting, bounded, for the watch to deliver those it has not yet:
        their events exist, so this waits on nothing but the watch itself), the state has
        seen every write of the kind up to ``R``. An object deleted since is still held, so
        the state can only count too much, never too little. One confirmation per kind runs
        at a time, at most :attr:`LiveSettings.confirm_reads` reads spaced by
        :attr:`LiveSettings.confirm_interval`, or longer as the kind's last read listed more
        objects (:attr:`LiveSettings.confirm_objects`); never called from a request it would
        delay beyond the ledger's own bounded wait.
        """
        if self.observed_version(kind) >= revision:
            return
        self._wanted[kind] = max(self._wanted.get(kind, 0), revision)
        if kind not in self._confirming:
            task = asyncio.get_running_loop().create_task(self._confirm(kind))
            self._confirming[kind] = task

    async def _confirm(self, kind: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(self.settings.confirm_delay)
            for _ in range(self.settings.confirm_reads):
                # Reads of one kind are spaced, across confirmations too: at most one per
                # interval, and fewer as the kind has more objects to list (at most
                # ``confirm_objects`` a second), whatever a tenant's writes ask for.
                last = self._last_read.get(kind)
                if last is not None:
                    gap = max(
                        self.settings.confirm_interval,
                        self._last_items.get(kind, 0) / self.settings.confirm_objects,
                    )
                    await asyncio.sleep(max(0.0, last + gap - loop.time()))
                if self.observed_version(kind) >= self._wanted.get(kind, 0):
                    break
                self._last_read[kind] = loop.time()
                await self._consistent_read(kind)
        except Exception as exc:  # the watch still gets there; the next confirmation retries
            log.warning(
                "consistent read failed", extra={"fields": {"kind": kind, "error": str(exc)}}
            )
        finally:
            del self._confirming[kind]
            if self.observed_version(kind) >= self._wanted.get(kind, 0):
                self._wanted.pop(kind, None)

    async def _consistent_read(self, kind: str) -> None:
        found = self.state.platform.kind(kind)
        plural = found.plural if found is not None else ""
        watch = self._apps.get(plural)
        if watch is None or not watch.reflector.listed:
            return
        reflector = watch.reflector
        self.consistent_reads += 1
        listed, items = await self._read_kind(kind, reflector)
        self._last_items[kind] = len(items)
        revision = resource_version(listed)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.confirm_wait
        while True:
            watched = resource_version(reflector.resource_version)
            held = self._held.get(kind, {})
            behind = [
                (key, version)
                for key, version in items
                if version > watched and (key not in held or held[key][2] < version)
            ]
            if not behind:
                if self._apps.get(plural) is watch:  # not a reflector replaced meanwhile
                    self._confirmed[kind] = max(self._confirmed.get(kind, 0), revision)
                return
            if loop.time() >= deadline:
                return
            await asyncio.sleep(0.02)


def _why(reflector: Reflector) -> str:
    if reflector.list_error:
        return f"cannot be listed ({reflector.list_error}); retrying with backoff"
    if not reflector.listed:
        return "not listed yet"
    if reflector.last_error:
        return f"watch not live ({reflector.last_error})"
    return "watch silent past its read timeout"


def _settle_memory(*, first: bool) -> None:
    """Move the long-lived state out of the garbage collector's way.

    A full collection walks every tracked object: with 200,000 applications it pauses for
    tens of milliseconds, behind the admission tail. Once the state is built, frozen objects
    are skipped. After a swap the old state's objects are unfrozen first, so what is garbage
    among them is collected once.
    """
    if not first:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


def _held_from_object(kind: str, obj: Obj) -> tuple[tuple[str, str], Held] | None:
    """What the state needs from an application object (its spec and charge annotation);
    ``None``, logged, for one that names no application."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        reason = "metadata: missing"
    else:
        name, namespace = metadata.get("name"), metadata.get("namespace")
        if not isinstance(name, str) or not name:
            reason = "metadata.name: missing"
        elif not isinstance(namespace, str) or not namespace:
            reason = "metadata.namespace: missing"
        else:
            annotations = metadata.get("annotations")
            note = annotations.get(CHARGE_ANNOTATION) if isinstance(annotations, Mapping) else None
            spec = sys.intern(_CANONICAL.encode(obj.get("spec")))
            recorded = sys.intern(note) if isinstance(note, str) else None
            version = resource_version(metadata.get("resourceVersion"))
            return (sys.intern(namespace), name), (spec, recorded, version)
    log.warning("application ignored", extra={"fields": {"kind": kind, "reason": reason}})
    return None


def _release_version_of(obj: Obj) -> tuple[tuple[str, str], int] | None:
    """A HelmRelease of a consistent read, as its application's key and resourceVersion
    (cozystack-api serves the application at the HelmRelease's resourceVersion)."""
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    if not isinstance(metadata, Mapping) or not isinstance(labels, Mapping):
        return None
    name, namespace = labels.get(RELEASE_NAME_LABEL), metadata.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        return None
    return (namespace, name), resource_version(metadata.get("resourceVersion"))


def _version_of(obj: Obj) -> tuple[tuple[str, str], int] | None:
    """An object of a consistent read, as its key and resourceVersion."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        return None
    return (namespace, name), resource_version(metadata.get("resourceVersion"))


def _application(kind: str, namespace: str, name: str, held: Held) -> Application:
    spec, recorded, version = held
    return Application(
        kind, namespace, name, json.loads(spec), parse_recorded_charge(recorded), version=version
    )


def _unusable(store: str, obj: Obj, source: str) -> str:
    """Why ``obj`` cannot go into a platform; empty when it can."""
    try:
        if store == "definitions":
            kind_from_definition(obj, {}, source=source)
        else:
            PlatformBuilder({}, {}).add(obj, source=source)
    except ValueError as exc:
        return str(ManifestError(source, _name(obj), str(exc)))
    except ReservationError as exc:
        return str(exc)
    return ""


def _reduce_definition(obj: Obj) -> Obj:
    """An ApplicationDefinition as far as charges go: kind, plural, schema, contract, prefix."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return _reduced(obj, spec, "spec")  # kept as it is, to be reported
    kept: Obj = {key: spec[key] for key in ("application", "reservation") if key in spec}
    release = spec.get("release")
    if isinstance(release, Mapping) and "prefix" in release:
        kept["release"] = {"prefix": release["prefix"]}
    return _reduced(obj, kept, "spec")


def _reduce_instance_type(obj: Obj) -> Obj:
    """An instance type as far as charges go: guest CPU and memory, GPU device names."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return _reduced(obj, spec, "spec")
    kept: Obj = {}
    for key in ("cpu", "memory"):
        if key in spec:
            section = spec[key]
            kept[key] = {"guest": section.get("guest")} if isinstance(section, Mapping) else section
    if "gpus" in spec:
        gpus = spec["gpus"]
        kept["gpus"] = (
            [{"deviceName": g.get("deviceName")} if isinstance(g, Mapping) else g for g in gpus]
            if isinstance(gpus, list)
            else gpus
        )
    return _reduced(obj, kept, "spec")


def _reduce_configmap(obj: Obj) -> Obj:
    data = obj.get("data")
    kept: Any = {PRESETS_KEY: data.get(PRESETS_KEY)} if isinstance(data, Mapping) else data
    return _reduced(obj, kept, "data")


def _reduced(obj: Obj, kept: Any, section: str) -> Obj:
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {k: metadata[k] for k in ("name", "namespace") if k in metadata},
        section: kept,
    }


def _source(obj: Obj) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    where = f"{namespace}/" if namespace else ""
    return f"{obj.get('kind')} {where}{metadata.get('name')}"


def _name(obj: Obj) -> str:
    metadata = obj.get("metadata")
    return str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""


def _uid(obj: Obj) -> str:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace', '')}/{metadata.get('name')}")

"""Barriers that never wait on a quiet watch: consistent reads prove a kind's state complete.

The ledger waits until the live state has seen every write of a kind up to a revision, and a
kind nobody writes moves its watch only at its next event or bookmark (cozystack-api may send
none). :meth:`ConsistentReads.confirm` gets there without the watch: a list at the API server's
current revision (of the HelmReleases cozystack-api stores applications as, or of the
applications where those cannot be read) compared with what the state holds, spaced and
bounded per kind whatever a tenant's writes ask for. Part of :class:`LiveState`, whose
reflectors and held applications it reads.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from webhook.core.tenancy.applications import (
    NAME_LABEL,
    AppKey,
    Mislabel,
    mislabel,
    resource_version,
)
from webhook.kube.client import METADATA_ONLY, ApiError, KubeClient, ResourceRef
from webhook.kube.pages import PageSizes, consistent_read
from webhook.kube.reflector import Reflector
from webhook.state.watch_repairs import WatchRepairs

if TYPE_CHECKING:
    from webhook.core.admission.state import ReservationState
    from webhook.state.held_applications import Held
    from webhook.state.live import AppWatch, LiveSettings

__all__ = ["HELM_RELEASES", "ConsistentReads"]

log = logging.getLogger("webhook.state.live")  # the live state's log, whichever part writes
Obj = dict[str, Any]

# How cozystack-api stores applications (pkg/apis/apps/v1alpha1/types.go): a HelmRelease
# labelled with the application's kind and name.
HELM_RELEASES = ResourceRef("helm.toolkit.fluxcd.io", "v2", "helmreleases")
RELEASE_KIND_LABEL: Final = "apps.cozystack.io/application.kind"
RELEASE_GROUP: Final = "apps.cozystack.io/application.group=apps.cozystack.io"
# The most HelmReleases labelled with another application's name one read keeps, per kind:
# each is a race of cozystack-api's creates, a handful in practice; the bound keeps the state's
# note of them small whatever is stored.
MAX_MISLABELLED: Final = 1000


class ConsistentReads(WatchRepairs):
    """The consistent-read barrier of :class:`~webhook.state.live.LiveState` (a mixin)."""

    client: KubeClient
    settings: LiveSettings
    state: ReservationState
    _apps: dict[str, AppWatch]
    _held: dict[str, dict[tuple[str, str], Held]]

    def _init_consistent_reads(self) -> None:
        # kind -> a revision up to which a consistent read proved the state complete, the
        # revision asked for, and the confirmation under way.
        self._confirmed: dict[str, int] = {}
        self._wanted: dict[str, int] = {}
        self._confirming: dict[str, asyncio.Task[None]] = {}
        self._last_read: dict[str, float] = {}  # kind -> when its last consistent read began
        self._last_items: dict[str, int] = {}  # kind -> how many objects that read listed
        self._last_bytes: dict[str, int] = {}  # kind -> how many bytes it listed
        self._release_pages: dict[str, PageSizes] = {}  # kind -> its HelmRelease pages' sizes
        self._read_pages: dict[str, PageSizes] = {}  # kind -> its application reads' pages
        self._releases_readable = True  # until a HelmRelease list is refused or not served
        self.consistent_reads = 0
        self._init_watch_repairs()

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

    async def _read_kind(self, kind: str, reflector: Reflector) -> tuple[str, list[Any]]:
        """Every object of ``kind`` as its key and resourceVersion, read consistently.

        cozystack-api answers lists of applications from its own cache, at the largest
        resourceVersion among the items (``0`` for none), not at the current revision; the
        HelmReleases it stores them as are read from kube-apiserver, whose list is at the
        current revision. So those are read, selected by the kind label cozystack-api sets;
        where they cannot be (403 without the RBAC rule, 404 with no such resource) the
        applications are, and their list proves only up to the version it reports."""
        if self._releases_readable:
            found = self.state.platform.kind(kind)
            prefix = found.release_prefix if found is not None else ""
            pages = self._release_pages.setdefault(kind, PageSizes())
            wrong: dict[AppKey, Mislabel] = {}

            def reduce(obj: Obj) -> tuple[tuple[str, str], int] | None:
                reduced = release_version_of(obj, prefix)
                if reduced is not None and len(wrong) < MAX_MISLABELLED:
                    (namespace, name), _ = reduced
                    labels = obj["metadata"].get("labels")
                    label = labels.get(NAME_LABEL) if isinstance(labels, Mapping) else None
                    mislabelled = mislabel(obj["metadata"]["name"], label, prefix)
                    if mislabelled is not None:
                        wrong[(kind, namespace, name)] = mislabelled
                return reduced

            try:
                read = await consistent_read(
                    self.client,
                    HELM_RELEASES,
                    reduce,
                    accept=METADATA_ONLY,  # a release's values can be large; its name is not
                    params={"labelSelector": f"{RELEASE_KIND_LABEL}={kind},{RELEASE_GROUP}"},
                    pages=pages,
                )
            except ApiError as exc:
                if exc.status not in (403, 404):
                    raise
                self._releases_readable = False
                log.warning(
                    "helmreleases cannot be listed; consistent reads use the applications",
                    extra={"fields": {"error": str(exc)}},
                )
            else:
                self._last_bytes[kind] = pages.listed_bytes
                # Named in the reports, for an operator to remove: cozystack-api serves and
                # the webhook charges each, but its DELETE answers 404 (its label disagrees).
                self.state.set_mislabelled(kind, wrong)
                return read
        pages = self._read_pages.setdefault(kind, PageSizes())  # apart from the lists' own
        read = await reflector.read(version_of, pages=pages)
        self._last_bytes[kind] = pages.listed_bytes
        return read

    def read_gap(self, kind: str) -> float:
        """The least time between two consistent reads of ``kind``: the interval, or longer as
        its last read listed more objects or more bytes than the reads may list in that time
        (:attr:`LiveSettings.confirm_objects`, :attr:`LiveSettings.confirm_bytes`)."""
        return max(
            self.settings.confirm_interval,
            self._last_items.get(kind, 0) / self.settings.confirm_objects,
            self._last_bytes.get(kind, 0) / self.settings.confirm_bytes,
        )

    def confirm(self, kind: str, revision: int) -> None:
        """Make :meth:`observed_version` of ``kind`` reach ``revision`` soon, whether or not
        anybody writes that kind: the ledger waits on it, and a kind nobody writes moves its
        watch only at its next event or bookmark (cozystack-api may send none).

        If the watch has not got there by itself after :attr:`LiveSettings.confirm_delay`, a
        consistent read of the kind (a list at the API server's current revision ``R``) is
        compared with what the state holds: once every object it shows is held at that
        version or newer, and none it no longer shows is held from before ``R`` (waiting,
        bounded, for the watch to deliver them: their events exist), the state has seen every
        write of the kind up to ``R``. What the watch still has not delivered then, it lost:
        it is fetched and put right (:mod:`webhook.state.watch_repairs`). One confirmation per
        kind runs
        at a time, at most :attr:`LiveSettings.confirm_reads` reads spaced by
        :attr:`LiveSettings.confirm_interval`, or longer as the kind's last read listed more
        objects or bytes (:meth:`read_gap`); never called from a request it would delay
        beyond the ledger's own bounded wait.
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
                # interval, and fewer as the kind has more objects or bytes to list (at most
                # ``confirm_objects`` and ``confirm_bytes`` a second), whatever a tenant's
                # writes ask for.
                last = self._last_read.get(kind)
                if last is not None:
                    await asyncio.sleep(max(0.0, last + self.read_gap(kind) - loop.time()))
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
        lists = self.lists_of(kind)  # a fresh list during the read or its repairs stops them
        listed, items = await self._read_kind(kind, reflector)
        self._last_items[kind] = len(items)
        revision = resource_version(listed)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.confirm_wait
        behind, gone = self.lost(kind, items, revision)
        del items
        while (behind or gone) and loop.time() < deadline:
            await asyncio.sleep(0.02)  # their events exist: give the watch time to deliver
            behind, gone = self.still_lost(kind, behind, gone, revision)
        if behind or gone:
            # The watch had its time and did not deliver them: it lost them. Put them right.
            await self.repair(kind, watch, [*behind, *gone], revision, set(behind), lists)
            behind, gone = self.still_lost(kind, behind, gone, revision)
        if not behind and not gone and self._apps.get(plural) is watch:
            self._confirmed[kind] = max(self._confirmed.get(kind, 0), revision)


def release_version_of(obj: Obj, prefix: str = "") -> tuple[tuple[str, str], int] | None:
    """A HelmRelease of a consistent read, as its application's key and resourceVersion
    (cozystack-api serves the application at the HelmRelease's resourceVersion).

    The application's name is the HelmRelease's without the kind's release ``prefix``, as
    cozystack-api names it (``TrimPrefix``), not its name label: the root tenant's HelmRelease
    ``tenant-root`` is labelled ``tenant-root`` but served as Tenant ``root``, and a key the
    state never holds would keep the kind unconfirmed, its objects fetched at every read."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        return None
    return (namespace, name.removeprefix(prefix)), resource_version(metadata.get("resourceVersion"))


def version_of(obj: Obj) -> tuple[tuple[str, str], int] | None:
    """An object of a consistent read, as its key and resourceVersion."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        return None
    return (namespace, name), resource_version(metadata.get("resourceVersion"))

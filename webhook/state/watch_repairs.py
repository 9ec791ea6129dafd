"""Repairs of what a watch lost: a consistent read finds it, a GET puts it right.

A watch through cozystack-api can lose an event and stay open: it translates a HelmRelease
watch of its own, and a change it drops is never sent again on that stream (and one made just
before a reopen is replayed only if the object still exists). The state would then count a
spec the object no longer has, or an object already gone, until the next full list, which
a healthy watch never needs. So a consistent read (:mod:`webhook.state.consistent_reads`) that
still finds objects the state holds older than the list shows, or holds objects the list
no longer shows, once the watch has had :attr:`LiveSettings.confirm_wait` to deliver them,
fetches each (at most :attr:`LiveSettings.repair_objects` a read) and applies it as the watch
would have: newer, deleted. Every kind is also read that way every
:attr:`LiveSettings.resync_seconds` whether or not the ledger waits on it (one kind at a time),
because a lost event that nothing waits for would otherwise never be found.

A repair can run ahead of the watch: an event older than what the state holds (or than a
deletion it remembers) is ignored, a deletion too, so a late one never reverts a repair; and an
object a read lists but the watch deleted since is not taken for one the watch lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from webhook.core.tenancy.applications import resource_version
from webhook.kube.client import ApiError, KubeClient
from webhook.kube.reflector import Reflector

if TYPE_CHECKING:
    from webhook.state.held_applications import Held
    from webhook.state.live import AppWatch, LiveSettings

__all__ = ["WatchRepairs"]

log = logging.getLogger("webhook.state.live")  # the live state's log, whichever part writes
Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
TOMBSTONES: Final = 10_000  # deletions remembered, per kind, against late events and reads


class WatchRepairs:
    """The repairs of :class:`~webhook.state.live.LiveState` (a mixin)."""

    client: KubeClient
    settings: LiveSettings
    _apps: dict[str, AppWatch]
    _held: dict[str, dict[Key, Held]]
    _last_read: dict[str, float]

    def _init_watch_repairs(self) -> None:
        self.repairs: dict[str, int] = {}  # kind -> objects put right, since start
        self._tombstones: dict[str, OrderedDict[Key, int]] = {}  # kind -> key -> deleted at
        self._resyncing: dict[str, asyncio.Task[None]] = {}
        self._lists: dict[str, int] = {}  # kind -> fresh lists that replaced the state's view

    def stale_event(self, kind: str, key: Key, version: int, event_type: str = "") -> bool:
        """Whether an event at ``version`` is older than what the state holds of ``key`` (a
        repair ran ahead of the watch): it is then ignored. A DELETED one older than what is
        held deleted an earlier object of that name, before the one a repair fetched was
        created (one without a version is applied)."""
        held = self._held.get(kind, {}).get(key)
        if event_type == "DELETED":
            return held is not None and 0 < version < held[2]
        if held is not None:
            return version < held[2]
        gone = self._tombstones.get(kind)
        return gone is not None and version <= gone.get(key, 0)

    def deleted(self, kind: str, key: Key, version: int) -> None:
        """The watch (or a repair) deleted ``key`` at ``version``: it is dropped, and the version
        kept, so that neither an older event nor a read listed before the deletion (a tenant's
        VM deleted while a read is under way) is taken for news the watch lost."""
        self._held.get(kind, {}).pop(key, None)
        if version <= 0:
            return
        gone = self._tombstones.setdefault(kind, OrderedDict())
        gone[key] = max(version, gone.get(key, 0))
        gone.move_to_end(key)
        while len(gone) > TOMBSTONES:
            gone.popitem(last=False)

    def forget_repairs(self, kind: str) -> None:
        """A fresh list of ``kind`` replaced the state's view: remembered deletions are moot."""
        self._tombstones.pop(kind, None)
        self._lists[kind] = self._lists.get(kind, 0) + 1

    def lists_of(self, kind: str) -> int:
        """How many fresh lists have replaced the state's view of ``kind`` (see :meth:`repair`)."""
        return self._lists.get(kind, 0)

    def lost(
        self, kind: str, items: list[tuple[Key, int]], revision: int
    ) -> tuple[dict[Key, int], list[Key]]:
        """Of a consistent read of ``kind`` at ``revision``: the objects the state holds older
        than listed (or not at all), with the version listed, and those it holds that the read
        no longer shows although they are older than it (deleted before it). One pass over the
        read and the held objects; :meth:`still_lost` then narrows the result cheaply."""
        held = self._held.get(kind, {})
        behind = self._behind(kind, dict(items))
        listed = {key for key, _ in items}
        gone = [key for key, h in held.items() if key not in listed and h[2] <= revision]
        return behind, gone

    def still_lost(
        self, kind: str, behind: dict[Key, int], gone: list[Key], revision: int
    ) -> tuple[dict[Key, int], list[Key]]:
        """Of what :meth:`lost` found, what the state still has not caught up with."""
        held = self._held.get(kind, {})
        return self._behind(kind, behind), [
            key for key in gone if key in held and held[key][2] <= revision
        ]

    def _behind(self, kind: str, listed: dict[Key, int]) -> dict[Key, int]:
        held = self._held.get(kind, {})
        deleted: Mapping[Key, int] = self._tombstones.get(kind, {})
        return {  # a key is known at what is held of it, or at its deletion
            key: version
            for key, version in listed.items()
            if (held[key][2] if key in held else deleted.get(key, 0)) < version
        }

    async def repair(
        self,
        kind: str,
        watch: AppWatch,
        keys: Iterable[Key],
        revision: int,
        listed: set[Key],
        since: int | None = None,
    ) -> int:
        """Fetch each of ``keys`` (at most :attr:`LiveSettings.repair_objects`) and apply what
        it is now, as the watch would have; how many were put right. A 404 for one of
        ``listed`` (those the read showed) is no deletion: cozystack-api answers a GET from
        its cache, which can be older than the read; the next read tells.

        Nothing is applied once a fresh list (:meth:`lists_of`, from ``since``: the read's
        start, or now) has replaced the state's view: it forgot the deletions that tell a stale
        answer from news, and an object it no longer shows would be brought back."""
        reflector = watch.reflector
        lists = self.lists_of(kind) if since is None else since
        fixed = 0
        for namespace, name in list(keys)[: self.settings.repair_objects]:
            if self._apps.get(reflector.resource.plural) is not watch:
                break  # the kind went, or a new reflector listed it afresh
            if self.lists_of(kind) != lists:
                break  # listed afresh since the read (or during the last GET): read again
            try:
                obj: Obj | None = await self.client.request(
                    "GET", f"{reflector.resource.path(namespace)}/{name}"
                )
            except ApiError as exc:
                if exc.status != 404:
                    raise
                if (namespace, name) in listed:
                    continue  # older than the read: a tombstone would hide what it showed
                obj = None
            if self.lists_of(kind) != lists:
                break  # listed afresh during the GET, whose answer may be older than the list
            fixed += self._apply_repair(kind, reflector, (namespace, name), obj, revision)
        if fixed:
            self.repairs[kind] = self.repairs.get(kind, 0) + fixed
            log.warning(
                "watch lost changes; put right from a consistent read",
                extra={"fields": {"kind": kind, "objects": fixed, "revision": revision}},
            )
        return fixed

    def _apply_repair(
        self, kind: str, reflector: Reflector, key: Key, obj: Obj | None, revision: int
    ) -> int:
        held = self._held.get(kind, {}).get(key)
        namespace, name = key
        if obj is None:
            if held is None or held[2] > revision:
                return 0  # none, or one the watch delivered during the GET: not what it missed
            deleted = {"namespace": namespace, "name": name, "resourceVersion": str(revision)}
            reflector.on_event("DELETED", {"metadata": deleted})
            return 1
        metadata = obj.get("metadata")
        version = resource_version(
            metadata.get("resourceVersion") if isinstance(metadata, dict) else None
        )
        if held is not None and version <= held[2]:
            return 0  # the watch got there meanwhile
        reflector.on_event("MODIFIED", obj)
        return 1

    def resync_due(self, now: float) -> None:
        """Start a consistent read of the kind read longest ago, once it has not been read for
        :attr:`LiveSettings.resync_seconds` (or its read gap, when longer; off at 0). One
        resync at a time, whatever the kind: kinds listed together (all of them, at the first
        sync) are due together, and their reads, run at once, would hold a page of each."""
        interval = self.settings.resync_seconds
        if interval <= 0 or self._resyncing:
            return
        due: list[tuple[float, str, str]] = []
        for plural, watch in list(self._apps.items()):
            kind = watch.kind
            if not watch.reflector.listed:
                continue
            last = self._last_read.get(kind)
            if last is None:
                self._last_read[kind] = now  # the list itself was the first read
            elif now - last >= max(interval, self.read_gap(kind)):
                due.append((last, kind, plural))
        if due:
            _, kind, plural = min(due)
            self._last_read[kind] = now
            task = asyncio.get_running_loop().create_task(self._resync(kind, plural))
            self._resyncing[kind] = task

    async def _resync(self, kind: str, plural: str) -> None:
        try:
            await self._consistent_read(kind)
        except Exception as exc:  # the next interval tries again
            log.warning("resync failed", extra={"fields": {"kind": kind, "error": str(exc)}})
        finally:
            del self._resyncing[kind]

    if TYPE_CHECKING:

        async def _consistent_read(self, kind: str) -> None: ...  # ConsistentReads

        def read_gap(self, kind: str) -> float: ...  # ConsistentReads

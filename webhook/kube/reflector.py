"""A reflector: list a resource, then watch it, and keep a consumer in step.

This is what client-go's Reflector does, written small: a paginated list replaces the consumer's
view, then a watch from the list's resourceVersion streams changes (with bookmarks). Each page
is reduced as it arrives (``reduce`` keeps what the consumer needs) and sized by the bytes the
last one brought (:mod:`webhook.kube.pages`), so a list never holds more than one page of whole
objects at once; the reduced items replace the consumer's view in one call. A watch that ends
normally is reopened from the last resourceVersion, and each asks the server to end it well
within the read timeout (:attr:`Reflector.server_timeout`: kube-apiserver bookmarks no watch of
a kind nothing writes, so a quiet watch ended only by its silence would be taken for dead); one
that breaks, or stays silent past the read timeout, is reopened after a backoff with jitter,
which grows only while reopened watches deliver nothing; ``410 Gone`` (the resume point was
compacted away) forces a fresh list: at once after a watch that worked, after the backoff when
the watch expired as it opened (a history compacted faster than the kind is listed would be
listed again and again without a pause). So does an event the watch cannot read (longer than the
client's bound, not JSON: :class:`~webhook.kube.client.WatchEventUnreadable`), and a watch that
broke :data:`STUCK_WATCHES` times in a row at one resourceVersion without delivering anything:
reopened from before it, the watch would meet the same event again, for good, where a list reads
the object whole and the next watch starts past it. So does a watch that breaks after it
delivered objects: cozystack-api starts a watch from ``r`` with every object newer than ``r`` in
name order, so a watch reopened from the last one delivered might never send one not yet sent.
Each is counted (``unreadable_relists``, ``stuck_relists``, ``broken_relists``) and logged.

:attr:`Reflector.synced` is true only after the first list was applied and while the watch is
live: a watch silent for longer than its read timeout is dead, and the state is then stale.
A list that fails (``404``: the resource is not served) is retried after a growing backoff and
kept in :attr:`Reflector.list_error`, with the URL, for readiness to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from webhook.kube.client import ApiError, KubeClient, ResourceRef, WatchEventUnreadable
from webhook.kube.pages import PageSizes, consistent_read
from webhook.waits import sleep_unless_stopped

__all__ = ["Reflector"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]
# Watches broken in a row at one resourceVersion, nothing delivered, before the reflector lists
# instead of reopening from there: a network blip breaks one or two; an event that breaks every
# watch that reaches it (whatever the reason) breaks them all.
STUCK_WATCHES: Final = 3


class _Relist(Exception):
    """The watch's resume point is gone: list again."""


class Reflector:
    """Lists then watches one resource type, feeding ``on_replace`` and ``on_event``."""

    def __init__(
        self,
        client: KubeClient,
        resource: ResourceRef,
        *,
        on_replace: Callable[[list[Any]], None],
        on_event: Callable[[str, Obj], None],
        reduce: Callable[[Obj], Any] | None = None,
        namespace: str = "",
        params: Mapping[str, str] | None = None,
        watch_timeout: int = 300,
        read_timeout: float = 90.0,
        backoff: tuple[float, float] = (0.2, 30.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.params = dict(params or {})
        self.on_replace = on_replace
        self.on_event = on_event
        self.reduce = reduce
        self.watch_timeout = watch_timeout
        self.read_timeout = read_timeout
        self.backoff = backoff
        self.clock = clock
        self.resource_version = ""
        self.listed = False
        self.watching = False
        self.last_activity = 0.0
        self.started = clock()
        self.first_sync_seconds: float | None = None
        # When the list under way began (clock), or the backoff before it after a watch
        # that expired as it opened.
        self.listing_since: float | None = None
        self.relists = 0
        self.last_error = ""
        self.list_error = ""  # why the last list failed (with its URL); empty once one succeeds
        self.list_failures = 0
        self.unreadable_relists = 0  # lists made because the watch met an unreadable event
        self.stuck_relists = 0  # lists made because watches kept breaking at one version
        self._stuck = 0  # watches broken in a row at _stuck_at, nothing delivered
        self._stuck_at = ""
        self._heard = False  # whether the current watch delivered anything but an error
        self._delivered = False  # whether the current watch delivered an object
        self.broken_relists = 0  # lists made because a watch broke after delivering objects
        self.pages = PageSizes()  # each page of its lists sized by the bytes the last brought

    @property
    def synced(self) -> bool:
        """Listed, watching, and heard from within the read timeout."""
        return (
            self.listed and self.watching and self.clock() - self.last_activity < self.read_timeout
        )

    async def run(self, stop: asyncio.Event) -> None:
        """List and watch until ``stop`` is set."""
        failures = 0
        expired = 0  # watches in a row that expired as they opened: their backoff's count
        expired_since = 0.0  # when the first of them expired (clock)
        while not stop.is_set():
            try:
                if not self.listed:
                    await self._list()
                    if self._delivered:  # listed after a watch that worked and then broke
                        failures, self._delivered = 0, False
                opened = time.monotonic()
                await self._watch(stop)
                if self._heard or stop.is_set() or not self._ended_at_once(opened):
                    failures = expired = 0
                else:
                    # Ended normally with nothing sent, long before the timeout it asked for:
                    # a stream closed as it opened, not a quiet kind. Reopened at once, it
                    # would be reopened without a pause for good.
                    failures += 1
                    self.last_error = f"watch {self._url()}: ended at once, nothing sent"
                    await self._back_off("watch ended at once", failures, stop)
            except _Relist:
                self.listed = False
                self.relists += 1
                failures = 0  # listed and watched: what failed before is behind it
                if self._heard:
                    expired = 0  # its history expired after it worked: list again at once
                else:
                    # Expired as it opened, at the version a list had just given: listed
                    # again at once, a server answering every watch so (compacting faster than
                    # a list of the kind takes) would be listed without a pause, for good.
                    # Backed off by these expiries alone, not by list failures before them.
                    expired += 1
                    if expired == 1:
                        expired_since = self.clock()
                    self.last_error = f"watch {self._url()}: expired as it opened"
                    # Relisting since the first expiry in a row: the backoff is part of the
                    # relist, so readiness's patience runs through it, and through every cycle
                    # after it (started afresh each cycle, it would stop every kind's admissions
                    # for most of each cycle, for good).
                    self.listing_since = expired_since
                    await self._back_off("watch expired as it opened: listing again", expired, stop)
            # Anything else a list or watch raised (one object's page that its consumer or the
            # decoder cannot take) is a failure like these: reported and retried. Let out, it
            # would end this reflector for good, and readiness with it.
            except Exception as exc:
                self.watching = False
                if self.listed and self._heard:
                    failures = 0  # the watch worked before it broke: back off from the start
                failures += 1
                if not self.listed:
                    self.list_failures += 1
                    self.list_error = f"GET {self._url()}: {exc}"
                    self.last_error = self.list_error
                    message = "list failed"
                else:
                    self.last_error = str(exc)
                    message = "watch interrupted"
                    if isinstance(exc, ApiError) and exc.status == 404:
                        self.listed = False  # no longer served: list again, and report it
                    elif isinstance(exc, WatchEventUnreadable):
                        self.listed = False  # never past it from here: list, then watch on
                        self.unreadable_relists += 1
                        message = "watch event unreadable: listing again"
                    elif self._delivered:
                        # cozystack-api starts a watch with every object newer than its
                        # resourceVersion, in name order: broken inside that burst, the last
                        # object delivered may be newer than one still to come, and a watch
                        # reopened from it never sends that one. A list reads them all.
                        self.listed = False
                        self.broken_relists += 1
                        message = "watch broken after it delivered objects: listing again"
                    elif self._stuck_again():
                        self.listed = False
                        self.stuck_relists += 1
                        message = "watch broken at one version again: listing again"
                delay = self._delay(failures)
                log.warning(
                    message,
                    extra={
                        "fields": {
                            "resource": self.resource.plural,
                            "url": self._url(),
                            "error": str(exc),
                            "failures": failures,
                            "retry_seconds": round(delay, 2),
                        }
                    },
                )
                await sleep_unless_stopped(delay, stop)
        self.watching = False

    async def _back_off(self, message: str, failures: int, stop: asyncio.Event) -> None:
        """Log ``message`` and wait the backoff of the ``failures``-th failure in a row."""
        delay = self._delay(failures)
        fields = {"resource": self.resource.plural, "url": self._url(), "failures": failures}
        log.warning(message, extra={"fields": {**fields, "retry_seconds": round(delay, 2)}})
        await sleep_unless_stopped(delay, stop)

    def _stuck_again(self) -> bool:
        """Count a watch broken with nothing delivered at the current resourceVersion; true
        (and the count started over) at the :data:`STUCK_WATCHES`-th in a row there."""
        if self._heard or self._stuck_at != self.resource_version:
            self._stuck, self._stuck_at = 0, self.resource_version
        self._stuck += 1
        if self._stuck < STUCK_WATCHES:
            return False
        self._stuck = 0
        return True

    def _ended_at_once(self, opened: float) -> bool:
        """Whether a watch opened at ``opened`` (monotonic) ended before a tenth of the
        timeout it asked the server for (and within a second)."""
        return time.monotonic() - opened < min(1.0, self.server_timeout / 10)

    def _delay(self, failures: int) -> float:
        low, high = self.backoff
        ceiling = min(high, low * 2 ** min(failures, 16))
        return random.uniform(ceiling / 2, ceiling)  # jitter spreads reconnecting replicas

    def _url(self) -> str:
        return str(getattr(self.client, "host", "")) + self.resource.path(self.namespace)

    async def _list(self) -> None:
        if self.listing_since is None:  # else relisting since a watch expired as it opened
            self.listing_since = self.clock()
        try:
            version, items = await self.read(self.reduce or _whole)
        finally:
            self.listing_since = None
        self.resource_version = version
        if self.resource_version == "0":
            # cozystack-api lists a kind with no objects at resourceVersion "0" (the largest of
            # its HelmReleases', of none), and its watch from "0" sends one bookmark and then
            # never an event. From "1" it sends every object newer than that (all of them: no
            # object is at 1) and then every change.
            self.resource_version = "1"
        self.on_replace(items)
        self.listed = True
        self.list_error = ""
        self.last_activity = self.clock()

    async def read(
        self, reduce: Callable[[Obj], Any], *, pages: PageSizes | None = None
    ) -> tuple[str, list[Any]]:
        """A read of the resource now, the consumer's view and the watch left alone (see
        :func:`consistent_read`); its pages sized by ``pages``, else by the lists' own."""
        return await consistent_read(
            self.client,
            self.resource,
            reduce,
            namespace=self.namespace,
            params=self.params,
            pages=pages if pages is not None else self.pages,
            read_timeout=self.read_timeout,
        )

    @property
    def server_timeout(self) -> int:
        """The ``timeoutSeconds`` each watch asks for: ``watch_timeout``, but at most two thirds
        of the read timeout. kube-apiserver sends no bookmark on a watch of a kind nothing
        writes, so a quiet kind's watch (instance types, ApplicationDefinitions, most
        applications at night) would fall silent past the read timeout and be taken for dead,
        its reconnect leaving the state unsynced and every admission refused meanwhile; ended
        by the server first, it is reopened at once and never stops being synced."""
        return max(1, min(self.watch_timeout, int(self.read_timeout * 2 / 3)))

    async def _watch(self, stop: asyncio.Event) -> None:
        events = self.client.watch(
            self.resource.path(self.namespace),
            resource_version=self.resource_version,
            timeout_seconds=self.server_timeout,
            read_timeout=self.read_timeout,
            params=self.params,
        )

        async def consume() -> None:
            async for event in events:
                self._apply(event)

        self.watching = True  # optimistic: the read timeout unmasks a watch that never opens
        self._heard = False
        self._delivered = False
        self.last_activity = self.clock()
        if self.first_sync_seconds is None:
            self.first_sync_seconds = self.clock() - self.started
        consumer = asyncio.create_task(consume())
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({consumer, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not consumer.done():
                consumer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer
            elif not consumer.cancelled():
                consumer.exception()  # retrieved even when this watch is itself cancelled
        if not consumer.cancelled():
            consumer.result()  # raise what broke the watch; a normal end reopens it

    def _apply(self, event: Obj) -> None:
        self.last_activity = self.clock()
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":  # the failure itself, not a watch that worked: no backoff reset
            if obj.get("code") == 410:
                raise _Relist()
            raise ApiError(
                int(obj.get("code") or 0),
                str(obj.get("reason") or ""),
                str(obj.get("message") or "watch error"),
            )
        self._heard = True
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._delivered = True
            try:
                self.on_event(str(kind), obj)
            except Exception:  # one bad object never stops the watch
                log.exception(
                    "event ignored",
                    extra={"fields": {"resource": self.resource.plural, "type": kind}},
                )
        if version:
            self.resource_version = str(version)


def _whole(obj: Obj) -> Obj:
    return obj

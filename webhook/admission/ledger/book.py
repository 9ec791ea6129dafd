"""Every pool's ledger object as this replica knows it, and the one place it is written.

The book follows each pool's ``TenantReservation`` by a watch (a reflector) and keeps the newest
copy it has seen or written (a look-aside cache: a write's answer is newer than what the watch
has delivered yet), and counts what that copy lists into the live state's pending charges
(:meth:`Book.track`), following the state into every rebuilt copy of it. Every write of a pool's
object goes through :meth:`Book.write`: conditional on the resourceVersion the decision read,
under that pool's lock (one per pool, taken in sorted order when a request charges several),
so a conflict (another replica wrote first) is told apart from any other failure and counted;
a write whose object would pass :data:`~.bounds.MAX_OBJECT_BYTES` is never sent (:class:`TooLarge`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Literal, Protocol

from webhook.admission.ledger import bounds
from webhook.admission.ledger.bounds import LedgerSettings
from webhook.admission.ledger.entries import (
    TENANT_RESERVATIONS,
    Obj,
    caps,
    expiry,
    listed,
    parse_hold,
    released,
    version,
)
from webhook.admission.ledger.slices import Slices, slice_records
from webhook.core.admission.escrow import Escrow
from webhook.core.admission.pending import Hold
from webhook.core.admission.state import ReservationState
from webhook.core.base.json_codec import encode_json
from webhook.core.tenancy.applications import resource_version
from webhook.kube.client import ApiError, KubeClient
from webhook.kube.reflector import Reflector

__all__ = ["Book", "Conflict", "Outcome", "StateSource", "TooLarge"]

log = logging.getLogger("webhook.admission.ledger")  # one logger for all of the ledger

Outcome = Literal["written", "conflict", "failed"]


class StateSource(Protocol):
    """The live state as the ledger needs it (``webhook.state.live.LiveState``)."""

    @property
    def state(self) -> ReservationState: ...

    def observed_version(self, kind: str) -> int: ...

    def confirm(self, kind: str, revision: int) -> None:
        """Make ``observed_version(kind)`` reach ``revision`` without waiting for the kind's
        own traffic (a consistent read); returns at once."""


class Conflict(Exception):
    """Another replica wrote the pool's object first: read it again, decide again."""


class TooLarge(ApiError):
    """A write whose object would pass :data:`~.bounds.MAX_OBJECT_BYTES`: never sent, so the
    API server refuses nothing for its size (etcd's limit would stop the pool's every write)."""

    def __init__(self, size: int) -> None:
        super().__init__(
            413, "RequestEntityTooLarge", f"{size} bytes, over {bounds.MAX_OBJECT_BYTES}"
        )


class Book:
    """Every pool's newest ``TenantReservation``, followed into the live state; one per ledger."""

    def __init__(
        self,
        client: KubeClient,
        live: StateSource,
        settings: LedgerSettings,
        *,
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self.live = live
        self.settings = settings
        self.clock = clock
        self.objects: dict[str, Obj] = {}  # pool -> newest TenantReservation seen or written
        self.changed: dict[str, float] = {}  # pool -> when its object last changed (clock)
        self.parsed: dict[str, dict[str, tuple[Obj, Hold]]] = {}  # pool -> id -> entry, hold
        # pool -> the revision its object was seen deleted at: an answer to a write made
        # before (the pool's Tenant deleted meanwhile) is no copy to take up again.
        self._deleted: OrderedDict[str, int] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._state: ReservationState | None = None  # the state the objects were tracked into
        self.slices = Slices()  # every pool's escrowed slices, counted whole (docs/escrow.md)
        self.escrow: Escrow | None = None  # this process's own slices, when it holds any
        self.conflicts = 0
        self.writes = 0
        self.failures = 0  # writes refused for anything but a conflict
        self.oversized = 0  # writes not sent: the object would pass MAX_OBJECT_BYTES
        self.reflector = Reflector(
            client,
            TENANT_RESERVATIONS,
            on_replace=self._replace,
            on_event=self._event,
            read_timeout=settings.read_timeout,
            watch_timeout=settings.watch_timeout,
        )

    def holds(self) -> int:
        """Pending charges held in every pool's ledger object, as this replica last saw them."""
        return sum(len(entries) for entries in self.parsed.values())

    def current(self) -> ReservationState:
        """The live state, following every pool's newest ledger object, caught up."""
        state = self.live.state
        if state is not self._state:
            self._state = state
            self.slices.follow(state)
            for obj in list(self.objects.values()):
                self.track(obj)
        state.pending.catch_up(self.live.observed_version)
        self.slices.catch_up(self.live.observed_version, lambda: sorted(state.platform.kinds))
        return state

    def fenced(self, pool: str) -> bool:
        """Whether ``pool`` waits for the state to pass entries or slices it never saw."""
        return self.current().pending.fenced(pool) or self.slices.fenced(pool)

    def awaiting(self, pool: str | None = None, *, departed: bool = True) -> dict[str, int]:
        """What the state must reach, per kind, for ``pool``'s (or every pool's) fences to lift
        and departed entries and room to be released (``departed`` off: slices' fences only,
        not their departed room)."""
        state = self.current()
        wanted = state.pending.awaiting(pool)
        kinds = sorted(state.platform.kinds)
        for kind, revision in self.slices.awaiting(kinds, departed=departed).items():
            wanted[kind] = max(wanted.get(kind, 0), revision)
        return wanted

    def now(self) -> str:
        """Now, as expiries are written."""
        return expiry(self.clock())

    # -- writing: one pool's object, under its lock ----------------------------------------

    def lock(self, pool: str) -> asyncio.Lock:
        """The lock every write of ``pool``'s object (and every batch decided for it) holds."""
        return self._locks.setdefault(pool, asyncio.Lock())

    @contextlib.asynccontextmanager
    async def locked(self, pools: list[str]) -> AsyncIterator[None]:
        # A fixed order (sorted) so that two requests touching the same two pools cannot
        # deadlock, as OpenShift's ClusterResourceQuota admission does.
        async with contextlib.AsyncExitStack() as stack:
            for pool in sorted(pools):
                await stack.enter_async_context(self.lock(pool))
            yield

    async def attempt(self, pool: str, current: Obj, status: Obj) -> Outcome:
        """One conditional write: ``written``, ``conflict`` (counted; decide again) or
        ``failed`` (logged)."""
        try:
            await self.write(pool, current, status)
        except Conflict:
            self.conflicts += 1
            return "conflict"
        except ApiError as exc:
            log.warning("ledger write failed", extra={"fields": {"error": str(exc)}})
            return "failed"
        return "written"

    async def write(self, pool: str, current: Obj, status: Obj) -> Obj:
        """Write ``status`` into ``pool``'s object, conditional on ``current``'s version;
        :class:`Conflict` (after reading the newer object) if another write came first."""
        # Without managedFields (about 700 bytes of the ~1.4 KiB an empty ledger object is): a
        # status update that sends none keeps the stored ones (the API server's field manager
        # falls back to the live object's), so they only cost the API server decoding them,
        # and every audit log line of the write, for nothing.
        metadata = dict(current.get("metadata") or {})
        metadata.pop("managedFields", None)
        body = {**current, "metadata": metadata, "status": status}
        # Each part's bound keeps the whole within MAX_OBJECT_BYTES; checked here all the same,
        # so a part a bound misses is refused here (TooLarge, an ApiError: the caller's
        # failure path) and never by the API server, or by etcd for every later write.
        # One that shrinks an object already past it (written before the bound, or by another
        # writer) is sent: refused, the object could never shrink back below it.
        size = len(encode_json(body))
        if size > bounds.MAX_OBJECT_BYTES and size >= len(
            encode_json({**current, "metadata": metadata})
        ):
            self.oversized += 1
            raise TooLarge(size)
        self.writes += 1
        try:
            written = await self.client.replace(TENANT_RESERVATIONS, body, status=True)
        except ApiError as exc:
            if exc.status == 409:
                with contextlib.suppress(ApiError):
                    self.remember(await self.client.get(TENANT_RESERVATIONS, pool, pool))
                raise Conflict() from None
            self.failures += 1
            raise
        self.remember(written)
        return written

    async def ensure(self, pool: str) -> Obj:
        """``pool``'s object, created (empty) if there is none yet."""
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
        self.remember(created)
        return created

    # -- following the objects: the informer and the look-aside cache ------------------------

    def remember(self, obj: Obj) -> None:
        pool = str((obj.get("metadata") or {}).get("name") or "")
        known = self.objects.get(pool)
        if known is None and version(obj) <= self._deleted.get(pool, 0):
            return  # a write's answer from before the deletion the watch delivered
        # Only a newer version: the same one again (the watch delivering a write whose answer
        # was remembered first, a relist) is the same object, already counted.
        if known is None or version(obj) > version(known):
            self.objects[pool] = obj
            self.changed[pool] = self.clock()
            self.track(obj)

    def track(self, obj: Obj) -> None:
        """Count what ``obj`` lists (it is the newest copy of its pool's ledger)."""
        if self.live.state is not self._state:
            self.current()  # a rebuilt state: follow every object into it first
        assert self._state is not None
        pool = str((obj.get("metadata") or {}).get("name") or "")
        revision = version(obj)
        known = self.parsed.get(pool, {})
        parsed: dict[str, tuple[Obj, Hold]] = {}
        replaced: set[str] = set()
        for entry in listed(obj):
            hold = parse_hold(pool, entry, revision, known)
            parsed[hold.id] = (entry, hold)
            taken = entry.get("replaces")
            if isinstance(taken, list):
                replaced.update(str(t) for t in taken[: bounds.MAX_REPLACES])
        self._state.pending.track(
            pool,
            [h for _, h in parsed.values()],
            version=revision,
            released=released(obj.get("status") or {}),
            replaced=replaced,
        )
        self._state.set_caps(pool, caps(obj.get("status") or {}))
        self.slices.track(pool, obj.get("status") or {}, revision)
        if self.escrow is not None:
            mine = slice_records(obj.get("status") or {}).get(self.escrow.incarnation)
            self.escrow.recorded(pool, mine, revision)
        if parsed:
            self.parsed[pool] = parsed
        else:
            self.parsed.pop(pool, None)

    def _replace(self, items: list[Obj]) -> None:
        names = set()
        for item in items:
            names.add(str((item.get("metadata") or {}).get("name") or ""))
            self.remember(item)
        for pool in [p for p in self.objects if p not in names]:
            self._gone(self.objects.pop(pool), resource_version(self.reflector.resource_version))

    def _event(self, kind: str, obj: Obj) -> None:
        if kind == "DELETED":
            pool = str((obj.get("metadata") or {}).get("name") or "")
            known = self.objects.pop(pool, None)
            if known is not None:
                self._gone(known, version(obj))
        else:
            self.remember(obj)

    def _gone(self, obj: Obj, revision: int) -> None:
        pool = str((obj.get("metadata") or {}).get("name") or "")
        self._deleted[pool] = max(revision, self._deleted.pop(pool, 0))
        while len(self._deleted) > bounds.DELETED_POOLS:
            self._deleted.popitem(last=False)
        if self._state is not None:
            self._state.pending.track(pool, [], version=revision)
            self._state.set_caps(pool, {})
            self.slices.track(pool, None, revision)
            if self.escrow is not None:
                self.escrow.forget(pool, revision)

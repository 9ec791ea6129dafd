"""Fair admission on the event loop: each review waits its turn by tenant before costly work.

A review's body is read (reading costs little CPU and holds no seat, so a slow body delays only
itself), then its tenant and size are read without decoding it (:func:`peek`), and it waits in
its tenant's flow of :class:`~webhook.core.admission.fair_queue.FairQueue` for the one seat:
decoding, parsing and deciding happen only once seated. The seat is given back as soon as the
decision first waits on something (the ledger's write, a key re-read), so a decision waiting
on I/O never holds the loop from others; the CPU the decision took, measured around each of
its steps with :func:`time.thread_time` (another task's steps are not counted), is charged to
its flow when it ends. Each step runs with the cyclic garbage collector paused
(:mod:`webhook.collector`): a review decoding a few hundred thousand containers would otherwise
set off a collection every 700 of them, each walking every young object and, often, much of the
state, for several times the decode's own cost; what the step leaves is collected once, at its
end, and charged to its flow with the rest of the step.

A flow holding its queue length of waiting requests, or a request that waited longer than the
wait limit (a quarter of the webhook's timeout, as APF waits at most a quarter of the request
timeout), is denied with code 429, the reason and when to retry: a denial, never an allow, and
only that flow's. Each refusal is logged (rate-limited) and counted under its tenant.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final, NamedTuple, TypeVar

from webhook import collector
from webhook.core.admission.fair_queue import (
    BASE_SECONDS,
    DEFAULT_FAIR_LIMITS,
    UNREAD_FLOW,
    FairLimits,
    FairQueue,
    Ticket,
    estimate_seconds,
    flow_of,
)

__all__ = ["PEEK_BYTES", "FairAdmission", "Peeked", "Throttled", "peek"]

T = TypeVar("T")

# How far into a body its request's uid and namespace are looked for. The API server writes the
# AdmissionRequest's fields in its struct's order: uid, kind, resource, requestKind,
# requestResource, name (at most 253 characters), namespace, then userInfo and the objects; so
# both are in the first kilobyte of every review it sends, before anything a tenant wrote.
PEEK_BYTES: Final = 4096
# A key, not text inside a string: a quote inside a JSON string is always escaped, so an
# unescaped ``"namespace"`` followed by ``:`` is a key of the document.
_NAMESPACE_KEY: Final = b'"namespace"'
_UID_KEY: Final = b'"uid"'
_NAME_KEY: Final = b'"name"'
_SPACE: Final = b" \t\r\n"
# Loop rounds between a decision's end and the next dispatch: a review whose bytes came while
# the last decision ran needs about five to reach the queue (the socket read and TLS record,
# aiohttp's connection task waking, its request task starting, the body taken, the peek).
_ARRIVAL_ROUNDS: Final = 8
# A decision past this much CPU held the loop long enough for others to have arrived unseen.
_COSTLY_SECONDS: Final = 0.002


class Peeked(NamedTuple):
    """What the first bytes of a body say before it is decoded: its flow and its uid."""

    flow: str
    uid: str


def peek(raw: bytes) -> Peeked:
    """The flow and uid of a review from its first :data:`PEEK_BYTES` bytes, by a bounded
    scan; a namespace not found there queues the review in a flow of its own kind
    (``(unread)``), never in another tenant's. A mutating webhook sees a create's name before
    the API server validates its length, so past a long name the namespace written right after
    it is looked for to the body's end, as the API server writes it (compact), by one
    ``bytes.find``: a name's string holds no unescaped quote, so the first ``"namespace":"``
    after it is the request's key. A tenant cannot leave its flow by naming its object long."""
    namespace = _string_of(raw, _NAMESPACE_KEY, 253)
    if namespace is None and (name := raw.find(_NAME_KEY, 0, PEEK_BYTES)) >= 0:
        namespace = _compact_string_after(raw, _NAMESPACE_KEY, 253, name)
    uid = _string_of(raw, _UID_KEY, 128)
    return Peeked(_flow(namespace) if namespace is not None else UNREAD_FLOW, uid or "")


@functools.lru_cache(maxsize=4096)  # namespaces are the cluster's: a few, asked every time
def _flow(namespace: str) -> str:
    return flow_of(namespace)


def _compact_string_after(raw: bytes, key: bytes, longest: int, begin: int) -> str | None:
    """The string value of the first ``key`` written compactly (``"key":"``) in ``raw`` after
    ``begin``, if it has one without escapes of at most ``longest`` characters: two finds,
    linear in C however hostile the bytes are."""
    start = raw.find(key + b':"', begin)
    if start < 0:
        return None
    at = start + len(key) + 1
    return _string_at(raw, at, at + 2 + longest)


def _string_of(raw: bytes, key: bytes, longest: int) -> str | None:
    """The string value of the first ``key`` in the first :data:`PEEK_BYTES` of ``raw`` (a
    JSON key: followed by ``:``), if it has one without escapes of at most ``longest``
    characters; found with ``bytes.find``, nothing copied but the value."""
    limit = min(len(raw), PEEK_BYTES)
    start = raw.find(key, 0, limit)
    while start >= 0:
        at = start + len(key)
        while at < limit and raw[at] in _SPACE:
            at += 1
        if at < limit and raw[at] == 0x3A:  # ":": a key
            at += 1
            while at < limit and raw[at] in _SPACE:
                at += 1
            if at >= limit or raw[at] != 0x22:  # not a string
                return None
            return _string_at(raw, at, min(at + 2 + longest, limit))
        start = raw.find(key, at, limit)
    return None


def _string_at(raw: bytes, at: int, stop: int) -> str | None:
    """The JSON string whose opening quote is ``raw[at]``, if it closes before ``stop`` and
    holds no escape."""
    end = raw.find(b'"', at + 1, stop)
    if end < 0 or raw.find(b"\\", at + 1, end) >= 0:
        return None
    return raw[at + 1 : end].decode("ascii", "replace")


class Throttled(Exception):
    """The review was refused its turn: its flow's queue is full, or it waited too long."""

    def __init__(self, flow: str, reason: str, retry_after: int, message: str) -> None:
        super().__init__(message)
        self.flow = flow
        self.reason = reason  # queue-full | wait
        self.retry_after = retry_after
        self.message = message


class FairAdmission:
    """Runs each review's costly work in fair order by flow, one seat at a time."""

    def __init__(
        self,
        *,
        wait_seconds: float,
        limits: FairLimits = DEFAULT_FAIR_LIMITS,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.queue = FairQueue(limits)
        self.wait_seconds = wait_seconds
        self._clock = clock
        self._cpu = cpu
        self._seated: dict[Ticket, asyncio.Future[None]] = {}
        # A dispatch is scheduled a few rounds ahead (after a costly decision): until then
        # every review queues, so that the order among those whose bodies completed together
        # (all ready in one round of the loop) and any arriving meanwhile is the fair one, not
        # the order the loop happened to wake them in.
        self._dispatching = False
        # Called after each review with (flow, waited seconds, CPU seconds) and on each
        # refusal with (flow, reason): the metrics and the log, set by the application.
        self.on_done: Callable[[str, float, float], None] | None = None
        self.on_refused: Callable[[Throttled], None] | None = None

    async def run(self, flow: str, size: int, work: Coroutine[Any, Any, T]) -> tuple[T, float]:
        """Run ``work`` once its flow's turn comes; returns its result and how long it waited.
        Raises :class:`Throttled` (``work`` is then closed, never run) when the flow is past
        its queue length or the wait limit."""
        started = self._clock()
        ticket = self.queue.arrive(flow, estimate_seconds(size), started)
        if ticket is None:
            work.close()
            raise self._refuse(
                flow,
                "queue-full",
                f"tenant reservations: too many requests from {flow} are waiting "
                f"({self.queue.limits.queue_length}); denied to keep other tenants' "
                "decisions on time",
            )
        if not self._dispatching:  # a free seat is taken at once, with nothing awaited
            self._dispatch()
        if ticket.state != "seated":
            try:
                await self._wait(ticket, self.wait_seconds)
            except BaseException:
                work.close()
                raise
        waited = self._clock() - started
        metered = _Metered(work, self._cpu, self, ticket)
        try:
            result = await metered
        finally:
            self.queue.charge(ticket, metered.cpu)  # all it took, on its first turn
            for later in metered.later:
                self.queue.charge(later, 0.0)
            if metered.cpu >= _COSTLY_SECONDS:
                self._dispatch_soon()
            elif not self._dispatching:
                self._dispatch()
            if self.on_done is not None:
                self.on_done(flow, waited, metered.cpu)
        return result, waited

    async def _resume(self, metered: _Metered) -> None:
        """Wait for a turn again before a decision goes on after waiting on I/O, so no step of
        it runs out of fair order (one carrying a record of an unknown key waits for the key
        re-read, then decides in full)."""
        flow = metered.ticket.flow
        again = self.queue.arrive(flow, BASE_SECONDS, self._clock(), resumed=True)
        if again is not None:  # always: a resumption is never refused, it is under way
            metered.later.append(again)
            await self._seat(again, limit=None)

    async def _seat(self, ticket: Ticket, *, limit: float | None = -1.0) -> None:
        """Wait until ``ticket`` holds the seat, at most ``limit`` seconds (the wait limit by
        default; ``None``: as long as it takes, for a decision under way)."""
        if not self._dispatching:
            self._dispatch()
            if ticket.state == "seated":
                return
        await self._wait(ticket, self.wait_seconds if limit == -1.0 else limit)

    async def _wait(self, ticket: Ticket, limit: float | None) -> None:
        """Wait until ``ticket``, not seated, is dispatched, at most ``limit`` seconds."""
        future = asyncio.get_running_loop().create_future()
        self._seated[ticket] = future
        try:
            async with asyncio.timeout(limit):
                await future
        except TimeoutError:
            if self.queue.withdraw(ticket):
                raise self._refuse(
                    ticket.flow,
                    "wait",
                    f"tenant reservations: requests from {ticket.flow} waited over "
                    f"{self.wait_seconds:g}s for their turn; denied to keep other tenants' "
                    "decisions on time",
                ) from None
            # dispatched just as the wait ran out: it runs
        except BaseException:  # cancelled (the client left): give the turn back
            if not self.queue.withdraw(ticket):
                self._free(ticket)
                self._dispatch()
            raise
        finally:
            self._seated.pop(ticket, None)

    def _free(self, ticket: Ticket) -> None:
        self.queue.release(ticket)
        self._dispatch()

    def _dispatch_soon(self, rounds: int = 0) -> None:
        """After a costly decision, dispatch once the loop has polled its sockets a few times:
        a review that arrived while it ran (its bytes read, its handler started, its body
        taken) takes a few rounds to reach the queue, and would otherwise find the next of
        another tenant's many already seated; so would the reviews whose bodies completed in
        the same round as the one just decided. Until then nobody takes the seat directly.
        A round with nothing to do costs microseconds; after a cheap decision the next is
        dispatched at once."""
        if rounds == 0:
            if self._dispatching:
                return  # one chain of rounds at a time; it dispatches whoever waits by then
            self._dispatching = True
        if rounds < _ARRIVAL_ROUNDS:
            asyncio.get_running_loop().call_soon(self._dispatch_soon, rounds + 1)
            return
        self._dispatching = False
        self._dispatch()

    def _dispatch(self) -> None:
        while (ticket := self.queue.dispatch()) is not None:
            future = self._seated.get(ticket)
            if future is not None and not future.done():
                future.set_result(None)

    def _refuse(self, flow: str, reason: str, message: str) -> Throttled:
        retry = self.queue.retry_after(flow)
        refusal = Throttled(flow, reason, retry, f"{message}; try again in {retry}s")
        if self.on_refused is not None:
            self.on_refused(refusal)
        return refusal


class _Metered:
    """Awaits a coroutine, adding the CPU of each of its own steps to :attr:`cpu`; frees the
    turn it holds each time it waits on something, and waits for a turn again (one more
    ticket, kept in :attr:`later`) before each step after one. Methods, not closures: a
    decision that never waits (most) makes one object here."""

    __slots__ = ("_clock", "_coro", "_fair", "cpu", "later", "ticket")

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        cpu: Callable[[], float],
        fair: FairAdmission,
        ticket: Ticket,
    ) -> None:
        self._coro = coro
        self._clock = cpu
        self._fair = fair
        self.ticket = ticket  # the review's first turn
        self.later: list[Ticket] = []  # one more per resumption
        self.cpu = 0.0

    def __await__(self) -> Generator[Any, Any, Any]:
        step = self._coro.__await__()
        sent: Any = None
        thrown: BaseException | None = None
        suspended = False
        while True:
            if suspended and thrown is None:
                try:  # its turn again before it goes on (an exception goes in at once)
                    yield from self._fair._resume(self).__await__()
                except BaseException as exc:
                    thrown = exc
            begun = self._clock()
            collector.pause()  # for the step (see the module's docstring)
            try:
                yielded = step.throw(thrown) if thrown is not None else step.send(sent)
            except StopIteration as stop:
                self._ended(begun)
                return stop.value
            except BaseException:
                self._ended(begun)
                raise
            self._ended(begun)
            self._fair._free(self.later[-1] if self.later else self.ticket)
            suspended = True
            thrown = None
            try:
                sent = yield yielded
            except BaseException as exc:
                thrown = exc

    def _ended(self, begun: float) -> None:
        """A step ended: the collector back on, what the step left collected now (it is the
        step's work, charged to its flow, not to whoever allocates next), the CPU counted."""
        if collector.resume() and gc.get_count()[0] > gc.get_threshold()[0]:
            gc.collect(0)
        self.cpu += self._clock() - begun

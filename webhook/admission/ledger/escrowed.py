"""Admission from this replica's escrowed slices, and the duty that keeps them (``docs/escrow.md``).

With ``LedgerSettings.escrow`` on (off by default), the ledger first tries to answer a CREATE from
the slices this process holds, in memory: decided as :func:`decide` decides it with the slices'
unspent room taken out of the pools' usage (it is this request's to spend), it is answered from
them when it is allowed in enforce mode, every pool it charges has a live slice naming its kind
with the room on every key, no pool is fenced or counted past its budget (a lowered budget, a
removed carve-out or an overcommit change stops spending as it stops admissions), and the object
has no held preview. Anything else (an UPDATE, a dry run, warn, a cap, a miss) takes the exact
path as before. No lock is held and no API call made.

The duty (:meth:`Escrowed.duty`, every ``escrow_seconds``, off the admission path) writes each
pool's object once when something is to change: spends folded once the state has observed their
object newer than their decision (or they can no longer be stored), a refill when the slice holds
less than a second of the recent rate, the lease renewed, room returned when idle or over budget,
and any other process's record past its expiry and the store bound removed. The write is the
ledger's conditional write of the whole status (:class:`~.status.Status`), under the pool's lock.
A cold pool's first create waits for its first grant (:meth:`Escrowed.open`) and is answered
from it.

Over 400 lines, and kept whole: the admission path, the first grant and the duty read and change
one holder's state (its slices, spends, rate and the pools being granted), and split they would
each reach into the others'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from webhook.admission.ledger.book import Book, Conflict, TooLarge
from webhook.admission.ledger.entries import Obj, expiry, version
from webhook.admission.ledger.recent import RecentAdmissions
from webhook.admission.ledger.sizing import Rates, fold_due, refill
from webhook.admission.ledger.slices import grant_fits, removals, slice_records
from webhook.admission.ledger.spent import SpentAdmissions, minted
from webhook.admission.ledger.status import Status
from webhook.admission.ledger.wants import with_want
from webhook.core.admission import escrow as core
from webhook.core.admission.decisions import Decision, Policy, decide
from webhook.core.admission.escrow import surplus
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.tenancy.applications import AppKey
from webhook.core.tenancy.tenants import ancestors
from webhook.kube.client import ApiError

__all__ = ["Escrowed", "record_json"]

log = logging.getLogger("webhook.admission.ledger")  # one logger for all of the ledger

# Pools whose writes one duty round makes at once: a cold burst over many pools has each
# granted within one write's time, not one after another (20 pools at 50 ms a write took a
# second, and the last pool's admissions fell back meanwhile), while a replica holding
# thousands still sends the API server a bounded few at a time.
_ROUND_WRITES = 8


def record_json(record: core.SliceRecord) -> Obj:
    """A record as ``status.slices`` lists it (its expiry in the ledger's one fixed form)."""
    return {
        "holder": record.holder,
        "kinds": sorted(record.kinds),
        "granted": rl.to_strings(record.granted),
        "folded": rl.to_strings(record.folded),
        "returned": rl.to_strings(record.returned),
        "expires": expiry(record.expires),
    }


class Escrowed:
    """This process's slices: what it admits from them, and the writes that keep them."""

    def __init__(
        self,
        book: Book,
        status: Status,
        *,
        bounds: core.EscrowBounds | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.book = book
        self.status = status
        # The event loop's clock (monotonic): the holder's deadline is never a wall time.
        self.monotonic = monotonic or (lambda: asyncio.get_running_loop().time())
        incarnation = f"{book.settings.replica}.{secrets.token_hex(6)}"
        bounds = bounds or core.EscrowBounds(store_seconds=book.settings.store_seconds)
        self.escrow = core.Escrow(book.settings.replica, incarnation, bounds)
        book.escrow = self.escrow
        self.spent = SpentAdmissions(self.escrow)
        self.recent = RecentAdmissions(bounds.idle_seconds)
        self._quiet: dict[str, float] = {}  # pool -> when a refusal gave its slice back
        self._returning: set[str] = set()  # pools whose slice a refusal is giving back now
        self._opening: dict[str, asyncio.Event] = {}  # pools being granted a first slice now
        self._started: dict[str, str] = {}  # pool -> the request whose charge started its rate
        self.spends = 0  # admissions answered from slices
        self.crowded: dict[str, bool] = {}  # pool -> its last grant would pass the slices' bound
        self.writes = 0  # writes of this process's records
        # Told of each stored write of this process's record: (pool, refilled, returned).
        self.on_write: Callable[[str, bool, bool], None] = lambda pool, grew, gave: None
        self.nudged = asyncio.Event()  # an admission fell back for want of a slice

    # -- the admission path ----------------------------------------------------------------

    def admit(
        self, request: AdmissionRequest, policy: Policy, state: ReservationState
    ) -> Decision | None:
        """``request``'s answer from the slices, or ``None``: the exact path decides it."""
        if request.operation != "CREATE" or request.dry_run or not 0 < len(request.uid) <= 128:
            return None
        own = state.tree.get(request.namespace)
        if own is None or not own.declared:
            return None  # a namespace no Tenant owns: the exact path says so
        now = self.monotonic()
        escrow = self.escrow
        # Only the pools on the namespace's way up can be charged: the slices of the others
        # (a burst over 20 pools leaves 20 until they go idle) stay counted as they are, and
        # each admission no longer walks every slice's spends and every pool's usage.
        # Walked from the path, not from escrow.pools(): the holder's books list every pool
        # whose object the watch ever delivered, deleted ones too.
        live = [pool for pool in ancestors(request.namespace) if escrow.live(pool, now)]
        if not live:
            return None
        unspent = {pool: escrow.available(pool) for pool in live}
        for pool, room in unspent.items():
            state.tree.add_usage(pool, rl.scale(room, Decimal(-1)))
        try:
            decision = decide(request, state, policy)
        finally:
            for pool, room in unspent.items():
                state.tree.add_usage(pool, room)
        charged = decision.charged_pools
        if not decision.allowed or not charged or decision.mode != "enforce":
            return None
        key: AppKey = (request.kind, request.namespace, request.name)
        if state.pending.previews(key):
            return None
        for pool in charged:
            node = state.tree.get(pool)
            if node is None or not node.declared or self.book.fenced(pool):
                return None
            if not core.within(node.budget, node.usage):
                return None
        charges = {pool: dict(room) for pool, room in charged.items()}
        limit = self.book.settings.share_limit
        if any(self.spent.held(pool, request.namespace) >= limit for pool in charges):
            return None  # its share of spends, as of entries: the exact path bounds it
        if any(self.narrow(pool) for pool in charges):
            return None  # a record being drained for the kinds it misses takes no more spends
        # The request the object's record names (it verified, or decide() would have refused):
        # a spend is folded on observing an object whose record names it, and without one only
        # once it can no longer be stored.
        named = minted(request)
        if not escrow.spend(request.uid, charges, kind=request.kind, now=now, update=not named):
            return None
        # Only an object newer than everything this replica had seen may be this request's.
        seen = max(version(self.book.objects.get(pool) or {}) for pool in charges)
        after = max(seen, self.book.live.observed_version(request.kind))
        expected = dict(decision.expected or {})
        self.spent.remember(request.uid, key, after, expected, named, charges)
        self.spends += 1
        return decision

    async def open(
        self, request: AdmissionRequest, policy: Policy, state: ReservationState
    ) -> bool:
        """Grant this process its first slice of each cold pool ``request`` charges (no slice
        here, no recent rate), before the request is answered; whether a grant was written.
        Otherwise a cold pool's first admission writes its entry and the next round writes
        the grant: two writes where one does. The request's charge starts the rate the grant
        is sized from and leaves the pool rated, so this is tried once per pool and idle
        period; the request is answered from the new slice, or by the exact path as ever.
        Creates arriving while the grant is written wait for it (one write's time), then
        spend from it too."""
        if request.operation != "CREATE" or request.dry_run or not 0 < len(request.uid) <= 128:
            return False
        now = self.monotonic()
        if not any(self._openable(pool, state, now) for pool in ancestors(request.namespace)):
            return False  # a pool kept too full to split pays no decision here per create
        decision = decide(request, state, policy)
        charged = decision.charged_pools
        if not decision.allowed or not charged or decision.mode != "enforce":
            return False
        opening = [self._opening[pool] for pool in charged if pool in self._opening]
        if opening:  # another create is being granted this pool's first slice: spend from it
            await asyncio.wait([asyncio.ensure_future(done.wait()) for done in opening])
            return True
        cold = [  # a pool charged nothing budgeted is left unrated by its note: not opened
            pool
            for pool in sorted(charged)
            if any(v > 0 for v in charged[pool].values()) and self._cold(pool, now)
        ]
        for pool in cold:
            self.recent.note(pool, charged[pool], request.kind, now)
            self._opening[pool] = asyncio.Event()
            self._started[pool] = request.uid  # its charge is counted once in the rate
        written = 0
        try:
            for pool in cold:  # one pool at a time, no lock held across their writes
                with contextlib.suppress(Conflict):
                    written += await self._pool(pool)
                # Its waiters (other tenants' creates, in a shared parent) wait for this
                # pool's write only, never for the pools this request charges besides.
                self._opening.pop(pool).set()
        finally:
            for pool in cold:
                if pool in self._opening:
                    self._opening.pop(pool).set()
        return written > 0

    def _cold(self, pool: str, now: float) -> bool:
        """No slice of ``pool`` here and no recent rate: its first grant is worth a write."""
        return self.escrow.record(pool) is None and not self.recent.rate(pool, now)

    def _openable(self, pool: str, state: ReservationState, now: float) -> bool:
        """Whether ``pool`` (on a request's way up) could be one :meth:`open` grants or waits
        for: bounded, and cold or being granted now."""
        node = state.tree.get(pool)
        if node is None or not node.bounded:
            return False
        return pool in self._opening or self._cold(pool, now)

    def note(self, request: AdmissionRequest, decision: Decision) -> None:
        """An allowed admission: it feeds the recent rate each pool's slice is sized from."""
        now = self.monotonic()
        for pool, room in decision.charged_pools.items():
            first = self._started.get(pool) == request.uid
            if first:
                del self._started[pool]  # its charge started the rate: counted once
            else:
                first = not self.recent.rate(pool, now)
                self.recent.note(pool, room, request.kind, now)
            charged = any(v > 0 for v in room.values())  # nothing: the pool stays unrated
            if first and charged and self.escrow.record(pool) is None:
                # Its first grant is not left to the next round; once a pool is rated, a
                # tenant keeping it too full to split makes the duty no busier.
                self.nudged.set()

    async def give_back(self, refused: Decision) -> bool:
        """Return what this process's slice of the refused admission's pool holds unspent, when
        that room would make it fit (near the bound the exact path takes the room); whether
        anything was given back. A request too large for the slice's room too leaves the slice
        alone: it is refused either way."""
        pool = refused.pool
        if pool in self._returning:
            # Another refusal's give-back is being written (its room is no longer spendable
            # here, nor free yet): decide again once it is.
            async with self.book.lock(pool):
                return True
        available = self.escrow.available(pool)
        if not core.covers_shortfall(available, refused.reserved_after, refused.budget):
            return False
        self._quiet[pool] = self.monotonic()  # no refill for a while: the pool is at its bound
        self._returning.add(pool)
        try:
            with contextlib.suppress(Conflict):
                return await self._pool(pool, give_all=True) > 0
        finally:
            self._returning.discard(pool)
        return False

    # -- the duty --------------------------------------------------------------------------

    async def duty(self) -> int:
        """One round over the pools this process holds or has admitted into; writes made."""
        written = 0
        count, now, mine = self.book.slices.count, self.book.clock(), self.escrow.incarnation
        reclaims = {  # another life's record past its lease and the store bound
            pool
            for pool in self.book.objects
            if any(
                incarnation != mine and core.reclaimable(record, now, self.escrow.bounds)
                for incarnation, record in count.records(pool).items()
            )
        }
        moment = self.monotonic()
        rated = self.recent.rated(moment)
        self.spent.observe(self.book.current())
        due = [
            pool
            for pool in sorted(reclaims | set(self.escrow.pools()) | rated)
            if pool in reclaims or pool in rated or not self._resting(pool, moment)
        ]
        if len(due) <= 1:  # most rounds: no task for the one pool, or none
            with contextlib.suppress(Conflict):
                return await self._pool(due[0]) if due else 0
            return 0
        gate = asyncio.Semaphore(_ROUND_WRITES)

        async def one(pool: str) -> int:
            async with gate:
                with contextlib.suppress(Conflict):
                    return await self._pool(pool)
                return 0

        # Every pool has its turn; one pool's failure is the round's once all have had it.
        outcomes = await asyncio.gather(*(one(pool) for pool in due), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            written += outcome
        return written

    def _resting(self, pool: str, now: float) -> bool:
        """Whether a round would leave ``pool``'s record as it is: nothing to spend or give
        back, nothing to fold, no renewal due and not yet removable (a record waits so for
        its spends' objects or the store bound, and a round over it is all the duty does
        then). A pool whose object is gone is taken up, to be dropped."""
        escrow = self.escrow
        return pool in self.book.objects and not (
            any(escrow.available(pool).values())
            or escrow.foldable(pool, now)
            or escrow.renew_due(pool, now)
            or escrow.removable(pool, now)
            or self.narrow(pool)
        )

    def narrow(self, pool: str) -> bool:
        """Whether this process's record of ``pool`` names fewer kinds than were lately
        admitted there: see :meth:`_pool`."""
        held = self.escrow.record(pool)
        return held is not None and not self.recent.kinds(pool) <= held.kinds

    async def _pool(self, pool: str, *, give_all: bool = False) -> int:
        book, escrow = self.book, self.escrow
        async with book.locked([pool]):
            current = book.objects.get(pool)
            if current is None:  # deleted: no write left in flight or unknown can be stored now
                escrow.drop(pool)
                self._quiet.pop(pool, None)
                self.crowded.pop(pool, None)
                return 0
            state = book.current()
            node = state.tree.get(pool)
            if node is None or not node.bounded:
                return 0
            self.spent.observe(state, pool)  # the round read every spend before it
            now, wall = self.monotonic(), float(math.floor(book.clock()))
            listed = slice_records(current.get("status") or {})
            gone = [
                incarnation
                for incarnation, record in listed.items()
                if incarnation != escrow.incarnation
                and core.reclaimable(record, book.clock(), escrow.bounds)
            ]
            available = escrow.available(pool)
            over = not core.within(node.budget, node.usage)
            # A refusal's live want: grants leave its room, and its shortfall goes back.
            counted, short = with_want(current, node.usage, node.budget, book.clock())
            grow: dict[str, Decimal] = {}
            give: dict[str, Decimal] = {}
            rate = {k: Decimal(str(round(v, 6))) for k, v in self.recent.rate(pool, now).items()}
            quiet = now - self._quiet.get(pool, -math.inf) < escrow.bounds.idle_seconds
            # A record's kinds are fixed at its first grant (a kind added later would not be
            # waited for when its room is released): one granted for a single create of a
            # rare kind, or before other kinds came, is drained and removed at once, and the
            # next grant names every kind admitted lately. Refilled, it would answer none of
            # the pool's other creates for as long as they kept it busy.
            narrow = self.narrow(pool)
            if rate and not (over or quiet or give_all or narrow or book.fenced(pool)):
                estimate = self.recent.estimate(pool, now)
                expected = {k: Decimal(str(round(v, 6))) for k, v in estimate.items()}
                grow = refill(
                    Rates(rate, expected, self.recent.warmth(pool, now), self.recent.last(pool)),
                    available,
                    node.budget,
                    counted,
                    escrow.bounds,
                )
            if grow:  # not made if the records would pass their bound: the exact path admits
                grown = escrow.granting(pool, grow, self.recent.kinds(pool), wall)
                fits = grant_fits(current, escrow.incarnation, record_json(grown), gone)
                grow, self.crowded[pool] = (grow if fits else {}), not fits
            # Near the bound (no room outside the slices for one more of the pool's last
            # admission) the slices go back, so whichever replica is asked uses the last byte.
            last = rl.mask(self.recent.last(pool), node.budget)
            full = bool(last) and bool(rl.exceeded(rl.add(node.usage, last), node.budget))
            if full or short:
                grow = {}
            drain = over or give_all or full or narrow or escrow.idle(pool, now)
            if drain and any(available.values()):
                give = available
                if full:
                    self._quiet[pool] = now  # no refill for a while: the pool is at its bound
            else:
                if not grow and escrow.renew_due(pool, now):
                    # A renewal keeps a few seconds of the current rate, not a past burst's.
                    give = surplus(rl.mask(rate, node.budget), available, escrow.bounds, least=last)
                # A want gets what it is short (plan caps it by what is unspent), no more.
                give = rl.maximum(give, short)
            pressed = over or give_all or any(short.values())
            write = None
            if not grow and escrow.removable(pool, now, early=narrow):
                gone.append(escrow.incarnation)  # idle and all given back: no more renewals
            else:
                write = escrow.plan(
                    pool,
                    now=now,
                    wall=wall,
                    version=version(current),
                    grow=grow,
                    give_back=give,
                    kinds=self.recent.kinds(pool),
                    fold=fold_due(
                        escrow.spends(pool),
                        node.budget,
                        node.usage,
                        escrow.bounds.share,
                        pressed=pressed,
                    ),
                )
            if write is None and not gone:
                return 0
            status = self._status(pool, current, state, write, gone)
            try:
                stored = await book.write(pool, current, status)
            except Conflict:
                if write is not None:
                    escrow.refused(write)
                raise
            except ApiError as exc:
                log.warning("escrow write failed", extra={"fields": {"error": str(exc)}})
                if write is not None:  # a write never sent (TooLarge) was not stored
                    (escrow.refused if isinstance(exc, TooLarge) else escrow.unknown)(write)
                return 0
            except BaseException:
                # Cancelled mid-write (the request that waited for it ran out of time): it
                # may be stored or not. Left in flight, the pool's record would never be
                # planned again; unknown, the watch settles it as any lost answer.
                if write is not None:
                    escrow.unknown(write)
                raise
            if write is not None:
                mine = slice_records(stored.get("status") or {}).get(escrow.incarnation)
                escrow.stored(write, mine, version(stored))
                self.on_write(pool, bool(grow), bool(give))
            self.writes += 1
            return 1

    def _status(
        self,
        pool: str,
        current: Obj,
        state: ReservationState,
        write: core.Write | None,
        gone: list[str],
    ) -> Obj:
        old = current.get("status") or {}
        kept = self.status.kept(pool, current, state, without=set())
        status = self.status.build(pool, current, state, kept)
        raw = old.get("slices")
        listed: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        slices = {str(k): v for k, v in listed.items() if k not in gone}
        if write is not None:
            slices[self.escrow.incarnation] = record_json(write.record)
        status["slices"] = slices
        status["removals"] = removals(old) + len(gone)
        return status

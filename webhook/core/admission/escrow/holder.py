"""The holder's side of escrow: spending its slices in memory, and the writes of its records.

One :class:`Escrow` per process, under an incarnation id of its own: it spends only records of
that incarnation, and only those it has seen stored. Its local room in a pool is the recorded
outstanding room less every spend not yet folded (in a write or not) and less what a write in
flight returns, so no room is spent twice and none is spent that a write may have given back.

* **Spending** is all or nothing across the pools a request charges, and only before the
  holder's deadline: the monotonic instant its last stored write was sent, plus the lease, less
  the skew margin (the record's ``expires`` is the wall clock at sending plus the lease).
* **Folding**: a spend is foldable once the holder's state has observed the object its request
  stored (a CREATE's, named by the request) or once it can no longer be stored (decided more
  than ``store_seconds`` ago); an UPDATE's only the latter way. Folds, refills, returns and
  renewals are one write (:meth:`Escrow.plan`), one in flight per pool at a time; a spend
  leaves the holder's books only once a stored copy shows its fold.
* **Outcomes**: a stored write is the record from then on; a refused one (409) puts its folds
  back; one whose outcome is unknown suspends the slice until a copy newer than the version it
  was conditional on shows whether it was stored (the record is either what was sent or what
  was there before: the holder alone writes it, one write at a time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Final

from webhook.core.admission.escrow.records import EscrowBounds, SliceRecord
from webhook.core.base import resources as rl

__all__ = ["Escrow", "Spend", "Write"]

_ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class Spend:
    """One admission answered from one pool's slice."""

    uid: str
    pool: str
    room: Mapping[str, Decimal]
    kind: str
    decided: float  # monotonic
    update: bool = False  # folded only once it can no longer be stored


@dataclass(frozen=True, slots=True)
class Write:
    """A write of the holder's record in one pool, conditional on the copy at ``version``."""

    pool: str
    record: SliceRecord
    folds: tuple[Spend, ...]
    version: int
    sent: float  # monotonic
    folded: Mapping[str, Decimal]  # the folds' rooms' sum, which a spend is checked against


# Deleted pools whose version the holder keeps: a late answer comes within the request timeout,
# and a tenant deleting this many pools it held a slice in within it gains only a slice counted
# in a pool nobody can admit into any more.
_GONE: Final = 4096


@dataclass(slots=True)
class _Slice:
    base: SliceRecord | None = None  # the newest stored copy of the holder's record
    version: int = 0  # the pool object's version that copy was read at
    spends: list[Spend] = field(default_factory=list)  # not folded, not in a write
    spent: dict[str, Decimal] = field(default_factory=dict)  # their rooms' sum
    inflight: Write | None = None
    unknown: bool = False  # the write in flight failed without saying whether it was stored
    deadline: float = float("-inf")  # monotonic: no spending from then on
    last_spend: float = float("-inf")  # or the last refill, if later

    def keep(self, spends: list[Spend]) -> None:
        """Hold ``spends`` as the unfolded ones, their sum recounted: a spend is checked
        against the sum, never by a walk of every spend still to be folded (a busy slice
        holds a few seconds of them)."""
        self.spends = spends
        self.spent = rl.total(spend.room for spend in spends)

    def add(self, spend: Spend) -> None:
        self.spends.append(spend)
        self.spent = rl.add(self.spent, spend.room)


class Escrow:
    """One process's slices, by pool: what it may spend, and the writes that change them."""

    def __init__(self, holder: str, incarnation: str, bounds: EscrowBounds) -> None:
        self.holder = holder
        self.incarnation = incarnation
        self.bounds = bounds
        self._slices: dict[str, _Slice] = {}
        self._observed: set[str] = set()  # request uids whose objects the state has observed
        # Request uid -> when it was spent, until it can no longer be stored: a call again
        # with the same uid (a retry) never spends a second time.
        self._uids: dict[str, float] = {}
        self._gone: dict[str, int] = {}  # deleted pools this life held -> deletion's version

    # -- what may be spent -----------------------------------------------------------------

    def record(self, pool: str) -> SliceRecord | None:
        found = self._slices.get(pool)
        return found.base if found is not None else None

    def available(self, pool: str) -> dict[str, Decimal]:
        """The room the holder may still spend in ``pool`` (deadline aside)."""
        found = self._slices.get(pool)
        if found is None or found.base is None:
            return {}
        left = rl.subtract(found.base.outstanding(), found.spent)
        if found.inflight is not None:
            left = rl.subtract(left, found.inflight.folded)
            returning = rl.subtract(found.inflight.record.returned, found.base.returned)
            left = rl.subtract(left, rl.positive_part(returning))
        return {key: max(_ZERO, value) for key, value in left.items()}

    def live(self, pool: str, now: float) -> bool:
        """Whether ``pool``'s slice may be spent at ``now`` (monotonic): stored, not suspended,
        before the deadline."""
        found = self._slices.get(pool)
        return (
            found is not None
            and found.base is not None
            and not found.unknown
            and now < found.deadline
        )

    def spend(
        self,
        uid: str,
        charges: Mapping[str, Mapping[str, Decimal]],
        *,
        kind: str,
        now: float,
        update: bool = False,
    ) -> bool:
        """Spend ``charges`` (pool -> room) for request ``uid`` if every pool's slice is live,
        names ``kind`` and has the room on every key charged; whether it did (else nothing is
        spent and the request takes the exact path).

        A uid spent within the store bound is refused, whether or not its spend was folded:
        the exact path then counts the call again (a double count until observed or expired,
        never an undercount). Answering it from the first spend instead would trust the caller
        that the second call is the same object; a different object under a reused uid would
        then be admitted on the first one's room."""
        if not charges:
            return False
        horizon = now - self.bounds.store_seconds
        while self._uids:  # spent in order of a monotonic clock: the oldest first
            oldest = next(iter(self._uids))
            if self._uids[oldest] >= horizon:
                break
            del self._uids[oldest]
        if uid in self._uids:
            return False
        for pool, room in charges.items():
            if not self.live(pool, now):
                return False
            found = self._slices[pool]
            assert found.base is not None
            if kind not in found.base.kinds:
                return False
            left = self.available(pool)
            if any(value > left.get(key, _ZERO) for key, value in room.items() if value > 0):
                return False
        for pool, room in charges.items():
            positive = {key: value for key, value in room.items() if value > 0}
            found = self._slices[pool]
            found.add(Spend(uid, pool, positive, kind, now, update))
            found.last_spend = now
        self._uids[uid] = now
        return True

    def observed(self, uid: str) -> None:
        """The state observed the object request ``uid`` stored (newer than its decision): a
        look-up of the uids spent within the store bound, not a walk of every spend."""
        if uid in self._uids:
            self._observed.add(uid)

    def spends(self, pool: str | None = None) -> list[Spend]:
        """Every spend not yet shown folded (in a write or not), of ``pool`` or every pool."""
        found: list[Spend] = []
        if pool is not None:  # one look-up, not a walk of every pool held
            slices = [self._slices[pool]] if pool in self._slices else []
        else:
            slices = [held for _, held in sorted(self._slices.items())]
        for held in slices:
            found.extend(held.spends)
            if held.inflight is not None:
                found.extend(held.inflight.folds)
        return found

    def foldable(self, pool: str, now: float) -> bool:
        """Whether some spend of ``pool`` could be folded by a write now."""
        found = self._slices.get(pool)
        return found is not None and any(self._foldable(s, now) for s in found.spends)

    def renew_due(self, pool: str, now: float) -> bool:
        """Whether the lease of ``pool``'s slice is due for renewal (its last stored write is
        older than ``renew_seconds``)."""
        found = self._slices.get(pool)
        if found is None or found.base is None:
            return False
        left = self.bounds.lease_seconds - self.bounds.skew_seconds - self.bounds.renew_seconds
        return now >= found.deadline - left

    def removable(self, pool: str, now: float, *, early: bool = False) -> bool:
        """Whether the holder may remove its own record of ``pool``: idle (or, ``early``, not
        yet), all given back, nothing spent left to fold, no write in flight (a removed record
        departs nothing)."""
        found = self._slices.get(pool)
        return (
            found is not None
            and found.base is not None
            and found.inflight is None
            and not found.unknown
            and not found.spends
            and not any(found.base.outstanding().values())
            and (early or self.idle(pool, now))
        )

    def idle(self, pool: str, now: float) -> bool:
        found = self._slices.get(pool)
        return found is not None and now - found.last_spend > self.bounds.idle_seconds

    def pools(self) -> list[str]:
        return sorted(self._slices)

    # -- writes ----------------------------------------------------------------------------

    def plan(
        self,
        pool: str,
        *,
        now: float,
        wall: float,
        version: int,
        grow: Mapping[str, Decimal] | None = None,
        give_back: Mapping[str, Decimal] | None = None,
        kinds: frozenset[str] = frozenset(),
        fold: bool = True,
    ) -> Write | None:
        """The next write of the holder's record in ``pool`` (conditional on ``version``): it
        folds what is foldable, grows ``granted`` by ``grow``, returns what it can of
        ``give_back`` and renews the lease (with ``fold`` off, folds only when something else
        is written). ``None`` while a write is in flight or suspended,
        for a first grant with nothing to grant or no kinds, or with nothing to change before
        the lease is due."""
        found = self._slices.setdefault(pool, _Slice())
        if found.inflight is not None or found.unknown:
            return None
        base = found.base
        if base is None:
            if not grow or not kinds:
                return None
            base = SliceRecord(self.incarnation, self.holder, kinds)
        folds = tuple(s for s in found.spends if self._foldable(s, now))
        if not fold and not grow and not give_back and not self.renew_due(pool, now):
            folds = ()  # not worth a write of its own: they ride on the next one
        left = self.available(pool)
        give = {
            key: min(value, left.get(key, _ZERO))
            for key, value in (give_back or {}).items()
            if min(value, left.get(key, _ZERO)) > 0
        }
        if not grow and not give and not folds and not self.renew_due(pool, now):
            return None  # nothing to change, and the lease is not due
        folded = rl.total(s.room for s in folds)
        record = replace(
            base,
            granted=rl.add(base.granted, {k: v for k, v in (grow or {}).items() if v > 0}),
            folded=rl.add(base.folded, folded),
            returned=rl.add(base.returned, give),
            expires=wall + self.bounds.lease_seconds,
        )
        leaving = {id(s) for s in folds}  # by identity: a thousand folds compare no fields
        found.keep([s for s in found.spends if id(s) not in leaving])
        found.inflight = Write(pool, record, folds, version, now, folded)
        if grow:
            found.last_spend = max(found.last_spend, now)  # idle counts from the refill too
        return found.inflight

    def granting(
        self, pool: str, grow: Mapping[str, Decimal], kinds: frozenset[str], wall: float
    ) -> SliceRecord:
        """The holder's record of ``pool`` granted ``grow`` more, as :meth:`plan` would write
        it before its folds and returns (a first grant's names ``kinds``): what a grant is
        checked by before it is planned."""
        found = self._slices.get(pool)
        base = found.base if found is not None else None
        base = base or SliceRecord(self.incarnation, self.holder, kinds)
        grown = rl.add(base.granted, {k: v for k, v in grow.items() if v > 0})
        return replace(base, granted=grown, expires=wall + self.bounds.lease_seconds)

    def stored(self, write: Write, record: SliceRecord | None, version: int) -> None:
        """``write`` was answered as stored, the object then at ``version`` listing ``record``
        as this incarnation's. Only what the answer lists counts: an API server that prunes
        what its schema does not know stores the write without the record, and a record no
        other replica can read is never spent."""
        found = self._slices[write.pool]
        if found.inflight is not write:
            return
        if record != write.record:
            self.refused(write)
            if version > found.version:
                found.base, found.version = record, version
            return
        found.inflight, found.unknown = None, False
        found.deadline = max(
            found.deadline,
            write.sent + self.bounds.lease_seconds - self.bounds.skew_seconds,
        )
        if version > found.version:
            found.base, found.version = write.record, version
        waiting = {spend.uid for spend in self.spends()}
        self._observed = {uid for uid in self._observed if uid in waiting}

    def refused(self, write: Write) -> None:
        """``write`` was not stored (a conflict): its folds are to be written again."""
        found = self._slices[write.pool]
        if found.inflight is not write:
            return
        found.inflight, found.unknown = None, False
        found.keep([*write.folds, *found.spends])

    def unknown(self, write: Write) -> None:
        """``write`` failed without saying whether it was stored: spend nothing from the slice
        until a newer copy says."""
        found = self._slices[write.pool]
        if found.inflight is write:
            found.unknown = True

    def recorded(self, pool: str, record: SliceRecord | None, version: int) -> None:
        """A copy of ``pool``'s object at ``version`` lists ``record`` as this incarnation's
        (``None``: none). An older copy than one already read changes nothing. Of a pool this
        life holds nothing in, nothing is kept: every TenantReservation the watch delivers
        would otherwise stay in the holder's books, and every duty round visit it."""
        found = self._slices.get(pool)
        if found is None:
            if record is None or version <= self._gone.get(pool, 0):
                return
            self._gone.pop(pool, None)
            found = self._slices[pool] = _Slice()
        if version <= found.version:
            return
        write = found.inflight
        if write is not None and record == write.record:
            self.stored(write, record, version)
            return
        if write is not None and found.unknown and version > write.version:
            self.refused(write)  # a newer copy without it: the write can never be stored now
        found.version = version
        if record is None and found.base is not None:
            # Removed (reclaimed): what was spent from it is counted as its removal departs.
            found.keep([])
        found.base = record

    def forget(self, pool: str, version: int) -> None:
        """``pool``'s object was deleted at ``version``: once no write of it is in flight,
        nothing is kept of it but the version (of the last :data:`_GONE` deletions), so that
        a late answer older than the deletion brings no slice back. One in flight then is
        left to :meth:`drop`."""
        self.recorded(pool, None, version)
        found = self._slices.get(pool)
        if found is None or found.inflight is not None or found.unknown or found.base is not None:
            return
        self.drop(pool)

    def drop(self, pool: str) -> None:
        """Keep nothing of ``pool`` but the version of its deletion: its object is gone, and no
        write of it is under way any more. A write the deletion left in flight, or of unknown
        outcome (its answer a 404), can never be stored now: it was conditional on a copy of
        the deleted object. Kept, it held the pool in the holder's books for good."""
        found = self._slices.pop(pool, None)
        if found is not None:
            self._gone[pool] = found.version  # forget() read the deletion's
            while len(self._gone) > _GONE:
                del self._gone[next(iter(self._gone))]

    def _foldable(self, spend: Spend, now: float) -> bool:
        if now > spend.decided + self.bounds.store_seconds:
            return True
        return not spend.update and spend.uid in self._observed

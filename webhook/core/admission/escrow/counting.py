"""What every replica counts of a pool's slices: outstanding room whole, departed room until
its state has caught up, and fences where records came and went unseen.

The rules of :mod:`webhook.core.admission.pending`, for slices:

* **Outstanding room counts whole**, whoever holds it, spent or not: what a holder spent and
  has not folded is inside it.
* **Folded or removed room stays counted until the state has caught up.** When a newer copy of
  the pool's object shows a record's ``folded`` grown, or a record gone, the room that left
  (the growth; a removed record's whole outstanding room) is *departed* at that copy's
  resourceVersion, and released only once the state's watch of every kind the record names
  has reached it: etcd revisions are one counter, so by then the state has observed every
  object stored before the fold or the removal, which is every object that room was spent on.
  A record seen for the first time counts all it ever folded that way (this replica cannot know
  what its state saw). ``returned`` room was never spent: it is released at once.
* **Records that came and went unseen fence the pool.** The object counts every record ever
  removed from it (``removals``); a copy whose count grew by more than the records this replica
  saw leave fences the pool at that version until the state has reached it (for every kind),
  and a record whose figures went backwards (no holder writes that) fences it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from webhook.core.admission.escrow.records import SliceRecord
from webhook.core.base import resources as rl

__all__ = ["EVERY_KIND", "SliceCount"]

_ZERO = Decimal(0)
EVERY_KIND = "*"  # a fence waits for every kind the state watches


@dataclass(frozen=True, slots=True)
class _Departed:
    pool: str
    room: Mapping[str, Decimal]
    kinds: frozenset[str]
    revision: int


class SliceCount:
    """The slices of every pool as one replica counts them, from the newest copy of each
    pool's object it has read (its watch, or the answer to its own write)."""

    def __init__(self) -> None:
        self._records: dict[str, dict[str, SliceRecord]] = {}  # pool -> incarnation -> record
        self._removals: dict[str, int] = {}
        self._versions: dict[str, int] = {}
        self._departed: list[_Departed] = []
        self._fences: dict[str, int] = {}  # pool -> revision every kind must reach

    def records(self, pool: str) -> dict[str, SliceRecord]:
        return dict(self._records.get(pool, {}))

    def version(self, pool: str) -> int:
        return self._versions.get(pool, 0)

    def track(
        self, pool: str, records: Mapping[str, SliceRecord], *, removals: int, version: int
    ) -> None:
        """``pool``'s object at ``version`` lists ``records`` (by incarnation) and has had
        ``removals`` records removed, ever. A copy no newer than one tracked is ignored."""
        if version <= self._versions.get(pool, 0):
            return
        before = self._records.get(pool, {})
        gone = before.keys() - records.keys()
        for incarnation in sorted(gone):
            old = before[incarnation]
            self._depart(pool, old.outstanding(), old.kinds, version)
        seen_removals = self._removals.get(pool, 0)
        if removals < seen_removals or removals - seen_removals > len(gone):
            self._fence(pool, version)
        for incarnation, record in sorted(records.items()):
            last = before.get(incarnation)
            if last is None:
                self._depart(pool, record.folded, record.kinds, version)
                continue
            if not record.covers(last) or record.kinds != last.kinds:
                self._fence(pool, version)
            self._depart(pool, rl.subtract(record.folded, last.folded), record.kinds, version)
        self._records[pool] = dict(records)
        self._removals[pool] = removals
        self._versions[pool] = version

    def counted(self, pool: str) -> dict[str, Decimal]:
        """What slices add to ``pool``'s usage now: outstanding room and departed room."""
        total: dict[str, Decimal] = {}
        for record in self._records.get(pool, {}).values():
            total = rl.add(total, record.outstanding())
        for departed in self._departed:
            if departed.pool == pool:
                total = rl.add(total, departed.room)
        return {key: value for key, value in total.items() if value}

    def outstanding(self, pool: str, *, besides: str = "") -> dict[str, Decimal]:
        """The outstanding room of ``pool``'s records but ``besides``'s (an incarnation)."""
        return rl.total(
            record.outstanding()
            for incarnation, record in self._records.get(pool, {}).items()
            if incarnation != besides
        )

    def departed(self, pool: str) -> dict[str, Decimal]:
        """The room that left ``pool``'s slices and is still counted."""
        return rl.total(d.room for d in self._departed if d.pool == pool)

    def fenced(self, pool: str) -> bool:
        return pool in self._fences

    def awaiting(self) -> dict[str, int]:
        """The revision each kind's watch must reach for departed room to be released and fences
        lifted (``*``: every kind)."""
        wanted: dict[str, int] = {}
        for departed in self._departed:
            for kind in departed.kinds:
                wanted[kind] = max(wanted.get(kind, 0), departed.revision)
        for revision in self._fences.values():
            wanted[EVERY_KIND] = max(wanted.get(EVERY_KIND, 0), revision)
        return wanted

    def catch_up(self, seen: Callable[[str], int]) -> None:
        """Release departed room whose kinds' watches have reached its revision, and fences
        every kind's watch has passed (``seen(kind)``; ``seen("*")``: the least of them)."""
        self._departed = [
            d for d in self._departed if not all(seen(kind) >= d.revision for kind in d.kinds)
        ]
        for pool, revision in list(self._fences.items()):
            if seen(EVERY_KIND) >= revision:
                del self._fences[pool]

    def _depart(
        self, pool: str, room: Mapping[str, Decimal], kinds: frozenset[str], version: int
    ) -> None:
        positive = {key: value for key, value in room.items() if value > 0}
        if positive:
            # No kind named: nothing was spent on any (a hostile record): wait for every kind.
            named = kinds or frozenset({EVERY_KIND})
            self._departed.append(_Departed(pool, positive, named, version))

    def _fence(self, pool: str, version: int) -> None:
        self._fences[pool] = max(self._fences.get(pool, 0), version)

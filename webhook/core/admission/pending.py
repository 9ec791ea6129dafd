"""Pending charges: admitted, not yet observed, as the shared ledger shows them now.

An allowed request is not yet an object: the API server stores it after the webhook answers,
and another admission step may still reject it. Its increase is held as *pending* (added to its
pool's usage) until the state observes the object, or until the ledger drops the entry.

What a replica counts is derived from the ledger objects as they are now, never accumulated:
:meth:`PendingCharges.track` replaces a pool's entries with those of the newest copy of its
ledger object, and every figure is the sum of the entries still counted. Three rules make that
exact under concurrency:

* **An entry settles only on a newer observation.** Each entry carries the ledger revision that
  admitted it (``after``). An observation of the application settles it only when the object's
  resourceVersion is newer than that revision and shows the charge the entry expects (a delete
  newer than the revision releases it). A stale copy that merely shows the same figures is older
  than the admission and settles nothing.
* **An entry that leaves the ledger stays counted until the state has caught up.** When an entry
  disappears from the ledger object (settled by another replica, or dropped after its grace
  period), it is kept as *departed* with the revision of the version it vanished from, and
  released only once the state's watch of that kind has reached that revision: by then the state
  has seen every write up to the entry's removal, so the object (if it was ever stored) is
  counted instead. A silent watch therefore never lets a hold go early; the replica stops being
  ready first.
* **A replica that missed entries waits for the state before deciding.** Each ledger object
  counts, per kind, every entry ever removed from it (``released``). When a replica's copy of
  the object advances and that count grew by more than the entries it saw leave, entries came
  and went unseen (admitted, then settled or dropped, between two versions it read): their
  objects may be stored where its state has not looked yet. The pool is then *fenced* at the
  new version for those kinds, and no decision is made for it until the state's watch of each
  fenced kind has reached that version: etcd revisions are one counter, so by then the state
  has seen every such object, or its absence.
* **Ids are the request's.** An id seen settled is remembered while the ledger still lists it, so
  a later delete of the object does not make it count again.

Every admitted write of an application is held, a shrink or a label change with nothing to add
as much as a growth, because an API server that writes without a resourceVersion precondition
(cozystack-api) may store any update last, whatever it read: each entry's ``charge`` is what
its object carries if it is the one stored. So the pool never counts an application below the
*floor* its updates leave: the largest charge any of them expects, each until it is settled by
an observation that only it can explain, or else until it expires
(:meth:`PendingCharges.expire_floors`): an observation showing a charge two writes expect cannot
tell which of them was stored, and the other may still land. What a pool counts for an
application is the larger of its observed charge plus the increases still held and that floor
(the difference is a *top-up*, counted in the application's namespace): a decrease frees room
only once no write that could overwrite it may still land. A dry run may be held too (an API
server that ignores dry runs stores it): its hold is a *preview*, which the next admitted write
of the same object replaces rather than adds to (see :mod:`webhook.admission.ledger`).

Over 400 lines, and kept whole: the rules above interlock on one set of counted entries (a
floor ends only once its entry no longer counts, and is settled alone only from a copy of the
ledger as new as the observation), so they are kept where each can see the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from webhook.core.admission.floors import FOLDED, Floors
from webhook.core.admission.pools import TenantTree
from webhook.core.base import resources as rl
from webhook.core.tenancy.applications import AppKey
from webhook.core.tenancy.tenants import TENANT_KIND

__all__ = ["Hold", "PendingCharges", "expects"]

_Slot = tuple[str, str]  # (pool, entry id): a request charging two pools has two entries


@dataclass(frozen=True, slots=True)
class Hold:
    """One admitted request's increase in one pool, waiting to be observed."""

    id: str
    key: AppKey
    namespace: str  # the pool it is counted in
    increase: Mapping[str, Decimal]  # what is added to the pool's usage while pending
    charge: Mapping[str, Decimal]  # the charge the object is expected to carry once stored
    expires: float = 0.0
    after: int = 0  # the ledger revision that admitted it: only newer observations settle it
    preview: bool = False  # admitted for a dry run: a later write of the same object absorbs it
    until: str = ""  # the entry's expiry as written (RFC 3339, one width): its floor lasts as long
    update: bool = False  # an UPDATE's: stored last, it overwrites whatever came before it


def expects(hold: Hold, charge: Mapping[str, Decimal]) -> bool:
    """Whether an observation at ``charge`` is what ``hold`` expects: its charge exactly. A
    Tenant's entry lists only the quota keys its pool bounds (a quota of many keys would not fit
    an entry), so for a Tenant those keys are compared."""
    if hold.key[0] == TENANT_KIND:
        return all(charge.get(key) == value for key, value in hold.charge.items())
    return dict(hold.charge) == dict(charge)


class PendingCharges:
    """The ledger entries a replica counts, by pool; every change is mirrored into the tree."""

    def __init__(
        self,
        tree: TenantTree,
        *,
        shows: Callable[[Hold], bool] | None = None,
        observed: Callable[[AppKey], Mapping[str, Decimal]] | None = None,
        written: Callable[[AppKey], int] = lambda _: 0,  # see Floors
    ) -> None:
        self._tree = tree
        # Whether the state already shows a hold's object, newer than its admission.
        self._shows: Callable[[Hold], bool] = shows or (lambda _: False)
        # Floors need what the state observes of an application; without it (charges followed
        # alone, as in a test of the ledger's arithmetic) none are kept.
        self._floors = Floors(tree, observed, self._held, written) if observed else None
        self._entries: dict[str, dict[str, Hold]] = {}  # pool -> id -> entry, as listed now
        self._counted: dict[_Slot, Hold] = {}  # what is in usage: listed or departed
        self._departed: dict[_Slot, int] = {}  # slot -> revision of the version it left
        self._by_key: dict[AppKey, set[_Slot]] = {}
        self._resolved: set[str] = set()  # ids seen settled while the ledger lists them
        self._resolved_floor = 0  # how many were still listed at the last pruning
        self._released: dict[str, dict[str, int]] = {}  # pool -> kind -> removed, as last read
        self._fences: dict[tuple[str, str], int] = {}  # (pool, kind) -> revision to reach
        self._versions: dict[str, int] = {}  # pool -> newest ledger version tracked (etcd's)
        self._figures: dict[str, dict[str, Decimal]] = {}  # pool -> counted usage
        self._adjusted: dict[str, dict[str, Decimal]] = {}  # pool -> decided, being written

    def __len__(self) -> int:
        return len(self._counted)

    def holds(self) -> list[Hold]:
        """Every entry counted now (listed or departed)."""
        return list(self._counted.values())

    def remote(self, pool: str) -> Mapping[str, Decimal]:
        """What pending entries add to ``pool``'s usage now."""
        return rl.add(self._figures.get(pool, {}), self._adjusted.get(pool, {}))

    def resolved(self, hold_id: str) -> bool:
        return hold_id in self._resolved

    def departed(self, pool: str) -> int:
        """How many entries that left ``pool``'s ledger are still counted."""
        return sum(1 for slot in self._departed if slot[0] == pool)

    # -- floors: what an application's updates may still store (:mod:`.floors`) ------------

    def floor(self, key: AppKey) -> Mapping[str, Decimal]:
        """The largest charge an update of ``key`` that may still be stored expects."""
        return self._floors.floor(key) if self._floors is not None else {}

    def topups(self) -> list[tuple[AppKey, Mapping[str, Decimal]]]:
        """What floors add to usage now, by application (counted in its namespace)."""
        return self._floors.topups() if self._floors is not None else []

    def topup(self, key: AppKey) -> Mapping[str, Decimal]:
        """What ``key``'s floor adds to usage now (a Tenant's: to its parent's pools)."""
        return self._floors.topup(key) if self._floors is not None else {}

    def expire_floors(self, now: str) -> bool:
        """Drop the floors past their grace period by ``now`` whose entries no longer count
        (:meth:`.Floors.expire`); whether room may be freed."""
        if self._floors is None:
            return False
        return self._floors.expire(now, self._still_counted)

    def forget_floor(self, key: AppKey) -> None:
        """The application was deleted: no update of it can be stored any more."""
        if self._floors is not None:
            self._floors.forget(key)

    def refloor(self, key: AppKey) -> None:
        """The state's observed charge of ``key`` changed: count its floor against it."""
        if self._floors is not None:
            self._floors.refloor(key)

    # -- following the ledger --------------------------------------------------------------

    def fenced(self, pool: str) -> bool:
        """Whether ``pool`` waits for the state to pass entries this replica never saw."""
        return any(slot[0] == pool for slot in self._fences)

    def awaiting(self, pool: str | None = None) -> dict[str, int]:
        """What the state must reach, per kind, before fences (of ``pool``, or every pool)
        lift and departed entries are released: the revision, per kind."""
        wanted: dict[str, int] = {}
        for (fenced_pool, kind), revision in self._fences.items():
            if pool is None or fenced_pool == pool:
                wanted[kind] = max(wanted.get(kind, 0), revision)
        for slot, revision in self._departed.items():
            if pool is None or slot[0] == pool:
                kind = self._counted[slot].key[0]
                wanted[kind] = max(wanted.get(kind, 0), revision)
        return wanted

    def track(
        self,
        pool: str,
        entries: Iterable[Hold],
        *,
        version: int,
        released: Mapping[str, int] | None = None,
        replaced: Iterable[str] = (),
    ) -> None:
        """``pool``'s ledger object, at resourceVersion ``version``, lists exactly ``entries``
        and has had ``released`` entries of each kind removed (``None``: the object is gone).
        ``replaced`` names previews a listed entry took over (it holds at least as much), so
        they stop counting at once rather than waiting for the state as departed entries do."""
        listed = {entry.id: entry for entry in entries}
        taken_over = set(replaced)
        before = self._entries.get(pool, {})
        if released is None:
            self._released.pop(pool, None)
        else:
            self._fence(pool, before, listed, released, version)
        for hold_id in before:  # in the ledger's order, not a set's: replays stay identical
            if hold_id in listed:
                continue
            slot = (pool, hold_id)
            if slot in self._counted and hold_id in taken_over and before[hold_id].preview:
                self._uncount(slot)
                self._departed.pop(slot, None)
            elif slot in self._counted:
                self._departed.setdefault(slot, version)
        shown: list[Hold] = []
        for hold_id, entry in listed.items():
            slot = (pool, hold_id)
            self._departed.pop(slot, None)
            known = self._counted.get(slot)
            if known == entry:
                continue
            if known is not None:
                self._uncount(slot)
            if hold_id in self._resolved or self._shows(entry):
                if hold_id not in self._resolved:
                    shown.append(entry)
                self._resolved.add(hold_id)
                continue
            self._count(slot, entry)
        self._shown(shown)
        self._versions[pool] = max(self._versions.get(pool, 0), version)
        if listed:
            self._entries[pool] = listed
        else:
            self._entries.pop(pool, None)
        self._forget_resolved()

    def settle(self, key: AppKey, charge: Mapping[str, Decimal] | None, version: int) -> None:
        """The application was observed at ``version`` with ``charge`` (``None``: deleted)."""
        settled = []
        for slot in sorted(self._by_key.get(key, ())):
            hold = self._counted[slot]
            if version <= hold.after:
                continue  # older than the admission: a stale copy settles nothing
            if charge is not None and not expects(hold, charge):
                continue
            settled.append(slot)
        ids = {slot[1] for slot in settled}
        for slot in settled:
            hold = self._counted[slot]
            floors = self._floors
            if (
                charge is not None
                and floors is not None
                and self._knows_updates_before(hold.namespace, version)
                and floors.alone(hold, version, len(ids))
            ):
                floors.drop(key, hold.id)  # its own write: it can land no more
            self._uncount(slot)
            self._departed.pop(slot, None)
            self._resolved.add(hold.id)

    def withdraw(self, hold_id: str) -> None:
        """Stop counting ``hold_id`` at once: its request was refused, so no object will ever
        carry it (a request's entries rolled back after a failure on another pool)."""
        for slot in [s for s in self._counted if s[1] == hold_id]:
            self._uncount(slot)
            self._departed.pop(slot, None)
        self._resolved.add(hold_id)

    def readmit(self, hold_id: str) -> None:
        """``hold_id`` is admitted again (the API server retrying a request whose entries were
        withdrawn under the same uid): the entry written for it now counts once listed, as any
        new entry does, rather than staying settled as the withdrawn one was."""
        self._resolved.discard(hold_id)

    def catch_up(self, seen: Callable[[str], int]) -> None:
        """Release departed entries whose kind's watch has reached the revision they left at,
        and fences the state has passed."""
        for fence, revision in list(self._fences.items()):
            if seen(fence[1]) >= revision:
                del self._fences[fence]
        for slot, revision in list(self._departed.items()):
            hold = self._counted[slot]
            if seen(hold.key[0]) >= revision:
                del self._departed[slot]
                self._uncount(slot)
        self._forget_resolved()

    # -- a batch being decided -------------------------------------------------------------

    def adjust(self, pool: str, delta: Mapping[str, Decimal]) -> None:
        """Add ``delta`` to ``pool`` while a batch is decided and written (undone by
        :meth:`clear_adjustments` once the written object is tracked)."""
        change = {k: v for k, v in delta.items() if v}
        if not change:
            return
        self._adjusted[pool] = rl.add(self._adjusted.get(pool, {}), change)
        self._tree.add_usage(pool, change)

    def clear_adjustments(self, pool: str) -> None:
        adjusted = self._adjusted.pop(pool, None)
        if adjusted:
            self._tree.add_usage(pool, rl.scale(adjusted, Decimal(-1)))

    def previews(self, key: AppKey) -> list[Hold]:
        """The preview holds of ``key`` the ledger lists now (not departed), in every pool."""
        return [
            hold
            for slot in sorted(self._by_key.get(key, ()))
            if (hold := self._counted[slot]).preview
            and slot not in self._departed
            and hold.id in self._entries.get(slot[0], {})
        ]

    def counted(self, pool: str, hold_id: str) -> Hold | None:
        """The entry ``hold_id`` of ``pool`` if it is counted now."""
        return self._counted.get((pool, hold_id))

    # -- a rebuilt state -------------------------------------------------------------------

    def carry_over(self, other: PendingCharges) -> None:
        """Continue ``other`` (a state rebuilt for a new platform keeps what the ledger lists)."""
        for slot, hold in other._counted.items():
            self._count(slot, hold)
        self._entries = {pool: dict(entries) for pool, entries in other._entries.items()}
        self._departed = dict(other._departed)
        self._resolved = set(other._resolved)
        self._released = {pool: dict(counts) for pool, counts in other._released.items()}
        self._fences = dict(other._fences)
        self._versions = dict(other._versions)
        if self._floors is not None and other._floors is not None:
            self._floors.carry_over(other._floors)

    # -- internals -------------------------------------------------------------------------

    def _fence(
        self,
        pool: str,
        before: Mapping[str, Hold],
        listed: Mapping[str, Hold],
        released: Mapping[str, int],
        version: int,
    ) -> None:
        """Fence ``pool`` for every kind whose removals this replica did not all see."""
        previous = self._released.get(pool, {})
        seen_leave: dict[str, int] = {}
        for hold_id in before.keys() - listed.keys():
            kind = before[hold_id].key[0]
            seen_leave[kind] = seen_leave.get(kind, 0) + 1
        for kind, count in released.items():
            earlier = previous.get(kind, 0)
            if count < earlier or count - earlier > seen_leave.get(kind, 0):
                fence = (pool, kind)
                self._fences[fence] = max(self._fences.get(fence, 0), version)
        self._released[pool] = dict(released)

    def _count(self, slot: _Slot, hold: Hold) -> None:
        self._counted[slot] = hold
        self._by_key.setdefault(hold.key, set()).add(slot)
        self._move(slot[0], hold.increase)
        self._raise_floor(hold)

    def _raise_floor(self, hold: Hold) -> bool:
        """Put ``hold`` under its application's floor if it is an update that could overwrite
        a later write (:mod:`.floors`); whether it was."""
        floors = self._floors
        if floors is None or not hold.update:
            return False
        if not self._known(hold):
            return False  # nothing to keep it under (and an update of no object stores nothing)
        floors.add(hold)
        return True

    def _shown(self, holds: list[Hold]) -> None:
        """``holds`` arrive already shown by the state: each is under its floor until it
        expires. What the state shows may be newer than this copy of the ledger, so an update
        admitted in between, expecting the same charge, may be the one stored: none of them
        can be told to be alone."""
        for hold in holds:
            self._raise_floor(hold)

    def _known(self, hold: Hold) -> bool:
        """Whether ``hold``'s application is counted here besides this update: observed, held
        by another entry (its CREATE, not yet observed) or under a floor already."""
        key = hold.key
        if self._floors is not None and (key in self._floors or self._floors.observed(key)):
            return True
        return any(self._counted[slot].id != hold.id for slot in self._by_key.get(key, ()))

    def _knows_updates_before(self, pool: str, version: int) -> bool:
        """Whether this copy of ``pool``'s ledger lists every update admitted before
        ``version`` (one etcd counter: an update stored at ``version`` was admitted at a
        revision below it), so an observation there can be told to be one update's alone."""
        return self._versions.get(pool, 0) >= version - 1

    def _still_counted(self, hold: Hold) -> bool:
        """Whether ``hold``'s entry is counted in some pool (listed, or departed and not yet
        caught up with); for updates folded together, whether any entry of theirs may be."""
        slots = self._by_key.get(hold.key, ())
        return bool(slots) if hold.id == FOLDED else any(slot[1] == hold.id for slot in slots)

    def _held(self, key: AppKey) -> Mapping[str, Decimal]:
        """What the entries counted for ``key`` add to its pools."""
        held: dict[str, Decimal] = {}
        for slot in self._by_key.get(key, ()):
            held = rl.add(held, self._counted[slot].increase)
        return held

    def _uncount(self, slot: _Slot) -> None:
        hold = self._counted.pop(slot)
        slots = self._by_key.get(hold.key)
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self._by_key[hold.key]
        self._move(slot[0], rl.scale(hold.increase, Decimal(-1)))
        self.refloor(hold.key)

    def _move(self, pool: str, delta: Mapping[str, Decimal]) -> None:
        figure = self._figures.setdefault(pool, {})
        for key, value in delta.items():
            if not value:
                continue
            total = figure.get(key, Decimal(0)) + value
            if total:
                figure[key] = total
            else:
                figure.pop(key, None)
        if not figure:
            del self._figures[pool]
        self._tree.add_usage(pool, delta)

    def _forget_resolved(self) -> None:
        """Keep settled ids only while some ledger object still lists them (checked once the
        set has doubled, so the walk costs O(1) per change on average)."""
        if len(self._resolved) < max(64, 2 * self._resolved_floor):
            return
        listed = {hold_id for entries in self._entries.values() for hold_id in entries}
        self._resolved &= listed
        self._resolved_floor = len(self._resolved)

"""Floors: what an application's admitted updates may still store, counted until they cannot.

cozystack-api writes an update without a resourceVersion precondition, so an admitted update is
stored last whatever it read: a ``kubectl label`` that read a VM before a shrink writes the old
size back after it. A pool therefore counts an application at no less than its *floor*, the
largest charge any of its held updates expects, each until an observation only it can explain
settles it (the object shown newer than its admission, at its charge, and no other held update
of it expecting that charge), or else until its grace period ends, when it has been stored or
never will be: an observation showing a charge two updates expect cannot tell which of them was
stored, and the other may still land. Nor can one that changed nothing the state reads (Flux
writing the release's status, anyone's label): it settles entries, never a floor, so a
label patch's floor lasts until its expiry. What is counted is ``max(observed + held increases,
floor)`` per resource; the difference, the *top-up*, goes into the application's namespace, so
it reaches every pool above it as the observed charge does. A CREATE leaves no floor (a create
of a stored name fails) and a delete ends it (an update of a deleted object fails). A Tenant's
updates keep its quota as a floor the same way: what the state observes of a Tenant is the quota
it counts (its parent counts ``max(quota, usage)`` per key, never less), so a stale write of an
earlier, larger quota keeps its room in the parent's pool until it can no longer be stored.

Settled alone only from a copy of the ledger listing every update admitted before the
observation; expired only once its entry no longer counts, i.e. the state has seen past the
ledger write that dropped it (a lagging watch may not show yet what was stored just before the
expiry).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING

from webhook.core.admission.pools import TenantTree
from webhook.core.base import resources as rl
from webhook.core.tenancy.applications import AppKey

if TYPE_CHECKING:  # the entries' type, defined with the pending charges that hold them
    from webhook.core.admission.pending import Hold

__all__ = ["FOLDED", "Floors"]

# Updates of one application kept apart before they are folded into one figure (a tenant
# writing one object in bursts keeps at most this many; folded, each is held longer, never less).
_PER_APPLICATION = 64
FOLDED = "(folded)"  # the id of updates folded together: it stands for each of them


class Floors:
    """The updates under each application's floor, and the top-ups they put into the tree."""

    def __init__(
        self,
        tree: TenantTree,
        observed: Callable[[AppKey], Mapping[str, Decimal]],
        held: Callable[[AppKey], Mapping[str, Decimal]],
        written: Callable[[AppKey], int],
    ) -> None:
        self._tree = tree
        self._observed = observed  # what the state counts for the application as stored
        self._held = held  # the increases its counted entries add
        # The version the application's values were last written at (0: not known); only a
        # write of them may be an update's own: a status or a label anyone may write.
        self._written = written
        self._updates: dict[AppKey, dict[str, Hold]] = {}  # key -> id -> update
        self._topups: dict[AppKey, dict[str, Decimal]] = {}  # in usage, at the key's namespace

    def __contains__(self, key: AppKey) -> bool:
        return key in self._updates

    def observed(self, key: AppKey) -> bool:
        """Whether the state counts the application as stored."""
        return bool(self._observed(key))

    def floor(self, key: AppKey) -> Mapping[str, Decimal]:
        """The largest charge any update of ``key`` still under its floor expects: the pool
        counts the application at least this much (an UPDATE may be credited it)."""
        floor: dict[str, Decimal] = {}
        for hold in self._updates.get(key, {}).values():
            floor = rl.maximum(floor, hold.charge)
        return floor

    def topups(self) -> list[tuple[AppKey, Mapping[str, Decimal]]]:
        """What floors add to usage now, by application (counted in its namespace)."""
        return list(self._topups.items())

    def topup(self, key: AppKey) -> Mapping[str, Decimal]:
        """What ``key``'s floor adds to usage now, above what is observed and held of it."""
        return self._topups.get(key, {})

    def add(self, hold: Hold) -> None:
        """Keep ``hold``'s charge under its application, counted or not (one update's entries
        in several pools: the charges of all, a Tenant's each listing the keys of its pool)."""
        holds = self._updates.setdefault(hold.key, {})
        same = holds.get(hold.id)
        if same is not None and same.charge != hold.charge:
            hold = dataclasses.replace(hold, charge=rl.maximum(same.charge, hold.charge))
        holds[hold.id] = hold
        if len(holds) > _PER_APPLICATION:
            folded = dataclasses.replace(hold, id=FOLDED, after=0, increase={}, charge={})
            for each in holds.values():
                folded = dataclasses.replace(
                    folded,
                    charge=rl.maximum(folded.charge, each.charge),
                    until=max(folded.until, each.until),
                )
            self._updates[hold.key] = {FOLDED: folded}
        self.refloor(hold.key)

    def alone(self, hold: Hold, version: int, matching: int) -> bool:
        """Whether an observation of ``hold``'s application at ``version`` showing its charge
        can only be ``hold``'s write: its values were written since the admission (a status
        or label write explains nothing), ``matching`` counted entries expect it, and no other
        update under the floor, admitted before that version, does."""
        if matching != 1 or self._written(hold.key) <= hold.after:
            return False
        return not any(
            other.id != hold.id and other.after < version and other.charge == hold.charge
            for other in self._updates.get(hold.key, {}).values()
        )

    def drop(self, key: AppKey, hold_id: str) -> None:
        """``hold_id``'s write was observed: it can land no more."""
        holds = self._updates.get(key)
        if holds is not None and holds.pop(hold_id, None) is not None:
            if not holds:
                del self._updates[key]
            self.refloor(key)

    def forget(self, key: AppKey) -> None:
        """The application was deleted: no update of it can be stored any more."""
        if self._updates.pop(key, None) is not None:
            self.refloor(key)

    def expire(self, now: str, counted: Callable[[Hold], bool] = lambda _: False) -> bool:
        """Drop the updates whose grace period has passed by ``now`` (as entries' expiries are
        written): each has been stored or never will be. One whose entry is still ``counted``
        stays: the state may not have seen its write yet (a lagging watch), and only the entry,
        dropped from the ledger by a write made after its expiry and released once the state
        has reached that write, says it has. Whether room may have been freed."""
        freed = False
        for key, holds in list(self._updates.items()):
            gone = [
                hold_id
                for hold_id, hold in holds.items()
                if _past(hold.until, now) and not counted(hold)
            ]
            if not gone:
                continue
            for hold_id in gone:
                del holds[hold_id]
            if not holds:
                del self._updates[key]
            freed = self.refloor(key) or freed
        return freed

    def carry_over(self, other: Floors) -> None:
        """Continue ``other`` (a state rebuilt for a new platform keeps what may be stored)."""
        for key, holds in other._updates.items():
            self._updates.setdefault(key, {}).update(holds)
            self.refloor(key)

    def refloor(self, key: AppKey) -> bool:
        """Count ``key`` at ``max(observed + held increases, floor)``, per resource: put the
        difference (the top-up) into its namespace's usage. Whether the top-up went down."""
        before = self._topups.get(key, {})
        after: dict[str, Decimal] = {}
        if key in self._updates:
            observed, held = self._observed(key), self._held(key)
            for resource, value in self.floor(key).items():
                gap = value - observed.get(resource, Decimal(0)) - held.get(resource, Decimal(0))
                if gap > 0:
                    after[resource] = gap
        if after == before:
            return False
        if after:
            self._topups[key] = after
        else:
            self._topups.pop(key, None)
        self._tree.add_usage(key[1], rl.subtract(after, before))
        return any(after.get(k, Decimal(0)) < v for k, v in before.items())


def _past(until: str, now: str) -> bool:
    """Whether an expiry written as ``until`` is past ``now`` (a malformed one is)."""
    return len(until) != len(now) or until <= now

"""Pending charges: admitted, not yet observed.

An allowed request is not yet an object: another admission step may still reject it. Its charge
is held as *pending* (added to its pool's usage) until the state observes the object with that
charge (then the recorded charge takes over) or until the grace period passes (then it is
released: an admission that never became an object cannot leak). Only the increases of a
request are held: a shrink counts when it is observed, never before, so a shrink that fails
later cannot have made room for somebody else.

Charges held by *other* replicas (read from the cluster's TenantReservation objects) enter as a
per-pool figure, set and replaced as those objects change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from webhook.core import resources as rl
from webhook.core.applications import AppKey
from webhook.core.pools import TenantTree

__all__ = ["Hold", "PendingCharges"]


@dataclass(frozen=True, slots=True)
class Hold:
    """One admitted request's increase, waiting to be observed."""

    id: str
    key: AppKey
    namespace: str
    increase: Mapping[str, Decimal]  # what is added to usage while pending
    charge: Mapping[str, Decimal]  # the charge the object is expected to carry once stored
    expires: float


class PendingCharges:
    """Holds by id, indexed by application; every change is mirrored into the tree."""

    def __init__(self, tree: TenantTree) -> None:
        self._tree = tree
        self._holds: dict[str, Hold] = {}
        self._by_key: dict[AppKey, set[str]] = {}
        self._remote: dict[str, dict[str, Decimal]] = {}
        # Entries already seen settled, by id, until they would have expired: an object that
        # was observed and later deleted must not make its entry count again.
        self._resolved: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def holds(self) -> list[Hold]:
        return list(self._holds.values())

    def hold(self, hold: Hold) -> None:
        if hold.id in self._holds:
            return
        self._holds[hold.id] = hold
        self._by_key.setdefault(hold.key, set()).add(hold.id)
        self._tree.add_usage(hold.namespace, hold.increase)

    def release(self, hold_id: str) -> Hold | None:
        hold = self._holds.pop(hold_id, None)
        if hold is None:
            return None
        ids = self._by_key.get(hold.key)
        if ids is not None:
            ids.discard(hold_id)
            if not ids:
                del self._by_key[hold.key]
        self._tree.add_usage(hold.namespace, rl.scale(hold.increase, Decimal(-1)))
        return hold

    def settle(self, key: AppKey, charge: Mapping[str, Decimal] | None) -> list[Hold]:
        """The application was observed with ``charge`` (``None``: deleted): release what it
        settles. A hold is settled by an observation of the charge it expected, or by a delete."""
        settled = [
            self._holds[i]
            for i in sorted(self._by_key.get(key, ()))
            if charge is None or dict(self._holds[i].charge) == dict(charge)
        ]
        for hold in settled:
            self.release(hold.id)
            self._resolved[hold.id] = hold.expires
        return settled

    def resolve(self, hold_id: str, expires: float) -> None:
        """Remember that entry ``hold_id`` (perhaps another replica's) has settled."""
        self._resolved[hold_id] = expires

    def resolved(self, hold_id: str) -> bool:
        return hold_id in self._resolved

    def expire(self, now: float) -> list[Hold]:
        """Release every hold whose grace period has passed."""
        expired = [hold for hold in self._holds.values() if hold.expires <= now]
        for hold in expired:
            self.release(hold.id)
        for hold_id in [i for i, expires in self._resolved.items() if expires <= now]:
            del self._resolved[hold_id]
        return expired

    def carry_over(self, other: PendingCharges) -> None:
        """Take ``other``'s holds and settled ids (a rebuilt state continues a previous one)."""
        for hold in other.holds():
            self.hold(hold)
        self._resolved.update(other._resolved)

    def set_remote(self, pool: str, increase: Mapping[str, Decimal]) -> None:
        """What other replicas hold in ``pool``, replacing the previous figure."""
        before = self._remote.get(pool, {})
        change = {k: v for k, v in rl.subtract(increase, before).items() if v}
        if increase:
            self._remote[pool] = dict(increase)
        else:
            self._remote.pop(pool, None)
        if change:
            self._tree.add_usage(pool, change)

    def remote(self, pool: str) -> Mapping[str, Decimal]:
        return self._remote.get(pool, {})

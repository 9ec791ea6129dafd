"""Escrowed slices as every replica counts them: read from each pool's object, into the state.

A pool's ``TenantReservation`` may list ``status.slices``, each replica process's slice of the
pool's room (``docs/escrow.md``). Whatever this replica's own settings, it counts every slice
whole in the pool's usage, and the room that left one (folded, or a record removed) as departed
until the state's watches of the record's kinds have reached the version it left at
(:class:`~webhook.core.admission.escrow.SliceCount`): a replica that spends nothing from slices
still never admits into room another holds. A copy whose ``removals`` grew by more than the
records this replica saw leave fences the pool until every kind's watch has reached it.
Everything here reads what another writer may have put there: a malformed record counts what
parses of it, an unreadable expiry as long past.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from webhook.core.admission.escrow import SliceCount, SliceRecord
from webhook.core.admission.escrow.counting import EVERY_KIND
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.quantities import parse_quantity

__all__ = ["Slices", "removals", "slice_records"]


def _quantities(values: object) -> dict[str, Decimal]:
    found: dict[str, Decimal] = {}
    if isinstance(values, Mapping):
        for key, value in values.items():
            with contextlib.suppress(Exception):
                found[str(key)] = parse_quantity(value)
    return found


def _seconds(value: object) -> float:
    with contextlib.suppress(Exception):
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    return 0.0


def slice_records(status: Mapping[str, Any]) -> dict[str, SliceRecord]:
    """The slices a status lists, by incarnation."""
    raw = status.get("slices")
    if not isinstance(raw, Mapping):
        return {}
    found = {}
    for incarnation, fields in raw.items():
        if not isinstance(fields, Mapping):
            continue
        kinds = fields.get("kinds")
        found[str(incarnation)] = SliceRecord(
            incarnation=str(incarnation),
            holder=str(fields.get("holder") or ""),
            kinds=frozenset(str(k) for k in kinds) if isinstance(kinds, list) else frozenset(),
            granted=_quantities(fields.get("granted")),
            folded=_quantities(fields.get("folded")),
            returned=_quantities(fields.get("returned")),
            expires=_seconds(fields.get("expires")),
        )
    return found


def removals(status: Mapping[str, Any]) -> int:
    count = status.get("removals")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


class Slices:
    """Every pool's slices as counted, mirrored into the usage of the live state's tree."""

    def __init__(self) -> None:
        self.count = SliceCount()
        self._figures: dict[str, dict[str, Decimal]] = {}  # pool -> what is in the tree now
        self._state: ReservationState | None = None

    def follow(self, state: ReservationState) -> None:
        """Count into ``state`` from now on (a rebuilt state starts from nothing)."""
        if state is self._state:
            return
        self._state = state
        for pool, figure in self._figures.items():
            state.tree.add_usage(pool, figure)

    def track(self, pool: str, status: Mapping[str, Any] | None, version: int) -> None:
        """``pool``'s object at ``version`` has ``status`` (``None``: the object is gone)."""
        listed = slice_records(status or {})
        if not listed and not self.count.records(pool) and not removals(status or {}):
            return  # no slices here, and none before: nothing to count (the usual case)
        self.count.track(pool, listed, removals=removals(status or {}), version=version)
        self._mirror(pool)

    def catch_up(self, seen: Callable[[str], int], kinds: Callable[[], list[str]]) -> None:
        """Release departed room and fences the state's watches have passed (``seen(kind)``;
        a fence waits for every kind of ``kinds()``)."""
        waiting = self.count.awaiting()
        if not waiting:
            return

        def reached(kind: str) -> int:
            if kind != EVERY_KIND:
                return seen(kind)
            return min((seen(k) for k in kinds()), default=0)

        before = {pool: self.count.counted(pool) for pool in self._figures}
        fenced = {pool for pool in self._figures if self.count.fenced(pool)}
        self.count.catch_up(reached)
        for pool, figure in before.items():
            if pool in fenced or self.count.counted(pool) != figure:
                self._mirror(pool)

    def fenced(self, pool: str) -> bool:
        return self.count.fenced(pool)

    def awaiting(self, kinds: list[str], *, departed: bool = True) -> dict[str, int]:
        """What each kind's watch must reach for departed room and fences to go (``departed``
        off: fences only)."""
        wanted = self.count.awaiting()
        every = wanted.pop(EVERY_KIND, 0)
        if not departed:
            wanted = {}
        if every:
            for kind in kinds:
                wanted[kind] = max(wanted.get(kind, 0), every)
        return wanted

    def _mirror(self, pool: str) -> None:
        figure = self.count.counted(pool)
        delta = rl.subtract(figure, self._figures.get(pool, {}))
        if figure or self.count.records(pool):
            self._figures[pool] = figure
        else:
            self._figures.pop(pool, None)
        if self._state is not None and any(delta.values()):
            self._state.tree.add_usage(pool, {k: v for k, v in delta.items() if v})

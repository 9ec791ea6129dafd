"""Escrow rules broken on purpose, each to show the simulation finds what it would let through.

Each is a context manager that replaces one rule for the duration of a block:

- ``grant-ignores-others``: a grant is decided on the observed usage and the replica's own
  slice only, not every replica's slices and entries (the grant rule);
- ``reclaim-at-expiry``: an expired record is removed at its expiry, without the store bound
  (the reclaim rule): an admission its dead holder answered may still be stored after;
- ``never-reclaim``: an expired record is never removed, so a dead life's slice holds room for
  ever (the reclaim rule, the other way);
- ``release-at-once``: room folded out of a slice, or a removed record's, stops counting at once
  instead of once the state's watch has reached the revision it left at;
- ``adopt-old-life``: a restarted replica takes the record of its pod name for its own, with
  none of the old life's spends in its books;
- ``spend-past-deadline``: the holder spends its slice whatever its lease says;
- ``ignore-lowered-budget``: the holder spends a growth from its slice while its pool is over
  budget;
- ``forget-unknown-write``: a write whose outcome is unknown is taken as not stored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from tests.simulation.escrow import replica as replica_module
from tests.simulation.escrow.replica import ZERO, M, Replica
from webhook.core.admission.escrow import holder, records
from webhook.core.admission.escrow.counting import SliceCount


def _own_only(self: Replica, pool: str) -> Decimal:
    mine = self.escrow.record(pool)
    return self.observed(pool) + (mine.outstanding().get(M, ZERO) if mine else ZERO)


def _at_expiry(record: records.SliceRecord, wall_now: float, bounds: Any) -> bool:
    return wall_now > record.expires


def _never(record: records.SliceRecord, wall_now: float, bounds: Any) -> bool:
    return False


def _no_departure(self: SliceCount, *args: Any) -> None:
    return None


def _adopting_init(original: Callable[..., None]) -> Callable[..., None]:
    def init(self: Replica, api: Any, name: str, incarnation: str, **kwargs: Any) -> None:
        taken = None
        for (plural, _, _), obj in sorted(api.objects.items()):
            if plural == replica_module.TRS:
                for key, raw in ((obj.get("status") or {}).get("slices") or {}).items():
                    if raw.get("holder") == name and not key.startswith(replica_module.ENTRY):
                        taken = key
        original(self, api, name, taken or incarnation, **kwargs)

    return init


def _live_always(self: holder.Escrow, pool: str, now: float) -> bool:
    found = self._slices.get(pool)
    return found is not None and found.base is not None and not found.unknown


def _never_over(self: Replica, pool: str) -> bool:
    return False


def _unknown_as_refused(self: holder.Escrow, write: holder.Write) -> None:
    self.refused(write)


PATCHES: dict[str, list[tuple[Any, str, Callable[[Any], Any]]]] = {
    "grant-ignores-others": [(Replica, "grant_basis", lambda _: _own_only)],
    "reclaim-at-expiry": [(records, "reclaimable", lambda _: _at_expiry)],
    "never-reclaim": [(records, "reclaimable", lambda _: _never)],
    "release-at-once": [(SliceCount, "_depart", lambda _: _no_departure)],
    "adopt-old-life": [(Replica, "__init__", _adopting_init)],
    "spend-past-deadline": [(holder.Escrow, "live", lambda _: _live_always)],
    "ignore-lowered-budget": [(Replica, "over_budget", lambda _: _never_over)],
    "forget-unknown-write": [(holder.Escrow, "unknown", lambda _: _unknown_as_refused)],
}


@contextlib.contextmanager
def broken(rule: str) -> Iterator[None]:
    """Within the block, ``rule`` (a key of :data:`PATCHES`; ``""``: none) is broken."""
    patches = PATCHES[rule] if rule else []
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, make in patches:
        setattr(owner, name, make(getattr(owner, name)))
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)

"""Escrowed slices as every replica counts them: read from each pool's object, into the state.

A pool's ``TenantReservation`` may list ``status.slices``, each replica process's slice of the
pool's room (``docs/escrow.md``). Whatever this replica's own settings, it counts every slice
whole in the pool's usage, and the room that left one (folded, or a record removed) as departed
until the state's watches of the record's kinds have reached the version it left at
(:class:`~webhook.core.admission.escrow.SliceCount`): a replica that spends nothing from slices
still never admits into room another holds. A copy whose ``removals`` grew by more than the
records this replica saw leave fences the pool until every kind's watch has reached it.
Everything here reads what another writer may have put there: a malformed record counts what
parses of it, an unreadable expiry as long past. :func:`slices_bytes` is what the records take
of :data:`~.bounds.MAX_SLICES_BYTES`, each at the largest it may grow to before its next grant.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any, Final

from webhook.admission.ledger import bounds
from webhook.core.admission.escrow import SliceCount, SliceRecord
from webhook.core.admission.escrow.counting import EVERY_KIND
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.json_codec import encode_json
from webhook.core.base.quantities import format_quantity, parse_quantity

__all__ = ["Slices", "grant_fits", "largest_bytes", "removals", "slice_records", "slices_bytes"]

_NANO = Decimal("1e9")
_ASCII: Final = json.JSONEncoder(separators=(",", ":"))  # encode_json's fallback


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


def _json_bytes(value: object) -> int:
    """``value``'s JSON bytes in whichever form the object is sent: :func:`encode_json`'s,
    or the standard encoder's it falls back to for the whole object when any part (an integer
    past 64 bits, a lone surrogate) is beyond orjson, escaping every character past ASCII."""
    size = len(encode_json(value))
    with contextlib.suppress(ValueError, TypeError, RecursionError):
        size = max(size, len(_ASCII.encode(value)))
    return size


def _widest(value: object) -> int:
    """The most characters any quantity from 0 to ``value`` formats to: a fraction takes
    ``m``, ``u`` or ``n`` after at most the digits of ``value`` in nano-units (an integer
    takes at most its digits), so a fold or a return of a grant is never wider than this."""
    try:
        granted = parse_quantity(value)
    except Exception:
        return _json_bytes(value)
    if granted <= 0:
        return len(format_quantity(granted))
    nano = int((granted * _NANO).to_integral_value(ROUND_CEILING))
    return max(len(format_quantity(granted)), len(str(nano)) + 1)


def largest_bytes(incarnation: str, fields: object) -> int:
    """The JSON bytes of ``{incarnation: fields}``, a record of ``status.slices``, at the
    largest it may grow to before its holder's next grant: as it is, or with its ``folded``
    and ``returned`` holding every granted key at :func:`_widest` of its grant, if that is
    more. Between grants a record changes only there and in its expiry (one fixed form): its
    grant, kinds and holder stay, and what is folded or returned of a key is within its grant."""
    actual = _json_bytes({incarnation: fields})
    if not isinstance(fields, Mapping):
        return actual
    raw = fields.get("granted")
    granted: Mapping[Any, Any] = raw if isinstance(raw, Mapping) else {}
    grown = dict(fields)
    for name in ("folded", "returned"):
        held = fields.get(name)
        now: dict[str, Any] = (
            {str(k): v for k, v in held.items()} if isinstance(held, Mapping) else {}
        )
        for key, value in granted.items():
            width = max(_widest(value), _json_bytes(now.get(str(key), "")) - 2)
            now[str(key)] = "9" * width
        grown[name] = now
    return max(actual, _json_bytes({incarnation: grown}))


def slices_bytes(slices: Mapping[str, object]) -> int:
    """The JSON bytes ``status.slices`` listing ``slices`` may take before any of its holders
    grants again (each record at :func:`largest_bytes`): what a grant is checked against."""
    inner = sum(largest_bytes(str(k), v) - 2 for k, v in slices.items())  # without its braces
    return 2 + inner + max(0, len(slices) - 1)  # the braces, the commas


def grant_fits(
    current: Mapping[str, Any], incarnation: str, record: Mapping[str, Any], gone: list[str]
) -> bool:
    """Whether the ``status.slices`` of the object ``current``, with ``incarnation``'s
    ``record`` as a grant would write it and without ``gone``, stays within
    :data:`~.bounds.MAX_SLICES_BYTES`, each record at its :func:`largest_bytes`: a renewal, a
    fold or a return never grows a record past that, so only a grant is checked (a budget of
    64 keys of the longest names makes a record of some 60 KiB, and ten would pass etcd's
    limit)."""
    raw = (current.get("status") or {}).get("slices")
    listed: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    kept = {str(k): v for k, v in listed.items() if k not in gone and k != incarnation}
    return slices_bytes({**kept, incarnation: record}) <= bounds.MAX_SLICES_BYTES


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

"""Persistent volumes never release what the cluster keeps: a volume term is held at its high mark.

A PersistentVolumeClaim never shrinks (the API server refuses a smaller request, and the
release then fails to upgrade with the old volume in place), and a StatefulSet keeps the claims
of the replicas it scales away (``persistentVolumeClaimRetentionPolicy.whenScaled: Retain`` is
its default). A charge that followed the values down would let a tenant lower a size, have the
freed budget admitted elsewhere, and hold both: about the whole budget again per cycle.

So a contract term whose storage is persistent volumes says so (``volume: kept`` when removed
units keep their volumes, ``volume: released`` when the operator deletes them with the unit),
and its storage is charged at what the cluster may still hold while the application exists:

- ``kept``: unit ``i`` (the ``i``-th replica, whose claim a StatefulSet names ``...-i``) holds
  the largest size it had while it existed, and a unit scaled away keeps its claim; the term is
  charged the sum over every unit that ever existed. The marks are that staircase: "units below
  ``n`` hold at least ``size``" (key ``term#n``), at most :data:`MAX_STEPS` steps (merging two
  rounds up, never down). A forEach item that disappears keeps its marks: its volumes stay.
- ``released``: each unit's size never drops below its high mark, times the units that exist.

The marks travel in the signed record (:mod:`webhook.core.tenancy.records`), so they survive
replicas and restarts; they are raised by growth and released only by deleting the application. This
module is the pure arithmetic: given a charge and the previous marks, the charge held at the
marks, the new marks, and which terms are held (for ``explain`` and warnings).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Final

from webhook.core.pricing.evaluation import Charge, TermCharge

__all__ = ["KEPT", "RELEASED", "Held", "hold", "mark_key"]

KEPT: Final = "kept"
RELEASED: Final = "released"
_ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class Held:
    """A charge with every volume at its high mark."""

    charge: Charge
    marks: dict[str, Decimal]  # what the record keeps: per volume, its high mark
    # per volume held above what the values say: (what the values say, what is charged)
    held: dict[str, tuple[Decimal, Decimal]] = field(default_factory=dict)


def mark_key(term: TermCharge) -> str:
    """Where a volume's marks are kept: the term's name, and the forEach item it came from
    (``#`` and ``%`` escaped: item names are the tenant's, and ``#`` separates a step)."""
    path = term.path.replace("%", "%25").replace("#", "%23")
    return f"{term.term}:{path}" if path else term.term


def hold(charge: Charge, previous: Mapping[str, Decimal], released: Iterable[str] = ()) -> Held:
    """``charge`` with each volume term at what the cluster may still hold (see above).

    ``released`` names the contract's terms whose units' volumes go with the unit; the marks of
    any other term (including one the contract no longer has) are kept even when its term or
    item no longer appears: the cluster still holds those volumes.
    """
    going = frozenset(released)
    steps: dict[str, dict[int, Decimal]] = {}  # kept: base -> {units below n: at least size}
    units: dict[str, Decimal] = {}  # released: base -> the largest size of one unit
    for key, value in previous.items():
        base, sep, below = key.rpartition("#")
        if sep and below.isdigit() and 0 < len(below) <= 6:
            steps.setdefault(base, {})[int(below)] = value
        elif not sep:
            units[key] = value
    marks: dict[str, Decimal] = {}
    held: dict[str, tuple[Decimal, Decimal]] = {}
    extra = _ZERO
    seen: set[str] = set()
    for term in charge.terms:
        if not term.volume:
            continue
        base = mark_key(term)
        seen.add(base)
        now = term.resources.get("storage", _ZERO)
        if term.volume == RELEASED:
            mark = max(term.storage, units.get(base, _ZERO))
            charged = mark * term.count
            if mark > 0:
                marks[base] = mark
        else:
            stair = dict(steps.get(base, {}))
            count = int(term.count)
            if count > 0 and term.storage > 0:
                stair[count] = max(stair.get(count, _ZERO), term.storage)
            stair = _staircase(stair)
            charged = max(_total(stair), now)
            marks.update({f"{base}#{n}": size for n, size in stair.items()})
        if charged > now:
            extra += charged - now
            held[base] = (now, charged)
    for base, stair in steps.items():
        if base in seen or base.partition(":")[0] in going:
            continue
        stair = _staircase(stair)  # its units are gone, their volumes are not
        marks.update({f"{base}#{n}": size for n, size in stair.items()})
        total = _total(stair)
        if total > 0:
            extra += total
            held[base] = (_ZERO, total)
    if len(marks) > MAX_MARKS:
        marks = _collapsed(marks, seen)
    if not extra:
        return Held(charge, marks, held)
    resources = dict(charge.resources)
    resources["storage"] = resources.get("storage", _ZERO) + extra
    return Held(replace(charge, resources=resources), marks, held)


# The most marks a record keeps before it folds them. Past it (hundreds of forEach items, each
# scaled up and down), each item's staircase becomes one step (its most units at its largest
# size: more than its claims hold, never less), and the items that are gone fold into one
# figure per term, their sum, held as such; the record stays small enough to be believed.
MAX_MARKS: Final = 256


def _collapsed(marks: Mapping[str, Decimal], present: set[str]) -> dict[str, Decimal]:
    steps: dict[str, dict[int, Decimal]] = {}
    kept: dict[str, Decimal] = {}
    for key, value in marks.items():
        base, sep, below = key.rpartition("#")
        if sep and below.isdigit():
            steps.setdefault(base, {})[int(below)] = value
        else:
            kept[key] = value  # a released term's unit size: one mark per item already
    gone: dict[str, Decimal] = {}
    for base, stair in steps.items():
        if base in present:
            kept[f"{base}#{max(stair)}"] = max(stair.values())
        else:
            term = base.partition(":")[0]
            gone[term] = gone.get(term, _ZERO) + _total(stair)
    kept.update({f"{term}:*#1": total for term, total in gone.items() if total > 0})
    return kept


# A staircase this long covers any history of scalings an application sees in practice; past
# it, two steps merge into one that covers both (a little more is charged, never less).
MAX_STEPS: Final = 16


def _staircase(points: Mapping[int, Decimal]) -> dict[int, Decimal]:
    """The points no other point covers (a point (n, s) covers (m, t) when n >= m and s >= t),
    by unit count: sizes fall as counts rise. At most :data:`MAX_STEPS`."""
    kept: list[tuple[int, Decimal]] = []
    for n, size in sorted(points.items(), reverse=True):  # most units first
        if size <= 0 or n <= 0:
            continue
        if kept and kept[-1][1] >= size:
            continue  # a point with more units and at least this size covers it
        kept.append((n, size))
    kept.reverse()  # fewest units (largest size) first
    while len(kept) > MAX_STEPS:
        # Merge the two steps whose merge adds least: the wider count at the larger size.
        costs = [
            ((kept[i + 1][0] - kept[i][0]) * (kept[i][1] - kept[i + 1][1]), i)
            for i in range(len(kept) - 1)
        ]
        _, i = min(costs)
        kept[i : i + 2] = [(kept[i + 1][0], kept[i][1])]
    return dict(kept)


def _total(stair: Mapping[int, Decimal]) -> Decimal:
    """What the staircase holds: sum over units of the largest size covering each."""
    total = _ZERO
    below = 0
    for n, size in sorted(stair.items()):
        total += (n - below) * size
        below = n
    return total

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
from decimal import Decimal, localcontext
from typing import Final

from webhook.core.base.quantities import MAX_QUANTITY
from webhook.core.pricing.evaluation import Charge, TermCharge

__all__ = ["KEPT", "RELEASED", "Held", "hold", "mark_key", "read_step", "step_key"]

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


# The most digits a step's unit count has: evaluation refuses a term counting more units than a
# Kubernetes quantity holds (2^63-1), so every count a mark is keyed by has at most 19 digits.
# A key is read back only up to that bound: the work of reading one is bounded, and nothing
# written is ever passed over (``servers#1000000`` of a 1000 x 1000 ClickHouse included).
_UNITS_DIGITS: Final = len(str(int(MAX_QUANTITY)))


def step_key(base: str, units: int) -> str:
    """The key of the step "units below ``units`` hold at least ...", of the volume ``base``."""
    return f"{base}#{units}"


def read_step(key: str) -> tuple[str, int] | None:
    """``(base, units)`` of a step's key as :func:`step_key` writes it; ``None`` for any other
    key (a released term's unit size, keyed by its base alone, whose ``#`` are escaped)."""
    base, sep, below = key.rpartition("#")
    if not sep or not 0 < len(below) <= _UNITS_DIGITS or not below.isascii():
        return None
    if not below.isdigit() or below[0] == "0":
        return None
    return base, int(below)


def hold(charge: Charge, previous: Mapping[str, Decimal], released: Iterable[str] = ()) -> Held:
    """``charge`` with each volume term at what the cluster may still hold (see above).

    ``released`` names the contract's terms whose units' volumes go with the unit; the marks of
    any other term (including one the contract no longer has) are kept even when its term or
    item no longer appears: the cluster still holds those volumes.
    """
    # Exact, as evaluation is: a count of up to 19 digits times a size of up to 28 would be
    # rounded (perhaps down) in the default 28-digit context.
    with localcontext() as context:
        context.prec = 60
        return _hold(charge, previous, frozenset(released))


def _hold(charge: Charge, previous: Mapping[str, Decimal], going: frozenset[str]) -> Held:
    steps: dict[str, dict[int, Decimal]] = {}  # kept: base -> {units below n: at least size}
    units: dict[str, Decimal] = {}  # released: base -> the largest size of one unit
    for key, value in previous.items():
        step = read_step(key)
        if step is not None:
            steps.setdefault(step[0], {})[step[1]] = value
        elif "#" not in key:
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
            marks.update({step_key(base, n): size for n, size in stair.items()})
        if charged > now:
            extra += charged - now
            held[base] = (now, charged)
    for base, stair in steps.items():
        if base in seen or base.partition(":")[0] in going:
            continue
        stair = _staircase(stair)  # its units are gone, their volumes are not
        marks.update({step_key(base, n): size for n, size in stair.items()})
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
        step = read_step(key)
        if step is not None:
            steps.setdefault(step[0], {})[step[1]] = value
        else:
            kept[key] = value  # a released term's unit size: one mark per item already
    gone: dict[str, Decimal] = {}
    for base, stair in steps.items():
        if base in present:
            kept[step_key(base, max(stair))] = max(stair.values())
        else:
            term = base.partition(":")[0]
            gone[term] = gone.get(term, _ZERO) + _total(stair)
    kept.update({step_key(f"{term}:*", 1): total for term, total in gone.items() if total > 0})
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

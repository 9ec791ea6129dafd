"""Persistent volumes never release what the cluster keeps: a volume term is held at its high mark.

A PersistentVolumeClaim never shrinks (the API server refuses a smaller request, and the
release then fails to upgrade with the old volume in place), and a StatefulSet keeps the claims
of the replicas it scales away (``persistentVolumeClaimRetentionPolicy.whenScaled: Retain`` is
its default). A charge that followed the values down would let a tenant lower a size, have the
freed budget admitted elsewhere, and hold both: about the whole budget again per cycle.

So a contract term whose storage is persistent volumes says so (``volume: kept`` when removed
units keep their volumes, ``volume: released`` when the operator deletes them with the unit),
and its storage is charged at the largest figure admitted while the application exists:

- ``kept``: the term's total storage (units x size) never drops below its high mark, and a
  forEach item that disappears keeps its mark (its volumes are still there);
- ``released``: each unit's size never drops below its high mark, times the units that exist.

The marks travel in the signed record (:mod:`webhook.core.records`), so they survive replicas
and restarts; they are raised by growth and released only by deleting the application. This
module is the pure arithmetic: given a charge and the previous marks, the charge held at the
marks, the new marks, and which terms are held (for ``explain`` and warnings).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Final

from webhook.core.evaluation import Charge, TermCharge

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
    """Where a volume's mark is kept: the term's name, and the forEach item it came from."""
    return f"{term.term}:{term.path}" if term.path else term.term


def hold(charge: Charge, previous: Mapping[str, Decimal], released: Iterable[str] = ()) -> Held:
    """``charge`` with each volume term at ``max(now, previous mark)``.

    ``released`` names the contract's terms whose units' volumes go with the unit; a mark of
    any other term (including one the contract no longer has) is kept even when its term or
    item no longer appears: the cluster still holds that volume.
    """
    going = frozenset(released)
    marks: dict[str, Decimal] = {}
    held: dict[str, tuple[Decimal, Decimal]] = {}
    extra = _ZERO
    for term in charge.terms:
        if not term.volume:
            continue
        key = mark_key(term)
        now = term.resources.get("storage", _ZERO)
        if term.volume == RELEASED:
            mark = max(term.storage, previous.get(key, _ZERO))
            charged = mark * term.count
        else:
            mark = max(now, previous.get(key, _ZERO))
            charged = mark
        if mark > 0:
            marks[key] = mark
        if charged > now:
            extra += charged - now
            held[key] = (now, charged)
    for key, mark in previous.items():
        if key in marks or key.partition(":")[0] in going or mark <= 0:
            continue
        marks[key] = mark  # its unit is gone, its volume is not
        extra += mark
        held[key] = (_ZERO, mark)
    if not extra:
        return Held(charge, marks, held)
    resources = dict(charge.resources)
    resources["storage"] = resources.get("storage", _ZERO) + extra
    return Held(replace(charge, resources=resources), marks, held)

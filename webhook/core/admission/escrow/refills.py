"""How much a slice is refilled, and how much a renewal gives back: sized from the recent rate."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_FLOOR, Decimal

from webhook.core.admission.escrow.records import EscrowBounds

__all__ = ["refill_wanted", "surplus"]

_ZERO = Decimal(0)


def refill_wanted(
    rate: Mapping[str, Decimal], available: Mapping[str, Decimal], bounds: EscrowBounds
) -> dict[str, Decimal]:
    """What a refill should add when the slice holds less than ``runway_seconds`` of ``rate``
    (per second) on some key: enough for ``target_seconds`` of it (``{}``: no refill)."""
    runway = Decimal(str(bounds.runway_seconds))
    if all(available.get(key, _ZERO) >= value * runway for key, value in rate.items()):
        return {}
    target = Decimal(str(bounds.target_seconds))
    wanted = {key: value * target - available.get(key, _ZERO) for key, value in rate.items()}
    return {key: value for key, value in wanted.items() if value > 0}


def surplus(
    rate: Mapping[str, Decimal],
    available: Mapping[str, Decimal],
    bounds: EscrowBounds,
    *,
    least: Mapping[str, Decimal] | None = None,
) -> dict[str, Decimal]:
    """What a renewal gives back: the unspent room beyond ``target_seconds`` of ``rate`` (per
    second) on each key, and beyond ``least`` (the last admission's charge, so the slice still
    answers one more like it). A slice sized for a burst and kept alive by a trickle would
    otherwise hold the burst's room for as long as the trickle lasts, room no other replica
    and not the exact path may use. Whole units, rounded down."""
    target = Decimal(str(bounds.target_seconds))
    floor = least or {}
    given: dict[str, Decimal] = {}
    for key, held in sorted(available.items()):
        keep = max(rate.get(key, _ZERO) * target, floor.get(key, _ZERO))
        extra = (held - keep).to_integral_value(ROUND_FLOOR)
        if extra > 0:
            given[key] = extra
    return given

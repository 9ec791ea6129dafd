"""How much a refill of a slice asks for, and when folds earn a write.

Both are read by the escrow duty (:mod:`.escrowed`) each round over a pool it holds; neither
writes or waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

from webhook.core.admission import escrow as core
from webhook.core.admission.escrow import Spend, refill_wanted
from webhook.core.base import resources as rl

__all__ = ["FOLD_SPENDS", "Rates", "fold_due", "refill", "warmed_grant"]

FOLD_SPENDS = 128  # spends waiting to be folded that are worth a write of their own


@dataclass(frozen=True, slots=True)
class Rates:
    """What one process admitted into a pool lately, as a refill reads it (per key)."""

    rate: Mapping[str, Decimal]  # the decayed sum, per second
    expected: Mapping[str, Decimal]  # the rate the sum estimates (larger while it is young)
    warmth: float  # the share of a steady rate the sum holds at its age
    last: Mapping[str, Decimal]  # the last admission's charge


def refill(
    rates: Rates,
    available: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
    counted: Mapping[str, Decimal],
    bounds: core.EscrowBounds,
) -> dict[str, Decimal]:
    """What to grant a slice holding ``available`` unspent of a pool with ``budget`` that counts
    ``counted`` (the slice's outstanding room in it), ``{}`` for nothing.

    Due when the slice holds less than a second of the rate the sum estimates (by the sum
    alone, a second into a burst the slice was refilled with a fifth of a second left, less
    than a round and a write take, and the burst fell back meanwhile); sized from the sum,
    warmed while young, at least one more of the last charge; none that would not hold the
    last charge. The slice then holds at most a grant's share of the room free around it: a
    slice just granted a share still reads as short of a young burst's second, and granted a
    share of what was left round after round, one burst parked 42% of a shared pool's room.
    """
    budgeted = {k: v for k, v in rates.expected.items() if k in budget}
    wanted = refill_wanted(rl.mask(rates.rate, budget), available, bounds, expected=budgeted)
    if wanted:  # at least one more of the last admission (a whole unit at least)
        wanted = rl.maximum(wanted, rl.mask(rates.last, wanted))
    grow = core.grant_size(budget=budget, counted=counted, want=wanted, bounds=bounds)
    grow = warmed_grant(grow, rates.warmth, rates.rate, available, budget, counted, bounds)
    grow = _within_share(grow, available, budget, counted, bounds.share)
    # A slice that would not hold the last admission's charge answers nothing.
    last = rl.mask(rates.last, budget)
    if any(rl.add(available, grow).get(k, Decimal(0)) < v for k, v in last.items()):
        return {}
    return grow


def _within_share(
    grow: Mapping[str, Decimal],
    available: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
    counted: Mapping[str, Decimal],
    share: Decimal,
) -> dict[str, Decimal]:
    """``grow`` cut, per key, so that the slice then holds at most ``share`` of the room free
    around it (the pool's free room and its own unspent room); a key it already holds that
    share of gets nothing."""
    kept: dict[str, Decimal] = {}
    for key, value in grow.items():
        if key not in budget:
            continue
        held = available.get(key, Decimal(0))
        around = budget[key] - counted.get(key, Decimal(0)) + held
        most = (around * share - held).to_integral_value(ROUND_FLOOR)
        if min(value, most) > 0:
            kept[key] = min(value, most)
    return kept


def warmed_grant(
    plain: Mapping[str, Decimal],
    warmth: float,
    rate: Mapping[str, Decimal],
    available: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
    counted: Mapping[str, Decimal],
    bounds: core.EscrowBounds,
) -> dict[str, Decimal]:
    """``plain`` (the grant sized from ``rate`` as it is) sized instead from ``rate`` scaled up
    while the rate is younger than its time constant (``warmth`` below 1: a decayed sum that
    young holds only part of the rate, so the first grants held a fraction of a second and
    admissions fell back), each key at most a grant's share of the free room. No grant where
    ``plain`` is none: near the bound the pool takes the exact path, warm or not."""
    if not plain or warmth >= 0.99:
        return dict(plain)
    scaled = {k: v / Decimal(str(round(warmth, 6))) for k, v in rate.items()}
    wanted = refill_wanted(rl.mask(scaled, budget), available, bounds)
    grant = dict(plain)
    for key, value in wanted.items():
        free = budget[key] - counted.get(key, Decimal(0))
        share = min(value, free * bounds.share).to_integral_value(ROUND_FLOOR)
        grant[key] = max(grant.get(key, Decimal(0)), share)
    return grant


def fold_due(
    waiting: list[Spend],
    budget: Mapping[str, Decimal],
    counted: Mapping[str, Decimal],
    share: Decimal,
    *,
    pressed: bool,
) -> bool:
    """Whether the ``waiting`` spends' folds are worth a write of their own: the pool is
    ``pressed`` (over its budget or giving back), many spends wait (each admission walks
    them), or the room they count twice (spent and observed) is more than a grant's ``share``
    of the free room. Else they ride on the next refill or renewal."""
    if pressed or len(waiting) >= FOLD_SPENDS:
        return True
    spent = rl.total(spend.room for spend in waiting)
    return any(
        value > (limit - counted.get(key, Decimal(0))) * share
        for key, limit in budget.items()
        if (value := spent.get(key, Decimal(0))) > 0
    )

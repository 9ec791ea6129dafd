"""How much a refill asks for while a pool's rate is young, and when folds earn a write.

Both are read by the escrow duty (:mod:`.escrowed`) each round over a pool it holds; neither
writes or waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_FLOOR, Decimal

from webhook.core.admission import escrow as core
from webhook.core.admission.escrow import Spend, refill_wanted
from webhook.core.base import resources as rl

__all__ = ["FOLD_SPENDS", "fold_due", "warmed_grant"]

FOLD_SPENDS = 128  # spends waiting to be folded that are worth a write of their own


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

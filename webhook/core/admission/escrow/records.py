"""A slice as its pool's ``TenantReservation`` records it, the bounds, and the grant rule.

A record's figures are cumulative and only grow, and only its holder writes them (the
bounded counter's rule, Antidote's ``antidote_crdt_counter_b``): ``granted`` by refills,
``folded`` by spent room once observed or no longer storable, ``returned`` by room given back
unspent. Its *outstanding* room is ``granted - folded - returned``; a replica that missed
versions still learns exactly what was folded between two copies by subtracting. ``kinds`` is
fixed at the first grant: every replica waits for those kinds' watches before it releases room
folded out of the slice, so the holder spends it on no other kind. Another replica only ever
removes a whole record, once :func:`reclaimable`. What a grant gives (:func:`grant_size`), what
a refill asks for (:func:`refill_wanted`) and what a renewal gives back (:func:`surplus`) are
sized here, from the bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal

from webhook.core.base import resources as rl

__all__ = [
    "EscrowBounds",
    "SliceRecord",
    "covers_shortfall",
    "grant_size",
    "reclaimable",
    "refill_wanted",
    "surplus",
    "within",
]

_ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class EscrowBounds:
    """How long a slice lives and how large it is granted (``docs/escrow.md``, "Bounds")."""

    # A request the webhook decided at t is stored before t + 60 s or never: kube-apiserver's
    # --request-timeout (60 s by default) bounds the request the webhook call is part of.
    store_seconds: float = 60.0
    lease_seconds: float = 30.0
    renew_seconds: float = 10.0
    # The holder stops this long before its recorded expiry and a reclaimer waits this long past
    # expiry plus the store bound: wall clocks of two replicas may differ by up to this much.
    skew_seconds: float = 5.0
    runway_seconds: float = 1.0  # refill when less than this much of the recent rate is left
    target_seconds: float = 10.0  # a refill tops the slice up to this much of the recent rate
    idle_seconds: float = 30.0  # a slice not spent from for this long is returned
    share: Decimal = Decimal("0.25")  # at most this share of the pool's free room per grant
    # No grant smaller than this share of what is wanted: near the bound, where the free room
    # is too small to split, the pool takes the exact path.
    smallest: Decimal = Decimal("0.25")


@dataclass(frozen=True, slots=True)
class SliceRecord:
    """One replica's slice of one pool, as the pool's ``TenantReservation`` lists it."""

    incarnation: str  # the holder process's own id: no other life ever spends it
    holder: str  # the replica (pod) name, for operators
    kinds: frozenset[str]
    granted: Mapping[str, Decimal] = field(default_factory=dict)
    folded: Mapping[str, Decimal] = field(default_factory=dict)
    returned: Mapping[str, Decimal] = field(default_factory=dict)
    expires: float = 0.0  # wall clock, seconds since the epoch

    def outstanding(self) -> dict[str, Decimal]:
        """The room every replica counts whole: granted, neither folded nor returned (never
        below zero: a hostile record frees nothing)."""
        left = rl.subtract(rl.subtract(self.granted, self.folded), self.returned)
        return {key: max(_ZERO, value) for key, value in left.items()}

    def covers(self, other: SliceRecord) -> bool:
        """Whether every cumulative figure is at least ``other``'s (a write of ``other`` is in
        this copy, or one after it)."""
        pairs = (
            (self.granted, other.granted),
            (self.folded, other.folded),
            (self.returned, other.returned),
        )
        return all(
            mine.get(key, _ZERO) >= value for mine, theirs in pairs for key, value in theirs.items()
        )


def reclaimable(record: SliceRecord, wall_now: float, bounds: EscrowBounds) -> bool:
    """Whether any replica may remove ``record``: its holder stopped spending before
    ``expires`` (by its own monotonic deadline), and every request it may have answered was
    decided before then, so stored by ``expires + store_seconds`` or never; ``skew_seconds``
    covers this replica's wall clock running ahead of the holder's."""
    return wall_now > record.expires + bounds.store_seconds + bounds.skew_seconds


def within(budget: Mapping[str, Decimal], counted: Mapping[str, Decimal]) -> bool:
    """Whether a pool counted at ``counted`` is within ``budget`` on every key: a holder spends
    only then (its own slice is counted whole, so a lowered budget stops it as it stops an
    admission today)."""
    return all(counted.get(key, _ZERO) <= limit for key, limit in budget.items())


def covers_shortfall(
    available: Mapping[str, Decimal],
    after: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
) -> bool:
    """Whether giving back ``available`` (a slice's unspent room) would make a refused
    admission fit: it counted ``after`` against ``budget`` and went over on some key. Only then
    is the slice given back; a create larger than the slice's room too would be refused anyway,
    and giving back for it would let one oversized request empty every replica's slices."""
    over = {key: after.get(key, _ZERO) - limit for key, limit in budget.items()}
    over = {key: value for key, value in over.items() if value > 0}
    return bool(over) and all(available.get(key, _ZERO) >= value for key, value in over.items())


def grant_size(
    *,
    budget: Mapping[str, Decimal],
    counted: Mapping[str, Decimal],
    want: Mapping[str, Decimal],
    bounds: EscrowBounds,
) -> dict[str, Decimal]:
    """What may be granted of ``want`` in a pool with ``budget`` that counts ``counted`` (every
    slice's outstanding room, departed room, pending entries and observed usage): on every key
    bounded here at most ``share`` of the free room, and nothing at all (``{}``: the exact path)
    when that is below ``smallest`` of what is wanted on some key, or rounds to none."""
    granted: dict[str, Decimal] = {}
    for key, wanted in sorted(want.items()):
        if key not in budget or wanted <= 0:
            continue
        free = budget[key] - counted.get(key, _ZERO)
        give = min(wanted, free * bounds.share).to_integral_value(ROUND_FLOOR)
        if give <= 0 or give < wanted * bounds.smallest:
            return {}
        granted[key] = give
    return granted


def refill_wanted(
    rate: Mapping[str, Decimal],
    available: Mapping[str, Decimal],
    bounds: EscrowBounds,
    *,
    expected: Mapping[str, Decimal] | None = None,
) -> dict[str, Decimal]:
    """What a refill should add when the slice holds less than ``runway_seconds`` of the rate
    ``expected`` (per second; ``rate`` itself unless given: a young pool's is larger, its sum
    holding only part of its rate yet) on some key: enough for ``target_seconds`` of ``rate``
    (``{}``: no refill)."""
    runway = Decimal(str(bounds.runway_seconds))
    judged = rate if expected is None else expected
    if all(available.get(key, _ZERO) >= value * runway for key, value in judged.items()):
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

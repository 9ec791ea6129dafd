"""What one process admitted into each pool lately: the rate a slice is sized from.

A pool's recent rate is a decaying sum per key of what was admitted there (time constant
:data:`RATE_SECONDS`); the escrow duty sizes refills and renewals from it, gives a young rate
room to warm up, and sizes "no room for one more" by the last admission's charge. A pool no
admission has fed for the idle time is forgotten: the duty takes up a pool while it has a rate,
and a sum that only decays never reaches zero, so every pool ever admitted into would be taken
up four times a second for good.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal

__all__ = ["RATE_SECONDS", "YOUNGEST_SECONDS", "RecentAdmissions"]

RATE_SECONDS = 5.0  # the recent rate decays with this time constant
# A rate is never taken as younger than this: a young pool's admissions so far read as about
# that many a second. Taken as just born, one admission would read as twenty charges a second
# and park ten seconds of them in a shared pool; a fifth of a charge, and a burst's first
# grants held a fraction of a second each.
YOUNGEST_SECONDS = 1.0


class RecentAdmissions:
    """Each pool's recent rate per key, the kinds admitted there and the last charge."""

    def __init__(self, idle_seconds: float) -> None:
        self.idle_seconds = idle_seconds
        self._rates: dict[str, dict[str, float]] = {}  # pool -> key -> per second, decaying
        self._noted: dict[str, float] = {}  # pool -> when its rate was last brought up to date
        self._admitted: dict[str, float] = {}  # pool -> when an admission last fed its rate
        self._since: dict[str, float] = {}  # pool -> when its recent rate started counting
        self._kinds: dict[str, set[str]] = {}  # pool -> kinds recently admitted there
        self._last: dict[str, dict[str, Decimal]] = {}  # pool -> the last admission's charge

    def note(self, pool: str, room: Mapping[str, Decimal], kind: str, now: float) -> None:
        """An admission of ``kind`` charged ``room`` to ``pool`` at ``now`` (monotonic)."""
        rates = self.rate(pool, now)
        if not rates:
            self._since[pool] = now
            rates = self._rates.setdefault(pool, {})
            self._noted[pool] = now
        for key, value in room.items():
            rates[key] = rates.get(key, 0.0) + float(value) / RATE_SECONDS
        self._kinds.setdefault(pool, set()).add(kind)
        self._last[pool] = dict(room)
        self._admitted[pool] = now

    def rate(self, pool: str, now: float) -> dict[str, float]:
        """``pool``'s recent rate per key, decayed to ``now`` (empty once idle: then nothing is
        kept of the pool, so pools admitted into once, sub-tenants come and gone, leave no
        entry behind for every later round to walk)."""
        rates = self._rates.get(pool)
        if rates is None:
            return {}
        last = self._noted.get(pool, now)
        if now - self._admitted.get(pool, now) > self.idle_seconds:
            for kept in (self._rates, self._noted, self._admitted, self._since, self._kinds):
                kept.pop(pool, None)
            self._last.pop(pool, None)
            return {}
        decay = math.exp(-(now - last) / RATE_SECONDS)
        for key in rates:
            rates[key] *= decay
        self._noted[pool] = now
        return rates

    def rated(self, now: float | None = None) -> set[str]:
        """The pools with a recent rate (as of their last update, or brought up to ``now``:
        a pool whose rate nothing else brings up to date, its object or its budget gone, is
        forgotten once idle all the same)."""
        if now is not None:
            for pool in [pool for pool, rates in self._rates.items() if rates]:
                self.rate(pool, now)
        return {pool for pool, rates in self._rates.items() if rates}

    def kinds(self, pool: str) -> frozenset[str]:
        return frozenset(self._kinds.get(pool, ()))

    def last(self, pool: str) -> dict[str, Decimal]:
        """The charge of the last admission into ``pool`` ({}: none)."""
        return self._last.get(pool, {})

    def estimate(self, pool: str, now: float) -> dict[str, float]:
        """``pool``'s rate per key as its recent sum estimates it: a sum younger than a few
        time constants holds only its :meth:`warmth` of a steady rate, so it is scaled up by
        it. A slice refilled at a second of the sum alone was refilled, a second into a
        burst, when a fifth of a second of it was left: less than a round and a write take,
        and the burst fell back to the exact path until the refill landed."""
        warmth = self.warmth(pool, now)
        rates = self.rate(pool, now)
        return rates if warmth >= 0.99 else {key: v / warmth for key, v in rates.items()}

    def warmth(self, pool: str, now: float) -> float:
        """The share of its rate a decayed sum ``pool``'s age holds (the age taken as at least
        :data:`YOUNGEST_SECONDS`; about 1 once older than a few time constants)."""
        age = now - self._since.get(pool, now - 10 * RATE_SECONDS)
        return 1.0 - math.exp(-max(age, YOUNGEST_SECONDS) / RATE_SECONDS)

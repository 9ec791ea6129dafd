"""Room a refusal asked the pool's slices for: the one ``escrowed`` answer that is a promise.

A request refused for a pool's budget that the other replicas' slices could answer is told
"try again" (``escrowed``) only while that room may really come back (``docs/escrow.md``). No
replica can tell from a slice's record how much of it its holder has spent (spends are made in
memory and folded later), so the refusing replica *asks*: it records the refused request's size
on the pool's object (``status.wanted``, until ``expires``), and every holder's escrow duty
then gives back what the pool is short of it outside the slices, as far as its slice holds it
unspent, and grants nothing that would take its room (:func:`with_want`). The refusing
replica promises that room only for :data:`ANSWER_SECONDS` after asking; past that, while the
want lasts, what the others still hold is taken as spent and the answer is ``exceeded``. A
client retrying on "try again" therefore gets a definite answer within a few seconds, whatever
the holders' last charges were and however much of their slices was spent.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webhook.admission.ledger import bounds
from webhook.admission.ledger.book import Book, Conflict
from webhook.admission.ledger.entries import expired, expiry
from webhook.core.base import resources as rl
from webhook.core.base.json_codec import encode_json
from webhook.core.base.quantities import parse_quantity
from webhook.kube.client import ApiError

__all__ = [
    "ANSWER_SECONDS",
    "WANT_SECONDS",
    "Asked",
    "Wants",
    "covers",
    "want_json",
    "wanted_room",
    "with_want",
]

log = logging.getLogger("webhook.admission.ledger")  # one logger for all of the ledger

ANSWER_SECONDS = 3.0  # holders' duty (every 0.25 s), their write and its watch event, with room
WANT_SECONDS = 30.0  # how long holders keep the want's room (a slice's idle time)
# A want is never written to expire later than WANT_SECONDS on; one expiring later than that
# and the replicas' clock skew (the escrow's skew bound) is another writer's, and asks nothing.
_LATEST_SECONDS = WANT_SECONDS + 5.0


def wanted_room(status: Mapping[str, Any], now: float) -> dict[str, Decimal]:
    """The room a refusal asked ``status``'s pool for, if its want has not expired (``now``,
    wall seconds): holders treat the pool as full for it. Another writer's malformed want asks
    for what parses of it; one expiring past what any replica writes asks nothing (it would
    keep every slice of the pool away for as long as it says)."""
    raw = status.get("wanted")
    if not isinstance(raw, Mapping) or expired(raw, expiry(now)):
        return {}
    if not expired(raw, expiry(now + _LATEST_SECONDS)):
        return {}
    room = raw.get("room")
    found: dict[str, Decimal] = {}
    if isinstance(room, Mapping):
        for key, value in room.items():
            with contextlib.suppress(Exception):
                quantity = parse_quantity(value)
                if quantity > 0:
                    found[str(key)] = quantity
    return found


def with_want(
    current: Mapping[str, Any],
    counted: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
    now: float,
) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    """``counted`` (every slice counted whole) with the room the pool's object ``current``
    asks for added, and the want's shortfall: how much more room than the pool has outside
    the slices it asks for, on each key. A holder gives back that much (not its whole slice:
    a want just over the free room kept every slice of a roomy pool away), and sizes grants
    on the count with the want in it, so that no refill takes the room the refused request
    takes on retry."""
    want = rl.mask(wanted_room(current.get("status") or {}, now), budget)
    with_it = rl.add(counted, want)
    short = rl.positive_part(rl.subtract(rl.mask(with_it, want), budget))
    return with_it, short


def want_json(room: Mapping[str, Decimal], now: float) -> dict[str, Any]:
    """``status.wanted`` asking for ``room`` from ``now`` (wall seconds) on."""
    return {"room": rl.to_strings(room), "expires": expiry(now + WANT_SECONDS)}


def covers(room: Mapping[str, Decimal], wanted: Mapping[str, Decimal]) -> bool:
    """Whether ``room`` is at least ``wanted`` on every key ``wanted`` names."""
    return all(room.get(key, Decimal(0)) >= value for key, value in wanted.items())


@dataclass(frozen=True, slots=True)
class Asked:
    """What this replica asked a pool's holders for, and when (its clock)."""

    room: Mapping[str, Decimal]
    at: float

    def answering(self, now: float) -> bool:
        """Whether the holders may still be giving back (the promise holds)."""
        return now < self.at + ANSWER_SECONDS

    def lasts(self, now: float) -> bool:
        return now < self.at + WANT_SECONDS


class Wants:
    """The wants this replica posted or relied on, by pool, and the write that posts one. What
    it asked is remembered by its monotonic clock (a wall clock set back would stretch the
    promise); a want's expiry on the object is wall time, read by other processes."""

    def __init__(self, book: Book, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.book = book
        self.monotonic = monotonic
        self._asked: dict[str, Asked] = {}

    def asked(self, pool: str) -> Asked | None:
        """What this replica asked ``pool``'s holders for within :data:`WANT_SECONDS`."""
        found = self._asked.get(pool)
        if found is not None and not found.lasts(self.monotonic()):
            del self._asked[pool]
            return None
        return found

    def answering(self, pool: str) -> bool:
        """Whether this replica asked ``pool``'s holders less than :data:`ANSWER_SECONDS` ago:
        what they hold may still come back."""
        found = self.asked(pool)
        return found is not None and found.answering(self.monotonic())

    async def ask(self, pool: str, room: Mapping[str, Decimal]) -> bool:
        """Record on ``pool``'s object that a refusal wants ``room`` (a want already there that
        covers it is taken as is, a smaller one grown to it), so that every holder treats the
        pool as full for it; whether the stored object asks for it now."""
        book = self.book
        async with book.lock(pool):
            asked = await self._ask(pool, room)
        if not asked:
            # Not asked again for a while: each refusal would be one more write of the
            # pool's whole object under its lock (a schema that prunes the want, a write that
            # keeps failing). Meanwhile the answer is "exceeded", as for this one.
            self._asked[pool] = Asked({}, self.monotonic() - ANSWER_SECONDS)
        return asked

    async def _ask(self, pool: str, room: Mapping[str, Decimal]) -> bool:
        """One ask under the pool's lock: whether the stored object asks for ``room`` now."""
        book = self.book
        for _ in range(3):
            current = book.objects.get(pool)
            if current is None:
                return False
            now = book.clock()
            status = dict(current.get("status") or {})
            there = wanted_room(status, now)
            if covers(there, room):
                self._asked[pool] = Asked(there, self.monotonic())
                return True
            wanted = want_json(rl.maximum(there, room), now)
            if len(encode_json({"wanted": wanted})) > bounds.MAX_WANT_BYTES:
                return False  # past its share of the object: "exceeded", as unasked
            status["wanted"] = wanted
            try:
                stored = await book.write(pool, current, status)
            except Conflict:
                continue  # the newer copy is read: ask on it
            except ApiError as exc:
                log.warning("ledger write failed", extra={"fields": {"error": str(exc)}})
                return False
            # Only what the stored object asks for is asked: an API server whose schema
            # does not know the field prunes it, and no holder would ever read it.
            asked = wanted_room(stored.get("status") or {}, now)
            if not covers(asked, room):
                return False
            self._asked[pool] = Asked(asked, self.monotonic())
            return True
        return False

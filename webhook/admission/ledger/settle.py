"""When a held charge stops counting: expiry, the sweep, and entries that departed the ledger.

An entry is held until its object is observed newer than its admission (it *settles*: every
replica drops it from its count, and the next write drops it from the list), or until its grace
period passes (it *expires*: the next write drops it). The floor an update's charge leaves
under its application (:class:`~webhook.core.admission.pending.PendingCharges`) lasts until that
expiry unless an observation only it explains settles it, and goes with the sweep or a
refusal. An entry that left the ledger still counts on a replica whose state has not yet seen
the write that removed it (it *departed*): a request refused for the pool's budget first sweeps
the pool's expired entries, then waits (bounded) until nothing departed is still counted, and is
decided again. Every replica also periodically asks the state to confirm the kinds that still
hold something back (:meth:`Settle.sweep`), so a release never waits for the kind's own traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

from webhook.admission.ledger.barrier import Barrier
from webhook.admission.ledger.book import Book, Conflict
from webhook.admission.ledger.entries import expired, listed
from webhook.admission.ledger.status import Status
from webhook.core.admission.decisions import Decision
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.tenants import beneath
from webhook.kube.client import ApiError

__all__ = ["Settle", "explain_floors"]


def explain_floors(
    decision: Decision, state: ReservationState, grace: float, namespace: str = ""
) -> Decision:
    """Say so when what the refusing pool counts includes an application held at a size an
    update admitted moments ago may still write back (:mod:`webhook.core.admission.floors`):
    the room its shrink seems to free is not there yet. Only the requester's own applications
    (in ``namespace`` or beneath it) are named; another tenant's are only counted."""
    pool = decision.pool
    held = sorted(key for key, _ in state.pending.topups() if beneath(key[1], pool))
    if not pool or not held:
        return decision
    own = [key for key in held if beneath(key[1], namespace)] if namespace else []
    others = len(held) - len(own)
    if own:
        kind, where, name = own[0]
        more = len(own) - 1 + others
        named = f"{kind} {where}/{name}" + (f" (and {more} more)" if more else "")
    else:
        named = f"{others} application{'s' if others > 1 else ''} of another tenant"
    message = (
        f"{decision.message}; it counts {named} at the size an update "
        "admitted moments ago may still write back (the API server stores updates without a "
        f"precondition), until that update is seen stored or {grace:g}s have passed: try again "
        "shortly"
    )
    return replace(decision, message=message, audit={**decision.audit, "message": message})


class Settle:
    """Drops what expired from a pool's ledger, and waits for what departed to stop counting."""

    def __init__(self, book: Book, status: Status, barrier: Barrier) -> None:
        self.book = book
        self.status = status
        self.barrier = barrier

    def sweep(self) -> None:
        """Release what the state has caught up with, and have the state confirm the kinds
        that still hold something back (every replica, periodically)."""
        pending = self.book.current().pending
        pending.expire_floors(self.book.now())
        # Room departed from slices is left to the watches' own traffic here (a busy pool's
        # next event passes it within milliseconds): a consistent read of a kind is a full
        # list, and a fold every escrow round would have every replica list it back to back.
        # A denial for the budget still confirms it (:meth:`wait_departed`).
        self.barrier.confirm(self.book.awaiting(departed=False))

    async def expire(self, pool: str) -> bool:
        """Drop ``pool``'s entries past their grace period and wait (bounded) until the state
        has seen every write up to their removal (and that of entries already gone from the
        ledger but still counted); whether anything may have been released."""
        book = self.book
        now = book.now()
        freed = book.current().pending.expire_floors(now)  # writes that can no longer land
        current = book.objects.get(pool)
        if current is None:
            return freed
        if not any(expired(e, now) for e in listed(current)):
            if freed:
                return True
            if not self.departed(pool):
                return False
            await self.wait_departed(pool)
            book.current().pending.expire_floors(book.now())  # those whose entries went
            return True
        async with book.locked([pool]):
            current = book.objects.get(pool)
            state = book.current()
            if current is not None:
                kept = self.status.kept(pool, current, state, without=set())
                if len(kept) < len(listed(current)):
                    status = self.status.build(pool, current, state, kept)
                    with contextlib.suppress(Conflict, ApiError):
                        await book.write(pool, current, status)
        await self.wait_departed(pool)
        book.current().pending.expire_floors(book.now())  # those whose entries were released
        return True

    async def wait_departed(self, pool: str) -> bool:
        """Wait (bounded) until no entry that left ``pool``'s ledger is still counted."""
        loop = asyncio.get_running_loop()  # a bounded real wait, whatever the ledger's clock
        deadline = loop.time() + self.book.settings.catch_up_seconds
        while loop.time() < deadline:
            if not self.departed(pool):
                break
            self.barrier.confirm(self.book.awaiting(pool))
            await asyncio.sleep(0.02)
        return True

    def departed(self, pool: str) -> bool:
        """Whether entries or slice room that left ``pool`` are still counted."""
        book = self.book
        return bool(book.current().pending.departed(pool)) or any(
            book.slices.count.departed(pool).values()
        )

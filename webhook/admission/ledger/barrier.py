"""The read barrier: no decision for a pool until the state has seen what its ledger removed.

A replica whose copy of a pool's ledger jumps past entries it never saw (admitted and removed
between two versions it read, their objects perhaps stored where its state has not looked yet)
finds the ``released`` counts grown by more than it saw leave: the pool is *fenced* until the
state has reached that version (:mod:`webhook.core.admission.pending`; so do escrowed slices,
:mod:`.slices`). The barrier waits for
that, bounded (the caller then answers "try again"), and never depends on the kind's own
traffic: a kind whose watch lags is confirmed by a consistent read (``LiveState.confirm``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from webhook.admission.ledger.book import Book

__all__ = ["Barrier"]


class Barrier:
    """Waits, bounded, until the live state has passed every fence on some pools."""

    def __init__(self, book: Book) -> None:
        self.book = book

    async def wait_unfenced(self, pools: list[str], deadline: float) -> bool:
        """Wait (until ``deadline``, loop time) for the state to pass every fence on ``pools``;
        whether it did. A quiet kind is confirmed by a consistent read, not awaited."""
        loop = asyncio.get_running_loop()
        book = self.book
        while True:
            if not any(book.fenced(pool) for pool in pools):
                return True
            if loop.time() >= deadline:
                return False
            for pool in pools:
                self.confirm(book.awaiting(pool))
            await asyncio.sleep(0.02)

    def confirm(self, wanted: Mapping[str, int]) -> None:
        """Ask the state to confirm each kind up to its revision (see ``LiveState.confirm``)."""
        live = self.book.live
        for kind, revision in wanted.items():
            if live.observed_version(kind) < revision:
                live.confirm(kind, revision)

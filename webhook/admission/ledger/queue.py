"""How admissions for one pool wait: a queue per pool, drained in batches, one at a time.

Admissions for one pool queue while a write for that pool is in flight; the queue is then
handed, as one batch, to the commit that decides and writes it (:mod:`.commit`), under the
pool's lock. Every request in a batch is answered whatever happens: a batch that fails for any
reason answers what it has not answered with "try again", and never stops the pool's queue. A
request whose caller has gone (its future is done) is skipped by the commit and holds nothing.

The entries of requests refused in another pool (:meth:`Queues.remove`) wait in the same queue
and ride on its next write: the batch's own, or, with no request waiting, one write for every
removal waiting. So a burst of carve-out creates their child pool refuses costs the parent
pool no write of its own per refusal, and a removal once queued is made whatever becomes of
the request's caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Set
from dataclasses import dataclass, field

from webhook.admission.ledger import answers
from webhook.admission.ledger.book import Book
from webhook.core.admission.decisions import Decision, Policy, Prepared
from webhook.core.admission.reviews import AdmissionRequest

__all__ = ["Queues", "Waiter", "answer"]

log = logging.getLogger("webhook.admission.ledger")  # one logger for all of the ledger


@dataclass
class Waiter:
    """One request waiting in its pool's queue for its answer."""

    request: AdmissionRequest
    policy: Policy
    future: asyncio.Future[Decision]
    prepared: Prepared | None = None  # the price decided before it queued, reused if still true
    # Every pool a request charging several charges (sorted): this queue's batch writes its
    # entry here only, and the others' batches their own, one after another (empty: one pool).
    pools: tuple[str, ...] = ()


@dataclass
class _Queue:
    waiting: list[Waiter] = field(default_factory=list)
    # Uids whose entry the next write removes, each told once a write has been tried for it.
    removing: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    draining: asyncio.Task[None] | None = None


# A pool's batch and the uids whose entries its write removes, decided and written at once.
_CommitBatch = Callable[[str, list[Waiter], Set[str]], Awaitable[None]]


class Queues:
    """One queue per pool, drained into ``commit`` one batch at a time under the pool's lock."""

    def __init__(self, book: Book, commit: _CommitBatch) -> None:
        self.book = book
        self.commit = commit
        self.on_batch: Callable[[int], None] = lambda size: None  # e.g. observe in a metric
        self._queues: dict[str, _Queue] = {}

    async def enqueue(
        self,
        pool: str,
        request: AdmissionRequest,
        policy: Policy,
        prepared: Prepared | None = None,
        pools: tuple[str, ...] = (),
    ) -> Decision:
        queue = self._queues.setdefault(pool, _Queue())
        future = asyncio.get_running_loop().create_future()
        waiter = Waiter(request, policy, future, prepared, pools)
        queue.waiting.append(waiter)
        self._start(pool, queue)
        return await waiter.future

    def remove(self, pool: str, uid: str) -> asyncio.Future[None]:
        """Have ``pool``'s next write remove ``uid``'s entry (a request refused elsewhere, which
        no object will carry); done once a write has been tried for it (best effort: an entry
        left behind is dropped with its grace period like any other). Queued at once, so the
        removal is made even if whoever waits for it is cancelled."""
        queue = self._queues.setdefault(pool, _Queue())
        future = queue.removing.get(uid)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            queue.removing[uid] = future
        self._start(pool, queue)
        return future

    def _start(self, pool: str, queue: _Queue) -> None:
        if queue.draining is None:
            queue.draining = asyncio.create_task(self._drain(pool, queue))

    async def _drain(self, pool: str, queue: _Queue) -> None:
        try:
            while queue.waiting or queue.removing:
                batch, queue.waiting = queue.waiting, []
                removing, queue.removing = queue.removing, {}
                if batch:
                    self.on_batch(len(batch))
                async with self.book.lock(pool):
                    try:
                        await self.commit(pool, batch, frozenset(removing))
                    except Exception:  # one bad batch must not stop the pool's queue
                        log.exception("ledger batch failed", extra={"fields": {"pool": pool}})
                    for waiter in batch:
                        if not waiter.future.done():
                            waiter.future.set_result(answers.unavailable())
                    for removed in removing.values():
                        if not removed.done():
                            removed.set_result(None)
        finally:
            queue.draining = None


def answer(given: Iterable[tuple[Waiter, Decision]]) -> None:
    """Give each waiter its decision (unless its caller has gone)."""
    for waiter, decision in given:
        if not waiter.future.done():
            waiter.future.set_result(decision)

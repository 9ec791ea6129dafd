"""The ledger one replica admits through: which part of the ledger decides each request.

:class:`Ledger` owns the parts and routes a request to them: a request the ledger does not hold
(a DELETE, or a dry run when ``dry_run_holds`` is off) is decided at once; a request refused for
the pool's budget first has the pool's expired entries swept (:mod:`.settle`) and is decided
again; a sub-Tenant allowed only in warn has its cap recorded (:mod:`.shares`); a namespace no
Tenant owns holds nothing; a request charging one pool waits in that pool's queue
(:mod:`.queue`) for its batch's commit, one charging several has a part in each of their
batches in turn (:mod:`.commit`). A held dry run's answer says for how long it is held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from decimal import Decimal

from webhook.admission.ledger import answers
from webhook.admission.ledger.barrier import Barrier
from webhook.admission.ledger.book import Book, StateSource
from webhook.admission.ledger.bounds import LedgerSettings
from webhook.admission.ledger.commit import Commit, decided_replacing
from webhook.admission.ledger.escrowed import Escrowed
from webhook.admission.ledger.fallbacks import fallback_reason
from webhook.admission.ledger.queue import Queues
from webhook.admission.ledger.settle import Settle, explain_floors
from webhook.admission.ledger.shares import Caps, largest_share
from webhook.admission.ledger.status import Status
from webhook.admission.ledger.wants import Wants
from webhook.core.admission.decisions import (
    Decided,
    Decision,
    Policy,
    Prepared,
    decide,
    errored,
    held_dry_run,
)
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.admission.warn_caps import explain_cap, over_in_warn
from webhook.core.base import resources as rl
from webhook.kube.client import KubeClient
from webhook.kube.reflector import Reflector
from webhook.waits import sleep_unless_stopped, sleep_unless_woken

__all__ = ["Ledger"]


def _ignore_write(pool: str, refilled: bool, returned: bool) -> None:
    return None


class Ledger:
    """Admits increases through the cluster-wide ledger; one per replica."""

    def __init__(
        self,
        client: KubeClient,
        live: StateSource,
        settings: LedgerSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._book = Book(client, live, settings, clock=clock)
        self._status = Status(self._book)
        self._barrier = Barrier(self._book)
        self._settle = Settle(self._book, self._status, self._barrier)
        self._caps = Caps(self._book, self._status)
        self._commit = Commit(self._book, self._status, self._barrier)
        self._queues = Queues(self._book, self._commit.batch)
        self._escrowed = Escrowed(self._book, self._status) if settings.escrow else None
        self._rolling_back: set[asyncio.Task[None]] = set()  # cancelled requests' entries
        self._wants = Wants(self._book)  # room this replica asked others' slices to give back
        # With escrow on, told of each admission the slices did not answer: (reason from
        # :data:`.fallbacks.REASONS`, seconds the exact path took to answer it).
        self.on_fallback: Callable[[str, float], None] = lambda reason, seconds: None

    @property
    def client(self) -> KubeClient:
        return self._book.client

    @property
    def live(self) -> StateSource:
        return self._book.live

    @property
    def settings(self) -> LedgerSettings:
        return self._book.settings

    @settings.setter
    def settings(self, settings: LedgerSettings) -> None:
        self._book.settings = settings

    @property
    def clock(self) -> Callable[[], float]:
        return self._book.clock

    @property
    def reflector(self) -> Reflector:
        return self._book.reflector

    @property
    def synced(self) -> bool:
        return self._book.reflector.synced

    @property
    def conflicts(self) -> int:
        """Conditional writes another replica's write came before."""
        return self._book.conflicts

    @property
    def writes(self) -> int:
        """Writes of ledger objects attempted."""
        return self._book.writes

    @property
    def failures(self) -> int:
        """Writes refused for anything but a conflict."""
        return self._book.failures

    @property
    def on_batch(self) -> Callable[[int], None]:
        """Called with each batch's size as it is drained (e.g. to observe it in a metric)."""
        return self._queues.on_batch

    @on_batch.setter
    def on_batch(self, on_batch: Callable[[int], None]) -> None:
        self._queues.on_batch = on_batch

    def holds(self) -> int:
        """Pending charges held in every pool's ledger object, as this replica last saw them."""
        return self._book.holds()

    def largest_share(self) -> float:
        """The largest share of a pool's ledger (of :data:`MAX_ENTRIES`) that one tenant's
        listed entries take now, over every pool (for metrics: one figure, no labels)."""
        return largest_share(self._book.objects)

    async def admit(self, request: AdmissionRequest, policy: Policy) -> Decision:
        state = self._book.current()
        if request.operation not in ("CREATE", "UPDATE") or (
            request.dry_run and not self.settings.dry_run_holds
        ):
            return decide(request, state, policy)
        escrowed = self._escrowed
        if escrowed is None:
            return await self._admit_exact(request, policy, state, None)
        spent = escrowed.admit(request, policy, state)
        if spent is not None:
            escrowed.note(request, spent)
            return spent
        started = time.monotonic()
        if await escrowed.open(request, policy, state):  # a cold pool's first slice
            spent = escrowed.admit(request, policy, self._book.current())
            if spent is not None:
                escrowed.note(request, spent)  # its charge started the pool's rate already
                return spent
        answer = await self._admit_exact(request, policy, state, escrowed)
        self.on_fallback(fallback_reason(escrowed, request, answer), time.monotonic() - started)
        return answer

    async def _admit_exact(
        self,
        request: AdmissionRequest,
        policy: Policy,
        state: ReservationState,
        escrowed: Escrowed | None,
    ) -> Decision:
        """A CREATE or UPDATE the slices did not answer: the pool's ledger decides it."""
        decided = decided_replacing(request, state, policy)
        decision = decided.decision
        expired = not decision.allowed and decision.reason == "exceeded" and decision.pool
        if expired and await self._settle.expire(decision.pool):
            state = self._book.current()
            decided = decided_replacing(request, state, policy)
            decision = decided.decision
        refused = not decision.allowed and decision.reason == "exceeded" and decision.pool
        if refused and escrowed is not None and await escrowed.give_back(decision):
            # Near the bound: what this replica's slice holds unspent goes back to the pool
            # (one write) and the exact path decides again, so the last byte can be used.
            state = self._book.current()
            decided = decided_replacing(request, state, policy)
            decision = decided.decision
        if over_in_warn(request, decision):
            return await self._caps.admit_capped(request, policy, decision)
        if not decision.allowed and decision.reason == "exceeded":
            decision = explain_cap(decision, state)
            decision = explain_floors(
                decision, state, self.settings.grace_seconds, request.namespace
            )
        if not decision.allowed or not decision.charged_pools:
            return await self._escrowed_elsewhere(decision, state, dry_run=request.dry_run)
        node = state.tree.get(request.namespace)
        if node is None or not node.declared:
            # A namespace no Tenant owns: the API server would not store the object (Cozystack
            # creates tenant namespaces from Tenants), so nothing is held for it: an
            # unauthenticated caller cannot fill a pool through namespaces that do not exist.
            if decision.mode != "enforce":
                return decision
            return errored(
                403,
                "Forbidden",
                "no-tenant",
                f"tenant reservations: namespace {request.namespace} belongs to no tenant the "
                "webhook knows of; if it was just created, try again",
            )
        if len(request.uid) > 128 or not request.uid:
            return errored(400, "BadRequest", "invalid", "tenant reservations: invalid uid")
        pools = sorted(decision.charged_pools)
        answer = await self._exact(pools, request, policy, decided)
        refused = not answer.allowed and answer.reason == "exceeded" and answer.pool
        if refused and escrowed is not None and await escrowed.give_back(answer):
            answer = await self._exact(pools, request, policy, None)  # the room given back
        if request.dry_run and answer.allowed and answer.charged_pools:
            return held_dry_run(answer, self.settings.grace_seconds)
        if escrowed is not None and answer.allowed:
            escrowed.note(request, answer)
        return await self._escrowed_elsewhere(answer, self._book.current(), dry_run=request.dry_run)

    async def _escrowed_elsewhere(
        self, decision: Decision, state: ReservationState, *, dry_run: bool = False
    ) -> Decision:
        """An "exceeded" the room in other replicas' slices would answer says "try again" only
        while that room may come back: the pool's holders are asked for it (``status.wanted``,
        :mod:`.wants`) and give back what it is short of, as far as they hold it unspent; a
        few seconds after asking, what they still hold is spent, and the answer is "exceeded"
        again. A dry run asks nothing (the webhook has no side effects on one): "try again"
        only while another refusal's ask is answered."""
        if decision.allowed or decision.reason != "exceeded" or not decision.pool:
            return decision
        own = self._escrowed.escrow.incarnation if self._escrowed is not None else ""
        held = self._book.slices.count.outstanding(decision.pool, besides=own)
        node = state.tree.get(decision.pool)
        if not any(held.values()) or node is None:
            return decision
        increase = rl.mask(rl.positive_part(decision.delta or {}), node.budget)
        without = rl.add(rl.subtract(node.usage, held), increase)
        if not increase or rl.exceeded(without, node.budget):
            return decision
        pool = decision.pool
        if self._wants.asked(pool) is None:
            if dry_run or not await self._wants.ask(pool, increase):
                return decision  # the holders were not asked: nothing says the room comes back
        elif not self._wants.answering(pool):
            return decision  # asked, and what the holders still hold did not come back: spent
        return answers.held_in_slices(pool, rl.mask(held, increase))

    async def _exact(
        self,
        pools: list[str],
        request: AdmissionRequest,
        policy: Policy,
        decided: Decided | None,
    ) -> Decision:
        """The exact path: the pool's batched conditional write, or a part in each pool's."""
        prepared = decided.prepared if decided is not None else None
        if len(pools) == 1:
            return await self._queues.enqueue(pools[0], request, policy, prepared)
        return await self._across(pools, request, policy, prepared)

    async def _across(
        self,
        pools: list[str],
        request: AdmissionRequest,
        policy: Policy,
        prepared: Prepared | None,
    ) -> Decision:
        """``request`` charging every pool of ``pools`` (sorted): its part in each pool's batch
        in turn, holding no pool while it waits for another; refused anywhere (or its caller
        gone), what its earlier parts wrote is removed."""
        decision: Decision | None = None
        try:
            for pool in pools:
                decision = await self._queues.enqueue(
                    pool, request, policy, prepared, pools=tuple(pools)
                )
                if not decision.allowed:
                    await self._roll_back(pools, request.uid)
                    break
        except asyncio.CancelledError:  # waiting for a part or removing them: finish off-task
            self._roll_back_later(pools, request.uid)
            raise
        assert decision is not None
        return decision

    async def _roll_back(self, pools: list[str], uid: str) -> None:
        """Remove ``uid``'s entries (a request that failed holds nothing): no longer counted
        here at once, each removed by its pool's next write (:meth:`.Queues.remove`), queued
        before anything is awaited, so a cancellation cannot leave one behind."""
        self._book.current().pending.withdraw(uid)  # never answered "allowed": nothing stored
        # Every pool, a part still being written (its caller gone) included: its removal waits
        # in the queue behind that write.
        await asyncio.wait([self._queues.remove(pool, uid) for pool in pools])

    def _roll_back_later(self, pools: list[str], uid: str) -> None:
        """Remove a cancelled request's entries off its caller's task (which is ending)."""
        task = asyncio.get_running_loop().create_task(self._roll_back(pools, uid))
        self._rolling_back.add(task)
        task.add_done_callback(self._rolling_back.discard)

    # -- every replica's and the leader's duties -------------------------------------------

    def sweep(self) -> None:
        """Release what the state has caught up with, and have the state confirm the kinds
        that still hold something back (every replica, periodically)."""
        self._settle.sweep()

    async def escrow(self) -> int:
        """Fold, refill, renew and return this process's slices, and reclaim expired ones
        (every ``escrow_seconds``, with ``escrow`` on); how many writes were made."""
        return await self._escrowed.duty() if self._escrowed is not None else 0

    async def escrow_rest(self, stop: asyncio.Event) -> None:
        """Wait for the next round of :meth:`escrow`: ``escrow_seconds``, or a fifth of it once
        an admission found no slice of its pool (that pool's first grant is not left to the
        next round), or until ``stop``."""
        seconds = self.settings.escrow_seconds
        if self._escrowed is None:
            await sleep_unless_stopped(seconds, stop)
        else:
            await sleep_unless_woken(seconds, stop, self._escrowed.nudged, soonest=seconds / 5)

    @property
    def escrowing(self) -> bool:
        return self._escrowed is not None

    @property
    def on_escrow_write(self) -> Callable[[str, bool, bool], None]:
        """Called with (pool, refilled, returned) for each stored write of this replica's
        slice record."""
        return self._escrowed.on_write if self._escrowed is not None else _ignore_write

    @on_escrow_write.setter
    def on_escrow_write(self, on_write: Callable[[str, bool, bool], None]) -> None:
        if self._escrowed is not None:
            self._escrowed.on_write = on_write

    def slices(self) -> dict[str, dict[str, Decimal]]:
        """The room this replica's slices hold unspent now, by pool and key (empty with
        escrow off)."""
        escrowed = self._escrowed
        if escrowed is None:
            return {}
        escrow = escrowed.escrow
        return {pool: escrow.available(pool) for pool in escrow.pools()}

    @property
    def spends(self) -> int:
        """Admissions answered from slices, with no API call."""
        return self._escrowed.spends if self._escrowed is not None else 0

    async def reconcile(self) -> int:
        """Make every pool's TenantReservation status true; returns how many were written."""
        return await self._status.reconcile()

"""The conditional commit: a pool's batch decided and written at once, or one request across pools.

**Group commit.** A pool's queued batch is decided against the pool (each request still all or
nothing, in arrival order, with a running total; its price, made before it queued, is reused
while nothing that price read has changed, its pool check never), and committed in one write
conditional on the object's resourceVersion that also drops the entries this replica has seen
settled and those past their grace period: two requests that each fit alone but not together
never both pass. A conflict (another replica wrote first) re-reads the object and decides the
batch again; after ``attempts`` conflicts the batch is denied with "try again" rather than
guessed.

**Several pools.** A request charging several pools has a part in each pool's batch, in sorted
order, one after another: each part decides the whole request again (its own entries in the
other pools are its own, not somebody else's) and writes its entry in that pool with the pool's
other requests. No lock is held across a write, so a carve-out's writes never make the parent
pool's other tenants wait for the child pool's write. An entry written before a later part is
refused holds its room meanwhile (never less than is committed); once the request is refused
this replica stops counting it (no object will carry it) and its removal rides on the pool's
next write (:meth:`.Queues.remove`): the batch written anyway drops it with the entries it
drops, or, with no batch coming, one write removes every removal waiting, so refusals in the
child pool cost its parent no write each. Every other replica counts the entry until it sees
that write (never less than is held). Its entries carry its request uid, so a retry recognises
and replaces them, and none is ever written twice.

**Revisions.** Each entry records the ledger revision that admitted it: a new entry is
unstamped (it was added by the write that produced the object's current resourceVersion) and
every later write stamps it with that revision. So every reader knows exactly which
observations are newer than the admission; only those settle it.

**Dry runs.** A held dry run is a *preview* entry keyed by its object. The next admitted write
of the same object in the pool (a real one, or another preview) is decided without the
preview's hold and replaces it in the same conditional write, holding the key-wise maximum of
both (whichever of the two the server ends up storing is covered until it is observed or the
grace period passes): a preview followed by the same write for real is never refused because
of its preview, and repeated previews of one name hold once. A real entry is never replaced by
a preview. A request charging several pools at once adds its preview like any entry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from decimal import Decimal

from webhook.admission.ledger import answers, bounds
from webhook.admission.ledger.barrier import Barrier
from webhook.admission.ledger.book import Book, Conflict
from webhook.admission.ledger.entries import (
    Obj,
    expiry,
    hold_of,
    listed,
    previews,
    quantities,
    size,
)
from webhook.admission.ledger.queue import Waiter, answer
from webhook.admission.ledger.shares import Room, metadata_room
from webhook.admission.ledger.status import Status
from webhook.core.admission.decisions import (
    Decided,
    Decision,
    Policy,
    decide_again,
    decide_prepared,
)
from webhook.core.admission.pending import PendingCharges
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.tenancy.applications import AppKey
from webhook.core.tenancy.tenants import TENANT_KIND
from webhook.kube.client import ApiError

__all__ = ["Commit", "decide_replacing", "decided_replacing"]

log = logging.getLogger("webhook.admission.ledger")  # one logger for all of the ledger


@dataclass(frozen=True, slots=True)
class _Part:
    """A request's part in one pool's batch: its answer there, and its entry when it has one."""

    decision: Decision
    entry: Obj | None = None


class Commit:
    """Decides what the ledger holds and writes it: a pool's batch, or a request across pools."""

    def __init__(self, book: Book, status: Status, barrier: Barrier) -> None:
        self.book = book
        self.status = status
        self.barrier = barrier
        self._sizes: dict[str, dict[str, tuple[object, str, int]]] = {}  # by pool: Room.sizes

    # -- one pool: the group commit ------------------------------------------------------------

    async def batch(self, pool: str, batch: list[Waiter], removing: Set[str] = frozenset()) -> None:
        """Decide ``batch`` against ``pool`` and commit the allowed ones in one write, which
        also removes the entries of ``removing`` (requests refused in another pool); those
        the batch wrote nothing for (all its callers gone, or its write not made) get one
        write of their own, together."""
        decided = {w.request.uid for w in batch if not w.future.done()}
        if decided:
            await self._batch(pool, batch, removing)
        # A request of the batch under a uid being removed (the same request again) was
        # decided again here: its entry, if written now, is its own.
        left = removing - decided
        if left:
            await self._remove(pool, left)

    async def _batch(self, pool: str, batch: list[Waiter], removing: Set[str]) -> None:
        book, settings = self.book, self.book.settings
        deadline = asyncio.get_running_loop().time() + settings.catch_up_seconds
        for _ in range(settings.attempts):
            while True:  # decide only once the state has passed what the ledger removed
                current = book.objects.get(pool) or await book.ensure(pool)
                state = book.current()
                if not book.fenced(pool):
                    break
                if not await self.barrier.wait_unfenced([pool], deadline):
                    for waiter in batch:
                        if not waiter.future.done():
                            waiter.future.set_result(answers.behind(pool))
                    return
            pending = state.pending
            ids = {w.request.uid for w in batch}
            # Refused elsewhere, never admitted: no longer counted here, gone with this write.
            kept = self.status.kept(pool, current, state, without=ids | removing)
            # What the entries kept take, by tenant; measured once each, across batches.
            room = Room(
                pool, kept, book.settings, self._sizes.get(pool), rest=metadata_room(current)
            )
            try:
                for hold_id in ids:  # a retried request's own entry is not somebody else's
                    own = pending.counted(pool, hold_id)
                    if own is not None:
                        pending.adjust(pool, rl.scale(own.increase, Decimal(-1)))
                answered: list[tuple[Waiter, Decision]] = []
                added: list[Obj] = []
                replaced: set[str] = set()  # previews the write drops, absorbed by a later write
                # Only previews can be replaced: looked up among these, not every entry, so a
                # batch costs O(entries + previews x batch), not O(entries x batch).
                listed_previews = [e for e in kept if e.get("dryRun") is True]
                fresh: list[Obj] = []  # previews this batch adds
                for waiter in batch:
                    if waiter.future.done():
                        continue  # the caller is gone: hold nothing for it
                    if waiter.pools:
                        part = self._part(pool, waiter, state, room)
                        if part.entry is not None:
                            added.append(part.entry)
                            if part.entry.get("dryRun") is True:
                                fresh.append(part.entry)
                        answered.append((waiter, part.decision))
                        continue
                    taken_ids = previews(waiter.request, [*listed_previews, *fresh], replaced)
                    floor = self._absorb(pool, taken_ids, added, pending)
                    # Decided again against the pools as they are now; the price made before
                    # the request queued is reused when nothing it read has changed since.
                    decision = decide_again(waiter.request, state, waiter.policy, waiter.prepared)
                    if decision.allowed and decision.charged_pools:
                        if set(decision.charged_pools) != {pool}:
                            decision = answers.changed(pool)
                        else:
                            taken = set(taken_ids)
                            for earlier in added:  # a preview of this batch: its own too
                                if earlier["id"] in taken:
                                    taken.update(earlier.get("replaces") or ())
                            entry = self._entry(
                                waiter.request, decision, pool, floor=floor, replaces=taken
                            )
                            refusal = (
                                answers.too_large()
                                if size(entry) > bounds.MAX_ENTRY_BYTES
                                else room.refusal(entry, taken_ids)  # replaced: theirs
                            )
                            if refusal is not None:
                                decision = refusal
                            else:
                                room.take(entry, taken_ids)
                                hold = hold_of(entry, decision, pool)
                                replaced.update(taken_ids)
                                if taken_ids:
                                    added[:] = [e for e in added if e["id"] not in taken_ids]
                                    fresh[:] = [e for e in fresh if e["id"] not in taken_ids]
                                pending.adjust(pool, hold.increase)
                                added.append(entry)
                                if hold.preview:
                                    fresh.append(entry)
                                book.parsed.setdefault(pool, {})[entry["id"]] = (entry, hold)
                                floor = {}
                    pending.adjust(pool, floor)  # not absorbed: the previews count again
                    answered.append((waiter, decision))
                kept = [e for e in kept if e["id"] not in replaced]
                entries = listed(current)
                if not added and len(kept) == len(entries):
                    answer(answered)
                    return
                status = self.status.build(pool, current, state, [*kept, *added])
                self._sizes[pool] = room.sizes
                outcome = await book.attempt(pool, current, status)
                if outcome == "conflict":
                    continue
                if outcome == "failed":
                    for waiter, _ in answered:
                        waiter.future.set_result(answers.unavailable())
                    return
                answer(answered)
                return
            finally:
                pending.clear_adjustments(pool)
        for waiter in batch:
            if not waiter.future.done():
                waiter.future.set_result(answers.contention([pool]))

    def _absorb(
        self, pool: str, previews: Iterable[str], added: list[Obj], pending: PendingCharges
    ) -> dict[str, Decimal]:
        """Take the holds of ``previews`` (ids listed in ``pool``'s ledger, or just ``added`` by
        this batch) out of the pool's usage while a write of their object is decided; returns
        their key-wise maximum, which the write's entry holds at least, or the caller adds back."""
        floor: dict[str, Decimal] = {}
        fresh = {str(e["id"]): e for e in added}
        for hold_id in previews:
            counted = pending.counted(pool, hold_id)
            if hold_id in fresh:
                increase = quantities(fresh[hold_id].get("charge"))
            elif counted is not None:
                increase = dict(counted.increase)
            else:
                continue  # listed but no longer counted (seen settled): nothing to carry
            floor = rl.maximum(floor, increase)
            pending.adjust(pool, rl.scale(increase, Decimal(-1)))
        return floor

    # -- several pools: a part in each pool's batch, its entries known by its uid ------------

    def _part(self, pool: str, waiter: Waiter, state: ReservationState, room: Room) -> _Part:
        """``waiter``'s part in ``pool``'s batch: the whole request decided again, without its
        own entries in its other pools (written by its earlier parts, or by an earlier attempt
        of the same request), and its entry here when it fits (counted in ``room``)."""
        request, pending = waiter.request, state.pending
        own = [
            (other, hold.increase)
            for other in waiter.pools
            if other != pool and (hold := pending.counted(other, request.uid)) is not None
        ]
        for other, increase in own:
            pending.adjust(other, rl.scale(increase, Decimal(-1)))
        try:
            # Priced before it queued, in its tenant's turn; a batch runs in nobody's, so only
            # the pools are checked here while nothing that price read has changed.
            if request.dry_run:  # checked like a write of another name: no replacing
                decision = decide_again(request, state, waiter.policy, waiter.prepared)
            else:
                # Never refused for the object's own previews; they stay held beside this entry
                # (whichever the server stores is covered) until observed or expired.
                decision = _replacing_again(request, state, waiter)
        finally:
            for other, increase in own:  # undone exactly: another pool's batch keeps its own
                pending.adjust(other, increase)
        if not decision.allowed or not decision.charged_pools:
            return _Part(decision)
        if set(decision.charged_pools) != set(waiter.pools):
            return _Part(answers.changed(", ".join(waiter.pools)))
        entry = self._entry(request, decision, pool)
        refusal = (
            answers.too_large() if size(entry) > bounds.MAX_ENTRY_BYTES else room.refusal(entry)
        )
        if refusal is not None:
            return _Part(refusal)
        room.take(entry)
        hold = hold_of(entry, decision, pool)
        pending.adjust(pool, hold.increase)
        pending.readmit(request.uid)  # refused before under this uid: this entry is new
        self.book.parsed.setdefault(pool, {})[entry["id"]] = (entry, hold)
        return _Part(decision, entry)

    async def _remove(self, pool: str, uids: Set[str]) -> None:
        """One write removing every entry of ``uids`` ``pool`` lists (none listed: no write);
        best effort: an entry left behind is dropped with its grace period like any other."""
        book = self.book
        for _ in range(book.settings.attempts):
            current = book.objects.get(pool)
            if current is None or not any(e.get("id") in uids for e in listed(current)):
                return
            state = book.current()
            kept = self.status.kept(pool, current, state, without=set(uids))
            try:
                await book.write(pool, current, self.status.build(pool, current, state, kept))
                return
            except Conflict:
                continue
            except ApiError as exc:
                log.warning("ledger roll-back failed", extra={"fields": {"error": str(exc)}})
                return

    def _entry(
        self,
        request: AdmissionRequest,
        decision: Decision,
        pool: str,
        *,
        floor: Mapping[str, Decimal] | None = None,
        replaces: Iterable[str] = (),
    ) -> Obj:
        """``request``'s entry in ``pool``, holding at least ``floor`` (previews it replaces)."""
        settings = self.book.settings
        expires = expiry(self.book.clock() + settings.grace_seconds)
        charge = rl.to_strings(rl.maximum(decision.charged_pools[pool], floor or {}))
        expected = rl.to_strings(decision.expected or {})
        if request.kind == TENANT_KIND:
            # A quota, of up to 64 keys: only those this pool bounds count here, so only they are
            # listed (and compared when it is observed, :func:`~.pending.expects`).
            node = self.book.current().tree.get(pool)
            bounded = node.budget if node is not None else {}
            expected = {key: value for key, value in expected.items() if key in bounded}
        entry: Obj = {
            "id": request.uid,
            "application": f"{request.kind}/{request.namespace}/{request.name}",
            "charge": charge,
            "expires": expires,
            "replica": settings.replica,
        }
        if expected != charge:  # absent: the same (a CREATE's); every write carries less
            entry["expected"] = expected
        if request.operation == "UPDATE":
            entry["update"] = True  # stored last (no precondition), it overwrites a later write
        if request.dry_run:
            entry["dryRun"] = True
        if replaces:
            entry["replaces"] = sorted(replaces)
        return entry


def _key(request: AdmissionRequest) -> AppKey:
    return (request.kind, request.namespace, request.name)


def decide_replacing(
    request: AdmissionRequest, state: ReservationState, policy: Policy
) -> Decision:
    """``decide``, without the holds of the object's own previews (the write replaces them)."""
    return decided_replacing(request, state, policy).decision


def _replacing_again(
    request: AdmissionRequest, state: ReservationState, waiter: Waiter
) -> Decision:
    """:func:`decide_replacing`, with the price ``waiter`` brought reused while still true."""
    held = state.pending.previews(_key(request))
    for hold in held:
        state.pending.adjust(hold.namespace, rl.scale(hold.increase, Decimal(-1)))
    try:
        return decide_again(request, state, waiter.policy, waiter.prepared)
    finally:
        for hold in held:  # undone exactly: a batch being written keeps its adjustments
            state.pending.adjust(hold.namespace, hold.increase)


def decided_replacing(
    request: AdmissionRequest, state: ReservationState, policy: Policy
) -> Decided:
    """:func:`decide_replacing`, keeping the price for the commit (``decide_again``): the
    previews only change the pools, never the price."""
    held = state.pending.previews(_key(request))
    for hold in held:
        state.pending.adjust(hold.namespace, rl.scale(hold.increase, Decimal(-1)))
    try:
        return decide_prepared(request, state, policy)
    finally:
        for hold in held:  # undone exactly: a batch being written keeps its adjustments
            state.pending.adjust(hold.namespace, hold.increase)

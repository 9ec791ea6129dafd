"""Escrowed room: the grant, spend, fold, return and reclaim rules, and what every replica counts.

The examples pin each rule; the state machine plays replicas holding slices of one pool against
one stored ``TenantReservation`` (conditional writes, one resourceVersion counter shared with
the applications) and checks, after every step:

- **committed room never passes the budget**: stored usage + admitted changes not stored yet
  that may still be stored + every record's unspent room (granted - returned - spent) <= the
  budget, unless the step did not raise it (a lowered budget);
- **no slice is spent twice**: what was spent from a record <= granted - returned;
- a spend never takes stored + unstored usage past the budget;
- every replica counts at least the truth: its view of the pool (what its watch observed, every
  record's outstanding room, departed room) is never below committed room, unless fenced.

Replicas' watches of the applications and their copies of the object lag independently; a
replica crashes and comes back as a new incarnation (which never spends the old one's record);
records are reclaimed once past their expiry plus the store bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from webhook.core.admission.escrow import (
    Escrow,
    EscrowBounds,
    SliceCount,
    SliceRecord,
    covers_shortfall,
    grant_size,
    reclaimable,
    refill_wanted,
    surplus,
    within,
)
from webhook.core.base import resources as rl

POOL = "tenant-a"
KIND = "Thing"
M = "memory"
BOUNDS = EscrowBounds()


def _d(value: int) -> Decimal:
    return Decimal(value)


# -- the rules, by example -----------------------------------------------------------------


def test_near_the_bound_no_slice_is_granted_so_the_exact_path_can_use_the_last_byte() -> None:
    budget = {M: _d(100)}
    assert grant_size(budget=budget, counted={M: _d(60)}, want={M: _d(4)}, bounds=BOUNDS) == {
        M: _d(4)
    }
    # 3 free, 4 wanted: a quarter of it rounds to none, the pool takes the exact path.
    assert grant_size(budget=budget, counted={M: _d(97)}, want={M: _d(4)}, bounds=BOUNDS) == {}
    # 12 free, 16 wanted: 3 would be granted, less than a quarter of 16: the exact path too.
    assert grant_size(budget=budget, counted={M: _d(88)}, want={M: _d(16)}, bounds=BOUNDS) == {}


def test_a_grant_takes_at_most_a_share_of_the_free_room() -> None:
    granted = grant_size(budget={M: _d(100)}, counted={}, want={M: _d(40)}, bounds=BOUNDS)
    assert granted == {M: _d(25)}


def test_a_key_the_pool_does_not_bound_is_not_granted() -> None:
    assert grant_size(budget={M: _d(100)}, counted={}, want={"cpu": _d(1)}, bounds=BOUNDS) == {}


def _granted(escrow: Escrow, amount: int, *, now: float = 0.0, version: int = 1) -> None:
    write = escrow.plan(
        POOL, now=now, wall=now, version=version, grow={M: _d(amount)}, kinds=frozenset({KIND})
    )
    assert write is not None
    escrow.stored(write, write.record, version + 1)


def test_the_record_a_grant_is_checked_by_is_the_one_it_writes_before_its_folds() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    first = escrow.granting(POOL, {M: _d(10), "cpu": _d(0)}, frozenset({KIND}), 5.0)
    assert first == SliceRecord(
        "a", "r1", frozenset({KIND}), {M: _d(10)}, expires=5.0 + BOUNDS.lease_seconds
    )
    _granted(escrow, 10)
    assert escrow.spend("u1", {POOL: {M: _d(4)}}, kind=KIND, now=1.0)
    escrow.observed("u1")
    checked = escrow.granting(POOL, {M: _d(5)}, frozenset({"Other"}), 2.0)
    write = escrow.plan(POOL, now=2.0, wall=2.0, version=2, grow={M: _d(5)})
    assert write is not None
    assert checked.kinds == write.record.kinds == frozenset({KIND}), "kinds fixed at the first"
    assert checked.granted == write.record.granted == {M: _d(15)}
    assert checked.expires == write.record.expires
    assert write.record.folded == {M: _d(4)}, "the folds the check counts at their widest"


def test_a_slice_is_never_spent_past_its_room() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10)
    assert escrow.spend("u1", {POOL: {M: _d(6)}}, kind=KIND, now=1.0)
    assert not escrow.spend("u2", {POOL: {M: _d(6)}}, kind=KIND, now=1.0)
    assert escrow.spend("u3", {POOL: {M: _d(4)}}, kind=KIND, now=1.0)
    assert escrow.available(POOL) == {M: _d(0)}


def test_reposting_one_uid_spends_the_slice_once() -> None:
    # The API server may call the webhook again with the same request uid (a retry): the second
    # call takes the exact path, before and after the first spend is folded.
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10)
    assert escrow.spend("u1", {POOL: {M: _d(4)}}, kind=KIND, now=1.0)
    assert not escrow.spend("u1", {POOL: {M: _d(4)}}, kind=KIND, now=1.5)
    assert escrow.available(POOL) == {M: _d(6)}
    escrow.observed("u1")
    write = escrow.plan(POOL, now=2.0, wall=2.0, version=2)
    assert write is not None
    escrow.stored(write, write.record, 3)
    assert not escrow.spend("u1", {POOL: {M: _d(4)}}, kind=KIND, now=2.5)
    assert escrow.available(POOL) == {M: _d(6)}


def test_a_spend_across_two_pools_takes_both_or_neither() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10)
    assert not escrow.spend("u1", {POOL: {M: _d(1)}, "tenant-b": {M: _d(1)}}, kind=KIND, now=1)
    assert escrow.available(POOL) == {M: _d(10)}


def test_a_slice_is_not_spent_on_a_kind_it_does_not_name() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10)
    assert not escrow.spend("u1", {POOL: {M: _d(1)}}, kind="Other", now=1.0)


def test_the_holder_stops_at_its_deadline_before_the_recorded_expiry() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10, now=100.0)
    record = escrow.record(POOL)
    assert record is not None
    assert record.expires == 100.0 + BOUNDS.lease_seconds
    deadline = 100.0 + BOUNDS.lease_seconds - BOUNDS.skew_seconds
    assert escrow.spend("u1", {POOL: {M: _d(1)}}, kind=KIND, now=deadline - 0.001)
    assert not escrow.spend("u2", {POOL: {M: _d(1)}}, kind=KIND, now=deadline)


def test_a_record_is_reclaimed_only_past_its_expiry_and_the_store_bound() -> None:
    record = SliceRecord("a", "r1", frozenset({KIND}), {M: _d(5)}, expires=1000.0)
    edge = 1000.0 + BOUNDS.store_seconds + BOUNDS.skew_seconds
    assert not reclaimable(record, edge, BOUNDS)
    assert reclaimable(record, edge + 0.001, BOUNDS)


def test_room_given_back_is_not_spent_while_the_write_is_in_flight() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10)
    write = escrow.plan(POOL, now=1.0, wall=1.0, version=2, give_back={M: _d(10)})
    assert write is not None
    assert not escrow.spend("u1", {POOL: {M: _d(1)}}, kind=KIND, now=1.0)
    escrow.unknown(write)
    escrow.recorded(POOL, write.record, 3)  # a newer copy shows it stored
    assert escrow.available(POOL) == {M: _d(0)}


def test_a_record_the_api_server_did_not_keep_is_never_spent() -> None:
    # A schema that does not know status.slices prunes it: the write is stored without it.
    escrow = Escrow("r1", "a", BOUNDS)
    write = escrow.plan(
        POOL, now=0.0, wall=0.0, version=1, grow={M: _d(10)}, kinds=frozenset({KIND})
    )
    assert write is not None
    escrow.stored(write, None, 2)
    assert not escrow.spend("u1", {POOL: {M: _d(1)}}, kind=KIND, now=1.0)


def test_a_write_of_unknown_outcome_suspends_the_slice_until_a_newer_copy_says() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10)
    assert escrow.spend("u1", {POOL: {M: _d(4)}}, kind=KIND, now=1.0)
    escrow.observed("u1")
    write = escrow.plan(POOL, now=2.0, wall=2.0, version=2)
    assert write is not None
    assert write.record.folded == {M: _d(4)}
    escrow.unknown(write)
    assert not escrow.spend("u2", {POOL: {M: _d(1)}}, kind=KIND, now=2.0)
    before = escrow.record(POOL)
    escrow.recorded(POOL, before, 3)  # newer than the write's precondition, without it
    assert [s.uid for s in escrow.spends()] == ["u1"]  # to be folded again
    assert escrow.spend("u2", {POOL: {M: _d(6)}}, kind=KIND, now=2.0)


def test_an_update_is_folded_only_once_it_can_no_longer_be_stored() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10)
    assert escrow.spend("u1", {POOL: {M: _d(4)}}, kind=KIND, now=1.0, update=True)
    escrow.observed("u1")  # a copy showing its charge may be another write's
    assert escrow.plan(POOL, now=2.0, wall=2.0, version=2) is None, "nothing to fold yet"
    later = 1.0 + BOUNDS.store_seconds + 1
    write = escrow.plan(POOL, now=later, wall=later, version=3)
    assert write is not None
    assert [s.uid for s in write.folds] == ["u1"]


def test_folded_room_stays_counted_until_every_named_kind_has_caught_up() -> None:
    count = SliceCount()
    record = SliceRecord("a", "r1", frozenset({KIND}), {M: _d(10)})
    count.track(POOL, {"a": record}, removals=0, version=5)
    folded = SliceRecord("a", "r1", frozenset({KIND}), {M: _d(10)}, folded={M: _d(4)})
    count.track(POOL, {"a": folded}, removals=0, version=9)
    assert count.counted(POOL) == {M: _d(10)}
    count.catch_up(lambda kind: 8)
    assert count.counted(POOL) == {M: _d(10)}
    count.catch_up(lambda kind: 9)
    assert count.counted(POOL) == {M: _d(6)}


def test_returned_room_is_released_at_once() -> None:
    count = SliceCount()
    count.track(
        POOL, {"a": SliceRecord("a", "r1", frozenset({KIND}), {M: _d(10)})}, removals=0, version=5
    )
    back = SliceRecord("a", "r1", frozenset({KIND}), {M: _d(10)}, returned={M: _d(10)})
    count.track(POOL, {"a": back}, removals=0, version=6)
    assert count.counted(POOL) == {}


def test_a_removed_record_stays_counted_and_unseen_removals_fence_the_pool() -> None:
    count = SliceCount()
    record = SliceRecord("a", "r1", frozenset({KIND}), {M: _d(10)})
    count.track(POOL, {"a": record}, removals=0, version=5)
    count.track(POOL, {}, removals=2, version=7)  # one seen leaving, two removed
    assert count.counted(POOL) == {M: _d(10)}
    assert count.fenced(POOL)
    count.catch_up(lambda kind: 7)
    assert count.counted(POOL) == {}
    assert not count.fenced(POOL)


def test_one_oversized_create_empties_no_slice() -> None:
    budget = {M: _d(100)}
    # 90 counted with the slice's 10 whole: 20 asked is 10 over, which the slice covers.
    assert covers_shortfall({M: _d(10)}, {M: _d(110)}, budget)
    # 11 over: the slice's room would not make it fit, so it is not given back for it.
    assert not covers_shortfall({M: _d(10)}, {M: _d(111)}, budget)
    assert not covers_shortfall({M: _d(10)}, {M: _d(100)}, budget), "not over: nothing to give"
    assert not covers_shortfall({M: _d(10)}, {}, budget), "no figures: nothing given"


def test_a_trickle_of_tiny_creates_parks_no_bursts_slice() -> None:
    # Sized for a burst (10 s of 10 a second), renewed while the rate is down to 1 a second:
    # all but 10 s of it goes back, or the last charge if that is larger.
    assert surplus({M: _d(1)}, {M: _d(100)}, BOUNDS) == {M: _d(90)}
    assert surplus({M: _d(1)}, {M: _d(100)}, BOUNDS, least={M: _d(12)}) == {M: _d(88)}
    assert surplus({M: _d(10)}, {M: _d(100)}, BOUNDS) == {}
    assert surplus({}, {M: _d(3)}, BOUNDS) == {M: _d(3)}, "no rate left: all of it"


def test_refill_asks_for_ten_seconds_of_the_rate_once_under_a_second_is_left() -> None:
    rate = {M: _d(2)}
    assert refill_wanted(rate, {M: _d(3)}, BOUNDS) == {}
    assert refill_wanted(rate, {M: _d(1)}, BOUNDS) == {M: _d(19)}


# -- the state machine -----------------------------------------------------------------------


@dataclass
class _Replica:
    escrow: Escrow
    count: SliceCount = field(default_factory=SliceCount)
    copy: int = 0  # the version of the pool object it last read
    seen: int = 0  # how far its watch of the applications has come


class EscrowMoves(RuleBasedStateMachine):
    """Replicas holding slices of one pool, against one stored object."""

    @initialize(budget=st.integers(10, 60), replicas=st.integers(1, 3))
    def setup(self, budget: int, replicas: int) -> None:
        self.budget = _d(budget)
        self.now = 0.0
        self.version = 1  # the one resourceVersion counter
        self.object = 1  # the pool object's resourceVersion: its last write's
        self.records: dict[str, SliceRecord] = {}
        self.removals = 0
        self.events: list[tuple[int, str, Decimal]] = []  # version, uid, +/- charge
        self.stored: dict[str, Decimal] = {}
        self.unstored: dict[str, tuple[Decimal, float]] = {}  # uid -> charge, decided
        self.spent: dict[str, Decimal] = {}  # incarnation -> spent from its record
        self.lives = 0
        self.replicas = [self._new_life() for _ in range(replicas)]
        self.committed = self._committed()

    def _new_life(self) -> _Replica:
        self.lives += 1
        replica = _Replica(Escrow(f"r{self.lives}", f"life{self.lives}", BOUNDS))
        self._read(replica)
        replica.seen = self.version
        return replica

    # -- the truth ---------------------------------------------------------------------------

    def _committed(self) -> Decimal:
        unspent = sum(
            (
                r.granted.get(M, _d(0)) - r.returned.get(M, _d(0)) - self.spent.get(i, _d(0))
                for i, r in self.records.items()
            ),
            _d(0),
        )
        unstored = sum((c for c, _ in self.unstored.values()), _d(0))
        return sum(self.stored.values(), _d(0)) + unstored + unspent

    def _observed(self, replica: _Replica) -> Decimal:
        return sum((c for v, _, c in self.events if v <= replica.seen), _d(0))

    def _view(self, replica: _Replica) -> Decimal:
        return self._observed(replica) + replica.count.counted(POOL).get(M, _d(0))

    # -- the replicas' reads and writes ------------------------------------------------------

    def _read(self, replica: _Replica) -> None:
        replica.copy = self.object
        replica.count.track(POOL, dict(self.records), removals=self.removals, version=self.object)
        mine = self.records.get(replica.escrow.incarnation)
        replica.escrow.recorded(POOL, mine, self.object)

    def _write(self, replica: _Replica, records: dict[str, SliceRecord], removed: int = 0) -> bool:
        if replica.copy != self.object:
            self._read(replica)  # 409: read again
            return False
        self.version += 1
        self.object = self.version
        created = records.keys() - self.records.keys()
        for incarnation in created:
            self.spent[incarnation] = _d(0)
        self.records, self.removals = records, self.removals + removed
        self._read(replica)
        return True

    def _catch_up(self, replica: _Replica) -> None:
        replica.count.catch_up(lambda kind: replica.seen)

    @rule(data=st.data(), amount=st.integers(1, 12))
    def grant(self, data: st.DataObject, amount: int) -> None:
        replica = data.draw(st.sampled_from(self.replicas))
        if replica.count.fenced(POOL):
            return
        counted = {M: self._view(replica)}
        size = grant_size(
            budget={M: self.budget}, counted=counted, want={M: _d(amount)}, bounds=BOUNDS
        )
        self._plan(replica, grow=size)

    @rule(data=st.data(), amount=st.integers(1, 12))
    def give_back(self, data: st.DataObject, amount: int) -> None:
        self._plan(data.draw(st.sampled_from(self.replicas)), give_back={M: _d(amount)})

    @rule(data=st.data())
    def fold(self, data: st.DataObject) -> None:
        self._plan(data.draw(st.sampled_from(self.replicas)))

    def _plan(
        self,
        replica: _Replica,
        *,
        grow: dict[str, Decimal] | None = None,
        give_back: dict[str, Decimal] | None = None,
    ) -> None:
        escrow = replica.escrow
        write = escrow.plan(
            POOL,
            now=self.now,
            wall=self.now,
            version=replica.copy,
            grow=grow,
            give_back=give_back,
            kinds=frozenset({KIND}),
        )
        if write is None:
            return
        if self._write(replica, {**self.records, escrow.incarnation: write.record}):
            escrow.stored(write, write.record, self.object)
        else:
            escrow.refused(write)

    @rule(data=st.data(), amount=st.integers(1, 8))
    def spend(self, data: st.DataObject, amount: int) -> None:
        replica = data.draw(st.sampled_from(self.replicas))
        if replica.count.fenced(POOL) or not within({M: self.budget}, {M: self._view(replica)}):
            return
        uid = f"u{len(self.events)}-{len(self.unstored)}-{self.now}"
        if replica.escrow.spend(uid, {POOL: {M: _d(amount)}}, kind=KIND, now=self.now):
            incarnation = replica.escrow.incarnation
            assert incarnation in self.records, "spent a record that is not stored"
            self.spent[incarnation] += amount
            self.unstored[uid] = (_d(amount), self.now)
            stored = sum(self.stored.values(), _d(0))
            assert stored + sum((c for c, _ in self.unstored.values()), _d(0)) <= self.budget

    @precondition(lambda self: bool(self.unstored))
    @rule(data=st.data(), keep=st.booleans())
    def store(self, data: st.DataObject, keep: bool) -> None:
        uid = data.draw(st.sampled_from(sorted(self.unstored)))
        charge, _ = self.unstored.pop(uid)
        if keep:  # else a later admission step refused it
            self.version += 1
            self.stored[uid] = charge
            self.events.append((self.version, uid, charge))

    @precondition(lambda self: bool(self.stored))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        uid = data.draw(st.sampled_from(sorted(self.stored)))
        self.version += 1
        self.events.append((self.version, uid, -self.stored.pop(uid)))

    @rule(data=st.data())
    def watch(self, data: st.DataObject) -> None:
        replica = data.draw(st.sampled_from(self.replicas))
        replica.seen = data.draw(st.integers(replica.seen, self.version))
        for version, uid, charge in self.events:
            if version <= replica.seen and charge > 0:
                replica.escrow.observed(uid)
        self._catch_up(replica)

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        self._read(data.draw(st.sampled_from(self.replicas)))

    @rule(seconds=st.sampled_from([0.5, 5.0, 30.0, 100.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        for uid, (_, decided) in list(self.unstored.items()):
            if self.now > decided + BOUNDS.store_seconds:
                del self.unstored[uid]  # the API server's deadline passed: never stored

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.replicas) - 1))
        self.replicas[index] = self._new_life()

    @rule(data=st.data())
    def reclaim(self, data: st.DataObject) -> None:
        replica = data.draw(st.sampled_from(self.replicas))
        gone = {
            i for i, r in replica.count.records(POOL).items() if reclaimable(r, self.now, BOUNDS)
        }
        if gone and replica.copy == self.object:
            kept = {i: r for i, r in self.records.items() if i not in gone}
            self._write(replica, kept, removed=len(gone))

    @rule(change=st.integers(-8, 8))
    def budget_change(self, change: int) -> None:
        self.budget = max(_d(1), self.budget + change)

    @invariant()
    def committed_room_never_passes_the_budget(self) -> None:
        committed = self._committed()
        assert committed <= self.budget or committed <= self.committed, (
            f"committed {committed} of {self.budget} (was {self.committed})"
        )
        self.committed = committed

    @invariant()
    def no_slice_is_spent_twice(self) -> None:
        for incarnation, record in self.records.items():
            room = record.granted.get(M, _d(0)) - record.returned.get(M, _d(0))
            assert self.spent.get(incarnation, _d(0)) <= room, incarnation

    @invariant()
    def the_sum_a_spend_is_checked_by_is_that_of_every_spend_still_to_fold(self) -> None:
        for replica in self.replicas:
            held = replica.escrow._slices.get(POOL)  # the holder's own books
            if held is None:
                continue
            kept = rl.add(held.spent, held.inflight.folded if held.inflight else {})
            walked = rl.total(spend.room for spend in replica.escrow.spends(POOL))
            assert rl.positive_part(kept) == rl.positive_part(walked)

    @invariant()
    def every_replica_counts_at_least_what_is_committed(self) -> None:
        for replica in self.replicas:
            self._catch_up(replica)
            if replica.copy == self.object and not replica.count.fenced(POOL):
                assert self._view(replica) >= self._committed()


EscrowMoves.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_no_sequence_of_grants_spends_folds_and_crashes_commits_past_the_budget = EscrowMoves.TestCase


@pytest.mark.parametrize("amount", [1, 5])
def test_a_new_life_of_the_same_pod_never_spends_the_old_lifes_record(amount: int) -> None:
    old = Escrow("r1", "life1", BOUNDS)
    _granted(old, 10)
    record = old.record(POOL)
    new = Escrow("r1", "life2", BOUNDS)
    new.recorded(POOL, None, 5)  # its own incarnation has no record there
    assert record is not None
    assert record.holder == new.holder
    assert not new.spend("u1", {POOL: {M: _d(amount)}}, kind=KIND, now=1.0)


def test_many_spends_marked_observed_are_each_looked_up_not_walked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A tenant's thousands of spends, all observed in one round: marking each walked every
    # spend of every pool, so the round cost grew with the square of what the tenant sent.
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10_000)
    uids = [f"u{index}" for index in range(1_000)]
    for uid in uids:
        assert escrow.spend(uid, {POOL: {M: _d(1)}}, kind=KIND, now=1.0)
    walked = [0]
    spends = escrow.spends

    def counted(pool: str | None = None) -> list[Any]:
        walked[0] += 1
        return spends(pool)

    monkeypatch.setattr(escrow, "spends", counted)
    for uid in uids:
        escrow.observed(uid)
    assert walked[0] == 0, f"{walked[0]} walks of every spend to mark {len(uids)}"
    monkeypatch.undo()
    escrow.observed("never-spent")
    write = escrow.plan(POOL, now=2.0, wall=2.0, version=2)
    assert write is not None
    assert write.record.folded == {M: _d(len(uids))}, "every observed spend is folded"


def test_a_deleted_pool_the_holder_held_is_forgotten_and_no_late_copy_brings_it_back() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    _granted(escrow, 10)
    assert escrow.spend("u1", {POOL: {M: _d(4)}}, kind=KIND, now=1.0)
    record = escrow.record(POOL)
    escrow.forget(POOL, 9)
    assert escrow.pools() == [], "nothing kept of a deleted pool"
    escrow.recorded(POOL, record, 5)  # a late answer, older than the deletion
    assert escrow.pools() == []
    assert escrow.record(POOL) is None
    assert not escrow.spend("u2", {POOL: {M: _d(1)}}, kind=KIND, now=2.0)
    escrow.recorded(POOL, None, 12)  # the pool again, by the same name: this life holds nothing
    assert escrow.pools() == []


def test_a_pool_this_life_never_held_is_not_kept_in_its_books() -> None:
    escrow = Escrow("r1", "a", BOUNDS)
    for index in range(100):
        escrow.recorded(f"tenant-p{index}", None, index + 1)
    assert escrow.pools() == []

"""Pending charges as the ledger shows them: what is counted, what settles it, when it goes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import state as builders_state
from tests.builders import thing
from webhook.core.admission.pending import Hold, PendingCharges
from webhook.core.admission.pools import TenantTree
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import AppKey, Application

POOL = "tenant-acme"
GI = Decimal(1024**3)


def hold(name: str, *, after: int, gib: int = 1, hold_id: str = "") -> Hold:
    return Hold(
        id=hold_id or f"id-{name}",
        key=("Thing", POOL, name),
        namespace=POOL,
        increase={"memory": gib * GI},
        charge={"memory": gib * GI},
        after=after,
    )


def used(tree: TenantTree) -> Decimal:
    node = tree.get(POOL)
    return node.usage.get("memory", Decimal(0)) if node else Decimal(0)


def pending() -> tuple[PendingCharges, TenantTree]:
    tree = TenantTree()
    tree.set_budget(POOL, {"memory": 100 * GI})
    return PendingCharges(tree), tree


def test_what_the_ledger_lists_is_counted_and_nothing_is_accumulated() -> None:
    charges, tree = pending()
    charges.track(POOL, [hold("a", after=5), hold("b", after=5)], version=5)
    charges.track(POOL, [hold("a", after=5), hold("b", after=5)], version=6)
    assert used(tree) == 2 * GI
    assert len(charges) == 2


def test_an_observation_older_than_the_admission_settles_nothing() -> None:
    charges, tree = pending()
    charges.track(POOL, [hold("a", after=10)], version=10)
    charges.settle(("Thing", POOL, "a"), {"memory": GI}, 9)
    charges.settle(("Thing", POOL, "a"), None, 10)
    assert used(tree) == GI
    charges.settle(("Thing", POOL, "a"), {"memory": 2 * GI}, 11)  # newer, other figures
    assert used(tree) == GI
    charges.settle(("Thing", POOL, "a"), {"memory": GI}, 11)
    assert used(tree) == 0


def test_a_settled_entry_stays_settled_when_its_object_is_deleted() -> None:
    charges, tree = pending()
    charges.track(POOL, [hold("a", after=10)], version=10)
    charges.settle(("Thing", POOL, "a"), {"memory": GI}, 11)
    charges.track(POOL, [hold("a", after=10)], version=12)
    assert used(tree) == 0


def test_an_entry_that_left_the_ledger_counts_until_the_watch_passes_its_removal() -> None:
    charges, tree = pending()
    charges.track(POOL, [hold("a", after=10)], version=10)
    charges.track(POOL, [], version=20)
    assert used(tree) == GI
    charges.catch_up(lambda kind: 19)
    assert used(tree) == GI
    charges.catch_up(lambda kind: 20)
    assert used(tree) == 0
    assert len(charges) == 0


def test_a_withdrawn_request_stops_counting_at_once() -> None:
    charges, tree = pending()
    charges.track(POOL, [hold("a", after=10)], version=10)
    charges.withdraw("id-a")
    charges.track(POOL, [], version=11)
    assert used(tree) == 0


def test_a_request_admitted_again_under_its_withdrawn_uid_counts_again() -> None:
    # Refused and withdrawn, then retried by the API server under the same uid and admitted:
    # the new entry is no settled one, so it counts.
    charges, tree = pending()
    charges.track(POOL, [hold("a", after=10)], version=10)
    charges.withdraw("id-a")
    charges.track(POOL, [], version=11)
    charges.readmit("id-a")
    charges.track(POOL, [hold("a", after=12)], version=12)
    assert used(tree) == GI
    charges.settle(("Thing", POOL, "a"), {"memory": GI}, 13)
    assert used(tree) == 0


def test_a_rebuilt_state_carries_every_counted_entry_into_its_tree() -> None:
    charges, _ = pending()
    charges.track(POOL, [hold("a", after=10)], version=10)
    charges.track(POOL, [], version=11)
    fresh, tree = pending()
    fresh.carry_over(charges)
    assert used(tree) == GI
    fresh.catch_up(lambda kind: 11)
    assert used(tree) == 0


def watched_up_to(revision: int) -> Callable[[str], int]:
    return lambda kind: revision


# A model: every entry listed (or departed and not yet caught up) and not settled by a newer
# matching observation is counted, exactly once; the tree shows exactly what is counted.
operations = st.lists(
    st.one_of(
        st.tuples(st.just("track"), st.sets(st.integers(0, 5), max_size=6)),
        st.tuples(st.just("settle"), st.integers(0, 5), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("catch_up"), st.integers(0, 8)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_counted_figure_is_exactly_what_the_rules_keep(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    charges, tree = pending()
    admitted: dict[int, int] = {}  # entry -> revision that admitted it
    listed: set[int] = set()
    departed: dict[int, int] = {}  # entry -> revision it left at
    settled: set[int] = set()
    for version, step in enumerate(steps, start=1):
        if step[0] == "track":
            for n in step[1] - listed:
                admitted.setdefault(n, version)
            for n in listed - step[1]:
                if n not in settled:
                    departed.setdefault(n, version)
            for n in step[1]:
                departed.pop(n, None)
            listed = set(step[1])
            charges.track(
                POOL, [hold(f"a{n}", after=admitted[n]) for n in sorted(listed)], version=version
            )
        elif step[0] == "settle":
            _, n, age, deleted = step
            seen = version - age
            if n in admitted and seen > admitted[n] and (n in listed or n in departed):
                settled.add(n)
                departed.pop(n, None)
            charges.settle(("Thing", POOL, f"a{n}"), None if deleted else {"memory": GI}, seen)
        else:
            reached = version - step[1]
            for n in [n for n, left in departed.items() if reached >= left]:
                del departed[n]
            charges.catch_up(watched_up_to(reached))
        counted = {n for n in listed | set(departed) if n not in settled}
        assert used(tree) == len(counted) * GI
        assert len(charges) == len(counted)


# ---------------------------------------------------------------------------------------------
# Entries that came and went between two copies this replica read


def test_entries_that_came_and_went_unseen_fence_the_pool_until_the_watch_passes() -> None:
    charges, tree = pending()
    charges.track(POOL, [hold("a", after=5)], version=5, released={})
    # Version 9: a left (seen leaving), and b was admitted and removed in between (never seen).
    charges.track(POOL, [], version=9, released={"Thing": 2})
    assert charges.fenced(POOL)
    charges.catch_up(lambda kind: 8)
    assert charges.fenced(POOL), "the state has not reached the version that showed the gap"
    charges.catch_up(lambda kind: 9 if kind == "Thing" else 0)
    assert not charges.fenced(POOL)
    assert used(tree) == 0


def test_entries_seen_leaving_raise_no_fence() -> None:
    charges, _ = pending()
    charges.track(POOL, [hold("a", after=5), hold("b", after=5)], version=5, released={})
    charges.track(POOL, [], version=9, released={"Thing": 2})
    assert not charges.fenced(POOL)


def test_a_first_copy_with_removals_fences_and_a_recreated_object_fences_again() -> None:
    charges, _ = pending()
    charges.track(POOL, [], version=4, released={"Thing": 1})
    assert charges.fenced(POOL)
    charges.catch_up(lambda kind: 4)
    charges.track(POOL, [], version=7, released=None)  # deleted
    charges.track(POOL, [], version=8, released={"Thing": 1})  # recreated, one removal since
    assert charges.fenced(POOL)


# A writer's history: each write removes some listed entries (by position) and adds some.
histories = st.lists(
    st.tuples(st.lists(st.integers(0, 7), max_size=3), st.integers(0, 2), st.booleans()),
    min_size=1,
    max_size=25,
)


@given(histories)
def test_a_pool_is_fenced_exactly_when_some_removed_entry_was_never_in_a_copy_read(
    writes: list[tuple[list[int], int, bool]],
) -> None:
    charges, _ = pending()
    listed: list[str] = []
    released = 0
    seen: set[str] = set()
    removed: set[str] = set()
    fresh = 0
    for version, (drops, adds, read) in enumerate(writes, start=1):
        for index in sorted({i % len(listed) for i in drops} if listed else set(), reverse=True):
            removed.add(listed.pop(index))
            released += 1
        for _ in range(adds):
            fresh += 1
            listed.append(f"e{fresh}")
        if read:
            charges.track(
                POOL,
                [hold(name, after=version, hold_id=name) for name in listed],
                version=version,
                released={"Thing": released} if released else {},
            )
            seen.update(listed)
            assert charges.fenced(POOL) == bool(removed - seen)


# -- floors: behind an API server that writes updates without a precondition ------------------

EARLY, LATE, LATER = (
    "2027-01-01T00:00:10.000000Z",
    "2027-01-01T00:00:30.000000Z",
    "2027-01-01T00:01:00.000000Z",
)


def update(hold_id: str, *, gib: int, after: int, adds: int = 0, until: str = LATE) -> Hold:
    """An admitted UPDATE of ``x`` expecting ``gib``, adding ``adds`` to the pool."""
    return Hold(
        id=hold_id,
        key=("Thing", POOL, "x"),
        namespace=POOL,
        increase={"memory": adds * GI} if adds else {},
        charge={"memory": gib * GI},
        after=after,
        until=until,
        update=True,
    )


def stored(gib: int, version: int) -> Application:
    return replace(thing(POOL, "x", memory=f"{gib}Gi"), version=version)


def observed_gib(current: ReservationState) -> Decimal:
    record = current.record(("Thing", POOL, "x"))
    assert record is not None
    return record.resources["memory"]


def counted(current: ReservationState) -> Decimal:
    node = current.tree.get(POOL)
    return node.usage.get("memory", Decimal(0)) if node else Decimal(0)


def test_a_shrink_frees_nothing_while_a_label_patch_that_read_the_old_size_may_be_stored() -> None:
    # cozystack-api's lost update: the label patch read x at 4Gi; stored after the shrink, it
    # writes 4Gi back, so the room the shrink seems to free is not there to give away.
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    current.pending.track(
        POOL, [update("shrink", gib=1, after=6), update("label", gib=4, after=6)], version=6
    )
    current.observe(stored(1, 7))  # the shrink, observed
    assert counted(current) == 4 * GI
    current.observe(stored(4, 8))  # the label patch lands: 4Gi again, as counted
    assert counted(current) == 4 * GI


def test_a_floor_goes_when_its_write_can_no_longer_be_stored() -> None:
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    current.pending.track(POOL, [update("label", gib=4, after=6)], version=6)
    current.observe(stored(1, 7))
    assert not current.pending.expire_floors(EARLY)
    assert counted(current) == 4 * GI
    current.pending.track(POOL, [], version=9, released={"Thing": 1})  # dropped, expired
    current.pending.catch_up(watched_up_to(9))
    assert current.pending.expire_floors(LATER)  # its grace period is over: room is freed
    assert counted(current) == GI


def test_an_expired_floor_holds_while_the_watch_has_not_reached_the_ledger_dropping_it() -> None:
    # The label patch was stored (at 8) before its grace period ended, but this replica's
    # watch still shows the shrink (7): until the state has reached the ledger write that
    # dropped the expired entry (9), that write may be what is stored.
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    current.pending.track(POOL, [update("label", gib=4, after=6)], version=6)
    current.observe(stored(1, 7))
    assert not current.pending.expire_floors(LATER)  # still listed: the state may lag
    assert counted(current) == 4 * GI
    current.pending.track(POOL, [], version=9, released={"Thing": 1})
    current.pending.catch_up(watched_up_to(8))
    assert not current.pending.expire_floors(LATER)
    assert counted(current) == 4 * GI
    current.pending.catch_up(watched_up_to(9))
    current.pending.expire_floors(LATER)
    assert counted(current) == GI


def test_an_update_observed_when_no_other_write_expects_its_charge_stops_holding_at_once() -> None:
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(1, 5))
    current.pending.track(POOL, [update("grow", gib=2, after=6, adds=1)], version=6)
    current.observe(stored(2, 7))  # only the grow expects 2Gi: this is its write
    current.observe(stored(1, 8))  # then a shrink
    assert counted(current) == GI


def test_two_updates_expecting_one_charge_both_keep_their_floor_when_one_is_observed() -> None:
    # One observation of 4Gi cannot tell the two label patches apart: the other may land yet.
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    labels = [update("l1", gib=4, after=6), update("l2", gib=4, after=6)]
    current.pending.track(POOL, labels, version=6)
    current.observe(stored(4, 7))
    current.observe(stored(1, 8))
    assert counted(current) == 4 * GI


def test_a_burst_of_label_patches_folded_together_holds_past_expiry_while_any_is_listed() -> None:
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    burst = [update(f"l{index}", gib=4, after=6) for index in range(65)]  # folded past 64
    current.pending.track(POOL, burst, version=6)
    current.observe(stored(1, 7))
    assert not current.pending.expire_floors(LATER)
    assert counted(current) == 4 * GI
    current.pending.track(POOL, [], version=9, released={"Thing": 65})
    current.pending.catch_up(watched_up_to(9))
    current.pending.expire_floors(LATER)
    assert counted(current) == GI


def test_an_observation_newer_than_the_ledger_copy_settles_no_floor_alone() -> None:
    # The copy of the ledger (6) lists one label patch; a second, admitted at 7, is not in it
    # yet. The 4Gi observed at 8 may be either's write: neither floor can go on it.
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    current.pending.track(POOL, [update("l1", gib=4, after=6)], version=6)
    current.observe(stored(4, 8))
    current.observe(stored(1, 9))  # a shrink
    assert counted(current) == 4 * GI


def test_two_label_patches_shown_before_their_entries_arrive_both_keep_their_floor() -> None:
    # The state shows 4Gi (8) before this replica reads the ledger listing the label patches,
    # one copy at a time: the first copy cannot say the second patch was not the one stored.
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    current.observe(stored(4, 8))
    current.pending.track(POOL, [update("l1", gib=4, after=6)], version=6)
    current.pending.track(
        POOL, [update("l1", gib=4, after=6), update("l2", gib=4, after=7)], version=7
    )
    current.observe(stored(1, 9))  # a shrink
    assert counted(current) == 4 * GI


def test_a_deleted_application_keeps_no_floor() -> None:
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    current.pending.track(POOL, [update("label", gib=4, after=6)], version=6)
    current.forget(("Thing", POOL, "x"), version=7)
    assert counted(current) == 0


BEE = ("Tenant", POOL, "bee")  # a sub-tenant of the pool, owning tenant-acme-bee


def stored_quota(gib: int, version: int) -> Application:
    return Application(*BEE, {"resourceQuotas": {"memory": f"{gib}Gi"}}, version=version)


def quota_gib(current: ReservationState) -> Decimal:
    node = current.tree.get("tenant-acme-bee")
    assert node is not None
    return node.budget["memory"]


# What an update of each kind stores, how it is seen stored, and what the state observes of it.
SUBJECTS: dict[str, tuple[AppKey, Callable[[int, int], Application], Callable[..., Decimal]]] = {
    "application": (("Thing", POOL, "x"), stored, observed_gib),
    "tenant": (BEE, stored_quota, quota_gib),
}


@pytest.mark.parametrize("subject", sorted(SUBJECTS))
@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["admit", "land", "admit", "land", "drop", "expire"]),
            st.integers(1, 4),
        ),
        max_size=25,
    )
)
def test_an_application_is_never_counted_below_a_version_that_may_still_be_stored(
    subject: str, steps: list[tuple[str, int]]
) -> None:
    """Updates admitted (each crediting what the pool counts for it), stored in any order,
    lost, or past their grace period: the pool counts an application (a Tenant: its quota) at
    least at every charge still in flight and at what is stored."""
    key, store, observed_of = SUBJECTS[subject]
    current = builders_state({POOL: {"memory": "100Gi"}})
    current.observe(store(2, 1))
    version, in_flight, listed = 1, {}, []  # id -> gib
    clock = [f"2027-01-01T00:00:{second:02d}.000000Z" for second in range(60)]
    now = 0
    for index, (step, gib) in enumerate(steps):
        version += 1
        if step == "admit":
            floor = current.pending.floor(key) if subject == "application" else {}
            topup = current.pending.topup(key) if subject == "tenant" else {}  # its carve-out's
            credit = max(observed_of(current), floor.get("memory", Decimal(0)))
            credit += topup.get("memory", Decimal(0))
            adds = max(0, int((gib * GI - credit) // GI))
            entry = replace(
                update(f"u{index}", gib=gib, after=version, adds=adds, until=clock[now + 20]),
                key=key,
            )
            listed.append(entry)
            in_flight[entry.id] = gib
            current.pending.track(POOL, listed, version=version)
        elif step == "land" and in_flight:
            hold_id = sorted(in_flight)[gib % len(in_flight)]
            current.observe(store(in_flight.pop(hold_id), version))
        elif step == "drop" and in_flight:
            in_flight.pop(sorted(in_flight)[gib % len(in_flight)])  # refused after admission
        elif step == "expire":
            now = min(now + 8 * gib, 39)
            current.pending.expire_floors(clock[now])
            for entry in listed:
                if entry.until <= clock[now]:
                    in_flight.pop(entry.id, None)  # past its grace: stored or never will be
        observed = observed_of(current)
        needed = max([observed, *(g * GI for g in in_flight.values())])
        assert counted(current) >= needed


def test_a_status_write_at_the_old_size_never_settles_a_label_patch_still_in_flight() -> None:
    # Flux writes the release's status, cozystack-api serves it as a new version of x with
    # nothing the reservation reads changed: no held update explains it, so the label patch
    # that read 4Gi may still land after the shrink, and the room is not there to give away.
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    current.pending.track(
        POOL, [update("label", gib=4, after=6), update("shrink", gib=1, after=6)], version=6
    )
    current.observe(stored(4, 7))  # a status write, not the label patch
    current.observe(stored(1, 8))  # the shrink
    assert counted(current) == 4 * GI


def test_a_restamp_at_the_old_size_never_settles_a_label_patch_still_in_flight() -> None:
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    current.pending.track(
        POOL, [update("label", gib=4, after=6), update("shrink", gib=1, after=6)], version=6
    )
    assert current.restamp(("Thing", POOL, "x"), 7)  # a status write, restamped
    current.observe(stored(1, 8))
    assert counted(current) == 4 * GI


def test_a_label_patch_listed_after_a_status_write_keeps_its_floor() -> None:
    # The ledger lists the label patch only once the state shows x newer, at 4Gi: a status
    # write shows that as well as the patch would, so its floor stays until it expires.
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 5))
    current.observe(stored(4, 7))  # a status write
    current.pending.track(POOL, [update("label", gib=4, after=6)], version=8)
    current.observe(stored(1, 9))  # a shrink admitted elsewhere, observed
    assert counted(current) == 4 * GI
    assert current.pending.expire_floors(LATER)
    assert counted(current) == GI


def test_a_state_rebuilt_after_a_status_write_keeps_a_label_patch_under_its_floor() -> None:
    # A rebuilt state (a new platform) first sees x at the status write's version: that is no
    # write of x's values, and the label patch listed then may still land after the shrink.
    current = builders_state({POOL: {"memory": "4Gi"}}, stored(4, 7))
    current.pending.track(POOL, [update("label", gib=4, after=6)], version=8)
    current.observe(stored(1, 9))
    assert counted(current) == 4 * GI

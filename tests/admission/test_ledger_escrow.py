"""Admission from escrowed slices (``LedgerSettings.escrow``): a CREATE that fits this process's
slice is answered with no API call; the slice is granted, folded, renewed and reclaimed off the
admission path by conditional writes, counted whole by every replica, and never spent by a new
life of the same pod."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path

import pytest

from tests.admission.test_ledger import POLICY, POOL, Clock, Cluster, Replica, create, preview
from tests.admission.test_ledger_writes import Live
from tests.builders import review
from tests.realkube import reservations_on_real_apiserver
from webhook.admission.ledger import LedgerSettings
from webhook.admission.ledger.book import Book
from webhook.admission.ledger.entries import TENANT_RESERVATIONS
from webhook.admission.ledger.escrowed import record_json
from webhook.admission.ledger.slices import slice_records
from webhook.admission.ledger.wants import ANSWER_SECONDS, Wants, wanted_room
from webhook.core.admission.decisions import mutate
from webhook.core.admission.escrow import SliceRecord
from webhook.core.admission.reviews import AdmissionRequest, parse_review
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, Application
from webhook.core.tenancy.records import parse_recorded_charge


async def _busy(replica: Replica, count: int = 3, memory: str = "1Gi") -> None:
    """Admit ``count`` creates by the exact path, so the pool has a recent rate."""
    for index in range(count):
        assert (await replica.admit(create(f"warm{index}", memory))).allowed


def _records(cluster: Cluster) -> dict[str, SliceRecord]:
    return dict(slice_records(cluster.objects[POOL].get("status") or {}))


async def test_a_create_that_fits_the_slice_is_answered_with_no_api_call() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    assert await a.ledger.escrow() == 1  # the slice is granted off the admission path
    assert len(_records(cluster)) == 1
    writes = cluster.writes
    decision = await a.admit(create("x", "1Gi"))
    assert decision.allowed
    assert cluster.writes == writes, "answered from the slice: no write"
    assert a.ledger.spends == 1


async def test_another_replica_counts_the_slice_whole_and_admits_only_around_it() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}}, escrow=True)
    b = Replica(cluster, "b", {POOL: {"memory": "8Gi"}})
    await _busy(a, count=2)  # 2Gi held as entries until observed
    assert await a.ledger.escrow() == 1
    (record,) = slice_records(cluster.objects[POOL]["status"]).values()
    held = record.outstanding()["memory"]
    assert held > 0
    b.deliver()
    free = 8 * 1024**3 - 2 * 1024**3 - int(held)
    assert not (await b.admit(create("big", str(free + 1)))).allowed
    assert (await b.admit(create("fits", str(free)))).allowed


async def test_a_slice_is_never_spent_past_its_room_the_exact_path_takes_the_rest() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    await a.ledger.escrow()
    (record,) = _records(cluster).values()
    room = int(record.outstanding()["memory"])
    writes = cluster.writes
    assert (await a.admit(create("x", str(room)))).allowed
    assert cluster.writes == writes
    assert (await a.admit(create("y", "1"))).allowed
    assert cluster.writes == writes + 1, "the slice is spent: the exact path wrote an entry"


async def test_reposting_one_uid_spends_the_slice_once() -> None:
    # A retried call carries the request's uid again: it takes the exact path (counted again,
    # never less), and the slice is spent once.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    await a.ledger.escrow()
    writes = cluster.writes
    assert (await a.admit(create("x", "1Gi", uid="same"))).allowed
    assert cluster.writes == writes
    assert a.ledger.spends == 1
    assert (await a.admit(create("x", "1Gi", uid="same"))).allowed
    assert a.ledger.spends == 1, "the repost was not answered from the slice"
    assert cluster.writes == writes + 1, "the exact path wrote an entry for it"


async def test_near_the_bound_no_slice_is_granted_so_the_last_byte_can_be_used() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}}, escrow=True)
    await _busy(a, count=3)  # 3Gi of 4Gi: a quarter of the free room is less than wanted
    assert await a.ledger.escrow() == 0
    assert _records(cluster) == {}
    assert (await a.admit(create("last", "1Gi"))).allowed
    assert not (await a.admit(create("over", "1"))).allowed


async def test_a_trickle_of_tiny_creates_parks_no_bursts_slice() -> None:
    # A burst sizes the slice from its rate; a create of 1Mi every 10 s afterwards keeps the
    # slice from going idle. Each renewal gives back what it holds beyond a few seconds of the
    # current rate, so the burst's room goes back to the pool instead of being parked there.
    cluster = Cluster()
    clock = Clock()
    a = Replica(cluster, "a", {POOL: {"memory": "640Gi"}}, escrow=True, clock=clock)
    escrowed = a.escrowed
    now = [0.0]
    escrowed.monotonic = lambda: now[0]
    await _busy(a, count=20)
    await a.ledger.escrow()
    (record,) = _records(cluster).values()
    assert record.outstanding()["memory"] >= 16 * 1024**3, "a burst's slice"
    for index in range(8):
        now[0] += 10.0
        clock.now += 10.0
        assert (await a.admit(create(f"tiny{index}", "1Mi"))).allowed
        await a.ledger.escrow()
    assert a.ledger.spends == 8, "the trickle is answered from the slice"
    left = _records(cluster)[record.incarnation].outstanding()["memory"]
    assert left < 1024**3, f"{left} bytes parked for a trickle of 1Mi every 10 s"


async def test_one_oversized_create_empties_no_slice() -> None:
    # A create larger than the pool's free room and the slice's room together is refused on
    # the exact path and leaves the slice as it is: no return, no pause of its refills.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    await a.ledger.escrow()
    (record,) = _records(cluster).values()
    held = int(record.outstanding()["memory"])
    free = 64 * 1024**3 - 3 * 1024**3 - held
    writes = cluster.writes
    assert not (await a.admit(create("huge", str(free + held + 1)))).allowed
    assert _records(cluster)[record.incarnation].returned == {}
    assert cluster.writes == writes, "nothing given back"
    assert (await a.admit(create("x", "1Gi"))).allowed
    assert cluster.writes == writes, "still answered from the slice"
    assert a.ledger.spends == 1


async def test_a_create_the_slices_room_makes_fit_gets_it_given_back() -> None:
    # Near the bound the slice's unspent room goes back to the pool so the last byte is used.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    await a.ledger.escrow()
    (record,) = _records(cluster).values()
    held = int(record.outstanding()["memory"])
    free = 64 * 1024**3 - 3 * 1024**3 - held
    assert (await a.admit(create("last", str(free + held)))).allowed
    assert _records(cluster)[record.incarnation].returned == {"memory": held}


async def test_a_new_life_of_the_same_pod_never_spends_the_old_lifes_slice() -> None:
    cluster = Cluster()
    old = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(old)
    await old.ledger.escrow()
    (before,) = _records(cluster).values()
    new = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    new.deliver()
    writes = cluster.writes
    assert (await new.admit(create("x", "1Gi"))).allowed
    # A cold pool for the new life: one write grants it a slice of its own, and it spends that.
    assert cluster.writes == writes + 1
    records = _records(cluster)
    assert records[before.incarnation] == before, "the old life's slice is untouched"
    (own,) = (r for incarnation, r in records.items() if incarnation != before.incarnation)
    assert own.holder == "a"
    assert own.granted["memory"] >= 1024**3
    assert new.ledger.spends == 1
    escrowed = new.escrowed
    assert escrowed.escrow.record(POOL) is not None
    assert escrowed.escrow.incarnation == own.incarnation


async def test_a_dead_replicas_slice_is_reclaimed_only_past_its_lease_and_the_store_bound() -> None:
    cluster = Cluster()
    clock = Clock()
    dead = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True, clock=clock)
    await _busy(dead)
    await dead.ledger.escrow()
    (record,) = _records(cluster).values()
    b = Replica(cluster, "b", {POOL: {"memory": "64Gi"}}, escrow=True, clock=clock)
    b.deliver()
    await _busy(b)
    clock.now = record.expires + 60
    await b.ledger.escrow()
    assert record.incarnation in _records(cluster)
    clock.now = record.expires + 66
    await b.ledger.escrow()
    assert record.incarnation not in _records(cluster)
    assert cluster.objects[POOL]["status"]["removals"] == 1


def _minted(replica: Replica, name: str, memory: str, call: str) -> tuple[AdmissionRequest, str]:
    """A CREATE as the validating call sees it, carrying the record the mutating call ``call``
    wrote on it, and that record's annotation."""
    body = create(name, memory, uid=call)
    patch = mutate(body, replica.state, POLICY).patch
    written = patch[0]["value"]
    assert isinstance(written, dict)
    text = written[CHARGE_ANNOTATION]
    spec = {"memory": memory}
    review_body = review("Thing", POOL, name, spec, uid=f"validate-{call}", annotations=written)
    return parse_review(review_body), text


def _stored(cluster: Cluster, name: str, memory: str, text: str | None) -> Application:
    """The object as stored (at the next revision), with the record ``text`` on it."""
    recorded = parse_recorded_charge(text) if text is not None else None
    spec = {"memory": memory}
    return Application("Thing", POOL, name, spec, recorded=recorded, version=cluster.bump())


async def test_a_spend_is_folded_once_its_object_is_observed() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    await a.ledger.escrow()
    request, text = _minted(a, "x", "1Gi", "mutate-1")
    assert (await a.admit(request)).allowed
    assert a.ledger.spends == 1
    a.observe(_stored(cluster, "x", "1Gi", text))
    # Far from the bound a fold is not worth a write of its own: it rides on the next one.
    assert await a.ledger.escrow() == 0
    await _renewed(a)
    (record,) = _records(cluster).values()
    assert record.folded == {"memory": 1024**3}


async def test_a_fold_is_written_at_once_when_the_room_it_counts_twice_matters() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}}, escrow=True)
    await _busy(a, count=2)
    assert await a.ledger.escrow() == 1
    request, text = _minted(a, "x", "1Gi", "mutate-1")
    assert (await a.admit(request)).allowed
    a.observe(_stored(cluster, "x", "1Gi", text))
    assert await a.ledger.escrow() == 1
    (record,) = _records(cluster).values()
    assert record.folded == {"memory": 1024**3}


async def test_a_delete_and_re_create_folds_no_spend_on_the_wrong_object() -> None:
    # x is admitted from the slice and not stored yet; a create of x by the exact path (or
    # another replica) is stored, deleted, and the first may still be stored after it. The
    # second object has the same name and charge, but its record names its own request: the
    # spend stays until its own object is observed (or it can no longer be stored).
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True)
    await _busy(a)
    await a.ledger.escrow()
    first, first_text = _minted(a, "x", "1Gi", "mutate-1")
    assert (await a.admit(first)).allowed
    assert a.ledger.spends == 1
    _, second_text = _minted(a, "x", "1Gi", "mutate-2")
    a.observe(_stored(cluster, "x", "1Gi", second_text))
    await _renewed(a)
    (record,) = _records(cluster).values()
    assert record.folded == {}, "folded on another create of the same name"
    a.observe(_stored(cluster, "x", "1Gi", None))  # nor on one that carries no record
    await _renewed(a)
    assert _records(cluster)[record.incarnation].folded == {}
    a.observe(_stored(cluster, "x", "1Gi", first_text))
    await _renewed(a)
    assert _records(cluster)[record.incarnation].folded == {"memory": 1024**3}


async def _renewed(replica: Replica) -> None:
    """Run ``replica``'s escrow duty with its lease due for renewal, so whatever folds it has
    ride on that write (far from the bound a fold waits for the next write)."""
    escrowed = replica.escrowed
    later = escrowed.monotonic() + escrowed.escrow.bounds.renew_seconds + 1
    escrowed.monotonic = lambda: later
    assert await replica.ledger.escrow() >= 1


@pytest.mark.kube
async def test_a_real_api_server_keeps_a_slice_record_as_written(tmp_path: Path) -> None:
    # A field the CRD's schema does not know is pruned: the shipped schema must keep a record
    # whole, or its holder would spend a slice no other replica counts.
    async with reservations_on_real_apiserver(tmp_path / "kube", POOL) as client:
        book = Book(client, Live(), LedgerSettings(replica="a"), clock=Clock())
        current = await book.ensure(POOL)
        record = SliceRecord(
            "a.1",
            "a",
            frozenset({"VMInstance"}),
            {"memory": Decimal(3 * 1024**3), "cpu": Decimal("1.5")},
            folded={"memory": Decimal(1024**3)},
            returned={},
            expires=1_800_000_030.0,
        )
        status = {"slices": {"a.1": record_json(record)}, "removals": 2}
        await book.write(POOL, current, status)
        stored = await client.get(TENANT_RESERVATIONS, POOL, POOL)
        assert slice_records(stored["status"]) == {"a.1": record}
        assert stored["status"]["removals"] == 2


@pytest.mark.kube
async def test_a_real_api_server_keeps_a_want_as_written(tmp_path: Path) -> None:
    # A pruned want would be asked of no holder: the refusal would promise room for nothing.
    async with reservations_on_real_apiserver(tmp_path / "kube", POOL) as client:
        clock = Clock()
        book = Book(client, Live(), LedgerSettings(replica="a"), clock=clock)
        await book.ensure(POOL)
        assert await Wants(book).ask(POOL, {"memory": Decimal(2 * 1024**3)})
        stored = await client.get(TENANT_RESERVATIONS, POOL, POOL)
        assert wanted_room(stored["status"], clock()) == {"memory": 2 * 1024**3}


async def test_near_the_bound_a_holder_gives_its_slice_back_so_another_replica_uses_the_room() -> (
    None
):
    # Two replicas behind one Service: a holds a slice, b is asked for the pool's last creates.
    # Without the give-back, b answers "try again" until a's slice idles out (30 s).
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "16Gi"}}, escrow=True)
    b = Replica(cluster, "b", {POOL: {"memory": "16Gi"}})
    await _busy(a)
    assert await a.ledger.escrow() == 1
    (record,) = _records(cluster).values()
    assert record.outstanding()["memory"] >= 1024**3
    b.deliver()
    admitted = 0
    while (decision := await b.admit(create(f"b{admitted}", "1Gi"))).allowed:
        admitted += 1
    assert decision.reason == "escrowed", decision.message
    a.deliver()
    assert await a.ledger.escrow() == 1, "no room is left outside the slices: a gives its back"
    (record,) = _records(cluster).values()
    assert not any(record.outstanding().values())
    b.deliver()
    while (decision := await b.admit(create(f"b{admitted}", "1Gi"))).allowed:
        admitted += 1
    assert decision.reason == "exceeded", decision.message
    assert admitted == 16 - 3, "every byte the pool has beside a's three creates"


async def held_by_a(clock: Clock) -> tuple[Cluster, Replica, Replica]:
    """``a`` holds a slice of a 16Gi pool, ``b`` has filled what is left outside it to 0.5Gi."""
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "16Gi"}}, escrow=True, clock=clock)
    b = Replica(cluster, "b", {POOL: {"memory": "16Gi"}}, clock=clock)
    b.ledger._wants.monotonic = clock
    await _busy(a)
    assert await a.ledger.escrow() == 1
    (record,) = _records(cluster).values()
    held = int(record.outstanding()["memory"])
    assert held >= 2 * 1024**3
    b.deliver()
    assert (await b.admit(create("fill", str(13 * 1024**3 - held - 1024**3 // 2)))).allowed
    return cluster, a, b


async def test_escrowed_answer_only_when_holder_gives_back() -> None:
    # "Try again" promised room that never came back: what another replica's slice holds may
    # be spent already (in its memory, not yet folded), and a holder whose last charge was
    # small never took the pool for full on a large request refused elsewhere. The refusal
    # now asks the holders (status.wanted); a few seconds later what they still hold is spent.
    for spent in (True, False):
        clock = Clock()
        cluster, a, b = await held_by_a(clock)
        (record,) = _records(cluster).values()
        held = int(record.outstanding()["memory"])
        # a spends its whole slice (or a trickle's 1Mi of it), from memory: no replica sees it
        assert (await a.admit(create("mine", str(held) if spent else "1Mi"))).allowed
        assert a.ledger.spends == 1
        big = create("big", "2Gi" if not spent else "1Gi", uid="big-1")
        first = await b.admit(big)  # fits only were a's slice free: a is asked to give back
        assert (first.code, first.reason) == (429, "escrowed"), first.message
        a.deliver()
        writes = await a.ledger.escrow()
        b.deliver()
        clock.now += ANSWER_SECONDS
        retry = await b.admit(create("big", "2Gi" if not spent else "1Gi", uid="big-2"))
        if spent:
            assert writes == 0, "nothing unspent to give back"
            assert (retry.allowed, retry.reason) == (False, "exceeded"), retry.message
            clock.now += 10
            again = await b.admit(create("big", "1Gi", uid="big-3"))
            assert again.reason == "exceeded", "no client loops on room already spent"
        else:
            assert writes == 1, "the want makes the pool full for 2Gi, not a's last 1Mi"
            assert retry.allowed, retry.message


async def test_two_refusals_during_one_give_back_both_decide_again_after_it() -> None:
    # The second refusal found nothing left to give back (the first was already returning it)
    # and answered "exceeded" on a pool that had the room once that write was stored.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "16Gi"}}, escrow=True)
    b = Replica(cluster, "b", {POOL: {"memory": "16Gi"}})
    await _busy(a)
    assert await a.ledger.escrow() == 1
    (record,) = _records(cluster).values()
    assert record.outstanding()["memory"] >= 2 * 1024**3
    b.deliver()
    filled = 0
    while (await b.admit(create(f"b{filled}", "1Gi"))).allowed:
        filled += 1
    a.deliver()
    # Dry runs take the exact path: both are refused there first, then given the slice's room.
    first, second = await asyncio.gather(
        a.admit(preview("one", "1Gi", uid="one")), a.admit(preview("two", "1Gi", uid="two"))
    )
    assert first.allowed, first.message
    assert second.allowed, second.message


def _visits(replica: Replica) -> list[str]:
    """The pools ``replica``'s escrow duty takes up from now on, one name per visit."""
    escrowed = replica.escrowed
    visited: list[str] = []
    visit = escrowed._pool

    async def counted(pool: str, *, give_all: bool = False) -> int:
        visited.append(pool)
        return await visit(pool, give_all=give_all)

    escrowed._pool = counted  # type: ignore[method-assign]
    return visited


async def _rounds(replica: Replica, clock: Clock, now: list[float], seconds: float) -> int:
    """The escrow duty every quarter second for ``seconds``; the writes it made."""
    written = 0
    for _ in range(int(seconds * 4)):
        now[0] += 0.25
        clock.now += 0.25
        written += await replica.ledger.escrow()
    return written


async def _busy_holder() -> tuple[Cluster, Clock, list[float], Replica]:
    """A replica with escrow on, its monotonic clock at ``now[0]``, busy in a 64Gi pool."""
    cluster, clock, now = Cluster(), Clock(), [0.0]
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True, clock=clock)
    a.escrowed.monotonic = lambda: now[0]
    await _busy(a)
    return cluster, clock, now, a


async def test_a_pool_admitted_into_once_is_not_visited_for_good() -> None:
    # The duty takes up each pool with a recent rate. Decayed every round, a rate never
    # reached zero: every pool ever admitted into was taken up four times a second for good,
    # under its lock, by every replica.
    cluster, clock, now, a = await _busy_holder()
    assert await a.ledger.escrow() == 1
    await _rounds(a, clock, now, 40)  # idle: the slice goes back, then its record
    assert _records(cluster) == {}
    visited = _visits(a)
    await _rounds(a, clock, now, 20)
    assert visited == []


async def test_a_record_waiting_for_its_spends_is_taken_up_only_to_be_written() -> None:
    # A slice spent whole waits for its spend's object (or the store bound) before its record
    # can go: a round over it then changes nothing, except to renew its lease or fold.
    cluster, clock, now, a = await _busy_holder()
    await a.ledger.escrow()
    (record,) = _records(cluster).values()
    assert (await a.admit(create("x", str(int(record.outstanding()["memory"]))))).allowed
    await _rounds(a, clock, now, 31)  # the rate is forgotten; the spend is not foldable yet
    visited = _visits(a)
    written = await _rounds(a, clock, now, 40)  # past the store bound: folded, then removed
    assert _records(cluster) == {}
    assert 0 < len(visited) == written, f"{len(visited)} visits for {written} writes"


async def test_a_young_bursts_slice_is_refilled_while_a_second_of_the_burst_is_left() -> None:
    # A second into a burst the decayed sum holds a fifth of its rate: a slice refilled at a
    # second of the sum was refilled with a fifth of a second left, less than a duty round
    # and a write take, and the burst fell back to the exact path until the refill landed.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "640Gi"}}, escrow=True)
    now = [0.0]
    a.escrowed.monotonic = lambda: now[0]
    await _busy(a, count=1)  # the pool's object is written
    now[0] += 40.0  # and the pool idle since: cold again
    for index in range(7):  # five creates a second, from a cold pool
        assert (await a.admit(create(f"burst{index}", "1Gi"))).allowed
        now[0] += 0.2
    assert a.ledger.spends == 7, "the first grant answered them all"
    (record,) = _records(cluster).values()
    left = record.outstanding()["memory"] - 7 * 1024**3
    assert 0 < left < 5 * 1024**3, "less than a second of the burst is left"
    writes = cluster.writes
    assert await a.ledger.escrow() == 1
    assert cluster.writes == writes + 1
    (refilled,) = _records(cluster).values()
    assert refilled.outstanding()["memory"] - 7 * 1024**3 >= 25 * 1024**3, "seconds of it"

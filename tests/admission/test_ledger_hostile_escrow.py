"""Hostile input to the escrow's wants and duty: a refusal's want, another writer's want, and
pools a tenant admits into and then takes away."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.admission.test_ledger import POOL, Clock, Cluster, Replica, create
from tests.admission.test_ledger_escrow import _busy, _records, _rounds, held_by_a
from tests.builders import review
from webhook.admission.ledger.book import TooLarge
from webhook.admission.ledger.bounds import MAX_OBJECT_BYTES
from webhook.admission.ledger.entries import expiry
from webhook.admission.ledger.wants import WANT_SECONDS, want_json, wanted_room, with_want
from webhook.core.admission.reviews import parse_review

GIGA = 1024**3


async def test_refusal_flood_where_the_want_is_not_kept_costs_one_write_per_refusal() -> None:
    # An API server whose schema prunes status.wanted (a CRD not yet upgraded), or a write
    # that keeps failing: the ask is never remembered, so every refusal a tenant sends asks
    # again, each a write of the pool's whole object under the pool's lock.
    clock = Clock()
    cluster, _, b = await held_by_a(clock)
    client: Any = b.ledger._book.client
    replace = client.replace

    async def pruning(ref: Any, obj: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        (obj.get("status") or {}).pop("wanted", None)
        stored: dict[str, Any] = await replace(ref, obj, status=status)
        return stored

    client.replace = pruning
    before = cluster.written.get(POOL, 0)
    for index in range(10):
        refused = await b.admit(create(f"big{index}", "2Gi"))
        assert (refused.allowed, refused.reason) == (False, "exceeded"), refused.message
    asks = cluster.written.get(POOL, 0) - before
    assert asks <= 1, f"{asks} writes for 10 refusals"


async def test_a_want_that_never_expires_does_not_keep_the_pools_slices_away() -> None:
    # Another writer's want may name any expiry: one far in the future made every holder
    # take the pool for full, give its slice back and grant nothing, for as long as it says.
    now = 1_000_000.0
    forever = {"room": {"memory": "1Ti"}, "expires": expiry(now + 100 * 365 * 86400)}
    assert wanted_room({"wanted": forever}, now) == {}, "no want lasts past WANT_SECONDS"
    fresh = {"room": {"memory": "1Gi"}, "expires": expiry(now + WANT_SECONDS)}
    assert wanted_room({"wanted": fresh}, now) == {"memory": GIGA}


async def test_a_want_that_never_expires_on_the_object_lets_a_holder_grant() -> None:
    clock = Clock()
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True, clock=clock)
    await _busy(a)
    status = cluster.objects[POOL].setdefault("status", {})
    status["wanted"] = {
        "room": {"memory": "64Gi"},
        "expires": expiry(clock() + 100 * 365 * 86400),
    }
    cluster.objects[POOL]["metadata"]["resourceVersion"] = str(cluster.bump())
    a.deliver()
    assert await a.ledger.escrow() == 1, "a hostile want keeps no slice from being granted"
    assert _records(cluster)
    assert (
        "wanted" not in (cluster.objects[POOL].get("status") or {})
        or not (cluster.objects[POOL]["status"]["wanted"])
    ), "the next write drops it"


async def test_a_pool_admitted_into_then_taken_away_is_not_visited_for_good() -> None:
    # A tenant admits into a pool and deletes it (or its quota): the duty returned before
    # bringing the pool's rate up to date, so the rate was never forgotten and the pool was
    # taken up, under its lock, four times a second for good; one more pool per such tenant.
    cluster, clock, now = Cluster(), Clock(), [0.0]
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True, clock=clock)
    escrowed = a.escrowed
    escrowed.monotonic = lambda: now[0]
    await _busy(a)
    a.ledger.reflector.on_event("DELETED", copy.deepcopy(cluster.objects[POOL]))
    await _rounds(a, clock, now, 40)
    assert escrowed.recent.rated() == set()


async def test_an_object_past_the_bound_can_still_shrink() -> None:
    # An object already past MAX_OBJECT_BYTES (written before the bound, or another writer's
    # record or entries): every write was refused, the ones that remove room too (a reclaim,
    # an expired entry's removal), so it never shrank back and the pool stopped for good.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}})
    assert (await a.admit(create("w0", "1Gi"))).allowed
    book = a.ledger._book
    current = cluster.objects[POOL]
    current["status"]["padding"] = "x" * (MAX_OBJECT_BYTES + 1000)
    smaller = {**current["status"], "padding": "x" * (MAX_OBJECT_BYTES + 10)}
    before = cluster.writes
    await book.write(POOL, current, smaller)
    assert cluster.writes == before + 1, "a write that shrinks the object is sent"
    current = cluster.objects[POOL]
    with pytest.raises(TooLarge):
        await book.write(POOL, current, {**smaller, "more": "y"})
    assert cluster.writes == before + 1, "one that grows it past the bound is not"


async def test_dry_run_refusals_post_no_want() -> None:
    # A dry run has no side effects (the webhooks say NoneOnDryRun): a refused one asked the
    # pool's holders to give back all the same, a write of the pool's object that made every
    # holder take the pool for full, from requests that create nothing.
    clock = Clock()
    cluster, _, b = await held_by_a(clock)
    before = cluster.written.get(POOL, 0)
    request = parse_review(review("Thing", POOL, "big", {"memory": "2Gi"}, dry_run=True))
    refused = await b.admit(request)
    assert not refused.allowed
    assert cluster.written.get(POOL, 0) == before, "a dry run wrote nothing"
    assert wanted_room(cluster.objects[POOL].get("status") or {}, clock()) == {}
    real = await b.admit(create("big", "2Gi"))
    assert (real.code, real.reason) == (429, "escrowed"), real.message
    again = await b.admit(
        parse_review(review("Thing", POOL, "big2", {"memory": "2Gi"}, dry_run=True))
    )
    assert (again.code, again.reason) == (429, "escrowed"), "told what a real one is told"


async def _wanted_by_b(
    clock: Clock, now: list[float]
) -> tuple[Cluster, Replica, Replica, int, int]:
    """``a`` holds a slice of a roomy pool; ``b`` is refused a create a quarter GiB larger
    than the free room outside it, and asks ``a`` for that: the cluster, ``a``, ``b``, what
    ``a`` held and the refused create's size."""
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}}, escrow=True, clock=clock)
    b = Replica(cluster, "b", {POOL: {"memory": "64Gi"}}, clock=clock)
    b.ledger._wants.monotonic = clock
    escrowed = a.escrowed
    escrowed.monotonic = lambda: now[0]
    await _busy(a)
    assert await a.ledger.escrow() == 1
    (record,) = _records(cluster).values()
    held = int(record.outstanding()["memory"])
    b.deliver()
    size = 64 * GIGA - 3 * GIGA - held + GIGA // 4  # the free room outside a's slice, and more
    refused = await b.admit(create("just-over", str(size)))
    assert (refused.code, refused.reason) == (429, "escrowed"), refused.message
    assert wanted_room(cluster.objects[POOL]["status"], clock()) == {"memory": size}
    a.deliver()
    return cluster, a, b, held, size


async def test_one_refused_request_per_half_minute_keeps_every_slice_of_a_roomy_pool_away() -> None:
    # A tenant of a pool with plenty of room asks for a little more than what is free outside
    # the slices, and never retries: every holder took the pool for full, gave all it held
    # back and refilled nothing, so every other tenant of the pool admitted by the exact path
    # (one write each) for as long as one such refusal came every half minute.
    clock, now = Clock(), [0.0]
    cluster, a, _, held, _ = await _wanted_by_b(clock, now)
    assert await a.ledger.escrow() == 1
    (after,) = _records(cluster).values()
    left = int(after.outstanding()["memory"])
    assert left >= held - GIGA // 4, f"gave back {held - left} for a want short of {GIGA // 4}"
    spends = a.ledger.spends
    assert (await a.admit(create("other-tenant", "1Gi"))).allowed
    assert a.ledger.spends == spends + 1, "the rest of the slice still answers, in memory"


async def test_a_want_gets_its_shortfall_back_in_one_round_and_the_retry_is_admitted() -> None:
    clock, now = Clock(), [0.0]
    cluster, a, b, held, size = await _wanted_by_b(clock, now)
    assert await a.ledger.escrow() == 1
    (after,) = _records(cluster).values()
    assert int(after.returned["memory"]) == GIGA // 4, "exactly what the want is short"
    assert int(after.outstanding()["memory"]) == held - GIGA // 4
    b.deliver()
    retry = await b.admit(create("just-over", str(size), uid="retry"))
    assert retry.allowed, retry.message
    (kept,) = _records(cluster).values()
    assert int(kept.outstanding()["memory"]) == held - GIGA // 4, "the rest is still a's"


async def test_no_refill_takes_the_room_a_live_want_needs() -> None:
    # The holder gave back the want's shortfall and then spent its slice down: a refill sized
    # on the pool's count without the want took a share of the room just given back, and the
    # refused request's retry was refused again (while the holder's next round gave it back).
    clock, now = Clock(), [0.0]
    cluster, a, b, held, size = await _wanted_by_b(clock, now)
    assert await a.ledger.escrow() == 1
    (after,) = _records(cluster).values()
    granted = after.granted
    spent = 0
    while spent + GIGA <= held - GIGA // 4 - GIGA:  # all but the last GiB: a refill is wanted
        assert (await a.admit(create(f"spend{spent}", "1Gi"))).allowed
        spent += GIGA
    assert a.ledger.spends * GIGA == spent
    for _ in range(40):  # ten seconds of duty rounds while the want lasts
        now[0] += 0.25
        clock.now += 0.25
        a.deliver()
        await a.ledger.escrow()
        (record,) = _records(cluster).values()
        assert record.granted == granted, "no refill while the want is live"
    b.deliver()
    retry = await b.admit(create("just-over", str(size), uid="retry"))
    assert retry.allowed, retry.message


@given(
    budget=st.integers(min_value=1, max_value=10**6),
    usage=st.integers(min_value=0, max_value=10**6),
    want=st.integers(min_value=1, max_value=10**6),
)
def test_a_wants_shortfall_is_exactly_what_makes_it_fit(budget: int, usage: int, want: int) -> None:
    # What a holder gives back for a want: never more than the want is short of the room
    # outside the slices (a want just over the free room took every slice whole), and enough
    # that the want fits once it is given back. Grants are sized on the count with the want.
    now = 1_000_000.0
    current = {"status": {"wanted": want_json({"memory": Decimal(want)}, now)}}
    counted, short = with_want(
        current, {"memory": Decimal(usage)}, {"memory": Decimal(budget)}, now
    )
    assert counted == {"memory": Decimal(usage + want)}
    over = usage + want - budget
    assert short == ({"memory": Decimal(over)} if over > 0 else {})
    assert usage + want - short.get("memory", Decimal(0)) <= budget
    unasked, none = with_want({}, {"memory": Decimal(usage)}, {"memory": Decimal(budget)}, now)
    assert (unasked, none) == ({"memory": Decimal(usage)}, {}), "no want: the count as it is"


async def test_a_write_answered_after_its_pool_was_deleted_brings_none_of_its_entries_back() -> (
    None
):
    # A tenant deletes its sub-tenant (the pool's object goes with its namespace) while a
    # write to the pool is under way: the watch delivers the deletion first, then the
    # write's answer, from before it, arrives. Taken up again, the pool's entries counted
    # once more, in a pool that no longer exists, until a relist.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}})
    assert (await a.admit(create("w0", "1Gi"))).allowed
    book = a.ledger._book
    answer = copy.deepcopy(cluster.objects[POOL])  # what the write was answered with
    deleted = copy.deepcopy(answer)
    deleted["metadata"]["resourceVersion"] = str(cluster.bump())
    a.ledger.reflector.on_event("DELETED", deleted)
    departed = a.state.pending.holds()  # counted until the state passes the deletion
    book.remember(answer)
    assert POOL not in book.objects
    assert a.state.pending.holds() == departed, "listed again: counted as the pool's entries"
    later = copy.deepcopy(answer)
    later["metadata"]["resourceVersion"] = str(cluster.bump())
    book.remember(later)  # the pool created again: its new object is taken up
    assert POOL in book.objects

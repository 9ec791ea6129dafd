"""Fair queuing by tenant: who is dispatched next, who is refused, and what is remembered."""

from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.admission.fair_queue import (
    CLUSTER_FLOW,
    UNREAD_FLOW,
    FairLimits,
    FairQueue,
    Ticket,
    estimate_seconds,
    flow_of,
)

FLOWS = ("tenant-a", "tenant-b", "tenant-c", "tenant-d")
# (flow, estimate in ms, what it really took in ms)
requests = st.tuples(
    st.sampled_from(FLOWS), st.integers(min_value=0, max_value=200), st.integers(0, 400)
)
Step = tuple[str, int, int] | Literal["dispatch"]
# A history: arrivals, and dispatches (each charged at once) interleaved.
histories = st.lists(st.one_of(requests, st.just("dispatch")), max_size=60)


def run(queue: FairQueue, history: list[Step], spent: dict[Ticket, float]) -> list[Ticket]:
    """Play a history; returns the tickets in the order they were dispatched."""
    order = []
    for step in history:
        if step == "dispatch":
            ticket = queue.dispatch()
            if ticket is not None:
                order.append(ticket)
                queue.charge(ticket, spent[ticket])
        else:
            flow, estimate, took = step
            ticket = queue.arrive(flow, estimate / 1000, now=0.0)
            if ticket is not None:
                spent[ticket] = took / 1000
    return order


def seated(queue: FairQueue) -> Ticket:
    ticket = queue.dispatch()
    assert ticket is not None
    return ticket


def drain(queue: FairQueue, spent: dict[Ticket, float]) -> list[Ticket]:
    order = []
    while (ticket := queue.dispatch()) is not None:
        order.append(ticket)
        queue.charge(ticket, spent.get(ticket, ticket.estimate))
    return order


@pytest.mark.parametrize(
    ("namespace", "flow"),
    [
        pytest.param("tenant-acme", "tenant-acme", id="a-top-level-tenant-is-its-own-flow"),
        pytest.param("tenant-acme-dev", "tenant-acme", id="a-sub-tenant-is-its-top-levels-flow"),
        pytest.param("tenant-acme-dev-ci", "tenant-acme", id="so-is-a-sub-sub-tenant"),
        pytest.param("tenant-root", "tenant-root", id="the-root-namespace-is-a-flow"),
        pytest.param("cozy-system", "cozy-system", id="a-namespace-no-tenant-owns-is-its-own"),
        pytest.param("", CLUSTER_FLOW, id="cluster-scoped-objects-share-one"),
        pytest.param("Tenant-Acme", UNREAD_FLOW, id="a-name-no-namespace-has-is-unread"),
        pytest.param("tenant-a" * 40, UNREAD_FLOW, id="a-name-too-long-is-unread"),
    ],
)
def test_the_flow_of_a_namespace(namespace: str, flow: str) -> None:
    assert flow_of(namespace) == flow


def test_a_larger_body_is_expected_to_cost_more() -> None:
    assert estimate_seconds(743_000) > 50 * estimate_seconds(1_500)


def test_a_newcomer_goes_before_the_second_of_a_flow_with_many_waiting() -> None:
    queue = FairQueue()
    heavy = [queue.arrive("tenant-acme", 0.065, now=0.0) for _ in range(12)]
    first = seated(queue)
    assert first is heavy[0]
    victim = queue.arrive("tenant-beta", 0.0003, now=0.0)
    queue.charge(first, 0.065)
    assert queue.dispatch() is victim


def test_a_flow_charged_more_than_estimated_starts_later() -> None:
    queue = FairQueue()
    a1, a2 = (queue.arrive("tenant-a", 0.001, now=0.0) for _ in range(2))
    b1, b2 = (queue.arrive("tenant-b", 0.001, now=0.0) for _ in range(2))
    ticket = seated(queue)
    assert ticket is a1
    queue.charge(ticket, 0.010)  # took ten times its estimate
    assert drain(queue, {}) == [b1, b2, a2]


def test_a_flow_past_its_queue_length_is_refused_and_no_other_is() -> None:
    queue = FairQueue(FairLimits(queue_length=3))
    assert all(queue.arrive("tenant-a", 0.01, now=0.0) for _ in range(3))
    assert queue.arrive("tenant-a", 0.01, now=0.0) is None
    assert queue.arrive("tenant-b", 0.01, now=0.0) is not None
    assert queue.waiting_in("tenant-a") == 3


def test_a_withdrawn_ticket_is_never_dispatched() -> None:
    queue = FairQueue()
    seated = queue.arrive("tenant-a", 0.01, now=0.0)
    assert queue.dispatch() is seated
    waiting = queue.arrive("tenant-b", 0.01, now=0.0)
    assert waiting is not None
    assert queue.withdraw(waiting)
    assert seated is not None
    assert not queue.withdraw(seated)
    queue.charge(seated, 0.01)
    assert queue.dispatch() is None
    assert queue.waiting == 0


def test_a_seat_given_back_before_the_charge_lets_the_next_run() -> None:
    queue = FairQueue()
    first = queue.arrive("tenant-a", 0.01, now=0.0)
    second = queue.arrive("tenant-b", 0.01, now=0.0)
    assert queue.dispatch() is first
    assert queue.dispatch() is None  # one seat
    assert first is not None
    queue.release(first)  # waiting on I/O now
    assert queue.dispatch() is second
    queue.charge(first, 0.02)


@settings(max_examples=300, deadline=None)
@given(histories, st.sampled_from(FLOWS), st.integers(0, 5))
def test_a_flow_with_one_request_waiting_goes_before_any_other_flows_second(
    history: list[Step], newcomer: str, estimate_ms: int
) -> None:
    queue = FairQueue(FairLimits(queue_length=1000))
    spent: dict[Ticket, float] = {}
    run(queue, history, spent)
    if queue.waiting_in(newcomer) or newcomer in queue._flows:
        return  # the property is about a flow owing nothing, waiting for nothing
    waiting_before = {flow: queue.waiting_in(flow) for flow in FLOWS}
    mine = queue.arrive(newcomer, estimate_ms / 1000, now=0.0)
    assert mine is not None
    order = drain(queue, spent)
    before_mine = order[: order.index(mine)]
    for flow in FLOWS:
        if flow != newcomer and waiting_before[flow]:
            assert sum(ticket.flow == flow for ticket in before_mine) <= 1


@settings(max_examples=300, deadline=None)
@given(histories)
def test_no_flow_starves_and_each_flow_is_served_in_order(history: list[Step]) -> None:
    queue = FairQueue(FairLimits(queue_length=1000))
    spent: dict[Ticket, float] = {}
    order = run(queue, history, spent)
    order += drain(queue, spent)
    assert len(order) == len(spent)  # every request that was queued was dispatched
    for flow in FLOWS:
        mine = [ticket.seq for ticket in order if ticket.flow == flow]
        assert mine == sorted(mine)
    assert queue.waiting == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(FLOWS), min_size=1, max_size=40), st.integers(1, 4))
def test_flows_of_equal_requests_take_turns(arrivals: list[str], length: int) -> None:
    """Backlogged flows sending requests of one cost are served round-robin: over any prefix
    of the dispatches, two flows both still waiting differ by at most one request."""
    queue = FairQueue(FairLimits(queue_length=length))
    for flow in arrivals:
        queue.arrive(flow, 0.01, now=0.0)
    counts = dict.fromkeys(FLOWS, 0)
    while (ticket := queue.dispatch()) is not None:
        counts[ticket.flow] += 1
        queue.charge(ticket, 0.01)
        backlogged = [f for f in FLOWS if queue.waiting_in(f)]
        served = [counts[f] for f in backlogged]
        assert not served or max(served) - min(served) <= 1


@settings(max_examples=200, deadline=None)
@given(histories, st.integers(1, 5))
def test_the_queue_length_refuses_only_the_flow_past_it(history: list[Step], length: int) -> None:
    queue = FairQueue(FairLimits(queue_length=length))
    for step in history:
        if step == "dispatch":
            ticket = queue.dispatch()
            if ticket is not None:
                queue.charge(ticket, 0.0)
            continue
        flow, estimate, _ = step
        full = queue.waiting_in(flow) >= length
        others = {f: queue.waiting_in(f) for f in FLOWS if f != flow}
        ticket = queue.arrive(flow, estimate / 1000, now=0.0)
        assert (ticket is None) == full
        assert others == {f: queue.waiting_in(f) for f in FLOWS if f != flow}


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 300))
def test_idle_flows_remembered_stay_bounded(bound: int, flows: int) -> None:
    queue = FairQueue(FairLimits(remembered_flows=bound))
    for index in range(flows):
        ticket = queue.arrive(f"tenant-t{index}", 0.01, now=0.0)
        assert ticket is not None
        assert queue.dispatch() is ticket
        queue.charge(ticket, 0.5)  # each leaves owing
    assert len(queue._flows) <= bound


def test_a_flow_idle_for_a_while_banks_no_credit() -> None:
    queue = FairQueue()
    queue.arrive("tenant-a", 0.001, now=0.0)
    queue.charge(seated(queue), 0.005)  # owes a little, and is remembered
    for _ in range(20):  # meanwhile another tenant is served for a long time
        queue.arrive("tenant-b", 0.01, now=0.0)
    for _ in range(10):
        ticket = queue.dispatch()
        assert ticket is not None
        queue.charge(ticket, 0.01)
    back = [queue.arrive("tenant-a", 0.01, now=0.0) for _ in range(3)]
    order = []
    for _ in range(4):
        ticket = queue.dispatch()
        assert ticket is not None
        queue.charge(ticket, 0.01)
        order.append(ticket)
    assert sum(ticket in back for ticket in order) == 2  # taking turns, not all three first

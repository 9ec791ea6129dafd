"""The search's world: moves it makes in place are undone exactly, and its meter stops it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.capacity.search_world import Bound, BudgetSpent, Meter, World
from webhook.core.capacity.snapshot import VM, Node, Snapshot

Gi = 1024**3 * 1000  # milli-units


def cluster(sizes: list[int], nodes: int) -> Snapshot:
    return Snapshot(
        nodes=tuple(
            Node(f"n{i}", {"memory": 64 * Gi, "cpu": 16_000, "pods": 110_000}) for i in range(nodes)
        ),
        vms=tuple(
            VM("tenant-a", f"vm{i}", f"n{i % nodes}", {"memory": size * Gi, "cpu": 1000})
            for i, size in enumerate(sizes)
        ),
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=16), min_size=1, max_size=8),
    st.integers(min_value=2, max_value=4),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0)), max_size=6),
)
def test_moves_undone_in_reverse_leave_the_world_as_it_was(
    sizes: list[int], nodes: int, moves: list[tuple[int, int]]
) -> None:
    world = World.build(cluster(sizes, nodes))
    before = ([list(f) for f in world.free], list(world.loc), [set(s) for s in world.on_node])
    done = []
    for vm, node in moves:
        v, t = vm % len(world.vms), node % nodes
        done.append((v, world.move(v, t)))
    for v, source in reversed(done):
        world.undo(v, source)
    assert ([list(f) for f in world.free], list(world.loc), [set(s) for s in world.on_node]) == (
        before
    )


def test_a_move_frees_the_source_and_fills_the_target() -> None:
    world = World.build(cluster([8, 4], 2))
    memory = world.keys.index("memory")
    source = world.move(0, 1)
    assert source == 0
    assert world.free[0][memory] == 64 * Gi
    assert world.free[1][memory] == (64 - 12) * Gi
    assert world.on_node[1] == {0, 1}


def test_the_meter_stops_past_its_bound_of_candidates() -> None:
    meter = Meter(Bound(candidates=10))
    meter.spend(10)
    with pytest.raises(BudgetSpent, match="its bound of 10 candidates"):
        meter.spend()


def test_the_meter_asks_the_deadline_hook_and_stops_when_time_is_up() -> None:
    meter = Meter(Bound(candidates=10**9, expired=lambda: True))
    with pytest.raises(BudgetSpent, match="the time limit"):
        meter.spend(10**6)

"""The planner: fewest live migrations, every step feasible while the source holds the VM."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.capacity.objects import hostile_mixed_cluster
from tests.core.capacity.planner_reference import brute_force, fits
from webhook.core.capacity.planner import Bound, Plan, plan_drain, plan_placement, replay
from webhook.core.capacity.snapshot import (
    VM,
    AntiAffinity,
    Node,
    Placement,
    Pod,
    Snapshot,
    Taint,
    Toleration,
)
from webhook.core.capacity.snapshot_objects import snapshot_from_objects

G = 1024**3 * 1000  # one GiB in milli-units


def node(name: str, memory: int, *, cpu: int = 64, **kw: object) -> Node:
    return Node(name, {"memory": memory * G, "cpu": cpu * 1000, "pods": 110_000}, **kw)  # type: ignore[arg-type]


def vm(name: str, memory: int, where: str | None, **kw: object) -> VM:
    return VM("ns", name, where, {"memory": memory * G, "cpu": 100, "pods": 1000}, **kw)  # type: ignore[arg-type]


def simulate(
    snapshot: Snapshot, plan: Plan, *, pending: str | None = None, drain: str | None = None
) -> None:
    """Replay a plan: each step must fit while the source still holds the VM."""
    state: dict[str, str | None] = {v.key: v.node for v in snapshot.vms}
    nodes = {n.name: n for n in snapshot.nodes}
    moved: set[str] = set()
    for move in plan.moves:
        moving = snapshot.vm(move.vm)
        assert moving is not None
        assert moving.migratable
        assert move.vm not in moved
        assert state[move.vm] == move.source != move.target != drain
        assert fits(moving, nodes[move.target], state, snapshot), move
        state[move.vm] = move.target
        moved.add(move.vm)
    if pending is not None:
        target = snapshot.vm(pending)
        assert target is not None
        assert plan.target is not None
        assert fits(target, nodes[plan.target], state, snapshot)
    if drain is not None:
        assert all(where != drain for where in state.values())


def seed_cluster() -> Snapshot:
    # The seed: three 30G workers, two 8Gi VMs each plus system pods, a 16Gi VM pending.
    workers = [node(n, 30) for n in ("green", "blue", "red")]
    system = [
        Pod(f"sys-{n.name}", "kube-system", n.name, {"memory": 3 * G, "pods": 1000})
        for n in workers
    ]
    vms = [vm(f"{n.name}-{i}", 8, n.name) for n in workers for i in (1, 2)]
    return Snapshot(tuple(workers), tuple(system), (*vms, vm("rhel7-red-llama", 16, None)))


def test_the_seed_needs_exactly_one_migration() -> None:
    snapshot = seed_cluster()
    plan = plan_placement(snapshot, "ns/rhel7-red-llama")
    assert plan.feasible
    assert len(plan.moves) == 1
    assert plan.moves[0].source == plan.target != plan.moves[0].target
    simulate(snapshot, plan, pending="ns/rhel7-red-llama")


def test_a_vm_that_fits_needs_no_migration() -> None:
    snapshot = Snapshot((node("a", 30),), (), (vm("p", 8, None),))
    plan = plan_placement(snapshot, "ns/p")
    assert plan.feasible
    assert plan.moves == ()
    assert plan.target == "a"


def test_draining_a_seed_worker_moves_both_its_vms() -> None:
    snapshot = seed_cluster()
    plan = plan_drain(snapshot, "green")
    assert plan.feasible
    assert len(plan.moves) == 2
    simulate(snapshot, plan, drain="green")


def test_draining_fails_with_a_reason_when_the_rest_cannot_hold_it() -> None:
    snapshot = Snapshot(
        (node("a", 16), node("b", 12)), (), (vm("x", 8, "a"), vm("y", 8, "a"), vm("z", 8, "b"))
    )
    plan = plan_drain(snapshot, "a")
    assert not plan.feasible
    assert "cannot take the 2 VMs on a" in plan.reason


def test_a_vm_that_cannot_migrate_blocks_a_drain_by_name() -> None:
    snapshot = Snapshot(
        (node("a", 30), node("b", 30)),
        (),
        (
            vm(
                "x",
                8,
                "a",
                migratable=False,
                why_not_migratable="not live-migratable (DisksNotLiveMigratable)",
            ),
        ),
    )
    plan = plan_drain(snapshot, "a")
    assert not plan.feasible
    assert plan.reason == "ns/x cannot move: not live-migratable (DisksNotLiveMigratable)"


def test_non_migratable_vms_are_never_moved_to_make_room() -> None:
    snapshot = Snapshot(
        (node("a", 20), node("b", 20)),
        (),
        (vm("x", 8, "a", migratable=False), vm("y", 8, "b", migratable=False), vm("p", 16, None)),
    )
    plan = plan_placement(snapshot, "ns/p")
    assert not plan.feasible
    assert "larger than any eligible node" in plan.reason


def test_anti_affinity_keeps_replicas_apart() -> None:
    apart = (AntiAffinity(match_labels=(("app", "db"),)),)
    db = {"app": "db"}
    snapshot = Snapshot(
        (node("a", 20), node("b", 20)),
        (),
        (
            vm("db-0", 8, "a", labels=db, placement=Placement(anti_affinity=apart)),
            vm("db-1", 8, "b", labels=db, placement=Placement(anti_affinity=apart)),
            vm("p", 16, None),
        ),
    )
    # Either replica would fit beside the other, but they may not share a node.
    plan = plan_placement(snapshot, "ns/p")
    assert not plan.feasible
    assert "no sequence" in plan.reason


def test_a_pending_vm_with_anti_affinity_moves_the_conflicting_vm_away() -> None:
    apart = (AntiAffinity(match_labels=(("app", "web"),)),)
    web = {"app": "web"}
    snapshot = Snapshot(
        (node("a", 30), node("b", 10)),
        (),
        (
            vm("w0", 4, "a", labels=web),
            vm("p", 4, None, labels=web, placement=Placement(anti_affinity=apart)),
        ),
    )
    # b is too small for p but takes w0; then p lands on a... or p goes to b directly.
    plan = plan_placement(snapshot, "ns/p")
    assert plan.feasible
    assert plan.moves == ()
    assert plan.target == "b"


def test_taints_keep_vms_off_nodes_they_do_not_tolerate() -> None:
    gpu = Taint("gpu", "true", "NoSchedule")
    snapshot = Snapshot(
        (node("a", 24), node("b", 20, taints=(gpu,))),
        (),
        (vm("x", 8, "a"), vm("y", 8, "a"), vm("p", 16, None)),
    )
    # p cannot go to b, and neither can x or y: no room can be made on a.
    plan = plan_placement(snapshot, "ns/p")
    assert not plan.feasible
    tolerant = Placement(tolerations=(Toleration("gpu", "Equal", "true", "NoSchedule"),))
    snapshot = Snapshot(
        snapshot.nodes,
        (),
        (vm("x", 8, "a", placement=tolerant), vm("y", 8, "a"), vm("p", 16, None)),
    )
    plan = plan_placement(snapshot, "ns/p")
    assert plan.feasible
    assert [m.vm for m in plan.moves] == ["ns/x"]
    assert plan.target == "a"


def test_a_cordoned_node_takes_no_vm() -> None:
    cordoned = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
    snapshot = Snapshot(
        (node("a", 20), node("b", 40, taints=(cordoned,), unschedulable=True)),
        (),
        (vm("x", 8, "a"), vm("p", 16, None)),
    )
    plan = plan_placement(snapshot, "ns/p")
    assert not plan.feasible


def test_a_pending_vm_larger_than_all_free_memory_is_refused_with_the_reason() -> None:
    snapshot = seed_cluster()
    snapshot = Snapshot(snapshot.nodes, snapshot.pods, (*snapshot.vms[:-1], vm("huge", 40, None)))
    plan = plan_placement(snapshot, "ns/huge")
    assert not plan.feasible
    assert "larger than any eligible node" in plan.reason
    big = Snapshot(snapshot.nodes, snapshot.pods, (*snapshot.vms[:-1], vm("big", 26, None)))
    plan = plan_placement(big, "ns/big")
    # 26Gi fits an emptied worker, but only by moving both of its VMs elsewhere.
    assert plan.feasible
    assert len(plan.moves) == 2


def test_a_move_needs_room_while_the_source_still_holds_the_vm() -> None:
    # Swapping x (a) and y (b) would leave p room on a, but neither side can hold both copies.
    snapshot = Snapshot(
        (node("a", 16), node("b", 16)),
        (),
        (vm("x", 10, "a"), vm("y", 10, "b"), vm("p", 12, None)),
    )
    assert brute_force(snapshot, pending="ns/p") is None
    assert not plan_placement(snapshot, "ns/p").feasible


def test_ties_are_broken_by_fewer_bytes_moved() -> None:
    snapshot = Snapshot(
        (node("a", 20), node("b", 20)),
        (),
        (
            vm("big", 8, "a"),
            vm("small", 4, "a"),
            vm("c", 10, "b", migratable=False),
            vm("p", 12, None),
        ),
    )
    plan = plan_placement(snapshot, "ns/p")
    assert [m.vm for m in plan.moves] == ["ns/small"]


def random_cluster(rng: random.Random) -> tuple[Snapshot, str]:
    nodes = []
    for i in range(rng.randint(2, 4)):
        taints = (Taint("t", "x", "NoSchedule"),) if rng.random() < 0.15 else ()
        labels = {"zone": rng.choice("ab"), "kubernetes.io/hostname": f"n{i}"}
        nodes.append(
            node(f"n{i}", rng.randint(6, 16), cpu=rng.randint(2, 6), labels=labels, taints=taints)
        )
    vms = []
    for i in range(rng.randint(1, 6)):
        where = rng.choice(nodes).name
        labels = {"app": rng.choice("xyz")}
        placement = Placement(
            node_selector=(("zone", rng.choice("ab")),) if rng.random() < 0.15 else (),
            tolerations=(Toleration("t", "Exists"),) if rng.random() < 0.3 else (),
            anti_affinity=(AntiAffinity(match_labels=(("app", labels["app"]),)),)
            if rng.random() < 0.15
            else (),
        )
        vms.append(
            VM(
                "ns",
                f"v{i}",
                where,
                {
                    "memory": rng.randint(1, 6) * G,
                    "cpu": rng.choice([500, 1000, 2000]),
                    "pods": 1000,
                },
                migratable=rng.random() > 0.1,
                labels=labels,
                placement=placement,
            )
        )
    if rng.random() < 0.5:
        pending = VM("ns", "p", None, {"memory": rng.randint(2, 12) * G, "cpu": 1000, "pods": 1000})
        return Snapshot(tuple(nodes), (), (*vms, pending)), "ns/p"
    return Snapshot(tuple(nodes), (), tuple(vms)), ""


@pytest.mark.parametrize("seed", range(8))
def test_the_planner_finds_the_same_minimum_as_exhaustive_search(seed: int) -> None:
    rng = random.Random(seed)
    checked = 0
    for _ in range(300):
        snapshot, pending = random_cluster(rng)
        if pending:
            expected = brute_force(snapshot, pending=pending, k=3)
            plan = plan_placement(snapshot, pending, max_moves=3)
        else:
            drained = rng.choice(snapshot.nodes).name
            expected = brute_force(snapshot, drain=drained, k=3)
            plan = plan_drain(snapshot, drained, max_moves=3)
        got = (len(plan.moves), plan.bytes_moved) if plan.feasible else None
        assert got == expected, (snapshot, pending, plan)
        if plan.feasible:
            simulate(snapshot, plan, pending=pending or None, drain=None if pending else drained)
        checked += 1
    assert checked == 300


def tight_cluster(rng: random.Random) -> Snapshot:
    """A pending VM just larger than any node's free memory: room must be made."""
    snapshot, _ = random_cluster(rng)
    vms = [v for v in snapshot.vms if v.key != "ns/p"]
    for i in range(rng.randint(1, 3)):
        vms.append(vm(f"extra{i}", rng.randint(1, 4), rng.choice(snapshot.nodes).name))
    used = {
        n.name: sum(v.requests["memory"] for v in vms if v.node == n.name) for n in snapshot.nodes
    }
    largest = max(n.allocatable["memory"] - used[n.name] for n in snapshot.nodes)
    size = max(1, largest // G + rng.randint(1, 4))
    return Snapshot(snapshot.nodes, (), (*vms, vm("p", size, None)))


@pytest.mark.parametrize("seed", range(100, 106))
def test_the_planner_matches_exhaustive_search_when_room_must_be_made(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        snapshot = tight_cluster(rng)
        expected = brute_force(snapshot, pending="ns/p", k=3)
        plan = plan_placement(snapshot, "ns/p", max_moves=3)
        got = (len(plan.moves), plan.bytes_moved) if plan.feasible else None
        assert got == expected, (snapshot, plan)
        if plan.feasible:
            simulate(snapshot, plan, pending="ns/p")


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_every_plan_replays_on_the_snapshot_it_came_from(seed: int) -> None:
    snapshot = tight_cluster(random.Random(seed))
    plan = plan_placement(snapshot, "ns/p")
    if plan.feasible:
        assert replay(snapshot, plan.moves, pending="ns/p", target=plan.target) == ""


def test_replay_names_the_first_step_a_new_pod_broke() -> None:
    snapshot = Snapshot(
        (node("a", 24), node("b", 10), node("c", 10)),
        (),
        (vm("x", 8, "a"), vm("y", 8, "a"), vm("p", 20, None)),
    )
    plan = plan_placement(snapshot, "ns/p")
    assert len(plan.moves) == 2
    squatter = Pod("squatter", "other", plan.moves[1].target, {"memory": 4 * G, "pods": 1000})
    changed = Snapshot(snapshot.nodes, (squatter,), snapshot.vms)
    reason = replay(changed, plan.moves, pending="ns/p", target=plan.target)
    assert reason == f"step 2: {plan.moves[1].target} no longer has room for {plan.moves[1].vm}"


def hostile_snapshot(
    *, per_node: int = 70, memory_short_mi: int = 4096, cpu_short_m: int = 7000
) -> Snapshot:
    return snapshot_from_objects(
        hostile_mixed_cluster(
            per_node=per_node, memory_short_mi=memory_short_mi, cpu_short_m=cpu_short_m
        )
    )


def test_a_vm_short_of_memory_and_cpu_among_mixed_vms_stops_at_the_candidate_bound() -> None:
    # 8 nodes x 70 mixed VMs at 5 moves: before the bound counted the sets of VMs weighed to
    # free a node, this searched for minutes while counting a few thousand states.
    plan = plan_placement(
        hostile_snapshot(), "tenant-evil/pending", max_moves=5, bound=Bound(candidates=200_000)
    )
    assert not plan.feasible
    assert plan.over_bound
    assert 200_000 < plan.candidates <= 201_000
    assert plan.reason.startswith(
        "no plan within the bound: stopped at its bound of 200000 candidates; "
    )
    # What was searched: the depths ruled out, and how far the next one got.
    assert "no plan of 4 moves or fewer exists" in plan.reason
    assert "5-move plans searched on 0 of 8 candidate nodes" in plan.reason


def test_the_deadline_hook_ends_a_search_within_a_few_thousand_candidates() -> None:
    asked = []

    def expired() -> bool:
        asked.append(1)
        return True

    plan = plan_placement(
        hostile_snapshot(), "tenant-evil/pending", max_moves=5, bound=Bound(expired=expired)
    )
    assert plan.over_bound
    assert "stopped at the time limit after considering" in plan.reason
    assert len(asked) == 1
    assert plan.candidates < 2 * 2048 + 1000


def test_a_drain_is_bounded_by_the_same_budget() -> None:
    snapshot = hostile_snapshot(per_node=4)
    plan = plan_drain(snapshot, "worker-0", max_moves=5, bound=Bound(candidates=50))
    assert plan.over_bound
    assert plan.reason.startswith("no plan within the bound: stopped at its bound of 50 ")


def test_the_mixed_cluster_is_planned_exactly_when_the_bound_allows() -> None:
    snapshot = hostile_snapshot(per_node=24, memory_short_mi=2048, cpu_short_m=3000)
    plan = plan_placement(snapshot, "tenant-evil/pending", max_moves=4)
    assert plan.feasible, plan.reason
    assert plan.candidates < 1_000_000
    simulate(snapshot, plan, pending="tenant-evil/pending")


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=1, max_value=3000))
def test_a_bounded_search_finds_the_unbounded_minimum_or_says_it_stopped(
    seed: int, candidates: int
) -> None:
    snapshot = tight_cluster(random.Random(seed))
    unbounded = plan_placement(snapshot, "ns/p", bound=Bound(candidates=10**9))
    bounded = plan_placement(snapshot, "ns/p", bound=Bound(candidates=candidates))
    if bounded.over_bound:
        assert not bounded.feasible
        assert bounded.reason.startswith("no plan within the bound")
        # A step counts its candidates at once: past the bound by one step at most.
        assert candidates < bounded.candidates <= candidates + 64
    else:
        assert bounded.candidates <= candidates
        assert (bounded.feasible, len(bounded.moves), bounded.bytes_moved) == (
            unbounded.feasible,
            len(unbounded.moves),
            unbounded.bytes_moved,
        )


def test_vms_that_each_choose_their_own_placement_count_against_the_bound() -> None:
    # Every distinct placement is matched against every node before any search: 300 VMs with
    # a selector each, on 300 nodes, weigh 90,000 candidates.
    nodes = tuple(node(f"n{i}", 16, labels={"slot": str(i)}) for i in range(300))
    vms = tuple(
        vm(f"v{i}", 1, f"n{i}", placement=Placement(node_selector=(("slot", str(i)),)))
        for i in range(300)
    )
    snapshot = Snapshot(nodes, (), (*vms, vm("p", 64, None)))
    plan = plan_placement(snapshot, "ns/p", bound=Bound(candidates=10_000))
    assert plan.over_bound
    assert plan.reason == "no plan within the bound: stopped at its bound of 10000 candidates"
    assert replay(snapshot, ()) == ""

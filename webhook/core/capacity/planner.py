"""The fewest live migrations that make room: for one pending VM, or to drain one node.

A VM that fits its quota and the cluster's total free memory may still fit no single node. This
module finds the minimum number of live migrations after which it does (or after which every VM
has left a node being drained), as an ordered plan in which **every step is feasible while the
source still holds the VM**: a live migration needs both copies, so the target must have room
before the source frees any. Among plans with the fewest moves it picks the fewest bytes moved.

The search is exact up to a cap (``max_moves``, default 3), by iterative deepening on the number
of moves, goal-directed: a move is only ever made to free room that a later step needs (the last
step being the pending VM itself, or a VM leaving the drained node). Two facts keep it small:

- an admissible bound: to free a shortage on a node takes at least as many VMs as the largest
  ones needed to cover it on the tightest resource, so depths that cannot work are skipped;
- destinations that fit a VM outright are interchangeable unless another step of the plan
  touches them, and a plan of ``d`` moves touches at most ``2(d-1)+1`` other nodes, so trying
  that many such destinations (plus every node that needs room made) loses no plan.

Each VM migrates at most once in a plan. The tests compare the result with an exhaustive search
over every move sequence on thousands of small random clusters.

The search is also bounded by the work it does, because a pending VM is a tenant's doing and the
search is exponential in the worst case: one budget counts every candidate it considers (each
state, each destination weighed, each set of VMs weighed to free a node, including those the
enumeration rejects) and a deadline hook ends it in time. Past either, the answer is "no plan
within the bound" with what was searched, never a plan whose minimality was not proven.

This module holds the entry points, the deepening across targets and the answers; the world the
search mutates (and its meter) is ``search_world``, and the search of one depth ``move_search``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from webhook.core.capacity.move_search import Search
from webhook.core.capacity.plan_limits import DEFAULT_MAX_MOVES, MAX_MOVES_CAP
from webhook.core.capacity.search_world import Bound, BudgetSpent, World, lower_bound
from webhook.core.capacity.snapshot import VM, Snapshot

__all__ = [
    "DEFAULT_MAX_MOVES",
    "MAX_MOVES_CAP",
    "Bound",
    "Move",
    "Plan",
    "plan_drain",
    "plan_placement",
    "replay",
]


@dataclass(frozen=True)
class Move:
    vm: str
    source: str
    target: str
    memory: int  # bytes
    cpu: int  # millicores


@dataclass(frozen=True)
class Plan:
    feasible: bool
    moves: tuple[Move, ...] = ()
    target: str | None = None
    reason: str = ""
    over_bound: bool = False  # the search stopped at its bound: no plan was proven or refuted
    candidates: int = 0  # what the search considered

    @property
    def bytes_moved(self) -> int:
        return sum(m.memory for m in self.moves)


def _deepen(
    world: World,
    todo: list[tuple[int, int]],
    max_moves: int,
    goal_node: int,
    floor: int,
    searched: _Progress,
) -> tuple[int, list[tuple[int, int, int]]] | None:
    movable = [vm.migratable for vm in world.vms]
    searched.ruled_out = floor - 1
    for depth in range(floor, max_moves + 1):
        searched.depth, searched.done = depth, 0
        search = Search(world, depth, goal_node, movable)
        search.run(todo)
        if search.best:
            return search.best[0]
        searched.ruled_out = depth
    return None


@dataclass
class _Progress:
    """What a search has settled so far, for the answer when it stops at its bound."""

    targets: int = 0  # nodes that could take the VM once emptied of what may move
    depth: int = 0  # the number of moves being searched
    done: int = 0  # targets searched completely at ``depth``
    ruled_out: int = -1  # every plan of at most this many moves is known not to exist

    def over(self, what: str, work: int) -> Plan:
        tried = [
            f"stopped at {what}"
            if what.startswith("its bound")
            else f"stopped at {what} after considering {work} candidates"
        ]
        if self.ruled_out > 0:
            moves = "move" if self.ruled_out == 1 else "moves"
            tried.append(f"no plan of {self.ruled_out} {moves} or fewer exists")
        if self.depth > 0 and self.targets:
            tried.append(
                f"{self.depth}-move plans searched on {self.done} of {self.targets} candidate nodes"
            )
        return Plan(
            False,
            reason="no plan within the bound: " + "; ".join(tried),
            over_bound=True,
            candidates=work,
        )


def _moves(world: World, path: Sequence[tuple[int, int, int]]) -> tuple[Move, ...]:
    return tuple(
        Move(
            vm=world.vms[v].key,
            source=world.nodes[s].name,
            target=world.nodes[t].name,
            memory=world.vms[v].requests.get("memory", 0) // 1000,
            cpu=world.vms[v].requests.get("cpu", 0),
        )
        for v, s, t in path
    )


def plan_placement(
    snapshot: Snapshot,
    vm_key: str,
    *,
    max_moves: int = DEFAULT_MAX_MOVES,
    bound: Bound | None = None,
) -> Plan:
    """The fewest migrations after which the pending VM ``vm_key`` fits some node.

    Within ``bound`` (default :class:`Bound`); past it, a plan that is not feasible, says so
    (``over_bound``) and tells what was searched.
    """
    max_moves = max(0, min(max_moves, MAX_MOVES_CAP))
    pending = snapshot.vm(vm_key)
    if pending is None:
        return Plan(False, reason=f"no VirtualMachineInstance {vm_key} in the snapshot")
    if pending.node is not None:
        return Plan(False, target=pending.node, reason=f"{vm_key} already runs on {pending.node}")
    others = Snapshot(
        nodes=snapshot.nodes,
        pods=snapshot.pods,
        vms=tuple(v for v in snapshot.vms if v is not pending),
    )
    try:
        world = World.build(others, [pending], bound=bound)
    except BudgetSpent as stop:
        return _Progress().over(stop.what, stop.work)
    p = len(world.vms) - 1
    if not world.eligible[p]:
        reasons = sorted({f"{n.name}: {pending.placement.why_not(n)}" for n in world.nodes})
        return Plan(False, reason="no node admits it (" + "; ".join(reasons) + ")")
    movable = [vm.migratable for vm in world.vms]
    searched = _Progress()
    try:
        # Static capacity: a node whose allocatable minus fixed pods cannot hold it never will.
        world.spend(len(world.vms) + len(world.nodes))
        totals = _room_if_emptied(world, p)
        targets = [n for n in sorted(world.eligible[p]) if totals[n]]
        if not targets:
            return Plan(
                False,
                reason="larger than any eligible node can hold even with every movable VM gone",
                candidates=world.work,
            )
        bounds: dict[int, int] = {}
        for n in targets:
            world.spend(len(world.on_node[n]))
            bounds[n] = _target_bound(world, p, n)
        searched.ruled_out = min(min(bounds.values()), max_moves + 1) - 1
        # Iterative deepening across every target at once, so a plan of d moves anywhere is
        # found before d + 1 moves are tried, and targets share one bound on bytes moved.
        for depth in range(min(bounds.values()), max_moves + 1):
            searched.depth, searched.done = depth, 0
            best: tuple[int, list[tuple[int, int, int]]] | None = None
            best_target = -1
            # A node short of S bytes needs at least S bytes moved off it: cheapest first.
            order = sorted(
                (n for n in targets if bounds[n] <= depth),
                key=lambda n: (
                    world.shortage(p, n)[world.keys.index("memory")]
                    if "memory" in world.keys
                    else 0
                ),
            )
            searched.targets = len(order)
            for n in order:
                search = Search(world, depth, n, movable)
                if best is not None:
                    search.best = [best]
                search.run([(-p - 1, n)])
                searched.done += 1
                if search.best and (best is None or search.best[0][0] < best[0]):
                    best = search.best[0]
                    best_target = n
            if best is not None:
                return Plan(
                    True,
                    moves=_moves(world, best[1]),
                    target=world.nodes[best_target].name,
                    candidates=world.work,
                )
            searched.ruled_out = depth
    except BudgetSpent as stop:
        return searched.over(stop.what, stop.work)
    return Plan(False, reason=_why_no_room(world, p, targets, max_moves), candidates=world.work)


def plan_drain(
    snapshot: Snapshot,
    node: str,
    *,
    max_moves: int = DEFAULT_MAX_MOVES,
    bound: Bound | None = None,
) -> Plan:
    """The fewest migrations after which no VM runs on ``node`` (which takes nothing new)."""
    max_moves = max(0, min(max_moves, MAX_MOVES_CAP))
    try:
        world = World.build(snapshot, bound=bound)
    except BudgetSpent as stop:
        return _Progress().over(stop.what, stop.work)
    index = next((i for i, n in enumerate(world.nodes) if n.name == node), None)
    if index is None:
        return Plan(False, reason=f"no node {node} in the snapshot")
    leaving = sorted(world.on_node[index])
    if not leaving:
        return Plan(True, reason=f"no VM runs on {node}")
    stuck = [world.vms[v] for v in leaving if not world.vms[v].migratable]
    if stuck:
        return Plan(
            False,
            reason="; ".join(f"{vm.key} cannot move: {vm.why_not_migratable}" for vm in stuck),
        )
    if len(leaving) > max_moves:
        return Plan(False, reason=f"{len(leaving)} VMs run on {node}, more than {max_moves} moves")
    world.banned.add(index)
    for v in leaving:
        if not (world.eligible[v] - {index}):
            return Plan(False, reason=f"{world.vms[v].key}: no other node admits it")
    searched = _Progress(targets=1)
    try:
        found = _deepen(world, [(v, -1) for v in leaving], max_moves, -1, len(leaving), searched)
    except BudgetSpent as stop:
        return searched.over(stop.what, stop.work)
    if found is None:
        return Plan(
            False,
            reason=f"the other nodes cannot take the {len(leaving)} VMs on {node} "
            f"within {max_moves} moves",
            candidates=world.work,
        )
    return Plan(True, moves=_moves(world, found[1]), candidates=world.work)


def _room_if_emptied(world: World, p: int) -> dict[int, bool]:
    result = {}
    for n in range(len(world.nodes)):
        room = list(world.free[n])
        for v in world.on_node[n]:
            if world.vms[v].migratable:
                for j in range(len(room)):
                    room[j] += world.req[v][j]
        result[n] = all(room[j] >= world.req[p][j] for j in range(len(room)))
    return result


def _target_bound(world: World, p: int, n: int) -> int:
    movable = [v for v in world.on_node[n] if world.vms[v].migratable]
    must = world.blockers(p, n)
    if any(not world.vms[o].migratable for o in must) or world.fixed_blocks(p, n):
        return 1 << 30
    shortage = world.shortage(p, n)
    base = [max(0, s - sum(world.req[o][j] for o in must)) for j, s in enumerate(shortage)]
    return len(must) + lower_bound(world, base, [v for v in movable if v not in must])


def _why_no_room(world: World, p: int, targets: Sequence[int], max_moves: int) -> str:
    need = world.req[p]
    total_free = [sum(max(0, world.free[n][j]) for n in targets) for j in range(len(need))]
    short = [world.keys[j] for j in range(len(need)) if total_free[j] < need[j]]
    if short:
        return f"not enough free {', '.join(short)} in total on the nodes that admit it"
    bound = min(_target_bound(world, p, n) for n in targets)
    if bound > max_moves:
        return f"every eligible node needs more than {max_moves} VMs moved off it"
    return f"no sequence of at most {max_moves} live migrations makes room"


def replay(
    snapshot: Snapshot,
    moves: Sequence[Move],
    *,
    pending: str | None = None,
    target: str | None = None,
    drain: str | None = None,
) -> str:
    """Why ``moves`` no longer work on ``snapshot`` (each step, then the goal); "" if they do.

    A controller calls this before each step of a plan it is carrying out: a new pod, a VM
    that moved or stopped, a node that changed all show up here as the first step that broke.
    """
    extra: tuple[VM, ...] = ()
    vm = snapshot.vm(pending) if pending else None
    if pending:
        if vm is None:
            return f"{pending} is gone"
        if vm.node is not None:
            return f"{pending} already runs on {vm.node}"
        snapshot = Snapshot(
            snapshot.nodes, snapshot.pods, tuple(v for v in snapshot.vms if v is not vm)
        )
        extra = (vm,)
    try:
        world = World.build(snapshot, extra)
    except BudgetSpent as stop:
        return f"the cluster could not be read within {stop.what}"
    index = {n.name: i for i, n in enumerate(world.nodes)}
    keys = {v.key: i for i, v in enumerate(world.vms)}
    if drain is not None and drain in index:
        world.banned.add(index[drain])
    for step, move in enumerate(moves, start=1):
        v = keys.get(move.vm)
        t = index.get(move.target)
        if v is None or t is None:
            return f"step {step}: {move.vm if v is None else move.target} is gone"
        if world.loc[v] != index.get(move.source, -2):
            return f"step {step}: {move.vm} is no longer on {move.source}"
        if not world.vms[v].migratable:
            return f"step {step}: {move.vm} can no longer migrate"
        if t not in world.eligible[v] or t in world.banned:
            return f"step {step}: {move.target} no longer admits {move.vm}"
        if not world.fits(v, t):
            return f"step {step}: {move.target} no longer has room for {move.vm}"
        world.move(v, t)
    if vm is not None and target is not None:
        p = len(world.vms) - 1
        t = index.get(target)
        if t is None or t not in world.eligible[p] or not world.fits(p, t):
            return f"{target} would not have room for {pending} after the plan"
    if drain is not None and drain in index and world.on_node[index[drain]]:
        return f"VMs would still run on {drain} after the plan"
    return ""

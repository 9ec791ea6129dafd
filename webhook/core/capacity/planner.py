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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from webhook.core.capacity.plan_limits import (
    DEFAULT_MAX_CANDIDATES,
    DEFAULT_MAX_MOVES,
    MAX_MOVES_CAP,
)
from webhook.core.capacity.snapshot import PODS, VM, AntiAffinity, Node, Placement, Snapshot

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

# The deadline hook is asked once per this many candidates (a few milliseconds of work).
_CHECK_EVERY: Final = 2048


@dataclass(frozen=True)
class Bound:
    """How much one plan may search: ``candidates`` considered, and ``expired``, a hook the
    caller gives to say time is up (the core reads no clock), asked every few milliseconds."""

    candidates: int = DEFAULT_MAX_CANDIDATES
    expired: Callable[[], bool] | None = None


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


class _Budget(Exception):
    def __init__(self, what: str, work: int) -> None:
        super().__init__(what)
        self.what = what
        self.work = work


@dataclass
class _Meter:
    """The count of candidates while the world is built (it then carries on in the world)."""

    bound: Bound
    work: int = 0
    next_check: int = _CHECK_EVERY

    def spend(self, count: int = 1) -> None:
        """Count ``count`` candidates against the bound; raise :class:`_Budget` past it."""
        self.work += count
        if self.work > self.bound.candidates:
            raise _Budget(f"its bound of {self.bound.candidates} candidates", self.work)
        if self.work >= self.next_check:
            self.next_check = self.work + _CHECK_EVERY
            if self.bound.expired is not None and self.bound.expired():
                raise _Budget("the time limit", self.work)


@dataclass
class _World:
    """The snapshot as dense integer vectors, mutated in place by the search and undone."""

    nodes: list[Node]
    keys: list[str]
    free: list[list[int]]
    vms: list[VM]
    req: list[list[int]]
    loc: list[int]
    eligible: list[frozenset[int]]
    on_node: list[set[int]]
    fixed_labels: list[list[tuple[str, dict[str, str], tuple[AntiAffinity, ...]]]]
    anti: bool
    banned: set[int] = field(default_factory=set)
    meter: _Meter = field(default_factory=lambda: _Meter(Bound()))

    @property
    def work(self) -> int:
        return self.meter.work

    def spend(self, count: int = 1) -> None:
        self.meter.spend(count)

    @classmethod
    def build(
        cls, snapshot: Snapshot, extra: Sequence[VM] = (), *, bound: Bound | None = None
    ) -> _World:
        """The dense world; the filtering of nodes per distinct placement (which VMIs choose)
        counts against ``bound`` like any other candidate."""
        meter = _Meter(bound or Bound())
        nodes = list(snapshot.nodes)
        index = {n.name: i for i, n in enumerate(nodes)}
        all_vms = [*snapshot.vms, *extra]
        keys = sorted(
            {k for n in nodes for k in n.allocatable}
            | {k for p in snapshot.pods for k in p.requests}
            | {k for v in all_vms for k in v.requests}
            | {PODS}
        )
        free = [[n.allocatable.get(k, 0) for k in keys] for n in nodes]
        fixed: list[list[tuple[str, dict[str, str], tuple[AntiAffinity, ...]]]] = [
            [] for _ in nodes
        ]
        anti = False
        for pod in snapshot.pods:
            i = index.get(pod.node)
            if i is None:
                continue
            for j, k in enumerate(keys):
                free[i][j] -= pod.requests.get(k, 0)
            fixed[i].append((pod.namespace, dict(pod.labels), pod.anti_affinity))
            anti = anti or bool(pod.anti_affinity)
        req = [[v.requests.get(k, 0) for k in keys] for v in all_vms]
        loc = []
        on_node: list[set[int]] = [set() for _ in nodes]
        for vi, vm in enumerate(all_vms):
            i = index.get(vm.node, -1) if vm.node is not None else -1
            loc.append(i)
            if i >= 0:
                on_node[i].add(vi)
                for j in range(len(keys)):
                    free[i][j] -= req[vi][j]
            anti = anti or bool(vm.placement.anti_affinity)
        # Most VMs share a handful of placements: filter the nodes once per distinct one.
        by_placement: dict[Placement, frozenset[int]] = {}
        eligible: list[frozenset[int]] = []
        for vm in all_vms:
            allowed = by_placement.get(vm.placement)
            if allowed is None:
                meter.spend(len(nodes))
                allowed = frozenset(i for i, n in enumerate(nodes) if vm.placement.allows(n))
                by_placement[vm.placement] = allowed
            eligible.append(allowed)
        return cls(
            nodes, keys, free, all_vms, req, loc, eligible, on_node, fixed, anti, meter=meter
        )

    def fits(self, v: int, t: int) -> bool:
        f = self.free[t]
        r = self.req[v]
        if any(f[j] < r[j] for j in range(len(r))):
            return False
        return not self.anti or not self._repels(v, t)

    def shortage(self, v: int, t: int) -> list[int]:
        f = self.free[t]
        return [max(0, r - f[j]) for j, r in enumerate(self.req[v])]

    def _repels(self, v: int, t: int) -> bool:
        vm = self.vms[v]
        for other in self.on_node[t]:
            o = self.vms[other]
            if _conflict(vm.namespace, vm.labels, vm.placement.anti_affinity, o):
                return True
        for namespace, labels, terms in self.fixed_labels[t]:
            if any(a.matches(vm.labels, vm.namespace, namespace) for a in terms):
                return True
            if any(a.matches(labels, namespace, vm.namespace) for a in vm.placement.anti_affinity):
                return True
        return False

    def blockers(self, v: int, t: int) -> set[int]:
        """VMs on ``t`` that ``v`` cannot share a node with."""
        if not self.anti:
            return set()
        vm = self.vms[v]
        return {
            o
            for o in self.on_node[t]
            if _conflict(vm.namespace, vm.labels, vm.placement.anti_affinity, self.vms[o])
        }

    def fixed_blocks(self, v: int, t: int) -> bool:
        vm = self.vms[v]
        for namespace, labels, terms in self.fixed_labels[t]:
            if any(a.matches(vm.labels, vm.namespace, namespace) for a in terms):
                return True
            if any(a.matches(labels, namespace, vm.namespace) for a in vm.placement.anti_affinity):
                return True
        return False

    def move(self, v: int, t: int) -> int:
        s = self.loc[v]
        r = self.req[v]
        if s >= 0:
            fs = self.free[s]
            for j in range(len(r)):
                fs[j] += r[j]
            self.on_node[s].discard(v)
        ft = self.free[t]
        for j in range(len(r)):
            ft[j] -= r[j]
        self.on_node[t].add(v)
        self.loc[v] = t
        return s

    def undo(self, v: int, s: int) -> None:
        t = self.loc[v]
        r = self.req[v]
        ft = self.free[t]
        for j in range(len(r)):
            ft[j] += r[j]
        self.on_node[t].discard(v)
        if s >= 0:
            fs = self.free[s]
            for j in range(len(r)):
                fs[j] -= r[j]
            self.on_node[s].add(v)
        self.loc[v] = s


def _conflict(
    namespace: str, labels: Mapping[str, str], terms: tuple[AntiAffinity, ...], other: VM
) -> bool:
    if any(a.matches(other.labels, other.namespace, namespace) for a in terms):
        return True
    return any(a.matches(labels, namespace, other.namespace) for a in other.placement.anti_affinity)


def lower_bound(world: _World, shortage: Sequence[int], candidates: Sequence[int]) -> int:
    """Fewest of ``candidates`` whose removal could cover ``shortage`` on every resource."""
    bound = 0
    for j, need in enumerate(shortage):
        if need <= 0:
            continue
        sizes = sorted((world.req[v][j] for v in candidates), reverse=True)
        got = 0
        count = 0
        for size in sizes:
            if got >= need or size <= 0:
                break
            got += size
            count += 1
        if got < need:
            return 1 << 30
        bound = max(bound, count)
    return bound


@dataclass
class _Search:
    world: _World
    depth: int
    goal_node: int  # -1 for drain
    movable: list[bool]
    best: list[tuple[int, list[tuple[int, int, int]]]] = field(default_factory=list)
    moved: set[int] = field(default_factory=set)
    path: list[tuple[int, int, int]] = field(default_factory=list)  # (vm, source, target)

    def memory(self, v: int) -> int:
        return self.world.vms[v].requests.get("memory", 0)

    def run(self, todo: list[tuple[int, int]]) -> None:
        self._step(todo, sum(self.memory(v) for v, _ in todo if v not in self.moved and v >= 0))

    def _pending_moves(self, todo: Sequence[tuple[int, int]]) -> int:
        return sum(1 for v, _ in todo if v >= 0)

    def _step(self, todo: list[tuple[int, int]], pending_bytes: int) -> None:
        w = self.world
        w.spend()
        used = len(self.path)
        cost = sum(self.memory(v) for v, _, _ in self.path)
        if self.best and (cost + pending_bytes) >= self.best[0][0]:
            return
        if not todo:
            self.best[:] = [(cost, list(self.path))]
            return
        v, t = todo[-1]
        rest = todo[:-1]
        remaining = self.depth - used - self._pending_moves(todo)
        if v < 0:  # the pending VM itself: it needs room on t, it is not a move
            vm = -v - 1
            self._arrive(vm, t, rest, remaining, pending_bytes, is_move=False)
            return
        if t >= 0:
            self._arrive(v, t, rest, remaining, pending_bytes, is_move=True)
            return
        # Choose a destination for v.
        source = w.loc[v]
        direct: list[int] = []
        roomy: list[int] = []
        w.spend(len(w.eligible[v]))
        for node in sorted(w.eligible[v]):
            if node == source or node in w.banned:
                continue
            if w.fits(v, node):
                direct.append(node)
            elif remaining > 0:
                roomy.append(node)
        limit = 2 * max(0, self.depth - 1) + 2
        if self.goal_node in direct[limit:]:
            direct = [*direct[:limit], self.goal_node]
        else:
            direct = direct[:limit]
        for node in direct:
            self._arrive(v, node, rest, remaining, pending_bytes, is_move=True)
        for node in roomy:
            self._arrive(v, node, rest, remaining, pending_bytes, is_move=True)

    def _arrive(
        self,
        v: int,
        t: int,
        rest: list[tuple[int, int]],
        remaining: int,
        pending_bytes: int,
        *,
        is_move: bool,
    ) -> None:
        w = self.world
        if w.fits(v, t):
            if is_move:
                s = w.move(v, t)
                self.moved.add(v)
                self.path.append((v, s, t))
                self._step(rest, pending_bytes - self.memory(v))
                self.path.pop()
                self.moved.discard(v)
                w.undo(v, s)
            else:
                self._step(rest, pending_bytes)
            return
        if remaining <= 0 or w.fixed_blocks(v, t):
            return
        # Make room on t: a minimal set of VMs there whose removal covers the shortage and
        # clears every anti-affinity conflict.
        shortage = w.shortage(v, t)
        must = w.blockers(v, t)
        if any(not self.movable[o] or o in self.moved for o in must):
            return
        w.spend(len(w.on_node[t]))
        candidates = [
            o for o in sorted(w.on_node[t]) if o != v and self.movable[o] and o not in self.moved
        ]
        base = [max(0, s - sum(w.req[o][j] for o in must)) for j, s in enumerate(shortage)]
        optional = [o for o in candidates if o not in must]
        need = lower_bound(w, base, optional)
        if len(must) + need > remaining:
            return
        for size in range(need, remaining - len(must) + 1):
            covering = _coverings(w, base, optional, size)
            # Cheapest first: the first complete plan bounds the bytes of every later one.
            covering.sort(key=lambda extra: sum(self.memory(o) for o in extra))
            for extra in covering:
                chosen = [*sorted(must), *extra]
                if not chosen:
                    continue
                supports = [(o, -1) for o in chosen]
                added = sum(self.memory(o) for o in chosen)
                todo = [*rest, (v if is_move else -v - 1, t), *supports]
                self._step(todo, pending_bytes + added)


def _coverings(
    w: _World, shortage: Sequence[int], optional: Sequence[int], size: int
) -> list[tuple[int, ...]]:
    """Every minimal set of ``size`` VMs of ``optional`` whose removal covers ``shortage``, in
    the order of ``itertools.combinations``; each set the enumeration weighs is counted.

    Two cuts that lose no minimal set: a prefix that already covers is never extended (every
    superset of a cover is not minimal), and a prefix is abandoned when, on some resource, the
    largest VMs left to choose from cannot complete it in the slots it has left.
    """
    short = [j for j, need in enumerate(shortage) if need > 0]
    if not short:
        return [()] if size == 0 else []
    n = len(optional)
    w.spend(n * len(short))
    # best[i][k][s]: the most that s VMs of optional[i:] free of resource short[k]. It never
    # grows with i, so once it falls short at i it is short for every later i too.
    tops: list[list[int]] = [[] for _ in short]
    best: list[list[list[int]]] = [[[0] * (size + 1) for _ in short] for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        r = w.req[optional[i]]
        for k, j in enumerate(short):
            top = tops[k]
            top.append(r[j])
            top.sort(reverse=True)
            del top[size:]
            row = best[i][k]
            for slots in range(1, size + 1):
                row[slots] = row[slots - 1] + (top[slots - 1] if slots <= len(top) else 0)
    found: list[tuple[int, ...]] = []
    chosen: list[int] = []
    keys = range(len(short))

    def extend(start: int, left: list[int]) -> None:
        w.spend()
        if all(x <= 0 for x in left):
            if len(chosen) == size and _minimal(w, shortage, chosen):
                found.append(tuple(chosen))
            return
        slots = size - len(chosen)
        if slots == 0:
            return
        for i in range(start, n - slots + 1):
            most = best[i]
            if any(left[k] > most[k][slots] for k in keys):
                return
            r = w.req[optional[i]]
            chosen.append(optional[i])
            extend(i + 1, [left[k] - r[j] for k, j in enumerate(short)])
            chosen.pop()

    extend(0, [shortage[j] for j in short])
    return found


def _covers(w: _World, shortage: Sequence[int], chosen: Sequence[int]) -> bool:
    return all(
        need <= 0 or sum(w.req[o][j] for o in chosen) >= need for j, need in enumerate(shortage)
    )


def _minimal(w: _World, shortage: Sequence[int], chosen: Sequence[int]) -> bool:
    return not any(_covers(w, shortage, [o for o in chosen if o != drop]) for drop in chosen)


def _deepen(
    world: _World,
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
        search = _Search(world, depth, goal_node, movable)
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


def _moves(world: _World, path: Sequence[tuple[int, int, int]]) -> tuple[Move, ...]:
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
        world = _World.build(others, [pending], bound=bound)
    except _Budget as stop:
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
                search = _Search(world, depth, n, movable)
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
    except _Budget as stop:
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
        world = _World.build(snapshot, bound=bound)
    except _Budget as stop:
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
    except _Budget as stop:
        return searched.over(stop.what, stop.work)
    if found is None:
        return Plan(
            False,
            reason=f"the other nodes cannot take the {len(leaving)} VMs on {node} "
            f"within {max_moves} moves",
            candidates=world.work,
        )
    return Plan(True, moves=_moves(world, found[1]), candidates=world.work)


def _room_if_emptied(world: _World, p: int) -> dict[int, bool]:
    result = {}
    for n in range(len(world.nodes)):
        room = list(world.free[n])
        for v in world.on_node[n]:
            if world.vms[v].migratable:
                for j in range(len(room)):
                    room[j] += world.req[v][j]
        result[n] = all(room[j] >= world.req[p][j] for j in range(len(room)))
    return result


def _target_bound(world: _World, p: int, n: int) -> int:
    movable = [v for v in world.on_node[n] if world.vms[v].migratable]
    must = world.blockers(p, n)
    if any(not world.vms[o].migratable for o in must) or world.fixed_blocks(p, n):
        return 1 << 30
    shortage = world.shortage(p, n)
    base = [max(0, s - sum(world.req[o][j] for o in must)) for j, s in enumerate(shortage)]
    return len(must) + lower_bound(world, base, [v for v in movable if v not in must])


def _why_no_room(world: _World, p: int, targets: Sequence[int], max_moves: int) -> str:
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
        world = _World.build(snapshot, extra)
    except _Budget as stop:
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

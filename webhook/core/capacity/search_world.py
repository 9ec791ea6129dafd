"""The world a capacity search works on: the snapshot as dense integer vectors, and its meter.

The planner tries millions of moves; each must cost a few list operations, not a walk over
Kubernetes-shaped values. :class:`World` numbers the nodes, the VMs and the resources once,
keeps each node's free capacity and each VM's request as vectors, and moves a VM (or undoes the
move) in place. Every candidate the search weighs is counted by its :class:`Meter` against the
:class:`Bound` the caller gives, which ends the search with :class:`BudgetSpent`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from webhook.core.capacity.plan_limits import DEFAULT_MAX_CANDIDATES
from webhook.core.capacity.snapshot import PODS, VM, AntiAffinity, Node, Placement, Snapshot

__all__ = ["Bound", "BudgetSpent", "Meter", "World", "lower_bound"]

# The deadline hook is asked once per this many candidates (a few milliseconds of work).
CHECK_EVERY: Final = 2048


@dataclass(frozen=True)
class Bound:
    """How much one plan may search: ``candidates`` considered, and ``expired``, a hook the
    caller gives to say time is up (the core reads no clock), asked every few milliseconds."""

    candidates: int = DEFAULT_MAX_CANDIDATES
    expired: Callable[[], bool] | None = None


class BudgetSpent(Exception):
    """The search reached its bound: ``what`` it was, and the ``work`` done by then."""

    def __init__(self, what: str, work: int) -> None:
        super().__init__(what)
        self.what = what
        self.work = work


@dataclass
class Meter:
    """The count of candidates while the world is built (it then carries on in the world)."""

    bound: Bound
    work: int = 0
    next_check: int = CHECK_EVERY

    def spend(self, count: int = 1) -> None:
        """Count ``count`` candidates against the bound; raise :class:`BudgetSpent` past it."""
        self.work += count
        if self.work > self.bound.candidates:
            raise BudgetSpent(f"its bound of {self.bound.candidates} candidates", self.work)
        if self.work >= self.next_check:
            self.next_check = self.work + CHECK_EVERY
            if self.bound.expired is not None and self.bound.expired():
                raise BudgetSpent("the time limit", self.work)


@dataclass
class World:
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
    meter: Meter = field(default_factory=lambda: Meter(Bound()))

    @property
    def work(self) -> int:
        return self.meter.work

    def spend(self, count: int = 1) -> None:
        self.meter.spend(count)

    @classmethod
    def build(
        cls, snapshot: Snapshot, extra: Sequence[VM] = (), *, bound: Bound | None = None
    ) -> World:
        """The dense world; the filtering of nodes per distinct placement (which VMIs choose)
        counts against ``bound`` like any other candidate."""
        meter = Meter(bound or Bound())
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


def lower_bound(world: World, shortage: Sequence[int], candidates: Sequence[int]) -> int:
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

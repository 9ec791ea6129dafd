"""The search for moves that make room: every plan of exactly ``depth`` live migrations.

One :class:`Search` looks for the cheapest (fewest bytes moved) plan of a given number of moves
that reaches its goal (a pending VM placed on a node, or every VM off a node being drained),
goal-directed: a VM is only moved to free room a later step needs, a node is freed by a minimal
set of its VMs (:func:`coverings`), and destinations that fit a VM outright are tried only as
many as a plan of that depth could touch. The planner deepens it one move at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from webhook.core.capacity.search_world import World, lower_bound

__all__ = ["Search", "coverings"]


@dataclass
class Search:
    """A search of ``depth`` moves towards ``goal_node`` (-1 for a drain)."""

    world: World
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
            covering = coverings(w, base, optional, size)
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


def coverings(
    w: World, shortage: Sequence[int], optional: Sequence[int], size: int
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


def _covers(w: World, shortage: Sequence[int], chosen: Sequence[int]) -> bool:
    return all(
        need <= 0 or sum(w.req[o][j] for o in chosen) >= need for j, need in enumerate(shortage)
    )


def _minimal(w: World, shortage: Sequence[int], chosen: Sequence[int]) -> bool:
    return not any(_covers(w, shortage, [o for o in chosen if o != drop]) for drop in chosen)

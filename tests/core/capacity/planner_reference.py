"""An exhaustive reference for the planner: every move sequence, nothing clever."""

from __future__ import annotations

from webhook.core.capacity.snapshot import VM, Node, Snapshot

Gi = 1024**3 * 1000  # milli-units


def _on(state: dict[str, str | None], node: str, snapshot: Snapshot) -> list[VM]:
    return [v for v in snapshot.vms if state[v.key] == node]


def _conflict(a: VM, b: VM) -> bool:
    return any(
        t.matches(b.labels, b.namespace, a.namespace) for t in a.placement.anti_affinity
    ) or any(t.matches(a.labels, a.namespace, b.namespace) for t in b.placement.anti_affinity)


def fits(vm: VM, node: Node, state: dict[str, str | None], snapshot: Snapshot) -> bool:
    if not vm.placement.allows(node):
        return False
    keys = {*node.allocatable, *vm.requests}
    used = dict.fromkeys(keys, 0)
    for pod in snapshot.pods:
        if pod.node == node.name:
            for k in keys:
                used[k] += pod.requests.get(k, 0)
            if any(t.matches(vm.labels, vm.namespace, pod.namespace) for t in pod.anti_affinity):
                return False
            if any(
                t.matches(pod.labels, pod.namespace, vm.namespace)
                for t in vm.placement.anti_affinity
            ):
                return False
    for other in _on(state, node.name, snapshot):
        if other.key == vm.key:
            continue
        if _conflict(vm, other):
            return False
        for k in keys:
            used[k] += other.requests.get(k, 0)
    return all(node.allocatable.get(k, 0) - used[k] >= vm.requests.get(k, 0) for k in keys)


def brute_force(
    snapshot: Snapshot, *, pending: str | None = None, drain: str | None = None, k: int = 3
) -> tuple[int, int] | None:
    """(moves, bytes) of the best plan, or None when none exists within k moves."""
    nodes = {n.name: n for n in snapshot.nodes}
    vms = [v for v in snapshot.vms if v.key != pending]
    target_vm = snapshot.vm(pending) if pending else None

    def goal(state: dict[str, str | None]) -> bool:
        if target_vm is not None:
            return any(fits(target_vm, n, state, snapshot) for n in snapshot.nodes)
        return not any(state[v.key] == drain for v in vms)

    start: dict[str, str | None] = {v.key: v.node for v in snapshot.vms}
    best: tuple[int, int] | None = None

    def search(state: dict[str, str | None], moved: frozenset[str], cost: int) -> None:
        nonlocal best
        if goal(state):
            candidate = (len(moved), cost)
            if best is None or candidate < best:
                best = candidate
            return
        if len(moved) >= k:
            return
        for vm in vms:
            if vm.key in moved or not vm.migratable or state[vm.key] is None:
                continue
            for name, node in nodes.items():
                if name == state[vm.key] or name == drain:
                    continue
                if not fits(vm, node, state, snapshot):
                    continue
                source = state[vm.key]
                state[vm.key] = name
                search(state, moved | {vm.key}, cost + vm.requests.get("memory", 0) // 1000)
                state[vm.key] = source

    search(dict(start), frozenset(), 0)
    return best

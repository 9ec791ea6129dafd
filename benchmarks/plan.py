"""The planner against an exact MILP on a 200-node, 4,000-VM cluster.

Builds one cluster (200 workers of 128Gi, twenty VMs each of 2, 4, 6 or 8Gi guest plus
KubeVirt's overhead, a node-agent pod per node) and three pending VMs sized so that they need
exactly 1, 2 and 3 live migrations: with ``cover(n, k)`` the free memory of node ``n`` plus
its ``k`` largest VMs, a VM just above ``max cover(n, k-1)`` cannot fit after fewer than ``k``
moves, and fits after ``k`` when ``cover(n, k)`` reaches it.

For each, it times :func:`plan_placement` and an exact MILP of the same instance solved with
HiGHS (``x[v,t]`` moves VM ``v`` to node ``t``, ``y[n]`` places the pending VM on ``n``; every
node's final memory, CPU and pod count within allocatable; each VM moves at most once; minimise
``moves * M + MiB moved``, lexicographic since ``M`` exceeds any plan's bytes). The MILP checks
only the final placement, not that each step fits while both copies exist, so its minimum can
only be lower; equal counts mean the sequencing cost nothing here.

Rounds are interleaved (planner, MILP, planner, MILP ...) and the medians printed with their
ratio. Goal: the same minimum, the planner at least 10x faster, and under 1 s for 3 moves.

Run: .venv/bin/pip install -e '.[bench]' && .venv/bin/python -m benchmarks.plan [--rounds N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import highspy
import numpy as np

from webhook.core.capacity.overhead import LauncherShape, memory_overhead
from webhook.core.capacity.planner import plan_placement
from webhook.core.capacity.snapshot import VM, Node, Placement, Pod, Snapshot

NODES = 200
PER_NODE = 20
GIB = 1024**3
MILLI_GIB = GIB * 1000
SIZES = (2, 4, 6, 8)


def cluster(seed: int = 7, nodes_count: int = NODES) -> tuple[Snapshot, dict[str, int]]:
    rng = random.Random(seed)
    nodes = []
    pods = []
    vms = []
    for i in range(nodes_count):
        name = f"worker-{i:03d}"
        allocatable = {"memory": 128 * MILLI_GIB, "cpu": 64_000, "pods": 250_000}
        nodes.append(Node(name, allocatable, {"kubernetes.io/hostname": name}))
        agents = rng.randint(2, 6) * MILLI_GIB
        pods.append(Pod(f"agents-{i}", "kube-system", name, {"memory": agents, "cpu": 900}))
        for j in range(PER_NODE):
            guest = rng.choice(SIZES) * GIB
            vcpus = guest // (2 * GIB)
            memory = guest + memory_overhead(LauncherShape(guest_memory=guest, vcpus=vcpus))
            requests = {"memory": memory * 1000, "cpu": 100 * vcpus, "pods": 1000}
            vms.append(VM(f"tenant-{j % 7}", f"vm-{i:03d}-{j:02d}", name, requests))
    snapshot = Snapshot(tuple(nodes), tuple(pods), tuple(vms))
    return snapshot, pending_sizes(snapshot)


def pending_sizes(snapshot: Snapshot) -> dict[str, int]:
    """Pending VM memory (bytes, launcher request) needing exactly 1, 2 and 3 moves."""
    covers: dict[int, list[int]] = {k: [] for k in range(4)}
    for node in snapshot.nodes:
        used = sum(p.requests.get("memory", 0) for p in snapshot.pods if p.node == node.name)
        mine = sorted(
            (v.requests["memory"] for v in snapshot.vms if v.node == node.name), reverse=True
        )
        free = node.allocatable["memory"] - used - sum(mine)
        for k in range(4):
            covers[k].append((free + sum(mine[:k])) // 1000)
    return {
        f"{k} move{'s' * (k > 1)}": max(covers[k - 1]) + 64 * 1024**2
        for k in (1, 2, 3)
        if max(covers[k - 1]) + 64 * 1024**2 <= max(covers[k])
    }


def with_pending(snapshot: Snapshot, memory: int) -> Snapshot:
    pending = VM(
        "tenant-x",
        "pending",
        None,
        {"memory": memory * 1000, "cpu": 800, "pods": 1000},
        placement=Placement(),
    )
    return Snapshot(snapshot.nodes, snapshot.pods, (*snapshot.vms, pending))


def milp(snapshot: Snapshot, pending_key: str, time_limit: float) -> tuple[int, int, bool]:
    """(moves, MiB moved, proven optimal) of an optimal final placement, by HiGHS."""
    nodes = [n.name for n in snapshot.nodes]
    index = {n: i for i, n in enumerate(nodes)}
    keys = ("memory", "cpu", "pods")
    scale = {"memory": 1000 * 1024**2, "cpu": 1, "pods": 1000}  # MiB, millicores, pods
    pending = next(v for v in snapshot.vms if v.key == pending_key)
    running = [v for v in snapshot.vms if v.node is not None]
    n_nodes, n_vms, n_res = len(nodes), len(running), len(keys)
    used = np.zeros((n_res, n_nodes))
    for pod in snapshot.pods:
        for r, k in enumerate(keys):
            used[r, index[pod.node]] += pod.requests.get(k, 0) / scale[k]
    req = np.array([[v.requests.get(k, 0) / scale[k] for k in keys] for v in running])
    src = np.array([index[str(v.node)] for v in running])
    for r in range(n_res):
        np.add.at(used[r], src, req[:, r])
    alloc = np.array([[n.allocatable.get(k, 0) / scale[k] for n in snapshot.nodes] for k in keys])
    big_m = 100 * float(req[:, 0].max())

    # Rows: one "moves at most once" per VM, one "placed once" for the pending VM, then one
    # capacity row per resource and node (final usage within allocatable).
    cap = n_vms + 1
    vv = np.repeat(np.arange(n_vms), n_nodes)
    tt = np.tile(np.arange(n_nodes), n_vms)
    keep = tt != src[vv]
    vv, tt = vv[keep], tt[keep]
    columns = len(vv)
    rows = [vv]
    vals = [np.ones(columns)]
    for r in range(n_res):
        rows += [cap + r * n_nodes + tt, cap + r * n_nodes + src[vv]]
        vals += [req[vv, r], -req[vv, r]]
    move_rows = np.stack(rows, axis=1).reshape(-1)
    move_vals = np.stack(vals, axis=1).reshape(-1)
    per_move = 1 + 2 * n_res
    preq = np.array([pending.requests.get(k, 0) / scale[k] for k in keys])
    place_rows = np.stack(
        [np.full(n_nodes, n_vms), *(cap + r * n_nodes + np.arange(n_nodes) for r in range(n_res))],
        axis=1,
    ).reshape(-1)
    place_vals = np.tile(np.concatenate([[1.0], preq]), n_nodes)
    per_place = 1 + n_res
    starts = np.concatenate(
        [np.arange(columns) * per_move, columns * per_move + np.arange(n_nodes + 1) * per_place]
    )
    costs = np.concatenate([big_m + req[vv, 0], np.zeros(n_nodes)])
    n_rows = cap + n_res * n_nodes
    row_lower = np.full(n_rows, -highspy.kHighsInf)
    row_lower[n_vms] = 1.0
    row_upper = np.concatenate([np.ones(n_vms + 1), (alloc - used).reshape(-1)])

    model = highspy.HighsModel()
    lp = model.lp_
    lp.num_col_ = columns + n_nodes
    lp.num_row_ = n_rows
    lp.col_cost_ = costs
    lp.col_lower_ = np.zeros(columns + n_nodes)
    lp.col_upper_ = np.ones(columns + n_nodes)
    lp.row_lower_ = row_lower
    lp.row_upper_ = row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts.astype(np.int32)
    lp.a_matrix_.index_ = np.concatenate([move_rows, place_rows]).astype(np.int32)
    lp.a_matrix_.value_ = np.concatenate([move_vals, place_vals])
    lp.integrality_ = [highspy.HighsVarType.kInteger] * (columns + n_nodes)
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("time_limit", time_limit)
    h.passModel(model)
    h.run()
    optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    solution = np.array(h.getSolution().col_value)
    if solution.size == 0 or solution[columns:].sum() < 0.5:
        return -1, -1, optimal  # no feasible placement found within the limit
    moved = solution[:columns] > 0.5
    return int(moved.sum()), round(float(req[vv[moved], 0].sum())), optimal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=NODES, help="20 VMs per node")
    parser.add_argument(
        "--milp-time-limit", type=float, default=300.0, help="seconds per MILP solve"
    )
    args = parser.parse_args()
    base, sizes = cluster(nodes_count=args.nodes)
    print(
        f"cluster: {len(base.nodes)} nodes, {len(base.vms)} VMs; "
        f"{args.rounds} interleaved rounds, medians"
    )
    head = f"{'case':<8} {'pending':>9} {'planner':>10} {'MILP':>10} {'ratio':>7}"
    print(f"{head}  moves planner/MILP (MiB moved)")
    for case, memory in sizes.items():
        snapshot = with_pending(base, memory)
        planner_times, milp_times = [], []
        plan_moves: tuple[int, int] = (-1, -1)
        milp_moves: tuple[int, int, bool] = (-1, -1, False)
        for _ in range(args.rounds):
            start = time.perf_counter()
            plan = plan_placement(snapshot, "tenant-x/pending", max_moves=3)
            planner_times.append(time.perf_counter() - start)
            plan_moves = (
                (len(plan.moves), plan.bytes_moved // 1024**2) if plan.feasible else (-1, -1)
            )
            start = time.perf_counter()
            milp_moves = milp(snapshot, "tenant-x/pending", args.milp_time_limit)
            milp_times.append(time.perf_counter() - start)
        p = statistics.median(planner_times)
        m = statistics.median(milp_times)
        proven = "" if milp_moves[2] else " (MILP stopped at its time limit, not proven optimal)"
        if milp_moves[0] < 0:
            proven = " (MILP found no feasible solution within its time limit)"
        print(
            f"{case:<8} {memory / GIB:>7.2f}Gi {p * 1000:>8.1f}ms {m * 1000:>8.1f}ms {m / p:>6.1f}x"
            f"  {plan_moves[0]}/{milp_moves[0]} ({plan_moves[1]}/{milp_moves[1]}){proven}",
            flush=True,
        )


if __name__ == "__main__":
    main()

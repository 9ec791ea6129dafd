"""``webhook plan``: the fewest live migrations that make room, from a snapshot or the cluster.

Prints the plan as JSON, as ``VirtualMachineInstanceMigration`` objects ready for
``kubectl apply -f -`` (one per step, in order), or as a table for a person. Exit codes follow
the CLI: 0 a plan exists, 1 no plan within the cap or the search's bound (candidates,
seconds; the reason says what was searched), 2 bad input. Its
flags are defined in :mod:`webhook.commands.plan`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from decimal import Decimal
from typing import Final

import yaml

from webhook.capacity.snapshot import load_snapshot, read_cluster
from webhook.core.base.quantities import format_quantity
from webhook.core.capacity.planner import MAX_MOVES_CAP, Bound, Plan, plan_drain, plan_placement
from webhook.core.capacity.snapshot import HOSTNAME, Snapshot, SnapshotError
from webhook.kube.client import ApiError, KubeClient

__all__ = ["migrations", "plan_json", "run"]

PLAN_ANNOTATION: Final = "reservation.cozystack.io/plan-step"


class PlanInputError(SnapshotError):
    """Bad arguments to ``webhook plan``."""


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.max_moves <= MAX_MOVES_CAP:
        raise PlanInputError(f"--max-moves: {args.max_moves} is not between 0 and {MAX_MOVES_CAP}")
    if args.vmi is not None and args.vmi.count("/") != 1:
        raise PlanInputError(f"--for: {args.vmi!r} is not NAMESPACE/NAME")
    if args.max_candidates < 1 or not args.plan_seconds > 0:
        raise PlanInputError("--max-candidates must be at least 1 and --plan-seconds positive")
    snapshot = load_snapshot(args.snapshot) if args.snapshot else _from_cluster(args.kubeconfig)
    deadline = time.monotonic() + args.plan_seconds
    bound = Bound(candidates=args.max_candidates, expired=lambda: time.monotonic() > deadline)
    if args.vmi is not None:
        plan = plan_placement(snapshot, args.vmi, max_moves=args.max_moves, bound=bound)
    else:
        plan = plan_drain(snapshot, args.drain, max_moves=args.max_moves, bound=bound)
    if args.output == "json":
        print(json.dumps(plan_json(plan), indent=2))
    elif args.output == "yaml":
        if plan.feasible:
            print(yaml.safe_dump_all(migrations(plan, snapshot), sort_keys=False), end="")
        else:
            print(f"# no plan: {plan.reason}")
    else:
        print(plan_table(plan, args.vmi or f"drain {args.drain}"))
    return 0 if plan.feasible else 1


def _from_cluster(kubeconfig: str | None) -> Snapshot:
    async def read() -> Snapshot:
        client = KubeClient.from_kubeconfig(kubeconfig)
        try:
            return await read_cluster(client)
        finally:
            await client.close()

    try:
        return asyncio.run(read())
    except ApiError as exc:
        raise SnapshotError(f"reading the cluster: {exc}") from None


def plan_json(plan: Plan) -> dict[str, object]:
    return {
        "feasible": plan.feasible,
        "target": plan.target,
        "moves": [
            {
                "vmi": m.vm,
                "from": m.source,
                "to": m.target,
                "memory": format_quantity(Decimal(m.memory)),
                "cpu": format_quantity(Decimal(m.cpu) / 1000),
            }
            for m in plan.moves
        ],
        "reason": plan.reason,
    }


def migrations(plan: Plan, snapshot: Snapshot) -> list[dict[str, object]]:
    """One ``VirtualMachineInstanceMigration`` per step, pinned to its target by hostname."""
    hostnames = {n.name: n.labels.get(HOSTNAME, n.name) for n in snapshot.nodes}
    result: list[dict[str, object]] = []
    for step, move in enumerate(plan.moves, start=1):
        namespace, name = move.vm.split("/", 1)
        result.append(
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstanceMigration",
                "metadata": {
                    "name": _name(f"make-room-{step}-{name}"),
                    "namespace": namespace,
                    "annotations": {PLAN_ANNOTATION: f"{step}/{len(plan.moves)}"},
                },
                "spec": {
                    "vmiName": name,
                    "addedNodeSelector": {HOSTNAME: hostnames.get(move.target, move.target)},
                },
            }
        )
    return result


def plan_table(plan: Plan, goal: str) -> str:
    if not plan.feasible:
        return f"{goal}: no plan: {plan.reason}"
    count = len(plan.moves)
    moved = format_quantity(Decimal(plan.bytes_moved))
    if plan.target is not None:
        head = f"{goal} fits on {plan.target}"
        head += " now" if not count else f" after {count} live migration{'s' * (count != 1)}"
    else:
        head = f"{goal}: {count} live migration{'s' * (count != 1)}"
    if count:
        head += f" ({moved} moved)"
    lines = [head + ":" if count else head]
    width = max((len(m.vm) for m in plan.moves), default=0)
    for step, m in enumerate(plan.moves, start=1):
        memory = format_quantity(Decimal(m.memory))
        cpu = format_quantity(Decimal(m.cpu) / 1000)
        lines.append(
            f"  {step}. {m.vm:<{width}}  {m.source} -> {m.target}  memory {memory}  cpu {cpu}"
        )
    if count > 1:
        lines.append("  Run the steps in order: each needs the previous one to have completed.")
    return "\n".join(lines)


def _name(text: str) -> str:
    cleaned = re.sub(r"[^a-z0-9.-]", "-", text.lower())[:253].strip("-.")
    return cleaned or "make-room"

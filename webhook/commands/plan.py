"""``webhook plan``'s flags; its code (:mod:`webhook.capacity.plan`, the Kubernetes client) loads to
run."""

from __future__ import annotations

import argparse
from typing import Any

from webhook.core.capacity.plan_limits import (
    DEFAULT_MAX_CANDIDATES,
    DEFAULT_MAX_MOVES,
    DEFAULT_PLAN_SECONDS,
    MAX_MOVES_CAP,
)

__all__ = ["add_parser"]


def add_parser(commands: Any) -> None:
    plan = commands.add_parser(
        "plan", help="the fewest live migrations that place a pending VM or drain a node"
    )
    plan.add_argument(
        "--snapshot",
        metavar="FILE",
        help="`kubectl get nodes,pods,virtualmachineinstances -A -o yaml` output; - is stdin "
        "(default: read the cluster)",
    )
    plan.add_argument("--kubeconfig", metavar="FILE", help="without --snapshot; default kubectl's")
    goal = plan.add_mutually_exclusive_group(required=True)
    goal.add_argument("--for", dest="vmi", metavar="NAMESPACE/VMI", help="a pending VM to place")
    goal.add_argument("--drain", metavar="NODE", help="a node every VM must leave")
    plan.add_argument(
        "--max-moves",
        type=int,
        default=DEFAULT_MAX_MOVES,
        metavar="K",
        help=f"at most K migrations (default {DEFAULT_MAX_MOVES}, at most {MAX_MOVES_CAP})",
    )
    plan.add_argument(
        "--max-candidates",
        type=int,
        default=DEFAULT_MAX_CANDIDATES,
        metavar="N",
        help=f"candidates the search may consider (default {DEFAULT_MAX_CANDIDATES})",
    )
    plan.add_argument(
        "--plan-seconds",
        type=float,
        default=DEFAULT_PLAN_SECONDS,
        metavar="SECONDS",
        help=f"wall-clock limit on the search (default {DEFAULT_PLAN_SECONDS:g})",
    )
    plan.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    plan.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from webhook.capacity.plan import run

    return run(args)

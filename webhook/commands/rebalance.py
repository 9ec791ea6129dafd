"""``webhook rebalance``'s flags; the controller (aiohttp, the Kubernetes client) loads to run."""

from __future__ import annotations

import argparse
from typing import Any

from webhook.core.capacity.plan_limits import (
    DEFAULT_MAX_CANDIDATES,
    DEFAULT_MAX_MOVES,
    DEFAULT_PLAN_SECONDS,
    DEFAULT_PLANNERS,
    DEFAULT_TENANT_GOALS,
    DEFAULT_TENANT_MIGRATIONS,
    DEFAULT_TENANT_PERIOD,
)

__all__ = ["add_parser"]


def add_parser(commands: Any) -> None:
    rebalance = commands.add_parser(
        "rebalance", help="make room for pending VMs and drains with live migrations"
    )
    rebalance.add_argument("--kubeconfig", metavar="FILE", help="default: in-cluster")
    rebalance.add_argument(
        "--apply", action="store_true", help="create migrations (default: dry run, Events only)"
    )
    rebalance.add_argument(
        "--all", dest="all_vms", action="store_true", help="act on every VMI, not only opted-in"
    )
    rebalance.add_argument("--interval", type=float, default=30.0, metavar="SECONDS")
    rebalance.add_argument("--max-moves", type=int, default=DEFAULT_MAX_MOVES, metavar="K")
    rebalance.add_argument("--migration-timeout", type=float, default=900.0, metavar="SECONDS")
    rebalance.add_argument(
        "--max-candidates",
        type=int,
        default=DEFAULT_MAX_CANDIDATES,
        metavar="N",
        help=f"candidates one goal's search may consider (default {DEFAULT_MAX_CANDIDATES})",
    )
    rebalance.add_argument(
        "--plan-seconds",
        type=float,
        default=DEFAULT_PLAN_SECONDS,
        metavar="SECONDS",
        help=f"wall-clock limit on one goal's search (default {DEFAULT_PLAN_SECONDS:g})",
    )
    rebalance.add_argument(
        "--planners",
        type=int,
        default=DEFAULT_PLANNERS,
        metavar="N",
        help=f"goals planned at once, each in a thread (default {DEFAULT_PLANNERS})",
    )
    rebalance.add_argument(
        "--tenant-goals",
        type=int,
        default=DEFAULT_TENANT_GOALS,
        metavar="N",
        help="pending VMs of one tenant planned per round, in rotation "
        f"(default {DEFAULT_TENANT_GOALS})",
    )
    rebalance.add_argument(
        "--tenant-migrations",
        type=int,
        default=DEFAULT_TENANT_MIGRATIONS,
        metavar="N",
        help="migrations one tenant's pending VMs may cause per --tenant-period "
        f"(default {DEFAULT_TENANT_MIGRATIONS})",
    )
    rebalance.add_argument(
        "--tenant-period",
        type=float,
        default=DEFAULT_TENANT_PERIOD,
        metavar="SECONDS",
        help=f"(default {DEFAULT_TENANT_PERIOD:g})",
    )
    rebalance.add_argument(
        "--listen", default="0.0.0.0:8080", metavar="HOST:PORT", help="/metrics and /healthz"
    )
    rebalance.add_argument("--once", action="store_true", help="one round, then exit")
    rebalance.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from webhook.capacity.rebalance import run

    return run(args)

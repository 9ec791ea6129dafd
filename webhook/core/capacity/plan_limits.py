"""How much a plan may take and cost: shared by the planner, the rebalancer and the command lines.

A plan is at most ``MAX_MOVES_CAP`` live migrations. Finding one is bounded twice, since a
pending VM is a tenant's doing and the search is exponential in the worst case: by the
candidates the search considers (every state, destination and set of VMs it weighs, counted in
one budget) and by a wall-clock deadline per goal. The rebalancer also bounds how many
migrations one tenant's pending VMs may cause per period.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_MAX_CANDIDATES",
    "DEFAULT_MAX_MOVES",
    "DEFAULT_PLANNERS",
    "DEFAULT_PLAN_SECONDS",
    "DEFAULT_TENANT_GOALS",
    "DEFAULT_TENANT_MIGRATIONS",
    "DEFAULT_TENANT_PERIOD",
    "MAX_MOVES_CAP",
]

DEFAULT_MAX_MOVES: Final = 3
MAX_MOVES_CAP: Final = 5
# About 2 s of one core on this project's machines (0.5 to 2 us per candidate); the 200-node,
# 4,000-VM benchmark's 3-move plan considers about 10,000.
DEFAULT_MAX_CANDIDATES: Final = 1_000_000
DEFAULT_PLAN_SECONDS: Final = 10.0
# Goals planned at once, each in a worker thread of its own.
DEFAULT_PLANNERS: Final = 2
# Pending VMs of one tenant planned per round (taken in rotation from round to round).
DEFAULT_TENANT_GOALS: Final = 2
# Migrations the pending VMs of one tenant (a top-level tenant with its sub-tenants) may cause
# in one period.
DEFAULT_TENANT_MIGRATIONS: Final = 10
DEFAULT_TENANT_PERIOD: Final = 3600.0

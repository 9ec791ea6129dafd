"""How many live migrations a plan may take: shared by the planner and the command lines."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_MAX_MOVES", "MAX_MOVES_CAP"]

DEFAULT_MAX_MOVES: Final = 3
MAX_MOVES_CAP: Final = 5

"""The admission modes, apart from the decision code, so a command line can offer them cheaply."""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["MODES", "Mode"]

Mode = Literal["enforce", "warn", "off"]
MODES: Final = ("enforce", "warn", "off")

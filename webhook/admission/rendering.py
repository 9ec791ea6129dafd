"""How reports are printed: data with exact quantities, tables with human ones.

Data (``-o json``, ``-o yaml``) carries exact canonical quantities (``13056Mi``), so a script
reads what the webhook computed; tables carry human ones (``12.75Gi``), aligned in columns.
Every report the commands print (pools, charge explanations, the capacity guard) goes through
these, so one quantity reads the same in each.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Final

from webhook.core.base.quantities import parse_quantity

__all__ = ["dump", "human_quantity", "pairs", "table"]

_BINARY: Final = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20))


def dump(data: Any, output: str) -> str:
    """Data as JSON (indented) or YAML, exact quantities as they are."""
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False)).rstrip("\n")
    return json.dumps(data, indent=2)


def human_quantity(text: str) -> str:
    """A canonical quantity for a table: ``13056Mi`` reads ``12.75Gi``, ``7500m`` reads ``7.5``.

    Binary byte quantities are shown in the largest unit they reach, to two decimals at most;
    the exact figure is what JSON and YAML carry.
    """
    if text.endswith("m") and text[:-1].isdigit() and int(text[:-1]) >= 1000:
        return f"{Decimal(text[:-1]).scaleb(-3).normalize():f}"  # 7500m of CPU reads 7.5
    if not text.endswith(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")):
        return text
    value = parse_quantity(text)
    for suffix, unit in _BINARY:
        if value >= unit:
            shown = (value / unit).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
            return f"{shown.normalize():f}{suffix}"
    return text


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` (the first a header) as lines of left-aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def pairs(resources: Mapping[str, str], *, human: bool = False) -> str:
    """``cpu=2,memory=4Gi``: a resource list on one line."""
    return ",".join(f"{k}={human_quantity(v) if human else v}" for k, v in resources.items())

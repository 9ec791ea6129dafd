"""Sizing the pod-level guard: per tenant namespace, will everything admitted be able to run?

For each namespace with a bounded tenant or a ResourceQuota: the guard's hard limits (the
tightest quota per key, or ``tenant-quota`` as the chart would render it from the budget when no
quota was observed), what the admitted applications' pods will request, the smallest factor on
``resourceQuotas`` that lets all of them start, and the factor a target mix of VM sizes needs.
Namespaces whose admitted applications cannot all run come first.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Final

from webhook.admission.rendering import dump, human_quantity
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.errors import QuantityError
from webhook.core.base.quantities import format_quantity, parse_quantity
from webhook.core.capacity.guard import (
    COUNTS_NOTE,
    QuotaBook,
    factor_for_mix,
    is_object_count,
    namespace_need,
    render_tenant_quota,
    smallest_factor,
)

__all__ = ["build_guard_report", "parse_mixes", "print_guard_report", "render_guard_report"]

EXIT_SHORT: Final = 1


def build_guard_report(
    state: ReservationState,
    quotas: QuotaBook,
    mixes: Iterable[Decimal] = (),
    *,
    namespace: str = "",
) -> dict[str, Any]:
    """The guard report as data (the ``-o json`` shape); with ``namespace``, that namespace
    and the tenant namespaces below it."""
    mixes = list(mixes)
    namespaces = {node.namespace for node in state.tree.nodes() if node.budget}
    namespaces.update(quotas.namespaces())
    if namespace:
        namespaces &= _subtree(state, namespace)
    rows = []
    for row_namespace in sorted(namespaces):
        node = state.tree.get(row_namespace)
        budget = dict(node.budget) if node is not None else {}
        observed = quotas.quotas(row_namespace)
        hard: dict[str, Decimal] = {}
        binding: dict[str, str] = {}
        if observed:
            for quota in observed:
                for key, value in quota.hard.items():
                    if key not in hard or value < hard[key]:
                        hard[key], binding[key] = value, quota.name
            source = "observed"
        else:
            hard = render_tenant_quota(budget)
            source = "rendered"
        need_total, unknown = namespace_need(
            (key, record.resources if record else None)
            for key, record in state.records_in(row_namespace)
        )
        counts = sorted(key for key in hard if is_object_count(key))
        hard = {key: value for key, value in hard.items() if key not in counts}
        short = {
            key: need_total[key] - hard[key]
            for key in sorted(need_total)
            if key in hard and need_total[key] > hard[key]
        }
        row: dict[str, Any] = {
            "namespace": row_namespace,
            "guard": source,
            "hard": rl.to_strings({k: v for k, v in hard.items() if k.startswith("requests.")}),
            "need": rl.to_strings(need_total),
            "short": rl.to_strings(short),
            "tightest": {key: binding[key] for key in short if key in binding},
            "unknown": [f"{kind}/{name}" for kind, _, name in unknown],
            # Object counts the guard leaves to the reservation (never pod requests).
            "counts": counts,
            "smallestFactor": str(smallest_factor(budget, need_total)) if budget else None,
            "mixFactors": {
                format_quantity(size): str(factor_for_mix(budget.get("memory", Decimal(0)), size))
                for size in mixes
            }
            if budget.get("memory")
            else {},
        }
        rows.append(row)
    rows.sort(key=lambda row: (not row["short"], row["namespace"]))
    report: dict[str, Any] = {"namespaces": rows}
    if any(row["counts"] for row in rows):
        report["note"] = COUNTS_NOTE
    return report


def _subtree(state: ReservationState, namespace: str) -> set[str]:
    """``namespace`` and every tenant namespace below it."""
    found = {namespace}
    node = state.tree.get(namespace)
    stack = [node] if node is not None else []
    while stack:
        current = stack.pop()
        for child in current.children.values():
            found.add(child.namespace)
            stack.append(child)
    return found


def parse_mixes(sizes: Iterable[str]) -> list[Decimal]:
    """``--mix`` sizes as quantities; a bad one is a :class:`ReservationError` naming it."""
    mixes = []
    for size in sizes:
        try:
            mixes.append(parse_quantity(size))
        except QuantityError as exc:
            raise QuantityError(f"--mix {size!r}: {exc}") from None
    return mixes


def print_guard_report(report: dict[str, Any], output: str, *, fail_on_short: bool) -> int:
    """Print the report as asked; the exit status (1 when asked to fail on a short namespace)."""
    print(dump(report, output) if output in ("json", "yaml") else render_guard_report(report))
    short = [row["namespace"] for row in report["namespaces"] if row["short"]]
    if fail_on_short and short:
        print(f"guard: --fail-on short: {', '.join(short)}", file=sys.stderr)
        return EXIT_SHORT
    return 0


def render_guard_report(report: dict[str, Any]) -> str:
    header = ("NAMESPACE", "GUARD", "HARD", "NEED", "SHORT", "FACTOR", "MIX FACTORS", "UNKNOWN")
    rows: list[tuple[str, ...]] = [header]
    for row in report["namespaces"]:
        rows.append(
            (
                row["namespace"],
                row["guard"],
                _pairs(row["hard"]) or "-",
                _pairs(row["need"]) or "-",
                _pairs(row["short"]) or "-",
                row["smallestFactor"] or "-",
                _pairs(row["mixFactors"]) or "-",
                ",".join(row["unknown"]) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    table = "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip()
        for r in rows
    )
    return f"{table}\n\nNote: {report['note']}" if report.get("note") else table


def _pairs(values: dict[str, str]) -> str:
    return ",".join(f"{key}={human_quantity(value)}" for key, value in values.items())

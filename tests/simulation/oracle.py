"""What the pools hold, recomputed from the API server's stored objects alone.

This is the judge of a simulation, so it shares nothing with the replicas' incremental
bookkeeping: per bounded tenant and budget key, the charges of the stored applications whose
nearest tenant bounding that key it is, plus the budgets of the bounded sub-tenants beneath it
(carve-outs). A ``Thing`` charges exactly the quantities its spec names.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from webhook.core.quantities import parse_quantity
from webhook.core.tenants import owned_namespace, parent_namespace

Obj = dict[str, Any]
Figures = dict[tuple[str, str], tuple[Decimal, Decimal]]  # (pool, key) -> (usage, budget)


def budgets(objects: Mapping[tuple[str, str, str], Obj]) -> dict[str, dict[str, Decimal]]:
    """Owned namespace -> budget, for every stored Tenant with one."""
    found: dict[str, dict[str, Decimal]] = {}
    for (plural, namespace, name), obj in sorted(objects.items()):
        if plural != "tenants":
            continue
        quotas = (obj.get("spec") or {}).get("resourceQuotas") or {}
        budget = {str(k): parse_quantity(v) for k, v in quotas.items()}
        if budget:
            found[owned_namespace(namespace, name)] = budget
    return found


def pools(objects: Mapping[tuple[str, str, str], Obj]) -> Figures:
    """Usage and budget of every (pool, key) the stored Tenants bound."""
    bounded = budgets(objects)

    def bounder(namespace: str, key: str) -> str | None:
        while namespace:
            if key in bounded.get(namespace, {}):
                return namespace
            namespace = parent_namespace(namespace)
        return None

    figures: Figures = {
        (pool, key): (Decimal(0), value)
        for pool, budget in sorted(bounded.items())
        for key, value in sorted(budget.items())
    }

    def add(pool: str | None, key: str, value: Decimal) -> None:
        if pool is not None and (pool, key) in figures:
            usage, budget = figures[(pool, key)]
            figures[(pool, key)] = (usage + value, budget)

    for (plural, namespace, _), obj in sorted(objects.items()):
        if plural == "things":
            for key, raw in sorted((obj.get("spec") or {}).items()):
                add(bounder(namespace, key), key, parse_quantity(raw))
    for child, budget in sorted(bounded.items()):
        parent = parent_namespace(child)
        for key, value in sorted(budget.items()):
            add(bounder(parent, key) if parent else None, key, value)
    return figures


def overshoots(before: Figures, after: Figures) -> dict[tuple[str, str], str]:
    """Every (pool, key) that a step pushed past its budget, with the figures.

    Usage above the budget is allowed only where the step did not raise it: a budget lowered
    below what is used stays overcommitted, but nothing new may be admitted into that pool.
    """
    found = {}
    for (pool, key), (usage, budget) in sorted(after.items()):
        previous = before.get((pool, key), (Decimal(0), budget))[0]
        if usage > budget and usage > previous:
            found[(pool, key)] = f"{pool} {key}: {usage} used of {budget} (was {previous})"
    return found


def lowered(before: Figures, after: Figures) -> list[tuple[str, str]]:
    """The (pool, key) whose budget a step lowered."""
    return [k for k, (_, budget) in sorted(after.items()) if k in before and budget < before[k][1]]

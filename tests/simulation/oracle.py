"""What the pools hold, recomputed from the API server's stored objects alone.

This is the judge of a simulation, so it shares nothing with the replicas' incremental
bookkeeping: per bounded tenant and budget key, the charges of the stored applications whose
nearest tenant bounding that key it is, plus what each bounded sub-tenant beneath it occupies
(a carve-out: the larger of its budget and its subtree's usage, so lowering a budget frees
nothing still used). A ``Thing`` charges exactly the quantities its spec names, and 1 of
``count/things.apps.cozystack.io``.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from webhook.core.base.quantities import parse_quantity
from webhook.core.tenancy.tenants import owned_namespace, parent_namespace

Obj = dict[str, Any]
THINGS = "count/things.apps.cozystack.io"
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

    direct: dict[tuple[str, str], Decimal] = {}
    for (plural, namespace, _), obj in sorted(objects.items()):
        if plural == "things":
            charge = [(k, parse_quantity(v)) for k, v in sorted((obj.get("spec") or {}).items())]
            for key, value in [*charge, (THINGS, Decimal(1))]:  # and 1 of the things' count
                pool = bounder(namespace, key)
                if pool is not None:
                    direct[(pool, key)] = direct.get((pool, key), Decimal(0)) + value
    carve_outs: dict[tuple[str, str], list[str]] = {}
    for child, budget in sorted(bounded.items()):
        for key in sorted(budget):
            parent = bounder(parent_namespace(child), key) if parent_namespace(child) else None
            if parent is not None:
                carve_outs.setdefault((parent, key), []).append(child)

    def usage(pool: str, key: str) -> Decimal:
        # A sub-tenant occupies the larger of its budget and what its subtree uses.
        total = direct.get((pool, key), Decimal(0))
        for child in carve_outs.get((pool, key), []):
            total += max(bounded[child][key], usage(child, key))
        return total

    return {
        (pool, key): (usage(pool, key), value)
        for pool, budget in sorted(bounded.items())
        for key, value in sorted(budget.items())
    }


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

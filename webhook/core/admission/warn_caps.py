"""Which writes are capped carve-outs, and the cap each gets: one answer for every path.

A sub-Tenant admitted only because Tenant is in ``warn``, beyond what fits, counts in the pools
above it no more than before the write (:mod:`webhook.core.admission.carveouts`). The live ledger
records that cap in the pool's ``status.capped`` before it answers; where the process is the
only store (``webhook review``, a server on manifest directories) the state records it. Both ask
here which write it is for, what it counts and what the tenant is told, so an offline sequence
of writes answers as the cluster would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from webhook.core.admission.carveouts import Cap, capped, kept_budget, overshoot
from webhook.core.admission.decisions import WARNING_LIMIT, Decision
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.errors import UNEVALUABLE
from webhook.core.tenancy.tenants import TENANT_KIND, owned_namespace, parse_budget

__all__ = ["WarnCap", "explain_cap", "over_in_warn", "warn_cap", "with_cap_warning"]


@dataclass(frozen=True, slots=True)
class WarnCap:
    """The cap of the Tenant owning ``owned``, listed by the pool ``pool``."""

    pool: str
    owned: str
    cap: Cap


def over_in_warn(request: AdmissionRequest, decision: Decision) -> bool:
    """A Tenant write allowed only because Tenant is in warn, over its parent's budget."""
    return (
        request.kind == TENANT_KIND
        and decision.outcome == "warned"
        and decision.reason == "exceeded"
        and not request.dry_run
    )


def warn_cap(
    request: AdmissionRequest, decision: Decision, state: ReservationState
) -> WarnCap | None:
    """The cap ``request`` gets, decided ``decision`` against ``state`` (as it stood before
    the write): ``None`` for a write that is not a capped carve-out, or whose quota does not
    parse, or that has no pool above it."""
    if not over_in_warn(request, decision):
        return None
    declared = _declared_budget(request.object, state)
    pool_node = state.tree.pool_root(request.namespace)
    if declared is None or pool_node is None:
        return None
    old = _declared_budget(request.old_object, state) if request.operation == "UPDATE" else None
    owned = owned_namespace(request.namespace, request.name)
    cap = capped(declared, kept_budget(state.tree, owned, declared, old))
    return WarnCap(pool_node.namespace, owned, cap)


def with_cap_warning(warned: Decision, found: WarnCap) -> Decision:
    """The warned answer, saying what the pool counts for the quota instead."""
    cap = found.cap
    over = overshoot(cap)
    if not over:
        return warned
    counted = rl.format_resources(cap.counted, sorted(over)) or "nothing"
    note = (
        f"not reserved: pool {found.pool} counts this quota as {counted} (what it had before) "
        f"and its subtree may use no more until the quota fits ({rl.format_resources(over)} over)"
    )
    return replace(warned, warnings=(*warned.warnings, note[:WARNING_LIMIT]))


def explain_cap(decision: Decision, state: ReservationState) -> Decision:
    """Say so when the pool that refused is a carve-out counted below its declared quota."""
    cap = state.capped().get(decision.pool)
    if cap is None:
        return decision
    message = (
        f"{decision.message} (its quota, {rl.format_resources(cap.declared)}, was admitted "
        f"in warn mode beyond what fits above it: it counts "
        f"{rl.format_resources(cap.counted, cap.declared) or 'nothing'} until it fits)"
    )
    return replace(decision, message=message, audit={**decision.audit, "message": message})


def _declared_budget(
    obj: Mapping[str, Any] | None, state: ReservationState
) -> dict[str, Decimal] | None:
    """The quota a Tenant object declares (``None``: none given, or it does not parse)."""
    if obj is None:
        return None
    kind = state.platform.kind(TENANT_KIND)
    spec = obj.get("spec")
    try:
        values = kind.defaulted(spec) if kind is not None else spec
        return parse_budget(values)
    except UNEVALUABLE:
        return None

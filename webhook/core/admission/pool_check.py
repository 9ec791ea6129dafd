"""Stage 4 of the admission decision: does the write fit every pool it changes?

An application is charged its reserved size on CREATE and the per-key difference from the old
charge :mod:`webhook.core.admission.resolve` believes on UPDATE; a CREATE also adds one to its
kind's count key. A Tenant's declared budget is a carve-out in its parent's pool, occupying
``max(budget, usage)`` per key, so setting, raising or removing it changes what the subtree
reserves there (:func:`tenant_change`); its budget keys must be ones a ResourceQuota takes
(:func:`budget_key_refusal`). Only increases are checked, each against the nearest tenant whose
budget limits that key, in one walk up the tree (:func:`check`), as HNC's hierarchical quota
does; a decrease always passes, even in an overcommitted pool. An application whose size is
unknown blocks only the keys it could hold, and only in its own pool. When the platform changes
a factor, the re-priced object (or subtree) is never refused for the pool: it is reported
overcommitted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from decimal import Decimal

from webhook.core.admission.answers import (
    BAD_BUDGET_KEY,
    Admitted,
    Decision,
    Facts,
    fit,
    invalid,
    quota_allowed,
    quota_denied,
)
from webhook.core.admission.factors import Factored
from webhook.core.admission.modes import Mode
from webhook.core.admission.pools import Node
from webhook.core.admission.price import Priced
from webhook.core.admission.resolve import Subject, old_charge
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.errors import UNEVALUABLE, EvaluationError, QuantityError
from webhook.core.base.quantities import format_quantity, parse_quantity
from webhook.core.tenancy.applications import AppKey, Application
from webhook.core.tenancy.counts import check_budget_keys, is_count_key
from webhook.core.tenancy.tenants import TENANT_KIND, TENANT_NAME, owned_namespace, parse_budget

__all__ = ["ModeFor", "budget_key_refusal", "check", "check_pools", "quota_facts", "tenant_change"]

_ZERO = Decimal(0)

ModeFor = Callable[[str], Mode]


def check_pools(
    subject: Subject, priced: Priced, factored: Factored, mode_for: ModeFor
) -> Decision:
    """The decision on the change this write makes to each pool (``mode_for`` says which kinds
    an unknown application blocks: those enforced)."""
    request, state, app = subject.request, subject.state, subject.app
    known = quota_facts(subject, priced, factored)
    contribution = dict(known.delta)
    # A CREATE also adds the application itself: 1 of its kind's count key. Its charge and
    # record stay sizes only (an UPDATE neither adds nor removes an application).
    counted = state.platform.count_of(app.key) if request.operation == "CREATE" else {}
    if request.kind == TENANT_KIND:
        tenant = tenant_change(request, state, app, known)
        if isinstance(tenant, Decision):
            return tenant
        contribution, extra_warnings, budget = tenant
        known.warnings.extend(extra_warnings)
        known.expected = budget
        if factored.changed:
            owned = owned_namespace(request.namespace, app.name)
            repriced = state.repricing(owned, factored.own)
            if any(v > 0 for v in repriced.values()):
                inner = check(owned, repriced, state, known, mode_for)
                if not inner.allowed:
                    known.warnings.append(f"re-priced at the new factor: {inner.message}")
    if counted:
        contribution = rl.add(contribution, counted)
    decision = check(request.namespace, contribution, state, known, mode_for)
    nothing_added = decision.allowed and not decision.charged_pools and decision.pool
    stores = known.expected if request.kind == TENANT_KIND else known.charge  # a quota: counted
    if nothing_added and stores:
        # Held with nothing to add, at its charge: a shrink or a label may still be stored
        # after a later write (no resourceVersion precondition behind cozystack-api), so the
        # pool keeps counting what it would store until it is observed or expires; a Tenant's
        # quota as much as an application's size. It is written into the nearest pool bounding
        # each key of its charge (where its floor is counted, and whose ledger a decision there
        # rereads), not just the nearest pool.
        holders = _bounding(request.namespace, stores, state) or {decision.pool}
        decision = replace(decision, charged_pools={pool: {} for pool in sorted(holders)})
    refused_for_pool = decision.reason in ("exceeded", "unknown-usage")
    if factored.changed and not decision.allowed and refused_for_pool:
        # The platform changed a factor: never refused for the pool, reported overcommitted.
        message = decision.message
        decision = quota_allowed(known, decision.pool, decision.reserved_after, decision.budget, {})
        decision = replace(
            decision,
            warnings=(fit(f"overcommitted at the new factor: {message}"), *decision.warnings),
        )
    return decision


def quota_facts(subject: Subject, priced: Priced, factored: Factored) -> Facts:
    """What every quota decision on this write reports: the charge at its factor, the delta
    from the old charge, and the application as the state will hold it once stored."""
    request, app = subject.request, subject.app
    old: Mapping[str, Decimal] = {}
    if request.operation == "UPDATE":
        # Never less than the floor its recent updates hold: the pool counts it at least that
        # much until they can no longer be stored (:mod:`webhook.core.admission.floors`). A
        # Tenant's floor is a quota, credited against its carve-out (:func:`tenant_change`).
        floor = subject.state.pending.floor(app.key) if request.kind != TENANT_KIND else {}
        old = rl.maximum(old_charge(subject), floor) if floor else old_charge(subject)
    reserved = factored.at.reserved
    delta = {k: v for k, v in rl.subtract(reserved, old).items() if v != 0}
    uid = subject.uid or app.uid
    admitted = Admitted(  # its record signed only when read: the answer never returns it
        lambda: Application(
            app.kind, app.namespace, app.name, app.spec, factored.record, app.overcommit, uid=uid
        )
    )
    declared = priced.charge.resources
    known = Facts(
        kind=request.kind,
        charge=reserved,
        delta=delta,
        digest=priced.charge.digest,
        admitted=admitted,
        committed=declared if reserved != declared else None,
        factor=factored.at.label,
    )
    known.warnings.extend(priced.warnings)
    return known


def _bounding(namespace: str, charge: Mapping[str, Decimal], state: ReservationState) -> set[str]:
    """The nearest pool above ``namespace`` that bounds each key of ``charge``."""
    bounders = (state.tree.bounder(namespace, key) for key in charge)
    return {node.namespace for node in bounders if node is not None}


def check(
    namespace: str,
    change: Mapping[str, Decimal],
    state: ReservationState,
    facts: Facts,
    mode_for: ModeFor,
) -> Decision:
    """Check the positive part of ``change`` against each key's nearest bounded tenant."""
    increases = rl.positive_part(change)
    pools: dict[str, Node] = {}  # key -> nearest tenant whose budget limits it
    pool_root: Node | None = None
    for node in state.tree.chain(namespace):  # one walk up the tree: O(depth x keys)
        if node.budget and pool_root is None:
            pool_root = node
        for key in node.budget:
            pools.setdefault(key, node)
    pool_name = pool_root.namespace if pool_root is not None else ""
    budget = {key: node.budget[key] for key, node in pools.items()}
    after = {
        key: node.usage.get(key, _ZERO) + change.get(key, _ZERO) for key, node in pools.items()
    }
    exceeded: dict[str, list[str]] = {}
    for key in sorted(increases):
        if key in pools and after[key] > budget[key]:
            exceeded.setdefault(pools[key].namespace, []).append(key)
    if exceeded:
        parts = []
        for pool_ns, keys in exceeded.items():
            node = pools[keys[0]]
            via = f" (via {namespace})" if namespace != pool_ns else ""
            parts.append(
                f"exceeded tenant quota: pool {pool_ns}{via}, "
                f"requested: {rl.format_resources(increases, keys)}, "
                f"used: {rl.format_resources(node.usage, keys)}, "
                f"limited: {rl.format_resources(node.budget, keys)}"
            )
        return quota_denied("; ".join(parts), facts, pool_name, after, budget)
    if state.unknown():
        for key in sorted(increases):
            if is_count_key(key):
                continue  # an unknown application's size is unknown, never its existence
            holder = pools[key].namespace if key in pools else ""
            blockers = [
                k
                for k in (state.unknown_in_pool(holder, key) if holder else [])
                if mode_for(k[0]) == "enforce"  # warn and off admit it knowingly
            ]
            if blockers:
                message = _unknown_message(holder, blockers, state.unknown())
                return quota_denied(
                    message, facts, pool_name, after, budget, reason="unknown-usage"
                )
    charged: dict[str, dict[str, Decimal]] = {}
    for key, value in increases.items():
        if key in pools:
            charged.setdefault(pools[key].namespace, {})[key] = value
    return quota_allowed(facts, pool_name, after, budget, charged)


def _unknown_message(pool: str, blockers: list[AppKey], reasons: Mapping[AppKey, str]) -> str:
    """A denial that names each unknown application, why, and what to do about it."""
    kind, namespace, name = blockers[0]
    reason = reasons.get(blockers[0], "")[:120]
    more = f" (and {len(blockers) - 1} more; see `webhook report`)" if len(blockers) > 1 else ""
    return (
        f"tenant quota: pool {pool} cannot grant more while the reservation of "
        f"{kind} {namespace}/{name} is unknown{more}: it cannot be evaluated ({reason}) and "
        f"has no recorded charge; fix its spec so it evaluates, or delete it"
    )


def tenant_change(
    request: AdmissionRequest, state: ReservationState, app: Application, facts: Facts
) -> tuple[dict[str, Decimal], list[str], dict[str, Decimal]] | Decision:
    """How a Tenant write changes its parent pool, and warnings about its own budget."""
    if not TENANT_NAME.fullmatch(app.name):
        return invalid("metadata.name", f"Tenant name {app.name!r} must match ^[a-z][a-z0-9]*$")
    kind = state.platform.kind(TENANT_KIND)
    try:
        values = kind.defaulted(app.spec) if kind is not None else app.spec
        budget = parse_budget(values)
    except EvaluationError as exc:
        return invalid(f"spec.{exc.path}", f"Tenant: {exc.message}")
    except UNEVALUABLE as exc:
        return invalid("spec", f"Tenant: the values cannot be evaluated ({type(exc).__name__})")
    refused = _key_refusal(request, state, budget)
    if refused is not None:
        return refused
    owned = owned_namespace(request.namespace, app.name)
    node = state.tree.get(owned)
    change: dict[str, Decimal] = dict(facts.delta)
    warnings: list[str] = []
    counted = state.counted_budget(owned, budget)  # below it: capped in warn (carveouts)
    if node is not None:
        # What the parent counts for it: its carve-out, and what a floor of its recent updates
        # adds above it (a quota they may still write back).
        carved = rl.subtract(state.tree.budget_change(node, counted), state.pending.topup(app.key))
        change = rl.add(change, carved)
        for key in sorted(budget):
            used = node.usage.get(key, _ZERO)
            if used > budget[key]:
                warnings.append(
                    f"{owned} already reserves {key}={format_quantity(used)}, over its new quota "
                    f"{format_quantity(budget[key])}: overcommitted until it shrinks"
                )
    else:
        change = rl.add(change, counted)
    return {k: v for k, v in change.items() if v != 0}, warnings, counted


def budget_key_refusal(request: AdmissionRequest, state: ReservationState) -> Decision | None:
    """The refusal of the keys in the object's ``spec.resourceQuotas`` as written, if any; a
    value that is no quantity is left to the budget's own refusal."""
    spec = request.object.get("spec") if request.object is not None else None
    quotas = spec.get("resourceQuotas") if isinstance(spec, Mapping) else None
    if not isinstance(quotas, Mapping):
        return None
    budget: dict[str, Decimal] = {}
    for key, raw in quotas.items():
        try:
            budget[str(key)] = parse_quantity(raw)
        except QuantityError:
            budget[str(key)] = _ZERO
    return _key_refusal(request, state, budget)


def _key_refusal(
    request: AdmissionRequest, state: ReservationState, budget: Mapping[str, Decimal]
) -> Decision | None:
    """The 422 for a budget whose keys :func:`check_budget_keys` refuses, or ``None``."""
    try:
        check_budget_keys(budget, state.platform.plurals(), kept=_old_budget_keys(request))
    except EvaluationError as exc:
        refused = invalid(f"spec.{exc.path}", f"Tenant: {exc.message}")
        return replace(refused, reason=BAD_BUDGET_KEY)
    return None


def _old_budget_keys(request: AdmissionRequest) -> list[str]:
    """The budget keys the stored Tenant already has (an UPDATE's old object): they entered
    before the key rules and do not make its next write fail."""
    if request.operation != "UPDATE" or request.old_object is None:
        return []
    spec = request.old_object.get("spec")
    quotas = spec.get("resourceQuotas") if isinstance(spec, Mapping) else None
    return [str(key) for key in quotas] if isinstance(quotas, Mapping) else []

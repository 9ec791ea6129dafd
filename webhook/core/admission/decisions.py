"""The admission decision: ``decide(request, state, policy) -> Decision``, pure.

Every request starts as a denial until it is shown to fit (Kubernetes' ResourceQuota admission
does the same). An application is charged its evaluated size on CREATE and the per-key
difference from its old charge on UPDATE; only increases are checked, each against the nearest
tenant whose budget limits that key, so a decrease always passes, even in an overcommitted pool.
A Tenant's declared budget is a carve-out in its parent's pool, occupying ``max(budget, usage)``
per key: setting, raising or removing it changes what the subtree reserves there, and increases
are checked the same way; lowering it below usage is allowed (with a warning) but frees nothing.
An overcommit factor (:mod:`webhook.core.tenancy.overcommit`) divides what is reserved; only the
platform may set, change or remove one, within bounds and steps, and a change re-prices the
object (or every application under a Tenant) through the same check, allowed with a warning
when it leaves a pool over budget.
The object under admission fails closed: unknown kind, no contract, values that cannot be
evaluated, a state that is not synced.

Decisions are values built by the named constructors at the bottom; the HTTP layer only
serialises them (:meth:`Decision.response`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Final

from webhook.core.admission.modes import MODES, Mode
from webhook.core.admission.pools import Node
from webhook.core.admission.reviews import AdmissionRequest, Response
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.errors import UNEVALUABLE, EvaluationError, QuantityError
from webhook.core.base.quantities import format_quantity, parse_quantity
from webhook.core.pricing.evaluation import Charge
from webhook.core.pricing.kinds import APPS_GROUP
from webhook.core.pricing.platform import Values
from webhook.core.pricing.unknown_keys import unknown_key_warnings
from webhook.core.pricing.volumes import RELEASED, Held, hold
from webhook.core.tenancy.applications import (
    CHARGE_ANNOTATION,
    AppKey,
    Application,
    application_from_object,
)
from webhook.core.tenancy.counts import check_budget_keys, is_count_key
from webhook.core.tenancy.overcommit import (
    OVERCOMMIT_ANNOTATION,
    OvercommitError,
    OvercommitRules,
    apply_factors,
    format_factors,
    parse_factors,
)
from webhook.core.tenancy.records import (
    RecordedCharge,
    believed,
    parse_recorded_charge,
    record_annotation,
    sign,
    verifies,
)
from webhook.core.tenancy.tenants import TENANT_KIND, TENANT_NAME, owned_namespace, parse_budget

Factors = dict[str, Decimal]

__all__ = [
    "DRY_RUN_NOTE",
    "MODES",
    "Decision",
    "Mode",
    "Policy",
    "decide",
    "errored",
    "held_dry_run",
    "mutate",
]


# The API server truncates warnings over 256 characters and drops them past 4096 in total
# (k8s.io/apiserver/pkg/warning); we aim for 120 so kubectl prints each on one line.
WARNING_TARGET: Final = 120
DRY_RUN_NOTE: Final = "dry run: nothing was reserved"
WARNING_LIMIT: Final = 256
# A Tenant budget key Kubernetes would refuse in a ResourceQuota, or a count nothing counts:
# refused in warn mode too, since admitting it protects nobody (the chart's ResourceQuota fails
# to apply, or the budget silently does not hold) and every key is work and a metric label.
BAD_BUDGET_KEY: Final = "invalid-budget-key"
_ZERO = Decimal(0)


@dataclass(frozen=True)
class Policy:
    """How strictly to apply decisions, globally and per kind (the rollout switch)."""

    mode: Mode = "enforce"
    per_kind: Mapping[str, Mode] = field(default_factory=dict)
    overcommit: OvercommitRules = field(default_factory=OvercommitRules)

    def mode_for(self, kind: str) -> Mode:
        return self.per_kind.get(kind, self.mode)


@dataclass(frozen=True)
class Decision:
    """The answer to one admission request, with every fact worth reporting."""

    allowed: bool
    outcome: str  # allowed | denied | warned | skipped | error: the metrics label
    reason: str = ""  # a short machine reason: fits, exceeded, invalid, no-contract, ...
    code: int = 200
    status_reason: str = ""  # Kubernetes StatusReason: Forbidden, Invalid, ...
    message: str = ""
    causes: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    audit: Mapping[str, str] = field(default_factory=dict)
    mode: Mode = "enforce"
    kind: str = ""
    pool: str = ""
    charge: Mapping[str, Decimal] | None = None
    committed: Mapping[str, Decimal] | None = None  # declared, when a factor discounts it
    factor: str = ""  # the factor applied and where it came from, e.g. "memory=1.2 (tenant-a)"
    delta: Mapping[str, Decimal] | None = None
    reserved_after: Mapping[str, Decimal] = field(default_factory=dict)
    budget: Mapping[str, Decimal] = field(default_factory=dict)
    digest: str = ""
    admitted: Application | None = None  # what the state holds once the object is stored
    patch: tuple[Mapping[str, object], ...] = ()  # JSONPatch operations (mutating side)
    # For the ledger: the increases this request adds to each pool (by pool namespace), and
    # what the stored object will show once observed (its charge; a Tenant's budget).
    charged_pools: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)
    expected: Mapping[str, Decimal] | None = None

    def response(self) -> Response:
        """The AdmissionResponse body (without the uid, added by ``review_response``)."""
        body: Response = {"allowed": self.allowed}
        if not self.allowed:
            body["status"] = {
                "code": self.code,
                "reason": self.status_reason,
                "message": self.message,
            }
            if self.causes:
                body["status"]["details"] = {
                    "causes": [
                        {"field": f, "message": m, "reason": "FieldValueInvalid"}
                        for f, m in self.causes
                    ]
                }
        if self.warnings:
            body["warnings"] = list(self.warnings)
        if self.audit:
            body["auditAnnotations"] = dict(self.audit)
        if self.patch:
            body["patchType"] = "JSONPatch"
            body["patch"] = base64.b64encode(json.dumps(list(self.patch)).encode()).decode()
        return body


def decide(request: AdmissionRequest, state: ReservationState, policy: Policy) -> Decision:
    """Decide one request against ``state``; never raises for a well-formed request."""
    if request.operation in ("DELETE", "CONNECT"):
        return skipped(f"{request.operation} needs no reservation")
    if request.group != APPS_GROUP:
        return errored(
            403,
            "Forbidden",
            "not-an-application",
            f"{request.group or 'core'}/{request.kind} is not an {APPS_GROUP} application",
        )
    malformed = _namespace_problem(request)
    if malformed:  # refused in every mode: there is no namespace to charge
        return _apply_mode(
            "enforce", errored(400, "BadRequest", "bad-namespace", malformed), request
        )
    mode = policy.mode_for(request.kind)
    if mode == "off":
        return skipped(f"reservation is off for {request.kind}", mode="off", kind=request.kind)
    if _unchanged(request):
        # The shipped matchConditions send a label-only update of a decided object here too;
        # nothing the reservation reads changed, so it is not refused for a pool's sake.
        return skipped("nothing the reservation reads changed", mode=mode, kind=request.kind)
    if not state.synced:
        return _apply_mode(
            mode,
            errored(
                503,
                "ServiceUnavailable",
                "not-synced",
                "tenant reservations: state not synced yet; try again shortly",
            ),
            request,
        )
    unavailable = state.kind_unavailable(request.kind)
    if unavailable:
        return _apply_mode(
            mode,
            errored(
                503,
                "ServiceUnavailable",
                "kind-not-synced",
                f"tenant reservations: {request.kind} applications {unavailable}; writes of "
                "this kind are denied until they can be listed",
            ),
            request,
        )
    unseen = state.unseen_tenant(request.namespace)
    if unseen:
        # Behind cozystack-api the watches lag: a namespace whose Tenant was just created would
        # otherwise be charged to an ancestor's pool, or to none, past its own budget.
        return _apply_mode(
            mode,
            errored(
                503,
                "ServiceUnavailable",
                "tenant-not-synced",
                f"tenant reservations: the Tenant owning namespace {unseen} is not known yet "
                "(just created, or deleted); try again shortly",
            ),
            request,
        )
    decision = _decide_application(request, state, policy)
    if request.kind == TENANT_KIND and not decision.allowed and mode != "enforce":
        # Refused before its budget's keys were looked at (a value that does not parse, a spec
        # that does not evaluate): warn would store the keys, and the Tenant's next write would
        # keep them as keys it already had. A bad key is refused first, in every mode.
        decision = _screen_budget_keys(request, state) or decision
    return _apply_mode("enforce" if decision.reason == BAD_BUDGET_KEY else mode, decision, request)


def _unchanged(request: AdmissionRequest) -> bool:
    """An UPDATE whose spec and ``reservation.cozystack.io/`` annotations are the stored ones."""
    if request.operation != "UPDATE" or request.object is None or request.old_object is None:
        return False
    try:
        if request.object.get("spec") != request.old_object.get("spec"):
            return False
        return _reservation_annotations(request.object) == _reservation_annotations(
            request.old_object
        )
    except RecursionError:  # nested deeper than Python compares: evaluated, and refused there
        return False


def _reservation_annotations(obj: Mapping[str, object]) -> dict[str, object]:
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return {}
    return {
        str(k): v for k, v in annotations.items() if str(k).startswith("reservation.cozystack.io/")
    }


def _namespace_problem(request: AdmissionRequest) -> str:
    """Why the request names no namespace to charge, or ``""``.

    Every ``apps.cozystack.io`` kind is namespaced, and the API server sends the namespace the
    object is stored in; a request without one, or whose object claims another, was not sent
    by it, and charging either namespace would be a guess.
    """
    if not request.namespace:
        return f"{request.kind} {request.name or '(no name)'}: the request names no namespace"
    for side, obj in (("object", request.object), ("oldObject", request.old_object)):
        metadata = obj.get("metadata") if obj is not None else None
        claimed = metadata.get("namespace") if isinstance(metadata, Mapping) else None
        if claimed not in (None, "", request.namespace):
            return (
                f"{request.kind} {request.name}: {side}.metadata.namespace {str(claimed)[:64]!r} "
                f"differs from the request's namespace {request.namespace!r}"
            )
    return ""


def _decide_application(
    request: AdmissionRequest, state: ReservationState, policy: Policy
) -> Decision:
    if request.object is None:
        return invalid("object", f"{request.operation} of {request.kind} carries no object")
    try:
        app = application_from_object(
            {**request.object, "kind": request.kind, "metadata": _metadata(request)}
        )
    except ValueError as exc:
        return invalid("metadata", str(exc))
    namespace = request.namespace
    kind = state.platform.kind(request.kind)
    if kind is None:
        return errored(
            403,
            "Forbidden",
            "unknown-kind",
            f"{request.kind}: unknown application kind; no ApplicationDefinition "
            "declares it, so its reservation cannot be evaluated",
        )
    try:
        prepared = state.platform.values(request.kind, app.spec)  # bounded, defaulted, digested
        charge = state.platform.charge_values(request.kind, prepared, namespace=namespace)
    except EvaluationError as exc:
        if kind.contract is None:
            return errored(403, "Forbidden", "no-contract", str(exc.for_kind(request.kind)))
        return invalid(f"spec.{exc.path}" if exc.path else "spec", str(exc.for_kind(request.kind)))
    except UNEVALUABLE as exc:  # values that got past the bounds into a library
        return invalid(
            "spec", f"{request.kind}: the values cannot be evaluated ({type(exc).__name__})"
        )
    values = prepared.digest  # what state.values_digest gives, without a second encoding
    held = _held(request, state, app, charge)
    charge = held.charge
    factor = _factor_change(request, state, policy.overcommit, deny=True)
    if isinstance(factor, Decision):
        return factor
    own, changed = factor
    priced = _priced(request, state, charge.resources, own)
    recorded = _signed(request, state, app, values, charge, priced, own, held.marks)
    forged = _record_problem(request, state, app, values, recorded)
    if forged:
        return errored(403, "Forbidden", "forged-charge", forged)
    old = _old_charge(request, state, app) if request.operation == "UPDATE" else {}
    delta = {k: v for k, v in rl.subtract(priced.reserved, old).items() if v != 0}
    admitted = Application(
        app.kind,
        app.namespace,
        app.name,
        app.spec,
        recorded,
        app.overcommit,
        uid=_stored_uid(request) or app.uid,
    )
    facts = _Facts(
        kind=request.kind,
        charge=priced.reserved,
        delta=delta,
        digest=charge.digest,
        admitted=admitted,
        committed=charge.resources if priced.reserved != charge.resources else None,
        factor=priced.label,
    )
    facts.warnings.extend(unknown_key_warnings(request.kind, app.spec, kind.schema))
    facts.warnings.extend(_held_warnings(held))
    contribution = dict(delta)
    # A CREATE also adds the application itself: 1 of its kind's count key. Its charge and
    # record stay sizes only (an UPDATE neither adds nor removes an application).
    counted = state.platform.count_of(app.key) if request.operation == "CREATE" else {}
    if request.kind == TENANT_KIND:
        tenant = _tenant_change(request, state, app, facts)
        if isinstance(tenant, Decision):
            return tenant
        contribution, extra_warnings, budget = tenant
        facts.warnings.extend(extra_warnings)
        facts.expected = budget
        if changed:
            owned = owned_namespace(request.namespace, app.name)
            repriced = state.repricing(owned, own)
            if any(v > 0 for v in repriced.values()):
                inner = _check(owned, repriced, state, facts, policy)
                if not inner.allowed:
                    facts.warnings.append(f"re-priced at the new factor: {inner.message}")
    if counted:
        contribution = rl.add(contribution, counted)
    decision = _check(namespace, contribution, state, facts, policy)
    if changed and not decision.allowed and decision.reason in ("exceeded", "unknown-usage"):
        # The platform changed a factor: never refused for the pool, reported overcommitted.
        message = decision.message
        decision = _allowed(facts, decision.pool, decision.reserved_after, decision.budget, {})
        decision = replace(
            decision,
            warnings=(_fit(f"overcommitted at the new factor: {message}"), *decision.warnings),
        )
    return decision


@dataclass(frozen=True)
class _Priced:
    reserved: dict[str, Decimal]
    factors: Factors
    source: str
    label: str


def _priced(
    request: AdmissionRequest,
    state: ReservationState,
    declared: Mapping[str, Decimal],
    own: Factors | None,
) -> _Priced:
    """What the object reserves at its effective factor (a Tenant's own factor is for its
    subtree, not for itself)."""
    applied = own if request.kind != TENANT_KIND else None
    factors, source = state.factors_for(request.namespace, applied)
    factors = {k: v for k, v in factors.items() if v != 1}
    label = f"{format_factors(factors)} ({source})" if factors else ""
    return _Priced(apply_factors(declared, factors), factors, source, label)


def _signed(
    request: AdmissionRequest,
    state: ReservationState,
    app: Application,
    values: str,
    charge: Charge,
    priced: _Priced,
    own: Factors | None,
    marks: Mapping[str, Decimal],
) -> RecordedCharge:
    """The record both sides write and expect: the mutating side signs exactly what the
    validating side will recompute, so neither can drift from the other. It is bound to what
    the tenant cannot choose: the stored object's uid (on UPDATE, from the old object the API
    server read; a CREATE has none yet) and whether this is a dry run."""
    return sign(
        state.keys,
        app.key,
        values,
        priced.reserved,
        charge.digest,
        priced.factors,
        charge.resources,
        own,
        priced.source,
        uid=_stored_uid(request),
        marks=marks,
        dry=request.dry_run,
    )


def _stored_uid(request: AdmissionRequest) -> str:
    """The stored object's uid: the old object's on UPDATE (the API server read it), else ""."""
    if request.operation != "UPDATE":
        return ""
    return _uid(request.old_object)


def _uid(obj: Mapping[str, object] | None) -> str:
    metadata = obj.get("metadata") if obj is not None else None
    uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
    return uid if isinstance(uid, str) and 0 < len(uid) <= 128 else ""


def _held(
    request: AdmissionRequest, state: ReservationState, app: Application, charge: Charge
) -> Held:
    """The charge with its persistent volumes at their high marks
    (:mod:`webhook.core.pricing.volumes`).

    The previous marks are the stored object's: from its record when that verifies for the old
    object (both webhooks read the same old object, so both compute the same marks), else what
    this state keeps for it, else the old object's own evaluation. A CREATE starts afresh.
    """
    kind = state.platform.kind(request.kind)
    contract = kind.contract if kind is not None else None
    released = [t.name for t in contract.terms if t.volume == RELEASED] if contract else []
    if request.operation != "UPDATE":
        return hold(charge, {}, released)
    return hold(charge, _old_marks(request, state, app), released)


def _old_marks(
    request: AdmissionRequest, state: ReservationState, app: Application
) -> Mapping[str, Decimal]:
    old = _old_application(request)
    if old is not None and old.recorded is not None:
        digest = state.values_digest(old.kind, old.spec)
        uid = _uid(request.old_object)
        if verifies(state.keys, old.key, digest, old.recorded, uid=uid, marks_only=True):
            return old.recorded.marks  # a dry run's, a retired key's: a mark only ever raises
    kept = state.record(app.key)
    if kept is not None and kept.marks:
        return kept.marks
    if old is None:
        return {}
    try:
        evaluated = state.platform.charge(request.kind, old.spec, namespace=request.namespace)
    except UNEVALUABLE:
        return {}
    return hold(evaluated, {}).marks


def _held_warnings(held: Held) -> list[str]:
    if not held.held:
        return []
    parts = ", ".join(
        f"{key} at {format_quantity(charged)} (values say {format_quantity(now)})"
        for key, (now, charged) in sorted(held.held.items())[:3]
    )
    return [
        f"storage held at its high mark: {parts}; a persistent volume never shrinks and "
        "removed replicas keep theirs; deleting the application releases it"
    ]


def _factor_change(
    request: AdmissionRequest, state: ReservationState, rules: OvercommitRules, *, deny: bool
) -> tuple[Factors | None, bool] | Decision:
    """The object's own factor once admitted, and whether this request changes it.

    A factor counts only by decision: the stored object's factor is what its record vouches
    for, and only the platform (``rules.admins``, from ``userInfo``) changes it, by changing
    the annotation in this very request, within the bounds and (on UPDATE) at most one step
    from the old vouched factor. An annotation sent back as the stored object has it changes
    nothing, whoever sends it, so a factor planted without the webhook never becomes real by
    being carried along; nor does one the mutating side rewrote to the vouched factor. A new
    object has no old factor: its factor needs the bounds, not the steps. With ``deny=False``
    (the mutating side) a refused change keeps the old factor.
    """
    new_text = _overcommit(request.object)
    old_text = _overcommit(request.old_object) if request.operation == "UPDATE" else None
    old_own = _vouched_own(request, state)
    path = f"metadata.annotations[{OVERCOMMIT_ANNOTATION}]"
    if new_text == old_text or _says(new_text, old_own):
        return old_own, False
    if not rules.may_set(request.user, request.groups):
        if not deny:
            return old_own, False
        if old_text is None and old_own is None:
            verb, fix = "setting", "remove the annotation"
        elif new_text is None:
            verb, fix = "removing", "keep the annotation as it is"
        else:
            verb, fix = "changing", "keep the annotation as it is"
        return errored(
            403,
            "Forbidden",
            "overcommit-forbidden",
            f"{path}: {verb} an overcommit factor is reserved to the platform "
            f"({rules.who()}); {request.user or 'this user'} may not; {fix}",
        )
    try:
        new = parse_factors(new_text) if new_text is not None else None
    except OvercommitError as exc:
        return invalid(path, f"{path}: {exc}") if deny else (old_own, False)
    if new == old_own:
        return old_own, False
    inherited, _ = state.factors_for(request.namespace, None)
    after = new if new is not None else inherited
    if request.operation == "UPDATE":
        before = old_own if old_own is not None else inherited
        why = rules.check(before, after)
    else:
        why = rules.check(after, after)  # bounds only: a new object steps from nothing
    if why:
        return invalid(path, f"{path}: {why}") if deny else (old_own, False)
    return new, True


def _vouched_own(request: AdmissionRequest, state: ReservationState) -> Factors | None:
    """The stored object's own factor, as its record vouches for it: the old object's record
    when it is believed (both webhooks read the same one), else what this state believes."""
    old = _old_application(request)
    if old is None:
        return None
    if old.recorded is not None and request.kind != TENANT_KIND:
        digest = state.values_digest(old.kind, old.spec)
        uid = _uid(request.old_object)
        if believed(state.keys, old.key, digest, old.recorded, uid=uid):
            return dict(old.recorded.own) if old.recorded.own is not None else None
    return state.believed_own(old)


def _says(text: str | None, factors: Factors | None) -> bool:
    """Whether an annotation states exactly ``factors`` (absent for none)."""
    if text is None or factors is None:
        return text is None and factors is None
    try:
        return parse_factors(text) == factors
    except OvercommitError:
        return False


def _overcommit(obj: Mapping[str, object] | None) -> str | None:
    metadata = obj.get("metadata") if obj is not None else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    value = annotations.get(OVERCOMMIT_ANNOTATION) if isinstance(annotations, Mapping) else None
    if value is None:
        return None
    return value if isinstance(value, str) else repr(value)


def _old_application(request: AdmissionRequest) -> Application | None:
    if request.operation != "UPDATE" or request.old_object is None:
        return None
    try:
        return application_from_object(
            {**request.old_object, "kind": request.kind, "metadata": _metadata(request, old=True)}
        )
    except ValueError:
        return None


@dataclass
class _Facts:
    kind: str
    charge: Mapping[str, Decimal]
    delta: Mapping[str, Decimal]
    digest: str
    admitted: Application
    warnings: list[str] = field(default_factory=list)
    expected: Mapping[str, Decimal] | None = None
    committed: Mapping[str, Decimal] | None = None
    factor: str = ""


def _check(
    namespace: str,
    change: Mapping[str, Decimal],
    state: ReservationState,
    facts: _Facts,
    policy: Policy,
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
        return _denied_quota("; ".join(parts), facts, pool_name, after, budget)
    if state.unknown():
        for key in sorted(increases):
            if is_count_key(key):
                continue  # an unknown application's size is unknown, never its existence
            holder = pools[key].namespace if key in pools else ""
            blockers = [
                k
                for k in (state.unknown_in_pool(holder, key) if holder else [])
                if policy.mode_for(k[0]) == "enforce"  # warn and off admit it knowingly
            ]
            if blockers:
                message = _unknown_message(holder, blockers, state.unknown())
                return _denied_quota(
                    message, facts, pool_name, after, budget, reason="unknown-usage"
                )
    charged: dict[str, dict[str, Decimal]] = {}
    for key, value in increases.items():
        if key in pools:
            charged.setdefault(pools[key].namespace, {})[key] = value
    return _allowed(facts, pool_name, after, budget, charged)


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


def _tenant_change(
    request: AdmissionRequest, state: ReservationState, app: Application, facts: _Facts
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
        change = rl.add(change, state.tree.budget_change(node, counted))
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


def _screen_budget_keys(request: AdmissionRequest, state: ReservationState) -> Decision | None:
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


def _record_problem(
    request: AdmissionRequest,
    state: ReservationState,
    app: Application,
    values: str,
    computed: RecordedCharge,
) -> str:
    """Why the object's charge annotation cannot stand, or ``""``.

    The annotation is ours: the mutating webhook replaces it with the record it computes for
    the request. Only two records count: on UPDATE the stored object's own record, unchanged
    (it must still verify for these values), and the one computed for this very request (same
    content; any key this replica accepts may have signed it, so replicas mid-rotation agree).
    Anything else (forged, copied from another object or a deleted one of the same name, an
    earlier record of this object, one minted by a dry run) is refused; the mutating side would
    have replaced it.
    """
    claimed = _annotation(request.object)
    if claimed is None:
        return ""
    record = parse_recorded_charge(claimed)
    uid = _uid(request.object) or _stored_uid(request)
    if record is not None and verifies(state.keys, app.key, values, record, uid=uid):
        if record.content() == computed.content():
            return ""
        if (
            request.operation == "UPDATE"
            and claimed == _annotation(request.old_object)
            and not record.dry
        ):
            return ""
    return (
        f"metadata.annotations[{CHARGE_ANNOTATION}]: this annotation is written by the "
        "reservation webhook only, and only the record of this very write (or the stored one, "
        "unchanged) counts; remove it and the recomputed charge is recorded"
    )


def _annotation(obj: Mapping[str, object] | None) -> str | None:
    metadata = obj.get("metadata") if obj is not None else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    value = annotations.get(CHARGE_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else None


def _old_charge(
    request: AdmissionRequest, state: ReservationState, app: Application
) -> Mapping[str, Decimal]:
    """What the old object is credited: what the pool counts for it now, else its record if it
    verifies for the old values, else its evaluation (both at its effective factor), else
    nothing.

    Never more than the webhook itself computed: an unsigned or foreign record is ignored. A
    record older than the request's old object (this state has not seen a shrink yet) credits
    no more than that old object evaluates to: the held increase is what the stored object
    will add, whatever copy of it another replica counts.
    """
    record = state.record(app.key)
    old = _old_application(request)
    if record is not None:
        if old is None or not 0 < record.version < old.version:
            return record.resources
        evaluated = _evaluated_old(request, state, old)
        return {k: min(v, evaluated.get(k, Decimal(0))) for k, v in record.resources.items()}
    if old is None:
        return {}
    return _evaluated_old(request, state, old)


def _evaluated_old(
    request: AdmissionRequest, state: ReservationState, old: Application
) -> Mapping[str, Decimal]:
    """The old object's charge at its effective factor: its verified record, else evaluated."""
    own = state.believed_own(old) if request.kind != TENANT_KIND else None
    factors, _ = state.factors_for(request.namespace, own)
    trusted = state.trusted(old)
    if trusted is not None:
        return apply_factors(trusted.declared, factors)
    try:
        declared = state.platform.charge(request.kind, old.spec, namespace=request.namespace)
    except UNEVALUABLE:
        return {}  # an old object that cannot be evaluated is charged nothing: check it all
    return apply_factors(declared.resources, factors)


def _metadata(request: AdmissionRequest, *, old: bool = False) -> dict[str, object]:
    source = request.old_object if old else request.object
    raw = source.get("metadata") if source is not None else None
    metadata = dict(raw) if isinstance(raw, Mapping) else {}
    metadata.setdefault("name", request.name)
    metadata["namespace"] = request.namespace or metadata.get("namespace")
    return metadata


def _apply_mode(mode: Mode, decision: Decision, request: AdmissionRequest) -> Decision:
    """Finish a decision: the mode, warn-mode's softening, dry-run's note, the audit trail."""
    warnings = decision.warnings
    allowed, outcome = decision.allowed, decision.outcome
    if not allowed and mode == "warn":
        allowed, outcome = True, "warned"
        warnings = (_fit(f"would be denied: {decision.message}"), *warnings)
    if request.dry_run and allowed:
        warnings = (*warnings, DRY_RUN_NOTE)
    audit = _audit(decision, outcome=outcome, mode=mode, allowed=allowed)
    if outcome == "warned":
        audit["would-deny"] = decision.message
    return replace(
        decision,
        allowed=allowed,
        outcome=outcome,
        warnings=warnings,
        mode=mode,
        kind=decision.kind or request.kind,
        audit=audit,
    )


def _audit(decision: Decision, *, outcome: str, mode: Mode, allowed: bool) -> dict[str, str]:
    """Audit annotations: short keys (the API server prefixes the webhook name), JSON values."""
    audit = {"decision": outcome, "mode": mode}
    if decision.reason:
        audit["reason"] = decision.reason
    if decision.charge is not None:
        audit["charge"] = _json(decision.charge)
    if decision.committed is not None:
        audit["committed"] = _json(decision.committed)
    if decision.factor:
        audit["overcommit"] = decision.factor
    if decision.delta is not None:
        # A CREATE's delta is its charge: the same figures, encoded once.
        same = decision.charge is not None and decision.delta == decision.charge
        audit["delta"] = audit["charge"] if same else _json(decision.delta)
    if decision.pool:
        audit["pool"] = decision.pool
    if decision.reserved_after:
        audit["reserved-after"] = _json(decision.reserved_after)
        audit["budget"] = _json(decision.budget)
    if decision.digest:
        audit["contract-digest"] = decision.digest
    if not allowed and decision.message:
        audit["message"] = decision.message
    return audit


_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _json(resources: Mapping[str, Decimal]) -> str:
    return _COMPACT.encode(rl.to_strings(resources))


def _fit(text: str) -> str:
    return text if len(text) <= WARNING_LIMIT else text[: WARNING_LIMIT - 3] + "..."


def _usage_warning(
    charge: Mapping[str, Decimal],
    delta: Mapping[str, Decimal],
    pool: str,
    after: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
) -> str:
    what = f"reserves {rl.format_resources(charge) or 'nothing'}"
    if delta != charge:
        grown = rl.positive_part(delta)
        what = f"adds {rl.format_resources(grown)}" if grown else "reserves no more"
    if not pool or not budget:
        return f"{what}; no tenant quota applies"
    shares = {k: int(after.get(k, _ZERO) * 100 / v) if v else 100 for k, v in budget.items()}
    key = max(shares, key=lambda k: (shares[k], k))
    used = f"{format_quantity(after.get(key, _ZERO))}/{format_quantity(budget[key])}"
    where = f"pool {pool} at {key} {used} ({shares[key]}%)"
    text = f"{what}; {where}"
    if len(text) > WARNING_TARGET:
        text = f"{what[: max(WARNING_TARGET - len(where) - 5, 20)]}...; {where}"
    return text


# -- named constructors ------------------------------------------------------------------------


def held_dry_run(decision: Decision, seconds: float) -> Decision:
    """An allowed dry run the ledger held as a write: say so instead of "nothing was reserved".

    An API server that ignores ``dryRun`` stores the object all the same (cozystack-api does),
    so the charge is held until the object is seen or ``seconds`` pass; the next write of the
    same object takes the hold over rather than adding to it.
    """
    note = (
        f"dry run: held like a write for up to {seconds:g}s (the API server may store it); "
        "the same write for real replaces the hold"
    )
    warnings = tuple(note if w == DRY_RUN_NOTE else w for w in decision.warnings)
    if note not in warnings:
        warnings = (*warnings, note)
    return replace(decision, warnings=warnings, audit={**decision.audit, "dry-run": "held"})


def skipped(message: str, *, mode: Mode = "enforce", kind: str = "") -> Decision:
    return Decision(
        allowed=True, outcome="skipped", reason="skipped", message=message, mode=mode, kind=kind
    )


def errored(code: int, status_reason: str, reason: str, message: str) -> Decision:
    return Decision(
        allowed=False,
        outcome="denied",
        reason=reason,
        code=code,
        status_reason=status_reason,
        message=message,
    )


def invalid(path: str, message: str) -> Decision:
    return Decision(
        allowed=False,
        outcome="denied",
        reason="invalid",
        code=422,
        status_reason="Invalid",
        message=message,
        causes=((path, message),),
    )


def _allowed(
    facts: _Facts,
    pool: str,
    after: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
    charged: Mapping[str, Mapping[str, Decimal]],
) -> Decision:
    warning = _usage_warning(facts.charge, facts.delta, pool, after, budget)
    return Decision(
        allowed=True,
        outcome="allowed",
        reason="fits",
        warnings=tuple(_fit(w) for w in (warning, *facts.warnings)),
        charged_pools=charged,
        expected=facts.charge if facts.expected is None else facts.expected,
        **_figures(facts, pool, after, budget),
    )


def _denied_quota(
    message: str,
    facts: _Facts,
    pool: str,
    after: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
    *,
    reason: str = "exceeded",
) -> Decision:
    return Decision(
        allowed=False,
        outcome="denied",
        reason=reason,
        code=403,
        status_reason="Forbidden",
        message=message,
        **_figures(facts, pool, after, budget),
    )


def _figures(
    facts: _Facts, pool: str, after: Mapping[str, Decimal], budget: Mapping[str, Decimal]
) -> dict[str, Any]:
    """What every quota decision reports, allowed or not."""
    return {
        "kind": facts.kind,
        "pool": pool,
        "charge": facts.charge,
        "committed": facts.committed,
        "factor": facts.factor,
        "delta": facts.delta,
        "reserved_after": after,
        "budget": budget,
        "digest": facts.digest,
        "admitted": facts.admitted,
    }


def mutate(request: AdmissionRequest, state: ReservationState, policy: Policy) -> Decision:
    """The mutating side: record the object's charge on it, signed, idempotently.

    It never denies; the validating side decides. Whatever the mode, only two charge records
    survive it: the stored object's own record carried unchanged (an UPDATE whose values it
    still verifies for), and the record computed for this request, which replaces anything else
    (forged, copied, replayed, minted by a dry run); with no record to write (mode ``off``,
    values that cannot be evaluated: validation then decides) anything else is removed. A
    factor annotation carried from the stored object that its record does not vouch for is
    removed (or set back to the vouched factor); a change in this request is left for the
    validating side to decide. A second call on an object that already carries the right
    record patches nothing.
    """
    if request.operation not in ("CREATE", "UPDATE") or request.object is None:
        return skipped(f"{request.operation} needs no reservation")
    if request.group != APPS_GROUP:
        return skipped("no reservation recorded", kind=request.kind)
    claimed = _annotation(request.object)
    try:
        app: Application | None = application_from_object(
            {**request.object, "kind": request.kind, "metadata": _metadata(request)}
        )
    except ValueError:
        app = None  # no name yet (generateName): nothing can be signed for it
    prepared: Values | None = None
    if app is not None:
        try:  # bounded, defaulted and digested once, for the digest and the charge
            prepared = state.platform.values(request.kind, app.spec)
        except UNEVALUABLE:
            prepared = None  # no charge; the digest below falls back as records expect
    if prepared is not None:
        values = prepared.digest
    else:
        values = state.values_digest(request.kind, app.spec) if app is not None else ""
    charge = None
    if app is not None and prepared is not None and policy.mode_for(request.kind) != "off":
        try:
            charge = state.platform.charge_values(
                request.kind, prepared, namespace=request.namespace
            )
        except UNEVALUABLE:
            charge = None
    operations: list[dict[str, object]] = []
    own: Factors | None = None
    if app is not None:
        factor = _factor_change(request, state, policy.overcommit, deny=False)
        own = factor[0] if isinstance(factor, tuple) else None
        fixed = _factor_fix(request, own)
        if fixed is not None:
            operations.append(fixed)
    value: str | None = None
    kept = _kept(request, state, app, values)
    if app is not None and charge is not None:
        held = _held(request, state, app, charge)
        charge = held.charge
        priced = _priced(request, state, charge.resources, own)
        record = _signed(request, state, app, values, charge, priced, own, held.marks)
        value = record_annotation(record)
        parsed = parse_recorded_charge(claimed) if claimed is not None else None
        same = (
            parsed is not None
            and parsed.content() == record.content()
            and verifies(state.keys, app.key, values, parsed, uid=_stored_uid(request))
        )
        if not same:
            operations.append(_set_annotation(request.object, value))
    elif claimed is not None and not kept:
        operations.append({"op": "remove", "path": f"/metadata/annotations/{_POINTER_KEY}"})
    if not operations:
        reason = "charge already recorded" if value is not None else "no reservation recorded"
        return skipped("signed record kept" if kept else reason, kind=request.kind)
    return Decision(
        allowed=True,
        outcome="allowed",
        reason="recorded" if value is not None else "unsigned-record-removed",
        kind=request.kind,
        charge=charge.resources if charge is not None else None,
        digest=charge.digest if charge is not None else "",
        patch=tuple(operations),
    )


def _kept(
    request: AdmissionRequest, state: ReservationState, app: Application | None, values: str
) -> bool:
    """Whether the object carries the stored object's own record, unchanged and still valid
    for these values (the only record other than a fresh one that may stay)."""
    claimed = _annotation(request.object)
    if app is None or claimed is None or request.operation != "UPDATE":
        return False
    if claimed != _annotation(request.old_object):
        return False
    record = parse_recorded_charge(claimed)
    return (
        record is not None
        and not record.dry
        and verifies(state.keys, app.key, values, record, uid=_stored_uid(request))
    )


def _factor_fix(request: AdmissionRequest, own: Factors | None) -> dict[str, object] | None:
    """The patch that makes a factor annotation carried from the stored object say what its
    record vouches for (removed when nothing is vouched), or ``None``: it already does, or this
    request changes it (the validating side decides that)."""
    text = _overcommit(request.object)
    old_text = _overcommit(request.old_object) if request.operation == "UPDATE" else None
    if request.object is None or text != old_text or _says(text, own):
        return None
    if own is None:
        return {"op": "remove", "path": f"/metadata/annotations/{_OVERCOMMIT_POINTER}"}
    return _set_annotation(request.object, format_factors(own), key=OVERCOMMIT_ANNOTATION)


_POINTER_KEY: Final = CHARGE_ANNOTATION.replace("~", "~0").replace("/", "~1")
_OVERCOMMIT_POINTER: Final = OVERCOMMIT_ANNOTATION.replace("~", "~0").replace("/", "~1")


def _set_annotation(
    obj: Mapping[str, object], value: str, *, key: str = CHARGE_ANNOTATION
) -> dict[str, object]:
    """The JSONPatch operation that sets annotation ``key`` to ``value``."""
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    pointer = key.replace("~", "~0").replace("/", "~1")
    if isinstance(annotations, Mapping):
        return {"op": "add", "path": f"/metadata/annotations/{pointer}", "value": value}
    return {"op": "add", "path": "/metadata/annotations", "value": {key: value}}

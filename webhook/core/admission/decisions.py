"""The admission decision: ``decide(request, state, policy) -> Decision``, pure, in five stages.

Every request starts as a denial until it is shown to fit (Kubernetes' ResourceQuota admission
does the same), and goes through the stages in order, each a pure function in a module named
after it; the first that refuses answers:

1. :mod:`~webhook.core.admission.resolve`: the application written, its kind, and what is
   believed of the stored object (its own factor, its volumes' marks, the old charge credited);
2. :mod:`~webhook.core.admission.price`: the charge its contract gives its values (fails
   closed: unknown kind, no contract, values that cannot be evaluated);
3. :mod:`~webhook.core.admission.factors`: the overcommit factor only the platform may change,
   the charge at it, and the signed record of both;
4. :mod:`~webhook.core.admission.pool_check`: the delta, counts and carve-outs checked against
   every pool they change (only increases; a decrease always passes);
5. :mod:`~webhook.core.admission.answers`: the answer as a value (mode, warnings, audit
   annotations, patch), which the HTTP layer only serialises (:meth:`Decision.response`).

:func:`decide_again` decides a request once more against a newer view of the pools (the
ledger's commit), reusing stages 1 to 3 of an earlier :func:`decide_prepared` while nothing they
read has changed, and redoing stage 4 always. :func:`mutate` is the mutating side over the
same stages: it records the charge on the object, signed, so that both sides compute the same
record. ``Decision``, ``Policy`` and the names the adapters use are importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from webhook.core.admission.annotation_room import beyond_annotation_limit, left_off
from webhook.core.admission.answers import (
    BAD_BUDGET_KEY,
    CHARGE_POINTER,
    DRY_RUN_NOTE,
    WARNING_LIMIT,
    WARNING_TARGET,
    Decision,
    errored,
    finish,
    held_dry_run,
    invalid,
    set_annotation,
    skipped,
)
from webhook.core.admission.factors import (
    Factored,
    at_factor,
    factor,
    factor_change,
    factor_fix,
    minted_for,
    record_content,
    signed,
)
from webhook.core.admission.modes import MODES, Mode
from webhook.core.admission.pool_check import budget_key_refusal, check_pools
from webhook.core.admission.price import Priced, held, price, price_for_record
from webhook.core.admission.resolve import (
    Factors,
    Subject,
    application,
    charge_annotation,
    kept,
    old_marks,
    resolve,
    screen,
    subject_of,
    unchanged,
)
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import AppRecord, ReservationState
from webhook.core.base.errors import UNEVALUABLE
from webhook.core.base.quantities import format_quantity
from webhook.core.pricing.kinds import APPS_GROUP
from webhook.core.pricing.volumes import RELEASED
from webhook.core.tenancy.overcommit import OvercommitRules
from webhook.core.tenancy.records import parse_recorded_charge, record_annotation, verifies
from webhook.core.tenancy.tenants import TENANT_KIND

__all__ = [
    "BAD_BUDGET_KEY",
    "DRY_RUN_NOTE",
    "MODES",
    "WARNING_LIMIT",
    "WARNING_TARGET",
    "Decided",
    "Decision",
    "Mode",
    "Policy",
    "Prepared",
    "decide",
    "decide_again",
    "decide_prepared",
    "errored",
    "held_dry_run",
    "invalid",
    "mutate",
    "skipped",
]


UNPRICED_UNCHANGED = "nothing the reservation reads changed, and it cannot be priced"


@dataclass(frozen=True)
class Policy:
    """How strictly to apply decisions, globally and per kind (the rollout switch)."""

    mode: Mode = "enforce"
    per_kind: Mapping[str, Mode] = field(default_factory=dict)
    overcommit: OvercommitRules = field(default_factory=OvercommitRules)

    def mode_for(self, kind: str) -> Mode:
        return self.per_kind.get(kind, self.mode)


@dataclass(frozen=True)
class Prepared:
    """Stages 1 to 3 of one decision: what it priced, against which state at which generation.

    Stages 1 to 3 read the request, the policy, the state's record of the application (an
    UPDATE's stored object) and what the state's generation covers (the Tenants, the platform,
    the keys, the caps), never the pending charges nor any other application; stage 4 reads the
    pools as they are now. So :func:`decide_again` may reuse the price of a decision made on the
    same state at the same generation, its record unchanged, and redo only the pool check."""

    subject: Subject
    priced: Priced
    factored: Factored
    policy: Policy
    generation: int
    record: AppRecord | None  # the state's record of the application, replaced when observed


@dataclass(frozen=True)
class Decided:
    """A decision, and its stages 1 to 3 when :func:`decide_again` may reuse them."""

    decision: Decision
    prepared: Prepared | None = None


def decide(request: AdmissionRequest, state: ReservationState, policy: Policy) -> Decision:
    """Decide one request against ``state``; never raises for a well-formed request."""
    return decide_prepared(request, state, policy).decision


def decide_prepared(request: AdmissionRequest, state: ReservationState, policy: Policy) -> Decided:
    """:func:`decide`, keeping its stages 1 to 3 for :func:`decide_again` (none for a Tenant,
    whose pool check reads more than the pools: it is always decided again in full)."""
    mode = policy.mode_for(request.kind)
    early = screen(request, state, mode)  # deletes, other groups, off, unchanged, not synced
    if early is not None:
        return Decided(early)
    prepared = _prepare(request, state, policy)
    if isinstance(prepared, Decision):
        if unchanged(request):
            # A label on an object whose values no longer price (or carry a record that no
            # longer verifies): it stores nothing the reservation reads anew, so it is let
            # through as it stands rather than refused for what an earlier write left.
            return Decided(skipped(UNPRICED_UNCHANGED, mode=mode, kind=request.kind))
        return Decided(_finish(request, state, mode, prepared))
    decision = _finish(request, state, mode, _check(prepared))
    return Decided(decision, None if request.kind == TENANT_KIND else prepared)


def decide_again(
    request: AdmissionRequest, state: ReservationState, policy: Policy, prepared: Prepared | None
) -> Decision:
    """:func:`decide` ``request`` again against ``state`` (e.g. at commit, with the pools as
    they are now): the price of ``prepared`` is reused when it was made on this very state at
    its current generation, with the application's record unchanged, under the same policy
    (nothing it read has changed since), and only the screen and the pool check are redone;
    otherwise the request is decided in full."""
    if (
        prepared is None
        or prepared.subject.state is not state
        or prepared.generation != state.generation
        or state.record(prepared.subject.app.key) is not prepared.record
        or prepared.policy != policy
        or prepared.subject.request is not request
    ):
        return decide(request, state, policy)
    mode = policy.mode_for(request.kind)
    early = screen(request, state, mode)  # the state may have fallen out of sync meanwhile
    if early is not None:
        return early
    return _finish(request, state, mode, _check(prepared))


def _finish(
    request: AdmissionRequest, state: ReservationState, mode: Mode, decision: Decision
) -> Decision:
    if request.kind == TENANT_KIND and not decision.allowed and mode != "enforce":
        # Refused before its budget's keys were looked at (a value that does not parse, a spec
        # that does not evaluate): warn would store the keys, and the Tenant's next write would
        # keep them as keys it already had. A bad key is refused first, in every mode.
        decision = budget_key_refusal(request, state) or decision
    return finish("enforce" if decision.reason == BAD_BUDGET_KEY else mode, decision, request)


def _prepare(
    request: AdmissionRequest, state: ReservationState, policy: Policy
) -> Prepared | Decision:
    """Stages 1 to 3; the first to refuse answers."""
    generation = state.generation
    subject = resolve(request, state)  # 1: the application, what is believed of the stored one
    if isinstance(subject, Decision):
        return subject
    priced = price(subject)  # 2: the charge from its contract, volumes held
    if isinstance(priced, Decision):
        return priced
    factored = factor(subject, priced, policy.overcommit)  # 3: at its factor, signed
    if isinstance(factored, Decision):
        return factored
    record = state.record(subject.app.key)
    return Prepared(subject, priced, factored, policy, generation, record)


def _check(prepared: Prepared) -> Decision:
    """Stage 4, answered by 5: the pool check, against the pools as they are now."""
    policy = prepared.policy
    return check_pools(prepared.subject, prepared.priced, prepared.factored, policy.mode_for)


def _unpriced_over_marks(subject: Subject) -> Decision | None:
    """The refusal, in warn too, of a write whose values cannot be priced while it holds
    volumes only a record keeps: an UPDATE whose stored object holds volumes at their high
    marks (stored so, it carries no record, and only a record keeps a mark: a 100Gi PVC lowered
    to 1Gi past the values bound freed 99Gi for the pool's enforced kinds on every replica that
    had not priced it before), or a write of a kind whose volumes are kept with values past
    their bound (created so, or deleted and created again so, a 100Gi disk counted nothing
    while its chart made its PVC). ``None``: no such write, warn lets it through."""
    request = subject.request
    marks = old_marks(subject) if request.operation == "UPDATE" else {}
    if not marks and not (_keeps_volumes(subject) and _past_bound(subject)):
        return None
    priced = price(subject)
    if not isinstance(priced, Decision):
        return None  # priced after all: recorded as ever
    if marks:
        held = ", ".join(
            f"{key} {format_quantity(value)}" for key, value in sorted(marks.items())[:3]
        )
        why = (
            f"its volumes are held at their high marks ({held}), which only its record "
            "keeps, and values that cannot be priced carry none"
        )
    else:
        why = (
            f"{request.kind} keeps persistent volumes, and values past their bound are "
            "stored with no record: its volumes would count nothing"
        )
    message = f"{priced.message}; refused in warn too: {why}"
    return replace(priced, message=message, causes=tuple((p, message) for p, _ in priced.causes))


def _keeps_volumes(subject: Subject) -> bool:
    """Whether the kind's contract has a volume term its removed units keep."""
    contract = subject.kind.contract if subject.kind is not None else None
    return contract is not None and any(t.volume and t.volume != RELEASED for t in contract.terms)


def _past_bound(subject: Subject) -> bool:
    """Whether the values cannot even be prepared (past their bound), for a known kind: not a
    catalog or contract change that a stored object may suffer, but what the tenant wrote."""
    try:
        subject.state.platform.values(subject.request.kind, subject.app.spec)
    except UNEVALUABLE:
        return True
    return False


def mutate(request: AdmissionRequest, state: ReservationState, policy: Policy) -> Decision:
    """The mutating side: record the object's charge on it, signed, idempotently.

    It denies only a write its patch would take past the 256 KiB Kubernetes allows all
    annotations (:mod:`webhook.core.admission.annotation_room`), which the API server would
    refuse naming the tenant's annotations, and only in enforce (in warn the record is left off,
    with a warning), and in warn an UPDATE whose values cannot be priced while its volumes are
    held at their high marks (:func:`_unpriced_over_marks`); the validating side decides.
    Whatever the mode, only two charge records survive it: the stored object's own record
    carried unchanged (an UPDATE whose values it still verifies for), and the record computed
    for this request, which replaces anything else (forged, copied, replayed, minted by a dry
    run); with no record to write (mode ``off``, values that cannot be evaluated: validation
    then decides) anything else is removed. A factor annotation carried from the stored object
    that its record does not vouch for is removed (or set back to the vouched factor); a change
    in this request is left for the validating side to decide. A second call on an object that
    already carries the right record patches nothing.
    """
    if request.operation not in ("CREATE", "UPDATE") or request.object is None:
        return skipped(f"{request.operation} needs no reservation")
    if request.group != APPS_GROUP:
        return skipped("no reservation recorded", kind=request.kind)
    subject: Subject | None
    try:
        subject = subject_of(request, state, application(request))
    except ValueError:
        subject = None  # no name yet (generateName): nothing can be signed for it
    claimed = charge_annotation(request.object)
    values, charge = price_for_record(subject, evaluate=policy.mode_for(request.kind) != "off")
    if (
        subject is not None
        and charge is None
        and policy.mode_for(request.kind) == "warn"
        # Nothing the reservation reads changes, the stored record (marks and all) carried or
        # none to lose: enforce lets it through as it stands (a label on an object whose
        # preset left the catalog), and warn is never stricter.
        and not (unchanged(request) and (claimed is None or kept(subject, values)))
    ):
        unpriced = _unpriced_over_marks(subject)
        if unpriced is not None:
            return replace(unpriced, kind=request.kind, mode="warn")
    operations: list[dict[str, object]] = []
    own: Factors | None = None
    if subject is not None:
        change = factor_change(subject, policy.overcommit, deny=False)
        own = change[0] if isinstance(change, tuple) else None
        fixed = factor_fix(subject, own)
        if fixed is not None:
            operations.append(fixed)
    recorded = False  # this request's record is on the object, or patched onto it
    carried = subject is not None and kept(subject, values)
    marked = False  # a volume is charged above what the values say: only the record keeps it
    if subject is not None and charge is not None:
        volumes = held(subject, charge)
        charge = volumes.charge
        marked = bool(volumes.held)
        at = at_factor(subject, charge.resources, own)
        minted = minted_for(subject)
        content = record_content(subject, values, charge, at, own, volumes.marks, request=minted)
        parsed = parse_recorded_charge(claimed) if claimed is not None else None
        same = (
            parsed is not None
            and parsed.content() == content.content()
            # A CREATE's record names the call that computed it: one carried in is re-minted.
            and parsed.request == content.request
            # Under the current key only: one a rotation retired stops vouching at the end of
            # its window, so a write in the window re-signs what it carries.
            and parsed.kid == state.keys.current_id
            and verifies(state.keys, subject.app.key, values, parsed, uid=subject.uid)
        )
        if not same:  # signed only to be written: an object carrying it is left as it is
            record = signed(subject, values, charge, at, own, volumes.marks, request=minted)
            operations.append(set_annotation(request.object, record_annotation(record)))
        recorded = True
    elif claimed is not None and not carried:
        operations.append({"op": "remove", "path": f"/metadata/annotations/{CHARGE_POINTER}"})
    if not operations:
        reason = "charge already recorded" if recorded else "no reservation recorded"
        return skipped("signed record kept" if carried else reason, kind=request.kind)
    beyond = beyond_annotation_limit(request.object, operations)
    if beyond is not None:
        mode = policy.mode_for(request.kind)
        # Stored without the record, a volume held at its high mark would count only what the
        # values now say (a 100Gi PVC lowered to 1Gi freed 99Gi for enforced writes): refused
        # in warn too, as the API server refused it before the record was measured.
        if mode == "enforce" or marked:
            return replace(beyond, kind=request.kind, mode=mode)
        return left_off(beyond, operations, kind=request.kind, mode=mode)
    return Decision(
        allowed=True,
        outcome="allowed",
        reason="recorded" if recorded else "unsigned-record-removed",
        kind=request.kind,
        charge=charge.resources if charge is not None else None,
        digest=charge.digest if charge is not None else "",
        patch=tuple(operations),
    )

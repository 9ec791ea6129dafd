"""Stage 1 of the admission decision: which application is written, and what is believed of it.

Before anything is priced, a request must name an application this webhook can decide now: an
``apps.cozystack.io`` object in the namespace the API server sent (:func:`screen` answers the
requests that never reach a price: deletes, kinds switched off, a state not yet synced; a label
update, :func:`unchanged`, goes on: stored with no precondition it may write an older size
back). :func:`resolve` then reads the application, its kind and the stored object it replaces
into a :class:`Subject`, of which the later stages ask what the webhook believes of the *stored*
object, each when it needs it: its own overcommit factor (:func:`vouched_own`), the high marks of
its volumes (:func:`old_marks`), and the old charge an UPDATE is credited (:func:`old_charge`).
Those come only from what the webhook itself computed or signed (a record a tenant could write
would be a discount on its own budget): :func:`record_problem` and :func:`kept` say which charge
annotation a write may carry. Pricing the new values is :mod:`webhook.core.admission.price`.

Over 400 lines, and kept whole: what is believed of the stored object and which record a write
may carry are one rule, read against each other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import NamedTuple

from webhook.core.admission.answers import Decision, errored, finish, invalid, skipped
from webhook.core.admission.modes import Mode
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.base.errors import UNEVALUABLE, EvaluationError
from webhook.core.pricing.bounds import check_values
from webhook.core.pricing.kinds import APPS_GROUP, ApplicationKind
from webhook.core.pricing.volumes import hold
from webhook.core.tenancy.applications import (
    CHARGE_ANNOTATION,
    Application,
    application_from_object,
)
from webhook.core.tenancy.overcommit import OVERCOMMIT_ANNOTATION, apply_factors
from webhook.core.tenancy.records import RecordedCharge, believed, parse_recorded_charge, verifies
from webhook.core.tenancy.tenants import TENANT_KIND

Factors = dict[str, Decimal]

__all__ = [
    "Factors",
    "Subject",
    "application",
    "charge_annotation",
    "kept",
    "old_charge",
    "old_marks",
    "overcommit_annotation",
    "record_problem",
    "resolve",
    "screen",
    "stored_uid",
    "subject_of",
    "unchanged",
    "vouched_own",
    "written_alike",
]


def screen(request: AdmissionRequest, state: ReservationState, mode: Mode) -> Decision | None:
    """The finished answer to a request that is decided before any application is read (in
    ``mode``, the request kind's), or ``None`` when it goes on to :func:`resolve`."""
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
        return finish("enforce", errored(400, "BadRequest", "bad-namespace", malformed), request)
    if mode == "off":
        return skipped(f"reservation is off for {request.kind}", mode="off", kind=request.kind)
    if not state.synced:
        message = "tenant reservations: state not synced yet; try again shortly"
        return finish(mode, errored(503, "ServiceUnavailable", "not-synced", message), request)
    unavailable = state.kind_unavailable(request.kind)
    if unavailable:
        message = (
            f"tenant reservations: {request.kind} applications {unavailable}; writes of "
            "this kind are denied until they can be listed"
        )
        return finish(mode, errored(503, "ServiceUnavailable", "kind-not-synced", message), request)
    unseen = state.unseen_tenant(request.namespace)
    if unseen:
        # Behind cozystack-api the watches lag: a namespace whose Tenant was just created would
        # otherwise be charged to an ancestor's pool, or to none, past its own budget.
        message = (
            f"tenant reservations: the Tenant owning namespace {unseen} is not known yet "
            "(just created, or deleted); try again shortly"
        )
        return finish(
            mode, errored(503, "ServiceUnavailable", "tenant-not-synced", message), request
        )
    return None


def unchanged(request: AdmissionRequest) -> bool:
    """An UPDATE whose spec and ``reservation.cozystack.io/`` annotations are those of the old
    object, written alike (:func:`written_alike`; ``replicas: true`` over a stored ``1`` is not).
    Still decided and held (cozystack-api may store it over a shrink); let through as it
    stands only when it cannot be priced."""
    if request.operation != "UPDATE" or request.object is None or request.old_object is None:
        return False
    new, old = request.object, request.old_object
    try:  # bounded first: equal specs are compared and encoded whole, on the shared loop
        check_values(new.get("spec"))
    except EvaluationError:
        return False  # the evaluation refuses it, in as bounded a walk
    return written_alike(
        [new.get("spec"), _reservation_annotations(new)],
        [old.get("spec"), _reservation_annotations(old)],
    )


def written_alike(new: object, old: object) -> bool:
    """Whether two JSON values are written alike, not merely equal under ``==``: ``true`` and
    ``1``, ``2.0`` and ``2`` are not (the evaluation and the values digest tell them apart); the
    order of keys does not matter (the API server may re-encode a patched spec with its keys
    sorted). Too deep, or no JSON: not alike."""
    try:
        if new != old:  # the usual answer, without encoding anything
            return False
        if _written(new) == _written(old):  # keys in the same order: no sort needed
            return True
        return _written(new, sort=True) == _written(old, sort=True)
    except (RecursionError, TypeError, ValueError):
        return False


def _written(value: object, *, sort: bool = False) -> str:
    return json.dumps(value, sort_keys=sort, check_circular=False, allow_nan=False)


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


class Subject(NamedTuple):
    """The application a request writes, read against ``state``, with the stored object it
    replaces (an UPDATE's). What is believed of the stored object is asked of it by the stage
    that needs it (:func:`vouched_own`, :func:`old_marks`, :func:`old_charge`), only then.
    A named tuple, like the other stages' results: one is built per request, on the hot path."""

    request: AdmissionRequest
    state: ReservationState
    app: Application
    kind: ApplicationKind | None  # None only on the mutating side, which decides nothing
    old: Application | None = None  # the stored object an UPDATE replaces
    uid: str = ""  # the stored object's uid (see :func:`stored_uid`)


def subject_of(request: AdmissionRequest, state: ReservationState, app: Application) -> Subject:
    """``app`` as the request writes it, with its kind and the stored object it replaces."""
    return Subject(
        request,
        state,
        app,
        state.platform.kind(request.kind),
        old_application(request),
        stored_uid(request),
    )


def resolve(request: AdmissionRequest, state: ReservationState) -> Subject | Decision:
    """The application ``request`` writes and its kind, or the refusal when there is none: no
    object, metadata that names no application, a kind no ApplicationDefinition declares."""
    if request.object is None:
        return invalid("object", f"{request.operation} of {request.kind} carries no object")
    try:
        app = application(request)
    except ValueError as exc:
        return invalid("metadata", str(exc))
    subject = subject_of(request, state, app)
    if subject.kind is None:
        return errored(
            403,
            "Forbidden",
            "unknown-kind",
            f"{request.kind}: unknown application kind; no ApplicationDefinition "
            "declares it, so its reservation cannot be evaluated",
        )
    return subject


def application(request: AdmissionRequest) -> Application:
    """The application in ``request.object``, in the request's namespace and of its kind;
    raises ``ValueError`` when its metadata names none (no name yet: ``generateName``)."""
    return application_from_object(
        {**(request.object or {}), "kind": request.kind, "metadata": _metadata(request)}
    )


def old_application(request: AdmissionRequest) -> Application | None:
    """The stored object of an UPDATE as an application, or ``None``."""
    if request.operation != "UPDATE" or request.old_object is None:
        return None
    try:
        return application_from_object(
            {**request.old_object, "kind": request.kind, "metadata": _metadata(request, old=True)}
        )
    except ValueError:
        return None


def _metadata(request: AdmissionRequest, *, old: bool = False) -> dict[str, object]:
    source = request.old_object if old else request.object
    raw = source.get("metadata") if source is not None else None
    metadata = dict(raw) if isinstance(raw, Mapping) else {}
    metadata.setdefault("name", request.name)
    metadata["namespace"] = request.namespace or metadata.get("namespace")
    return metadata


def stored_uid(request: AdmissionRequest) -> str:
    """The stored object's uid: the old object's on UPDATE (the API server read it), else ""."""
    if request.operation != "UPDATE":
        return ""
    return _uid(request.old_object)


def _uid(obj: Mapping[str, object] | None) -> str:
    metadata = obj.get("metadata") if obj is not None else None
    uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
    return uid if isinstance(uid, str) and 0 < len(uid) <= 128 else ""


def charge_annotation(obj: Mapping[str, object] | None) -> str | None:
    """The charge record annotation ``obj`` carries, if it is a string."""
    metadata = obj.get("metadata") if obj is not None else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    value = annotations.get(CHARGE_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else None


def overcommit_annotation(obj: Mapping[str, object] | None) -> str | None:
    """The overcommit factor annotation ``obj`` carries, as text (a non-string as its repr)."""
    metadata = obj.get("metadata") if obj is not None else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    value = annotations.get(OVERCOMMIT_ANNOTATION) if isinstance(annotations, Mapping) else None
    if value is None:
        return None
    return value if isinstance(value, str) else repr(value)


def vouched_own(subject: Subject) -> Factors | None:
    """The stored object's own factor, as its record vouches for it: the old object's record
    when it is believed (both webhooks read the same one), else what this state believes."""
    request, state, old = subject.request, subject.state, subject.old
    if old is None:
        return None
    if old.recorded is not None and request.kind != TENANT_KIND:
        digest = state.values_digest(old.kind, old.spec)
        uid = _uid(request.old_object)
        if believed(state.keys, old.key, digest, old.recorded, uid=uid):
            return dict(old.recorded.own) if old.recorded.own is not None else None
    return state.believed_own(old)


def old_marks(subject: Subject) -> Mapping[str, Decimal]:
    """The stored object's volume high marks (:mod:`webhook.core.pricing.volumes`): from its
    record when that verifies for the old object (both webhooks read the same old object, so
    both compute the same marks), else what this state keeps for it, else the old object's own
    evaluation; nothing for a CREATE."""
    request, state, app, old = subject.request, subject.state, subject.app, subject.old
    if old is not None and old.recorded is not None:
        digest = state.values_digest(old.kind, old.spec)
        uid = _uid(request.old_object)
        if verifies(state.keys, old.key, digest, old.recorded, uid=uid, marks_only=True):
            return old.recorded.marks  # a dry run's, a retired key's: a mark only ever raises
    kept_record = state.record(app.key)
    if kept_record is not None and kept_record.marks:
        return kept_record.marks
    if kept_record is None and state.kept_marks(app.key):
        # Stored unpriced and record-less since (warn past the values bound): the marks of the
        # charge it is still counted at, or the next priced write launders them.
        return state.kept_marks(app.key)
    if old is None:
        return {}
    try:
        evaluated = state.platform.charge(request.kind, old.spec, namespace=request.namespace)
    except UNEVALUABLE:
        return {}
    return hold(evaluated, {}).marks


def old_charge(subject: Subject) -> Mapping[str, Decimal]:
    """What the old object is credited: what the pool counts for it now, else its record if it
    verifies for the old values, else its evaluation (both at its effective factor), else
    nothing.

    Never more than the webhook itself computed: an unsigned or foreign record is ignored. A
    record older than the request's old object (this state has not seen a shrink yet) credits
    no more than that old object evaluates to: the held increase is what the stored object
    will add, whatever copy of it another replica counts.
    """
    request, state, app, old = subject.request, subject.state, subject.app, subject.old
    record = state.record(app.key)
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


def record_problem(subject: Subject, values: str, computed: RecordedCharge) -> str:
    """Why the object's charge annotation cannot stand, or ``""``.

    The annotation is ours: the mutating webhook replaces it with the record it computes for
    the request. Only two records count: on UPDATE the stored object's own record, unchanged
    (it must still verify for these values), and the one computed for this very request (same
    content; any key this replica accepts may have signed it, so replicas mid-rotation agree).
    Anything else (forged, copied from another object or a deleted one of the same name, an
    earlier record of this object, one minted by a dry run) is refused; the mutating side would
    have replaced it.
    """
    request, state = subject.request, subject.state
    claimed = charge_annotation(request.object)
    if claimed is None:
        return ""
    record = parse_recorded_charge(claimed)
    uid = _uid(request.object) or subject.uid
    if record is not None and verifies(state.keys, subject.app.key, values, record, uid=uid):
        # A CREATE's record names the mutating call that computed it, which this call cannot
        # recompute: any request it verifies for (the mutating side re-mints one carried in).
        fresh = request.operation == "CREATE" or record.request == computed.request
        if record.content() == computed.content() and fresh:
            return ""
        if (
            request.operation == "UPDATE"
            and claimed == charge_annotation(request.old_object)
            and not record.dry
        ):
            return ""
    return (
        f"metadata.annotations[{CHARGE_ANNOTATION}]: this annotation is written by the "
        "reservation webhook only, and only the record of this very write (or the stored one, "
        "unchanged) counts; remove it and the recomputed charge is recorded"
    )


def kept(subject: Subject, values: str) -> bool:
    """Whether the object carries the stored object's own record, unchanged and still valid
    for these values (the only record other than a fresh one that may stay)."""
    request = subject.request
    claimed = charge_annotation(request.object)
    if claimed is None or request.operation != "UPDATE":
        return False
    if claimed != charge_annotation(request.old_object):
        return False
    record = parse_recorded_charge(claimed)
    return (
        record is not None
        and not record.dry
        and verifies(subject.state.keys, subject.app.key, values, record, uid=subject.uid)
    )

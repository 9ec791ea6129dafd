"""Stage 2 of the admission decision: the charge the application's contract gives its values.

The values are bounded, defaulted and digested once (the digest is what the charge record is
bound to), then evaluated against the kind's reservation contract; anything that stops the
evaluation fails closed here, as a refusal that names the field (a kind with no contract is
refused as such: a missing contract is not zero). Persistent volumes are then held at the
largest size the cluster may still keep (:mod:`webhook.core.pricing.volumes`), from the stored
object's marks that :mod:`webhook.core.admission.resolve` believes. The charge here is what
the application *declares*; its overcommit factor is the next stage's.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import NamedTuple

from webhook.core.admission.answers import Decision, errored, invalid
from webhook.core.admission.resolve import Subject, old_marks
from webhook.core.base.errors import UNEVALUABLE, EvaluationError
from webhook.core.base.quantities import format_quantity
from webhook.core.pricing.evaluation import Charge
from webhook.core.pricing.unknown_keys import unknown_key_warnings
from webhook.core.pricing.volumes import RELEASED, Held, hold

__all__ = ["Priced", "held", "held_warnings", "price", "price_for_record"]


class Priced(NamedTuple):
    """What the contract charges the application, volumes held, and what to tell about it."""

    values: str  # the digest of the defaulted values charged (the record is bound to it)
    charge: Charge  # declared, volumes at their high marks
    marks: Mapping[str, Decimal]  # the high marks the record keeps
    warnings: tuple[str, ...] = ()  # unknown keys in the values, volumes held


def price(subject: Subject) -> Priced | Decision:
    """The application's charge from its kind's contract, or the refusal of values that
    cannot be evaluated (``no-contract`` when the kind has none)."""
    request, platform = subject.request, subject.state.platform
    try:
        prepared = platform.values(request.kind, subject.app.spec)  # bounded, defaulted, digested
        charge = platform.charge_values(request.kind, prepared, namespace=request.namespace)
    except EvaluationError as exc:
        if subject.kind is None or subject.kind.contract is None:
            return errored(403, "Forbidden", "no-contract", str(exc.for_kind(request.kind)))
        return invalid(f"spec.{exc.path}" if exc.path else "spec", str(exc.for_kind(request.kind)))
    except UNEVALUABLE as exc:  # values that got past the bounds into a library
        return invalid(
            "spec", f"{request.kind}: the values cannot be evaluated ({type(exc).__name__})"
        )
    volumes = held(subject, charge)
    index = subject.kind.key_index if subject.kind is not None else None  # made once per kind
    warnings = (
        *(unknown_key_warnings(request.kind, subject.app.spec, index) if index is not None else ()),
        *held_warnings(volumes),
    )
    # prepared.digest is what state.values_digest gives, without a second encoding
    return Priced(prepared.digest, volumes.charge, volumes.marks, warnings)


def price_for_record(subject: Subject | None, *, evaluate: bool) -> tuple[str, Charge | None]:
    """The mutating side's price, which never refuses: the values digest a record is bound to
    (``""`` with no application) and the charge, ``None`` where the validating side refuses
    or, with ``evaluate`` false (mode ``off``), records nothing."""
    if subject is None:
        return "", None
    request, state = subject.request, subject.state
    try:  # bounded, defaulted and digested once, for the digest and the charge
        prepared = state.platform.values(request.kind, subject.app.spec)
    except UNEVALUABLE:  # no charge; the digest falls back as records expect
        return state.values_digest(request.kind, subject.app.spec), None
    if not evaluate:
        return prepared.digest, None
    try:
        charge = state.platform.charge_values(request.kind, prepared, namespace=request.namespace)
    except UNEVALUABLE:
        return prepared.digest, None
    return prepared.digest, charge


def held(subject: Subject, charge: Charge) -> Held:
    """``charge`` with its persistent volumes at their high marks: an UPDATE's from the stored
    object's (:func:`~webhook.core.admission.resolve.old_marks`); a CREATE starts afresh."""
    contract = subject.kind.contract if subject.kind is not None else None
    released = [t.name for t in contract.terms if t.volume == RELEASED] if contract else []
    if subject.request.operation != "UPDATE":
        return hold(charge, {}, released)
    return hold(charge, old_marks(subject), released)


def held_warnings(volumes: Held) -> list[str]:
    """The warning for volumes charged above what the values say, naming at most three."""
    if not volumes.held:
        return []
    parts = ", ".join(
        f"{key} at {format_quantity(charged)} (values say {format_quantity(now)})"
        for key, (now, charged) in sorted(volumes.held.items())[:3]
    )
    return [
        f"storage held at its high mark: {parts}; a persistent volume never shrinks and "
        "removed replicas keep theirs; deleting the application releases it"
    ]

"""Stage 3 of the admission decision: the overcommit factor, and the record of the charge at it.

A factor (:mod:`webhook.core.tenancy.overcommit`) divides what an application reserves, so it
counts only by decision: the stored object's factor is what its record vouches for, and only
the platform (``OvercommitRules.admins``, from ``userInfo``) changes it, within bounds and
steps (:func:`factor_change`). The charge the contract gave is then reserved at the effective
factor (the object's own, else its tenant's; a Tenant's own factor is for its subtree) and
signed as the record both webhooks write and expect (:func:`signed`; the validating side
signs it only where it is read, :class:`Factored`). The object may carry no
other record than that one or the stored one, unchanged (``forged-charge`` otherwise, judged by
:func:`webhook.core.admission.resolve.record_problem`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import NamedTuple

from webhook.core.admission.answers import (
    OVERCOMMIT_POINTER,
    Decision,
    errored,
    invalid,
    set_annotation,
)
from webhook.core.admission.price import Priced
from webhook.core.admission.resolve import (
    Factors,
    Subject,
    charge_annotation,
    overcommit_annotation,
    record_problem,
    vouched_own,
)
from webhook.core.pricing.evaluation import Charge
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
    RecordKeys,
    parse_recorded_charge,
    sign_record,
    unsigned,
)
from webhook.core.tenancy.tenants import TENANT_KIND

__all__ = [
    "AtFactor",
    "Factored",
    "at_factor",
    "factor",
    "factor_change",
    "factor_fix",
    "minted_for",
    "record_content",
    "signed",
]


class AtFactor(NamedTuple):
    """What an application reserves at its effective factor, and which factor that is."""

    reserved: dict[str, Decimal]
    factors: Factors  # the factors that differ from 1
    source: str  # where they come from: the object, or the tenant that sets them
    label: str  # e.g. "memory=1.2 (tenant-a)", "" when none applies


@dataclass(frozen=True, eq=False)
class Factored:
    """Stage 3's result: the object's own factor once admitted, whether this write changes it,
    what it reserves at the effective factor, and the record for it.

    The record is signed the first time :attr:`record` is read, once: the validating side
    compares only its :attr:`content` with what the object carries, and its answer never
    returns it, so a dry run (or a write through the ledger, which stores no record) does no
    HMAC; what the state observes, the audit replays and the mutating side patches is signed
    exactly as before."""

    own: Factors | None
    changed: bool
    at: AtFactor
    content: RecordedCharge  # the record, unsigned (no key id, no MAC)
    app: tuple[str, str, str]
    keys: RecordKeys

    @functools.cached_property
    def record(self) -> RecordedCharge:
        """The record both webhooks write and expect, signed with the current key."""
        return sign_record(self.keys, self.app, self.content)


def factor(subject: Subject, priced: Priced, rules: OvercommitRules) -> Factored | Decision:
    """The charge at the object's effective factor and its signed record, or the refusal of a
    factor change the platform did not make (or outside the rules), or of a charge annotation
    that is neither this write's record nor the stored one."""
    change = factor_change(subject, rules, deny=True)
    if isinstance(change, Decision):
        return change
    own, changed = change
    at = at_factor(subject, priced.charge.resources, own)
    content = record_content(subject, priced.values, priced.charge, at, own, priced.marks)
    forged = record_problem(subject, priced.values, content)
    if forged:
        return errored(403, "Forbidden", "forged-charge", forged)
    if subject.request.operation == "CREATE":
        # The request the mutating call minted the record for, as the object carries it (it
        # verified above): what the state holds until the watch delivers is what is stored.
        claimed = parse_recorded_charge(charge_annotation(subject.request.object))
        if claimed is not None and claimed.request:
            content = replace(content, request=claimed.request)
    return Factored(own, changed, at, content, subject.app.key, subject.state.keys)


def factor_change(
    subject: Subject, rules: OvercommitRules, *, deny: bool
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
    request, state = subject.request, subject.state
    new_text = overcommit_annotation(request.object)
    old_text = overcommit_annotation(request.old_object) if request.operation == "UPDATE" else None
    old_own = vouched_own(subject)
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


def _says(text: str | None, factors: Factors | None) -> bool:
    """Whether an annotation states exactly ``factors`` (absent for none)."""
    if text is None or factors is None:
        return text is None and factors is None
    try:
        return parse_factors(text) == factors
    except OvercommitError:
        return False


def at_factor(subject: Subject, declared: Mapping[str, Decimal], own: Factors | None) -> AtFactor:
    """What the object reserves at its effective factor (a Tenant's own factor is for its
    subtree, not for itself)."""
    request = subject.request
    applied = own if request.kind != TENANT_KIND else None
    factors, source = subject.state.factors_for(request.namespace, applied)
    factors = {k: v for k, v in factors.items() if v != 1}
    label = f"{format_factors(factors)} ({source})" if factors else ""
    return AtFactor(apply_factors(declared, factors), factors, source, label)


def signed(
    subject: Subject,
    values: str,
    charge: Charge,
    at: AtFactor,
    own: Factors | None,
    marks: Mapping[str, Decimal],
    *,
    request: str = "",
) -> RecordedCharge:
    """The record both sides write and expect: the mutating side signs exactly what the
    validating side will recompute, so neither can drift from the other. It is bound to what
    the tenant cannot choose: the stored object's uid (on UPDATE, from the old object the API
    server read; a CREATE has none yet), whether this is a dry run, and on a CREATE the
    mutating call's uid (``request``, :func:`minted_for`), which only the validating call
    cannot recompute and takes as written."""
    content = record_content(subject, values, charge, at, own, marks, request=request)
    return sign_record(subject.state.keys, subject.app.key, content)


def minted_for(subject: Subject) -> str:
    """The request a record computed by this (mutating) call names: its own uid on a CREATE,
    within the bound every uid the ledger keeps has (128 characters), else none. The API server
    gives every webhook call a fresh random uid, so no other create carries it."""
    request = subject.request
    if request.operation != "CREATE" or not 0 < len(request.uid) <= 128:
        return ""
    return request.uid


def record_content(
    subject: Subject,
    values: str,
    charge: Charge,
    at: AtFactor,
    own: Factors | None,
    marks: Mapping[str, Decimal],
    *,
    request: str = "",
) -> RecordedCharge:
    """:func:`signed`'s record, unsigned: the same :meth:`~RecordedCharge.content`."""
    return unsigned(
        values,
        at.reserved,
        charge.digest,
        at.factors,
        charge.resources,
        own,
        at.source,
        uid=subject.uid,
        marks=marks,
        dry=subject.request.dry_run,
        request=request,
    )


def factor_fix(subject: Subject, own: Factors | None) -> dict[str, object] | None:
    """The patch that makes a factor annotation carried from the stored object say what its
    record vouches for (removed when nothing is vouched), or ``None``: it already does, or this
    request changes it (the validating side decides that)."""
    request = subject.request
    text = overcommit_annotation(request.object)
    old_text = overcommit_annotation(request.old_object) if request.operation == "UPDATE" else None
    if request.object is None or text != old_text or _says(text, own):
        return None
    if own is None:
        return {"op": "remove", "path": f"/metadata/annotations/{OVERCOMMIT_POINTER}"}
    return set_annotation(request.object, format_factors(own), key=OVERCOMMIT_ANNOTATION)

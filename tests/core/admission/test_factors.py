"""Stage 3 alone: who may change an overcommit factor, the charge at it, and its signed record."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.builders import ADMIN, KEYS, request, signed, state
from webhook.core.admission.answers import Decision
from webhook.core.admission.factors import (
    Factored,
    at_factor,
    factor,
    factor_change,
    factor_fix,
)
from webhook.core.admission.factors import (
    signed as signed_record,
)
from webhook.core.admission.price import Priced, price
from webhook.core.admission.resolve import Subject, resolve
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.core.tenancy.overcommit import OVERCOMMIT_ANNOTATION, OvercommitRules
from webhook.core.tenancy.records import verifies

GI = Decimal(1024**3)
NS = "tenant-acme"
RULES = OvercommitRules()


def subject(body: AdmissionRequest) -> Subject:
    resolved = resolve(body, state({NS: {"memory": "16Gi"}}))
    assert isinstance(resolved, Subject), resolved
    return resolved


def priced(resolved: Subject) -> Priced:
    result = price(resolved)
    assert isinstance(result, Priced), result
    return result


def create(annotations: dict[str, str] | None = None, **who: Any) -> AdmissionRequest:
    return request("Thing", NS, "x", {"memory": "3Gi"}, annotations=annotations, **who)


def carried(note: dict[str, str] | None, **who: Any) -> AdmissionRequest:
    """An UPDATE that sends back the stored object's annotations unchanged."""
    spec = {"memory": "3Gi"}
    return request(
        "Thing",
        NS,
        "x",
        spec,
        operation="UPDATE",
        old_spec=spec,
        annotations=note,
        old_annotations=note,
        **who,
    )


def test_a_tenant_may_not_set_a_factor() -> None:
    refused = factor_change(
        subject(create({OVERCOMMIT_ANNOTATION: "memory=1.5"})), RULES, deny=True
    )
    assert isinstance(refused, Decision)
    assert (refused.reason, refused.code) == ("overcommit-forbidden", 403)
    assert "setting an overcommit factor is reserved to the platform" in refused.message


def test_the_mutating_side_keeps_the_old_factor_instead_of_refusing() -> None:
    body = create({OVERCOMMIT_ANNOTATION: "memory=1.5"})
    assert factor_change(subject(body), RULES, deny=False) == (None, False)


def test_the_platform_sets_a_factor_within_the_bounds() -> None:
    body = create({OVERCOMMIT_ANNOTATION: "memory=1.5"}, **ADMIN)
    assert factor_change(subject(body), RULES, deny=True) == ({"memory": Decimal("1.5")}, True)


def test_even_the_platform_is_held_to_the_bounds() -> None:
    body = create({OVERCOMMIT_ANNOTATION: "memory=9"}, **ADMIN)
    refused = factor_change(subject(body), RULES, deny=True)
    assert isinstance(refused, Decision)
    assert refused.reason == "invalid"
    assert "above the maximum" in refused.message


def test_an_annotation_carried_unchanged_changes_nothing_whoever_sends_it() -> None:
    body = carried({OVERCOMMIT_ANNOTATION: "memory=1.5"}, **ADMIN)
    assert factor_change(subject(body), RULES, deny=True) == (None, False)


def test_the_charge_at_a_factor_is_the_ceiling_of_declared_over_it_and_says_where_from() -> None:
    at = at_factor(subject(create()), {"memory": 3 * GI}, {"memory": Decimal("1.5")})
    assert at.reserved == {"memory": 2 * GI}
    assert at.label == "memory=1.5 (application)"


def test_a_factor_of_one_is_no_factor() -> None:
    at = at_factor(subject(create()), {"memory": 3 * GI}, {"memory": Decimal(1)})
    assert (at.reserved, at.factors, at.label) == ({"memory": 3 * GI}, {}, "")


def test_a_tenants_own_factor_is_for_its_subtree_not_for_itself() -> None:
    body = request("Tenant", "tenant-root", "acme", {})
    resolved = resolve(body, state({}))
    assert isinstance(resolved, Subject)
    at = at_factor(resolved, {"memory": 3 * GI}, {"memory": Decimal("1.5")})
    assert at.reserved == {"memory": 3 * GI}


def test_the_record_is_signed_for_these_values_and_says_whether_it_was_a_dry_run() -> None:
    resolved = subject(create(dry_run=True))
    found = priced(resolved)
    at = at_factor(resolved, found.charge.resources, None)
    record = signed_record(resolved, found.values, found.charge, at, None, found.marks)
    assert record.resources == {"memory": 3 * GI}
    assert record.dry
    assert verifies(KEYS, resolved.app.key, found.values, record, uid="")


def test_the_stage_refuses_a_record_the_webhook_did_not_compute_for_this_write() -> None:
    spec = {"memory": "3Gi"}
    planted = signed("Thing", NS, "x", spec, {"memory": "0"}, "sha256:x")
    resolved = subject(request("Thing", NS, "x", spec, annotations={CHARGE_ANNOTATION: planted}))
    refused = factor(resolved, priced(resolved), RULES)
    assert isinstance(refused, Decision)
    assert refused.reason == "forged-charge"


def test_the_stage_gives_the_charge_at_the_factor_with_its_record() -> None:
    resolved = subject(create({OVERCOMMIT_ANNOTATION: "memory=1.5"}, **ADMIN))
    result = factor(resolved, priced(resolved), RULES)
    assert isinstance(result, Factored)
    assert (result.changed, result.at.reserved) == (True, {"memory": 2 * GI})
    assert result.record.resources == result.at.reserved


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("memory=1.5", "remove", id="an-unvouched-carried-factor-is-removed"),
        pytest.param(None, None, id="no-annotation-nothing-to-fix"),
    ],
)
def test_a_carried_factor_no_record_vouches_for_is_fixed(
    text: str | None, expected: str | None
) -> None:
    note = {OVERCOMMIT_ANNOTATION: text} if text is not None else None
    fix = factor_fix(subject(carried(note)), None)
    assert (fix["op"] if fix is not None else None) == expected

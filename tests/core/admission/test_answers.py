"""Stage 5 alone: decisions as values, finished for the mode, serialised for the API server."""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import request
from webhook.core.admission import answers
from webhook.core.admission.answers import (
    DRY_RUN_NOTE,
    WARNING_LIMIT,
    Decision,
    Facts,
    errored,
    evolve,
    finish,
    fit,
    held_dry_run,
    invalid,
    quota_allowed,
    quota_denied,
    set_annotation,
    skipped,
)
from webhook.core.base import resources as rl
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, Application

GI = Decimal(1024**3)
CREATE = request("Thing", "tenant-acme", "x", {"memory": "1Gi"})


def facts(charge: dict[str, Decimal], delta: dict[str, Decimal] | None = None) -> Facts:
    app = Application("Thing", "tenant-acme", "x", {})
    return Facts(
        kind="Thing",
        charge=charge,
        delta=charge if delta is None else delta,
        digest="sha256:c",
        admitted=app,
    )


def test_warn_mode_admits_a_denial_and_says_what_would_have_been_denied() -> None:
    finished = finish("warn", errored(403, "Forbidden", "exceeded", "over budget"), CREATE)
    assert (finished.allowed, finished.outcome, finished.mode) == (True, "warned", "warn")
    assert finished.warnings == ("would be denied: over budget",)
    assert finished.audit["would-deny"] == "over budget"
    assert "message" not in finished.audit  # the message is audited only when refused


def test_enforce_mode_keeps_a_denial_and_audits_its_message() -> None:
    finished = finish("enforce", errored(403, "Forbidden", "exceeded", "over budget"), CREATE)
    assert (finished.allowed, finished.outcome) == (False, "denied")
    assert finished.audit == {
        "decision": "denied",
        "mode": "enforce",
        "reason": "exceeded",
        "message": "over budget",
    }
    assert finished.kind == "Thing"  # taken from the request when the decision names none


def test_an_allowed_dry_run_says_nothing_was_reserved_and_a_denied_one_does_not() -> None:
    dry = request("Thing", "tenant-acme", "x", {}, dry_run=True)
    assert finish("enforce", skipped("fine"), dry).warnings == (DRY_RUN_NOTE,)
    assert finish("enforce", invalid("spec", "bad"), dry).warnings == ()


def test_a_create_audits_its_delta_as_the_same_figures_as_its_charge() -> None:
    allowed = quota_allowed(
        facts({"memory": GI}), "tenant-acme", {"memory": 2 * GI}, {"memory": 16 * GI}, {}
    )
    audit = finish("enforce", allowed, CREATE).audit
    assert audit["charge"] == audit["delta"] == '{"memory":"1Gi"}'
    assert audit["reserved-after"] == '{"memory":"2Gi"}'
    assert audit["budget"] == '{"memory":"16Gi"}'
    assert audit["pool"] == "tenant-acme"
    assert audit["contract-digest"] == "sha256:c"


def test_an_admitted_write_is_told_the_fullest_key_of_its_pool() -> None:
    allowed = quota_allowed(
        facts({"cpu": Decimal(1), "memory": GI}),
        "tenant-acme",
        {"cpu": Decimal(1), "memory": 12 * GI},
        {"cpu": Decimal(8), "memory": 16 * GI},
        {"tenant-acme": {"memory": GI}},
    )
    assert allowed.warnings[0] == (
        "reserves cpu=1, memory=1Gi; pool tenant-acme at memory 12Gi/16Gi (75%)"
    )
    assert allowed.charged_pools == {"tenant-acme": {"memory": GI}}
    assert allowed.expected == {"cpu": Decimal(1), "memory": GI}


def test_an_update_that_grows_nothing_reserves_no_more_and_no_quota_applies() -> None:
    allowed = quota_allowed(facts({"memory": GI}, {"memory": -GI}), "", {}, {}, {})
    assert allowed.warnings == ("reserves no more; no tenant quota applies",)


def test_a_quota_denial_carries_the_pool_figures_and_its_reason() -> None:
    denied = quota_denied(
        "no room", facts({"memory": GI}), "tenant-acme", {}, {}, reason="unknown-usage"
    )
    assert (denied.allowed, denied.code, denied.status_reason) == (False, 403, "Forbidden")
    assert (denied.reason, denied.pool) == ("unknown-usage", "tenant-acme")
    assert denied.charge == {"memory": GI}


@pytest.mark.parametrize(
    ("length", "kept"),
    [
        pytest.param(WARNING_LIMIT, WARNING_LIMIT, id="at-the-limit-unchanged"),
        pytest.param(WARNING_LIMIT + 1, WARNING_LIMIT, id="past-the-limit-cut-with-dots"),
    ],
)
def test_a_warning_never_exceeds_what_the_api_server_passes_on(length: int, kept: int) -> None:
    text = fit("w" * length)
    assert len(text) == kept
    assert text.endswith("...") == (length > WARNING_LIMIT)


def test_a_refusal_serialises_its_status_and_causes_and_a_patch_as_base64_json() -> None:
    body = invalid("spec.memory", "not a quantity").response()
    assert body["allowed"] is False
    assert body["status"]["code"] == 422
    assert body["status"]["details"]["causes"] == [
        {"field": "spec.memory", "message": "not a quantity", "reason": "FieldValueInvalid"}
    ]
    patch = ({"op": "remove", "path": "/metadata/annotations/x"},)
    patched = Decision(allowed=True, outcome="allowed", patch=patch).response()
    assert patched["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(patched["patch"])) == list(patch)


def test_a_dry_run_the_ledger_held_says_so_instead_of_nothing_reserved() -> None:
    dry = finish("enforce", skipped("fine"), request("Thing", "tenant-acme", "x", {}, dry_run=True))
    held = held_dry_run(dry, 30)
    assert DRY_RUN_NOTE not in held.warnings
    assert held.warnings[-1].startswith("dry run: held like a write for up to 30s")
    assert held.audit["dry-run"] == "held"


def test_an_annotation_is_added_to_the_map_or_the_map_is_created() -> None:
    pointer = CHARGE_ANNOTATION.replace("/", "~1")
    with_map = {"metadata": {"annotations": {"other": "1"}}}
    assert set_annotation(with_map, "v") == {
        "op": "add",
        "path": f"/metadata/annotations/{pointer}",
        "value": "v",
    }
    assert set_annotation({"metadata": {}}, "v") == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {CHARGE_ANNOTATION: "v"},
    }


def test_evolve_builds_what_replace_builds_for_every_field() -> None:
    base = finish(
        "enforce", quota_allowed(facts({"memory": GI}), "tenant-acme", {}, {}, {}), CREATE
    )
    values: dict[str, Any] = {
        "allowed": False,
        "outcome": "warned",
        "code": 403,
        "warnings": ("w",),
        "audit": {"decision": "x"},
        "mode": "warn",
        "charge": {"cpu": Decimal(2)},
        "patch": ({"op": "remove", "path": "/a"},),
    }
    for item in dataclasses.fields(Decision):
        change: dict[str, Any] = {item.name: values.get(item.name, f"new {item.name}")}
        assert evolve(base, **change) == replace(base, **change)
    assert evolve(base) == base
    assert evolve(base) is not base
    with pytest.raises(dataclasses.FrozenInstanceError):
        evolve(base, reason="x").reason = "y"  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"no field among \['nope', 'reason'\]"):
        evolve(base, nope=1, reason="x")


def test_a_decision_stays_a_dataclass_evolve_may_copy() -> None:
    # evolve copies attributes without __init__: only sound while __init__ stores them as given
    assert not hasattr(Decision, "__post_init__")
    assert all(item.init for item in dataclasses.fields(Decision))


_KEYS = st.text(min_size=1, max_size=12) | st.sampled_from(["memory", "ü", "\ud800", "a\x7f"])


@settings(max_examples=300)
@given(st.dictionaries(_KEYS, st.integers(min_value=0, max_value=2**70).map(Decimal), max_size=6))
def test_audit_figures_are_the_stdlib_encoders_text(resources: dict[str, Decimal]) -> None:
    stdlib = json.JSONEncoder(separators=(",", ":")).encode(rl.to_strings(resources))
    assert answers._json(resources) == stdlib

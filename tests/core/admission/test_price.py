"""Stage 2 alone: the charge a contract gives the values, failing closed, volumes held."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from tests.builders import KEYS, THING_DEFINITION, request, signed_marks, state
from webhook.core.admission.answers import Decision
from webhook.core.admission.price import Priced, price, price_for_record
from webhook.core.admission.resolve import Subject, resolve
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.pricing.platform import PlatformBuilder
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.defaults import default_contracts, default_presets

GI = Decimal(1024**3)
NS = "tenant-acme"


def subject(body: AdmissionRequest, current: ReservationState | None = None) -> Subject:
    resolved = resolve(body, state({NS: {"memory": "16Gi"}}) if current is None else current)
    assert isinstance(resolved, Subject), resolved
    return resolved


def priced(body: AdmissionRequest, current: ReservationState | None = None) -> Priced:
    result = price(subject(body, current))
    assert isinstance(result, Priced), result
    return result


def test_the_charge_is_what_the_contract_reads_from_the_values() -> None:
    result = priced(request("Thing", NS, "x", {"memory": "2Gi", "cpu": "500m"}))
    assert result.charge.resources == {"memory": 2 * GI, "cpu": Decimal("0.5")}
    assert result.warnings == ()


def test_the_values_digest_is_the_one_the_state_binds_records_to() -> None:
    current = state({NS: {"memory": "16Gi"}})
    spec = {"memory": "2Gi"}
    assert priced(request("Thing", NS, "x", spec), current).values == current.values_digest(
        "Thing", spec
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"memory": "lots"}, "spec.memory", id="not-a-quantity"),
        pytest.param({"cpu": "-1"}, "spec.cpu", id="a-negative-size"),
        pytest.param({"memory": [1]}, "spec.memory", id="a-list-for-a-size"),
    ],
)
def test_values_that_do_not_evaluate_are_refused_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    result = price(subject(request("Thing", NS, "x", spec)))
    assert isinstance(result, Decision)
    assert (result.reason, result.code) == ("invalid", 422)
    assert result.causes[0][0] == field


def test_a_kind_without_a_contract_is_refused_not_charged_zero() -> None:
    gadget = copy.deepcopy(THING_DEFINITION)
    gadget["metadata"]["name"] = "gadget"
    gadget["spec"]["application"] = {"kind": "Gadget", "plural": "gadgets", "openAPISchema": "{}"}
    del gadget["spec"]["reservation"]
    builder = PlatformBuilder(default_contracts(), default_presets())
    builder.add(gadget, source="test")
    current = ReservationState(builder.build(), keys=KEYS)
    result = price(subject(request("Gadget", NS, "g", {}), current))
    assert isinstance(result, Decision)
    assert (result.reason, result.code) == ("no-contract", 403)


def test_a_key_the_schema_does_not_know_is_warned_about() -> None:
    spec = {"instanceType": "u1.micro", "bogus": 1}
    result = priced(request("VMInstance", NS, "vm", spec))
    assert any("bogus is not in the VMInstance schema" in w for w in result.warnings)


def test_a_shrunk_disk_is_charged_at_the_mark_its_stored_record_keeps() -> None:
    old = {"storage": "100Gi"}
    record = signed_marks("VMDisk", NS, "d", old, {"storage": "100Gi"}, {"disk#1": "100Gi"})
    body = request(
        "VMDisk",
        NS,
        "d",
        {"storage": "1Gi"},
        operation="UPDATE",
        old_spec=old,
        old_annotations={CHARGE_ANNOTATION: record},
    )
    result = priced(body)
    assert result.charge.resources["storage"] == 100 * GI
    assert result.marks == {"disk#1": 100 * GI}
    held = "storage held at its high mark: disk at 100Gi (values say 1Gi)"
    assert result.warnings[-1].startswith(held)


def test_a_created_disk_starts_afresh() -> None:
    result = priced(request("VMDisk", NS, "d", {"storage": "1Gi"}))
    assert result.charge.resources["storage"] == GI


def test_the_mutating_side_prices_quietly() -> None:
    good = subject(request("Thing", NS, "x", {"memory": "1Gi"}))
    values, charge = price_for_record(good, evaluate=True)
    assert charge is not None
    assert charge.resources == {"memory": GI}
    assert price_for_record(good, evaluate=False) == (values, None)  # mode off records nothing
    broken = subject(request("Thing", NS, "x", {"memory": "lots"}))
    digest, none = price_for_record(broken, evaluate=True)
    assert none is None
    assert digest == broken.state.values_digest("Thing", {"memory": "lots"})
    assert price_for_record(None, evaluate=True) == ("", None)

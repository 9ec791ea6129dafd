"""Stage 1 alone: which requests are decided at all, the application written, what is believed."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import request, review, signed, state, thing
from webhook.core.admission.answers import Decision
from webhook.core.admission.decisions import Policy, decide
from webhook.core.admission.resolve import (
    Subject,
    kept,
    old_charge,
    record_problem,
    resolve,
    screen,
    unchanged,
    vouched_own,
)
from webhook.core.admission.reviews import AdmissionRequest, parse_review
from webhook.core.admission.state import ReservationState
from webhook.core.pricing.bounds import DEFAULT_VALUES_LIMITS
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, Application
from webhook.core.tenancy.overcommit import OVERCOMMIT_ANNOTATION
from webhook.core.tenancy.records import parse_recorded_charge

GI = Decimal(1024**3)
NS = "tenant-acme"


def acme(*apps: Application) -> ReservationState:
    return state({NS: {"memory": "16Gi"}}, *apps)


def subject(body: AdmissionRequest, current: ReservationState) -> Subject:
    resolved = resolve(body, current)
    assert isinstance(resolved, Subject), resolved
    return resolved


def edited(body: dict[str, Any], side: str, **metadata: str) -> AdmissionRequest:
    """``body``'s request with ``metadata`` set on its ``side`` (object or oldObject)."""
    body["request"][side]["metadata"].update(metadata)
    return parse_review(body)


def update(spec: dict[str, str], old: dict[str, str], **kwargs: object) -> AdmissionRequest:
    return request("Thing", NS, "x", spec, operation="UPDATE", old_spec=old, **kwargs)


# -- screen: the requests decided before any application is read ------------------------------


def test_an_ordinary_create_goes_on_to_be_resolved() -> None:
    assert screen(request("Thing", NS, "x", {}), acme(), "enforce") is None


def test_a_delete_needs_no_reservation() -> None:
    decision = screen(request("Thing", NS, "x", {}, operation="DELETE"), acme(), "enforce")
    assert decision is not None
    assert decision.outcome == "skipped"


def test_a_namespace_the_object_contradicts_is_refused_even_in_warn_mode() -> None:
    body = edited(review("Thing", NS, "x", {}), "object", namespace="tenant-other")
    decision = screen(body, acme(), "warn")
    assert decision is not None
    assert (decision.allowed, decision.reason, decision.mode) == (False, "bad-namespace", "enforce")


def test_a_kind_switched_off_is_skipped_before_the_state_is_asked() -> None:
    unsynced = ReservationState(acme().platform, synced=False)
    decision = screen(request("Thing", NS, "x", {}), unsynced, "off")
    assert decision is not None
    assert (decision.outcome, decision.mode) == ("skipped", "off")


def test_an_update_that_changes_only_labels_is_decided_and_held_at_its_charge() -> None:
    # Stored without a resourceVersion precondition, a label patch that read an older size
    # writes it back: it is held at what it would store, with nothing to add to the pool.
    body = update({"memory": "1Gi"}, {"memory": "1Gi"})
    assert unchanged(body)
    assert screen(body, acme(), "enforce") is None
    decision = decide(body, acme(thing(NS, "x", memory="1Gi")), Policy())
    assert (decision.allowed, decision.outcome) == (True, "allowed")
    assert decision.charged_pools == {NS: {}}
    assert decision.expected == {"memory": GI}


def test_label_only_updates_of_a_spec_past_the_values_bounds_are_not_encoded_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A spec stored unevaluated (its kind was off) may be as large as the API server stores:
    # each label-only update of it would be compared and encoded whole, twice or four times,
    # on the loop every admission shares. Past the values bounds it goes on to the
    # evaluation, which refuses it in a bounded walk, and nothing of it is encoded.
    huge = {f"k{i}": "1Gi" for i in range(DEFAULT_VALUES_LIMITS.max_nodes + 1)}
    encoded: list[object] = []
    real_dumps = json.dumps

    def counting(value: object, **kwargs: Any) -> str:
        encoded.append(value)
        return real_dumps(value, **kwargs)

    body, current = update(dict(huge), dict(huge)), acme()
    monkeypatch.setattr(json, "dumps", counting)
    assert screen(body, current, "enforce") is None
    assert encoded == []
    decision = decide(update(dict(huge), dict(huge)), acme(), Policy())
    assert (decision.allowed, decision.outcome) == (False, "denied")
    assert f"more than {DEFAULT_VALUES_LIMITS.max_nodes} entries" in decision.message


@pytest.mark.parametrize(
    ("stored", "sent"),
    [
        pytest.param(1, True, id="true-for-a-stored-1"),
        pytest.param(0, False, id="false-for-a-stored-0"),
        pytest.param(2, 2.0, id="a-float-for-a-stored-integer"),
        pytest.param(0.0, -0.0, id="minus-zero-for-a-stored-zero"),
    ],
)
def test_a_value_python_calls_equal_but_written_otherwise_is_not_skipped_as_unchanged(
    stored: object, sent: object
) -> None:
    # Skipped, ``replicas: true`` would be stored unevaluated: its record no longer verifies,
    # the state holds it as unknown, and every increase in its pool (its siblings' too) fails.
    body = request(
        "Postgres", NS, "db", {"replicas": sent}, operation="UPDATE", old_spec={"replicas": stored}
    )
    assert screen(body, acme(), "enforce") is None


def test_sending_true_for_a_stored_replicas_of_1_is_refused_not_stored_unevaluated() -> None:
    body = request(
        "Postgres", NS, "db", {"replicas": True}, operation="UPDATE", old_spec={"replicas": 1}
    )
    decision = decide(body, acme(), Policy())
    assert (decision.allowed, decision.outcome) == (False, "denied")
    assert "replicas: true is not a whole number" in decision.message


_JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(-3, 3, allow_nan=False), st.text("ab")
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab", max_size=2), inner),
    max_leaves=8,
)


def _retyped(value: object) -> object:
    """``value`` with every number written as another type Python calls equal to it."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return bool(value) if value in (0, 1) else float(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, list):
        return [_retyped(item) for item in value]
    if isinstance(value, dict):
        return {key: _retyped(item) for key, item in value.items()}
    return value


@given(old=_JSON, new=_JSON, how=st.sampled_from(["as-stored", "retyped", "another"]))
def test_an_update_is_unchanged_only_when_its_spec_is_written_exactly_as_stored(
    old: object, new: object, how: str
) -> None:
    new = old if how == "as-stored" else _retyped(old) if how == "retyped" else new
    body = request("Thing", NS, "x", new, operation="UPDATE", old_spec=old)
    alike = unchanged(body)
    # Unchanged exactly when written alike, whatever Python's == says, in whatever key order.
    assert alike == (json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True))
    if how == "as-stored":  # a label-only update is unchanged
        assert alike


def test_a_label_only_update_whose_spec_comes_back_with_its_keys_sorted_is_unchanged() -> None:
    stored = {"storage": "1Gi", "memory": "1Gi", "cpu": "1"}
    body = update(dict(sorted(stored.items())), stored)
    assert unchanged(body)


def test_an_update_that_changes_a_reservation_annotation_is_not_unchanged() -> None:
    body = update({"memory": "1Gi"}, {"memory": "1Gi"}, annotations={OVERCOMMIT_ANNOTATION: "2"})
    assert not unchanged(body)
    assert screen(body, acme(), "enforce") is None


def test_a_state_not_synced_refuses_with_503_in_the_kinds_mode() -> None:
    unsynced = ReservationState(acme().platform, synced=False)
    decision = screen(request("Thing", NS, "x", {}), unsynced, "warn")
    assert decision is not None
    assert (decision.code, decision.reason, decision.outcome) == (503, "not-synced", "warned")


# -- resolve: the application and its kind ----------------------------------------------------


def test_a_request_without_an_object_is_invalid() -> None:
    body = replace(request("Thing", NS, "x", {}), object=None)
    decision = resolve(body, acme())
    assert isinstance(decision, Decision)
    assert decision.causes[0][0] == "object"


def test_a_kind_no_application_definition_declares_is_refused() -> None:
    decision = resolve(request("Nonesuch", NS, "x", {}), acme())
    assert isinstance(decision, Decision)
    assert decision.reason == "unknown-kind"


def test_the_application_is_read_in_the_requests_namespace_with_its_kind() -> None:
    resolved = subject(request("Thing", NS, "x", {"memory": "1Gi"}), acme())
    assert resolved.app.key == ("Thing", NS, "x")
    assert resolved.kind is not None
    assert resolved.kind.kind == "Thing"
    assert resolved.old is None
    assert resolved.uid == ""


# -- what is believed of the stored object -----------------------------------------------------


def test_a_create_is_credited_nothing() -> None:
    assert old_charge(subject(request("Thing", NS, "x", {"memory": "1Gi"}), acme())) == {}


def test_an_update_is_credited_what_the_pool_counts_not_what_the_old_object_says() -> None:
    current = acme(thing(NS, "x", memory="4Gi"))
    resolved = subject(update({"memory": "8Gi"}, {"memory": "1Gi"}), current)
    assert old_charge(resolved) == {"memory": 4 * GI}


def test_an_update_of_an_object_the_state_lacks_is_credited_its_old_evaluation() -> None:
    resolved = subject(update({"memory": "8Gi"}, {"memory": "2Gi"}), acme())
    assert old_charge(resolved) == {"memory": 2 * GI}


def test_a_factor_annotation_no_record_vouches_for_is_not_believed() -> None:
    body = update(
        {"memory": "1Gi"}, {"memory": "1Gi"}, old_annotations={OVERCOMMIT_ANNOTATION: "memory=1.5"}
    )
    assert vouched_own(subject(body, acme())) is None


def test_the_old_uid_binds_the_record_and_a_bad_one_is_ignored() -> None:
    def with_old_uid(uid: str) -> AdmissionRequest:
        body = review("Thing", NS, "x", {}, operation="UPDATE", old_spec={"memory": "1Gi"})
        return edited(body, "oldObject", uid=uid)

    assert subject(with_old_uid("u-1"), acme()).uid == "u-1"
    # longer than any uid the API server gives: not a uid to bind a record to
    assert subject(with_old_uid("u" * 129), acme()).uid == ""


# -- which charge annotation a write may carry -------------------------------------------------


def forged(spec: dict[str, str]) -> str:
    return signed("Thing", NS, "x", spec, {"memory": "0"}, "sha256:x")


def test_a_record_that_is_not_this_writes_is_a_problem() -> None:
    spec = {"memory": "4Gi"}
    body = request("Thing", NS, "x", spec, annotations={CHARGE_ANNOTATION: forged(spec)})
    resolved = subject(body, acme())
    computed = parse_recorded_charge(signed("Thing", NS, "x", spec, {"memory": "4Gi"}, "d"))
    assert computed is not None
    values = resolved.state.values_digest("Thing", spec)
    assert "written by the reservation webhook only" in record_problem(resolved, values, computed)


def test_no_annotation_is_no_problem() -> None:
    resolved = subject(request("Thing", NS, "x", {}), acme())
    computed = parse_recorded_charge(signed("Thing", NS, "x", {}, {}, "d"))
    assert computed is not None
    assert record_problem(resolved, resolved.state.values_digest("Thing", {}), computed) == ""


@pytest.mark.parametrize(
    ("operation", "same_as_stored", "expected"),
    [
        pytest.param("UPDATE", True, True, id="stored-record-carried-unchanged-is-kept"),
        pytest.param("UPDATE", False, False, id="a-record-the-stored-object-lacks-is-not"),
        pytest.param("CREATE", False, False, id="a-create-has-no-stored-record"),
    ],
)
def test_only_the_stored_record_carried_unchanged_is_kept(
    operation: str, same_as_stored: bool, expected: bool
) -> None:
    spec = {"memory": "1Gi"}
    record = signed("Thing", NS, "x", spec, {"memory": "1Gi"}, "d")
    body = request(
        "Thing",
        NS,
        "x",
        spec,
        operation=operation,
        old_spec=spec if operation == "UPDATE" else None,
        annotations={CHARGE_ANNOTATION: record},
        old_annotations={CHARGE_ANNOTATION: record} if same_as_stored else None,
    )
    resolved = subject(body, acme())
    assert kept(resolved, resolved.state.values_digest("Thing", spec)) is expected

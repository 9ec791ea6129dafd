"""Signed charge records: every way a tenant could write the charge annotation, and why it fails.

The invariant under test: for every object the pool counts either the current evaluation of its
values or a charge the webhook signed for exactly this object and these values; nothing a tenant
writes lowers what a pool counts or raises what an UPDATE is credited.
"""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import KEYS, request, signed, state, thing
from webhook.core.admission.decisions import Policy, decide, mutate
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy import records
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, Application
from webhook.core.tenancy.records import (
    RecordKeys,
    parse_recorded_charge,
    record_annotation,
    sign,
    values_digest,
    verifies,
)

GI = Decimal(1024**3)
ENFORCE = Policy()
WARN = Policy(mode="warn")
OFF = Policy(mode="off")
OTHER_KEYS = RecordKeys(b"an-attacker-guessed-this-key-0123456789")
BIG = {"instanceType": "u1.2xlarge"}  # KubeVirt u1.2xlarge: 8 vCPU, 32Gi


def forged(charge: dict[str, str], digest: str = "sha256:x") -> str:
    """What a tenant can write: any JSON, any MAC (it does not hold the key)."""
    return json.dumps({"charge": charge, "digest": digest, "values": "sha256:y", "mac": "x"})


def annotated(app: Application, text: str) -> Application:
    return Application(app.kind, app.namespace, app.name, app.spec, parse_recorded_charge(text))


def pool_memory(current: ReservationState, namespace: str = "tenant-acme") -> Decimal:
    node = current.tree.get(namespace)
    assert node is not None
    return node.usage.get("memory", Decimal(0))


def patch_of(decision: Any) -> list[dict[str, Any]]:
    body = decision.response()
    return json.loads(base64.b64decode(body["patch"])) if "patch" in body else []


# -- the record itself ------------------------------------------------------------------------


def test_a_record_verifies_only_for_its_object_its_values_and_a_key_we_hold() -> None:
    values = values_digest({"memory": "1Gi"})
    record = sign(KEYS, ("Thing", "ns", "a"), values, {"memory": GI}, "sha256:c")
    assert verifies(KEYS, ("Thing", "ns", "a"), values, record)
    assert not verifies(KEYS, ("Thing", "ns", "b"), values, record)
    assert not verifies(KEYS, ("Thing", "other", "a"), values, record)
    assert not verifies(KEYS, ("Other", "ns", "a"), values, record)
    assert not verifies(KEYS, ("Thing", "ns", "a"), values_digest({"memory": "2Gi"}), record)
    assert not verifies(OTHER_KEYS, ("Thing", "ns", "a"), values, record)


def test_changing_any_signed_figure_breaks_the_mac() -> None:
    values = values_digest({})
    text = record_annotation(sign(KEYS, ("Thing", "ns", "a"), values, {"memory": GI}, "sha256:c"))
    for field, value in (
        ("charge", {"memory": "1Mi"}),
        ("digest", "sha256:other"),
        ("factor", {"memory": "1.5"}),
    ):
        body = json.loads(text)
        body[field] = value
        record = parse_recorded_charge(json.dumps(body))
        assert record is not None
        assert not verifies(KEYS, ("Thing", "ns", "a"), values, record), field


def test_a_record_signed_with_the_previous_key_verifies_during_a_rotation() -> None:
    values = values_digest({})
    record = sign(KEYS, ("Thing", "ns", "a"), values, {"memory": GI}, "sha256:c")
    rotated = RecordKeys(b"the-new-current-key-0123456789abcdef", (KEYS.current,))
    assert verifies(rotated, ("Thing", "ns", "a"), values, record)
    retired = RecordKeys(b"the-new-current-key-0123456789abcdef")
    assert not verifies(retired, ("Thing", "ns", "a"), values, record)


def test_a_record_naming_a_request_verifies_only_with_that_request() -> None:
    # The request a CREATE's record names is signed: changing it, or dropping it, breaks the
    # MAC, and a record naming none is signed exactly as records were before the field.
    values = values_digest({})
    app = ("Thing", "ns", "a")
    plain = sign(KEYS, app, values, {"memory": GI}, "sha256:c")
    named = sign(KEYS, app, values, {"memory": GI}, "sha256:c", request="call-1")
    assert named.mac != plain.mac
    assert plain.mac == records.mac(KEYS.current, app, values, {"memory": GI}, "sha256:c")
    assert verifies(KEYS, app, values, named)
    for value in ("call-2", ""):
        body = json.loads(record_annotation(named))
        body["request"] = value
        record = parse_recorded_charge(json.dumps(body))
        assert record is not None
        assert not verifies(KEYS, app, values, record), value
    text = record_annotation(named)
    assert len(text) - len(record_annotation(plain)) == len(',"request":"call-1"')


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        RecordKeys(b"short")


# -- attacks on the pool's count --------------------------------------------------------------


def test_forged_tiny_charge_on_a_32gi_vm_counts_32gi() -> None:
    vm = Application("VMInstance", "tenant-acme", "big", BIG)
    current = state({"tenant-acme": {"memory": "64Gi"}}, annotated(vm, forged({"memory": "1Gi"})))
    assert pool_memory(current) == 32 * GI
    record = current.record(vm.key)
    assert record is not None
    assert not record.drifted  # the forgery is not a record: nothing to compare


def test_forged_tiny_charge_signed_with_a_guessed_key_counts_the_real_size() -> None:
    text = signed(
        "VMInstance", "tenant-acme", "big", BIG, {"memory": "1Gi"}, "sha256:x", keys=OTHER_KEYS
    )
    vm = Application("VMInstance", "tenant-acme", "big", BIG)
    current = state({"tenant-acme": {"memory": "64Gi"}}, annotated(vm, text))
    assert pool_memory(current) == 32 * GI


def test_annotation_copied_from_another_object_counts_nothing() -> None:
    small = {"instanceType": "u1.micro"}
    genuine = signed("VMInstance", "tenant-acme", "small", small, {"memory": "1Gi"}, "sha256:x")
    # Copied onto a big VM of another name, and onto a same-sized VM of another name.
    big = annotated(Application("VMInstance", "tenant-acme", "big", BIG), genuine)
    twin = annotated(Application("VMInstance", "tenant-acme", "twin", small), genuine)
    current = state({"tenant-acme": {"memory": "64Gi"}}, big, twin)
    assert pool_memory(current) == 33 * GI
    assert current.trusted(big) is None
    assert current.trusted(twin) is None


def test_annotation_left_over_from_smaller_values_counts_the_values_as_they_stand() -> None:
    small = {"instanceType": "u1.micro"}
    old = signed("VMInstance", "tenant-acme", "vm", small, {"memory": "1Gi"}, "sha256:x")
    grown = annotated(Application("VMInstance", "tenant-acme", "vm", BIG), old)
    current = state({"tenant-acme": {"memory": "64Gi"}}, grown)
    assert pool_memory(current) == 32 * GI


def test_drift_compares_amounts_not_only_digests() -> None:
    # A genuine record whose digest happens to equal today's but whose amount differs.
    today = state({}).platform.charge("VMInstance", BIG)
    text = signed("VMInstance", "tenant-acme", "vm", BIG, {"memory": "30Gi"}, today.digest)
    vm = annotated(Application("VMInstance", "tenant-acme", "vm", BIG), text)
    current = state({"tenant-acme": {"memory": "64Gi"}}, vm)
    record = current.record(vm.key)
    assert record is not None
    assert record.drifted
    assert record.current is not None
    assert record.current["memory"] == 32 * GI


# -- attacks on an UPDATE's credit --------------------------------------------------------------


def test_forged_huge_charge_then_grow_is_checked_in_full() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}}, thing("tenant-acme", "t", memory="1Gi"))
    decision = decide(
        request(
            "Thing",
            "tenant-acme",
            "t",
            {"memory": "512Gi"},
            operation="UPDATE",
            old_spec={"memory": "1Gi"},
            old_annotations={CHARGE_ANNOTATION: forged({"memory": "600Gi"})},
        ),
        current,
        ENFORCE,
    )
    assert not decision.allowed
    assert decision.delta == {"memory": 511 * GI}


def test_huge_charge_copied_from_another_object_then_grow_is_checked_in_full() -> None:
    other = signed("Thing", "tenant-acme", "huge", {"memory": "600Gi"}, {"memory": "600Gi"}, "d")
    current = state({"tenant-acme": {"memory": "16Gi"}}, thing("tenant-acme", "t", memory="1Gi"))
    decision = decide(
        request(
            "Thing",
            "tenant-acme",
            "t",
            {"memory": "512Gi"},
            operation="UPDATE",
            old_spec={"memory": "1Gi"},
            old_annotations={CHARGE_ANNOTATION: other},
        ),
        current,
        ENFORCE,
    )
    assert not decision.allowed


def test_an_object_carrying_a_forged_annotation_is_denied_at_validation() -> None:
    current = state({"tenant-acme": {"memory": "64Gi"}})
    decision = decide(
        request(
            "VMInstance",
            "tenant-acme",
            "vm",
            BIG,
            annotations={CHARGE_ANNOTATION: forged({"memory": "1Gi"})},
        ),
        current,
        ENFORCE,
    )
    assert not decision.allowed
    assert decision.reason == "forged-charge"


def test_the_admitted_record_is_signed_and_the_state_believes_it() -> None:
    current = state({"tenant-acme": {"memory": "64Gi"}})
    decision = decide(request("VMInstance", "tenant-acme", "vm", BIG), current, ENFORCE)
    assert decision.allowed
    assert decision.admitted is not None
    assert current.trusted(decision.admitted) is not None


# -- the mutating side, in every mode ---------------------------------------------------------


def test_mutate_replaces_a_forged_annotation_with_the_signed_record() -> None:
    current = state({"tenant-acme": {"memory": "64Gi"}})
    review = request(
        "VMInstance", "tenant-acme", "vm", BIG, annotations={CHARGE_ANNOTATION: forged({})}
    )
    (operation,) = patch_of(mutate(review, current, ENFORCE))
    assert operation["op"] == "add"
    record = parse_recorded_charge(operation["value"])
    assert record is not None
    assert record.resources["memory"] == 32 * GI
    vm = annotated(Application("VMInstance", "tenant-acme", "vm", BIG), operation["value"])
    assert current.trusted(vm) is not None


def test_a_create_carrying_another_creates_record_gets_its_own() -> None:
    # A record copied from an earlier object of the same name and values verifies, but it
    # names that object's request: the mutating call mints one naming itself, which the
    # validating call (under a uid of its own) accepts as written.
    current = state({"tenant-acme": {"memory": "64Gi"}})
    first = patch_of(mutate(request("Thing", "tenant-acme", "x", {}, uid="a"), current, ENFORCE))
    copied = first[0]["value"][CHARGE_ANNOTATION]
    carried = request(
        "Thing", "tenant-acme", "x", {}, uid="b", annotations={CHARGE_ANNOTATION: copied}
    )
    (operation,) = patch_of(mutate(carried, current, ENFORCE))
    record = parse_recorded_charge(operation["value"])
    assert record is not None
    assert record.request == "b"
    validated = request(
        "Thing",
        "tenant-acme",
        "x",
        {},
        uid="c",
        annotations={CHARGE_ANNOTATION: operation["value"]},
    )
    decision = decide(validated, current, ENFORCE)
    assert decision.allowed
    assert decision.admitted is not None
    assert decision.admitted.recorded is not None
    assert decision.admitted.recorded.request == "b"
    again = request(
        "Thing",
        "tenant-acme",
        "x",
        {},
        uid="b",
        annotations={CHARGE_ANNOTATION: operation["value"]},
    )
    assert patch_of(mutate(again, current, ENFORCE)) == [], "its own record is kept"


def test_charge_planted_in_off_mode_is_removed() -> None:
    current = state({"tenant-acme": {"memory": "64Gi"}})
    review = request(
        "VMInstance",
        "tenant-acme",
        "vm",
        BIG,
        annotations={CHARGE_ANNOTATION: forged({"memory": "1Gi"})},
    )
    assert decide(review, current, OFF).allowed  # off decides nothing ...
    operations = patch_of(mutate(review, current, OFF))  # ... but the forgery does not survive
    assert operations == [
        {"op": "remove", "path": "/metadata/annotations/reservation.cozystack.io~1charge"}
    ]


def test_charge_planted_with_an_unevaluable_spec_in_warn_mode_is_removed_and_blocks_the_pool() -> (
    None
):
    spec = {"instanceType": "u9.huge"}
    current = state({"tenant-acme": {"memory": "64Gi"}})
    review = request(
        "VMInstance",
        "tenant-acme",
        "vm",
        spec,
        annotations={CHARGE_ANNOTATION: forged({"memory": "1Gi"})},
    )
    assert decide(review, current, WARN).allowed  # warn admits it, with a warning
    (operation,) = patch_of(mutate(review, current, WARN))
    assert operation["op"] == "remove"
    # Had it been stored anyway (webhook down, or before install), the state does not believe
    # it: the application is unknown and its pool grants nothing more.
    vm = Application("VMInstance", "tenant-acme", "vm", spec)
    current.observe(annotated(vm, forged({"memory": "1Gi"})))
    assert vm.key in current.unknown()
    assert not decide(
        request("Thing", "tenant-acme", "t", {"memory": "1"}), current, ENFORCE
    ).allowed


def test_in_off_mode_only_the_stored_record_carried_unchanged_survives() -> None:
    current = state({"tenant-acme": {"memory": "64Gi"}})
    text = signed("VMInstance", "tenant-acme", "vm", BIG, {"memory": "32Gi"}, "sha256:x")
    notes = {CHARGE_ANNOTATION: text}
    carried = request(
        "VMInstance",
        "tenant-acme",
        "vm",
        BIG,
        operation="UPDATE",
        old_spec=BIG,
        annotations=notes,
        old_annotations=notes,
    )
    assert patch_of(mutate(carried, current, OFF)) == []
    # The same record on a CREATE (a deleted object's, recreated under its name) is removed.
    review = request("VMInstance", "tenant-acme", "vm", BIG, annotations=notes)
    (operation,) = patch_of(mutate(review, current, OFF))
    assert operation["op"] == "remove"


def test_mutate_removes_a_planted_annotation_from_an_object_without_a_name_yet() -> None:
    current = state({"tenant-acme": {"memory": "64Gi"}})
    review = request(
        "VMInstance", "tenant-acme", "", BIG, annotations={CHARGE_ANNOTATION: forged({})}
    )
    (operation,) = patch_of(mutate(review, current, ENFORCE))
    assert operation["op"] == "remove"


# -- the invariant, generated ---------------------------------------------------------------


MEMORY = st.integers(min_value=0, max_value=64)
CLAIMS = st.one_of(
    st.none(),
    st.builds(lambda m: forged({"memory": f"{m}Gi"}), MEMORY),
    st.builds(  # a genuine record of another object (copied)
        lambda m: signed(
            "Thing", "tenant-acme", "other", {"memory": f"{m}Gi"}, {"memory": f"{m}Gi"}, "d"
        ),
        MEMORY,
    ),
    st.builds(  # a genuine record of this object for other values (left over)
        lambda m: signed(
            "Thing", "tenant-acme", "t", {"memory": f"{m}Gi", "cpu": "1"}, {"memory": "0"}, "d"
        ),
        MEMORY,
    ),
    st.builds(  # a record signed with a key the webhook does not hold
        lambda m: signed(
            "Thing",
            "tenant-acme",
            "t",
            {"memory": "0Gi"},
            {"memory": f"{m}Gi"},
            "d",
            keys=OTHER_KEYS,
        ),
        MEMORY,
    ),
)


@settings(max_examples=200, deadline=None)
@given(size=MEMORY, old_size=MEMORY, claim=CLAIMS, old_claim=CLAIMS)
def test_nothing_a_tenant_writes_lowers_a_count_or_raises_an_update_credit(
    size: int, old_size: int, claim: str | None, old_claim: str | None
) -> None:
    spec = {"memory": f"{size}Gi"}
    app = Application("Thing", "tenant-acme", "t", spec)
    current = state({"tenant-acme": {"memory": "1Ti"}})
    current.observe(annotated(app, claim) if claim is not None else app)
    assert pool_memory(current) == size * GI  # the values as they stand
    fresh = state({"tenant-acme": {"memory": "1Ti"}})
    decision = decide(
        request(
            "Thing",
            "tenant-acme",
            "t",
            spec,
            operation="UPDATE",
            old_spec={"memory": f"{old_size}Gi"},
            old_annotations={CHARGE_ANNOTATION: old_claim} if old_claim is not None else None,
        ),
        fresh,
        ENFORCE,
    )
    if decision.outcome == "skipped":  # nothing the reservation reads changed: nothing moves
        assert size == old_size
        assert decision.delta is None
        return
    assert decision.delta is not None
    credited = size * GI - decision.delta.get("memory", Decimal(0))
    assert credited <= old_size * GI  # never credited more than the old values evaluate to


def test_a_label_only_update_of_an_object_that_no_longer_evaluates_is_not_refused() -> None:
    """Every update of an annotated object reaches the webhooks now; one that changes neither
    the spec nor a reservation annotation (a label) must not be refused because the values do
    not evaluate any more, or because a pool is over budget."""
    current = state({"tenant-acme": {"memory": "1Gi"}})
    broken = {"instanceType": "u9.gone"}
    notes = {CHARGE_ANNOTATION: forged({"memory": "1Gi"}), "note": "x"}
    labelled = request(
        "VMInstance",
        "tenant-acme",
        "vm",
        broken,
        operation="UPDATE",
        old_spec=broken,
        annotations={**notes, "note": "y"},
        old_annotations=notes,
    )
    decision = decide(labelled, current, ENFORCE)
    assert decision.allowed
    assert decision.outcome == "skipped"
    # A spec change, or any change to a reservation annotation, is decided (and here denied).
    replayed = request(
        "VMInstance",
        "tenant-acme",
        "vm",
        broken,
        operation="UPDATE",
        old_spec=broken,
        annotations={**notes, CHARGE_ANNOTATION: forged({"memory": "0"})},
        old_annotations=notes,
    )
    assert not decide(replayed, current, ENFORCE).allowed


def test_a_dry_run_record_a_server_ignoring_dry_runs_would_store_is_never_believed() -> None:
    current = state({"tenant-acme": {"memory": "64Gi"}})
    review = request("VMInstance", "tenant-acme", "vm", BIG, dry_run=True)
    (operation,) = patch_of(mutate(review, current, ENFORCE))
    value = operation["value"]
    text = value[CHARGE_ANNOTATION] if isinstance(value, dict) else value
    record = parse_recorded_charge(str(text))
    assert record is not None
    assert record.dry, "marked as a dry run's"
    stored = Application("VMInstance", "tenant-acme", "vm", BIG, recorded=record)
    assert current.trusted(stored) is None, "never believed for its charge once stored"


def test_a_dry_run_still_loses_a_planted_record() -> None:
    current = state({"tenant-acme": {"memory": "64Gi"}})
    planted = {CHARGE_ANNOTATION: forged({"memory": "1Gi"})}
    review = request("VMInstance", "tenant-acme", "vm", BIG, dry_run=True, annotations=planted)
    (operation,) = patch_of(mutate(review, current, ENFORCE))
    value = operation["value"]
    text = value[CHARGE_ANNOTATION] if isinstance(value, dict) else value
    assert text != planted[CHARGE_ANNOTATION]
    record = parse_recorded_charge(str(text))
    assert record is not None
    assert record.dry

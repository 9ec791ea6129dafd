"""A record is signed only where it is used: never for a validating answer that does not return
it (a dry run, a write held in the ledger), and byte for byte as before wherever it is used (the
mutating side's patch, what the state observes, the ledger's entries).

The reference is the eager signing the webhook did before: :func:`eager_sign` is a copy of the
old :func:`webhook.core.tenancy.records.sign` (one HMAC per decision), kept here only to compare
against."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.admission.test_ledger import POOL, Cluster, Replica, create, grow
from tests.builders import ADMIN, KEYS, request, signed, state
from webhook.core.admission import decisions, factors, pool_check
from webhook.core.admission.decisions import Decision, Policy, decide, mutate
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.tenancy import records
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, Application
from webhook.core.tenancy.overcommit import OVERCOMMIT_ANNOTATION, OvercommitRules
from webhook.core.tenancy.records import RecordedCharge, RecordKeys, record_annotation

NS = "tenant-acme"
POLICY = Policy(overcommit=OvercommitRules(admins=frozenset({"ops"})))
_EMPTY: Mapping[str, Decimal] = {}


def eager_sign(
    keys: RecordKeys,
    app: tuple[str, str, str],
    values: str,
    charge: Mapping[str, Decimal],
    digest: str,
    factor: Mapping[str, Decimal] = _EMPTY,
    committed: Mapping[str, Decimal] = _EMPTY,
    own: Mapping[str, Decimal] | None = None,
    source: str = "",
    *,
    uid: str = "",
    marks: Mapping[str, Decimal] = _EMPTY,
    dry: bool = False,
    request: str = "",
) -> RecordedCharge:
    """The old ``records.sign``, verbatim (and the request a CREATE's record names): the
    reference the lazy record must equal."""
    committed = dict(committed) if dict(committed) != dict(charge) else {}
    own = dict(own) if own is not None else None
    source = source if factor else ""
    signature = records.mac(
        keys.current,
        app,
        values,
        charge,
        digest,
        factor,
        committed,
        own,
        source,
        uid=uid,
        marks=marks,
        dry=dry,
        request=request,
    )
    return RecordedCharge(
        dict(charge),
        digest,
        values,
        signature,
        dict(factor),
        committed,
        own,
        source,
        keys.current_id,
        uid,
        dict(marks),
        dry,
        request,
    )


def eager_signed(
    subject: Any, values: str, charge: Any, at: Any, own: Any, marks: Any, *, request: str = ""
) -> Any:
    """The old ``factors.signed``, over :func:`eager_sign`."""
    return eager_sign(
        subject.state.keys,
        subject.app.key,
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


def sign_eagerly(patched: pytest.MonkeyPatch) -> None:
    """The old code path: the mutating side signs with :func:`eager_sign`, and the validating
    side signs every decision's record as soon as stage 3 is done."""
    patched.setattr(decisions, "signed", eager_signed)
    old_factor = factors.factor

    def factor_signing_at_once(subject: Any, priced: Any, rules: Any) -> Any:
        result = old_factor(subject, priced, rules)
        if isinstance(result, factors.Factored):
            eager_record = eager_signed(
                subject, priced.values, priced.charge, result.at, result.own, priced.marks
            )
            result.__dict__["record"] = eager_record  # what the cached property would hold
        return result

    patched.setattr(decisions, "factor", factor_signing_at_once)


@pytest.fixture
def hmacs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every MAC computed, signing or verifying (``records.mac`` is the one place)."""
    calls: list[str] = []
    real = records.mac

    def counted(*args: Any, **kwargs: Any) -> str:
        calls.append(args[1][2])  # the application's name
        return real(*args, **kwargs)

    monkeypatch.setattr(records, "mac", counted)
    return calls


def corpus() -> list[AdmissionRequest]:
    """Writes covering what the record depends on: CREATE and UPDATE, dry or not, a factor set
    by the platform, a stored record carried, a forged one, volumes held at a high mark."""
    spec = {"memory": "3Gi"}
    stored = signed("Thing", NS, "x", spec, {"memory": "3Gi"}, "sha256:x")
    factor = {OVERCOMMIT_ANNOTATION: "memory=1.2"}
    found = []
    for dry in (False, True):
        found += [
            request("Thing", NS, "x", spec, dry_run=dry),
            request("Thing", NS, "x", {"memory": "5Gi", "storage": "9Gi"}, dry_run=dry),
            request("Thing", NS, "x", spec, annotations=factor, dry_run=dry, **ADMIN),
            request(
                "Thing",
                NS,
                "x",
                {"memory": "4Gi", "storage": "2Gi"},
                operation="UPDATE",
                old_spec={"memory": "3Gi", "storage": "9Gi"},
                dry_run=dry,
            ),
            request(
                "Thing",
                NS,
                "x",
                spec,
                operation="UPDATE",
                old_spec=spec,
                annotations={CHARGE_ANNOTATION: stored},
                old_annotations={CHARGE_ANNOTATION: stored},
                dry_run=dry,
            ),
            request(
                "Thing",
                NS,
                "x",
                spec,
                annotations={CHARGE_ANNOTATION: '{"charge":{}}'},
                dry_run=dry,
            ),
        ]
    return found


def answers(requests: list[AdmissionRequest]) -> list[tuple[bytes, bytes, Application | None]]:
    """Each request's /mutate and /validate answers, as bytes, and what the state observes."""
    current = state({NS: {"memory": "16Gi"}})
    found = []
    for body in requests:
        patched = mutate(body, current, POLICY)
        validated = decide(body, current, POLICY)
        found.append(
            (
                json.dumps(patched.response(), sort_keys=True).encode(),
                json.dumps(validated.response(), sort_keys=True).encode(),
                validated.admitted,
            )
        )
    return found


def test_every_mutate_patch_and_validate_answer_is_byte_for_byte_the_eager_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lazy = answers(corpus())
    with monkeypatch.context() as patched:
        sign_eagerly(patched)
        before = answers(corpus())
    assert [m for m, _, _ in lazy] == [m for m, _, _ in before]
    assert [v for _, v, _ in lazy] == [v for _, v, _ in before]
    assert [a for _, _, a in lazy] == [a for _, _, a in before]
    assert any(b'"patch"' in m for m, _, _ in lazy), "the corpus patches something"
    assert sum(a is not None for _, _, a in lazy) >= 6, "and admits writes with records"


def test_what_the_state_observes_is_the_record_the_mutating_side_wrote() -> None:
    current = state({NS: {"memory": "16Gi"}})
    body = request("Thing", NS, "x", {"memory": "5Gi", "storage": "9Gi"})
    patch = mutate(body, current, POLICY).patch
    written = patch[0]["value"]
    assert isinstance(written, dict)
    # The validating call sees the object as patched, under a uid of its own.
    patched = request("Thing", NS, "x", {"memory": "5Gi", "storage": "9Gi"}, annotations=written)
    admitted = decide(replace(patched, uid="another-call"), current, POLICY).admitted
    assert admitted is not None
    assert admitted.recorded is not None
    assert written[CHARGE_ANNOTATION] == record_annotation(admitted.recorded)


@settings(max_examples=200, deadline=None)
@given(
    values=st.text(max_size=20),
    charge=st.dictionaries(
        st.sampled_from(["cpu", "memory", "storage"]), st.integers(0, 2**40).map(Decimal)
    ),
    factor=st.dictionaries(st.sampled_from(["cpu", "memory"]), st.sampled_from(["1.1", "1.5"])),
    committed=st.dictionaries(st.sampled_from(["cpu", "memory"]), st.integers(0, 99).map(Decimal)),
    own=st.none() | st.dictionaries(st.sampled_from(["memory"]), st.just(Decimal("1.2"))),
    source=st.sampled_from(["", "application", "tenant-acme"]),
    uid=st.sampled_from(["", "uid-1"]),
    marks=st.dictionaries(st.sampled_from(["storage"]), st.integers(0, 99).map(Decimal)),
    dry=st.booleans(),
)
def test_a_record_signed_later_is_the_record_signed_at_once(
    values: str,
    charge: dict[str, Decimal],
    factor: dict[str, str],
    committed: dict[str, Decimal],
    own: dict[str, Decimal] | None,
    source: str,
    uid: str,
    marks: dict[str, Decimal],
    dry: bool,
) -> None:
    """Property: unsigned + sign_record gives the old record, field for field and in bytes."""
    factors_ = {k: Decimal(v) for k, v in factor.items()}
    app = ("Thing", NS, "x")
    args = (values, charge, "sha256:d", factors_, committed or charge, own, source)
    later = records.sign_record(KEYS, app, records.unsigned(*args, uid=uid, marks=marks, dry=dry))
    at_once = eager_sign(KEYS, app, *args, uid=uid, marks=marks, dry=dry)
    assert later == at_once
    assert record_annotation(later) == record_annotation(at_once)
    assert records.sign(KEYS, app, *args, uid=uid, marks=marks, dry=dry) == at_once


def test_a_validating_dry_run_does_no_hmac(hmacs: list[str]) -> None:
    current = state({NS: {"memory": "16Gi"}})
    body = request("Thing", NS, "x", {"memory": "5Gi", "storage": "9Gi"}, dry_run=True)
    decision = decide(body, current, POLICY)
    assert decision.allowed
    assert decision.charge is not None
    decision.response()  # the answer, as served
    assert hmacs == []


def test_a_dry_run_whose_object_carries_no_record_signs_only_on_the_mutating_side(
    hmacs: list[str],
) -> None:
    current = state({NS: {"memory": "16Gi"}})
    body = request("Thing", NS, "x", {"memory": "5Gi"}, dry_run=True)
    assert mutate(body, current, POLICY).patch
    assert hmacs == ["x"], "one HMAC: the record the patch carries"
    decide(body, current, POLICY).response()
    assert hmacs == ["x"]


async def test_a_write_held_in_the_ledger_does_no_hmac(hmacs: list[str]) -> None:
    cluster = Cluster()
    replica = Replica(cluster, "a", {POOL: {"memory": "16Gi"}})
    for body in (create("x", "1Gi"), grow("x", "1Gi", "2Gi", uid="grow")):
        decision = await replica.admit(body)
        assert decision.allowed, decision.message
        decision.response()
    assert len(cluster.entries()) == 2
    assert hmacs == []


async def test_every_ledger_entry_is_byte_for_byte_the_eager_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def entries() -> tuple[bytes, list[bytes]]:
        cluster = Cluster()
        replica = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
        answered = []
        bodies = [
            create("x", "1Gi"),
            create("y", "1Gi", storage="3Gi"),
            grow("x", "1Gi", "2Gi", uid="grow"),
            create("z", "9Gi"),
        ]
        for body in bodies:
            decision: Decision = await replica.admit(body)
            answered.append(json.dumps(decision.response(), sort_keys=True).encode())
        stored = dict(cluster.objects[POOL])
        stored["metadata"] = {k: v for k, v in stored["metadata"].items() if k != "uid"}
        return json.dumps(stored, sort_keys=True).encode(), answered

    lazy = await entries()
    with monkeypatch.context() as patched:
        old_quota_facts = pool_check.quota_facts

        def signing_at_once(subject: Any, priced: Any, factored: Any) -> Any:
            factored.record  # noqa: B018  # the old code signed it in stage 3, always
            return old_quota_facts(subject, priced, factored)

        patched.setattr(pool_check, "quota_facts", signing_at_once)
        before = await entries()
    assert lazy == before
    assert b'"pending"' in lazy[0]


@pytest.mark.parametrize("dry", [False, True], ids=["write", "dry-run"])
def test_a_record_with_this_writes_content_and_a_forged_mac_is_refused_unsigned(
    dry: bool, hmacs: list[str]
) -> None:
    """The validating side compares the carried record's content with this write's unsigned
    record: equal content is not enough, the carried MAC must still verify (one HMAC, the
    verification's; this write's record is never signed for the comparison)."""
    current = state({NS: {"memory": "16Gi"}})
    body = request("Thing", NS, "x", {"memory": "5Gi"}, dry_run=dry)
    genuine = mutate(body, current, POLICY).patch[0]["value"]
    assert isinstance(genuine, dict)
    record = json.loads(genuine[CHARGE_ANNOTATION])
    record["mac"] = "hmac-sha256:" + "0" * 64
    forged = request(
        "Thing",
        NS,
        "x",
        {"memory": "5Gi"},
        dry_run=dry,
        annotations={CHARGE_ANNOTATION: json.dumps(record)},
    )
    hmacs.clear()
    decision = decide(forged, current, POLICY)
    assert not decision.allowed
    assert decision.reason == "forged-charge"
    assert hmacs == ["x"], "the carried record's verification only"


def test_a_decision_admitting_later_equals_one_admitting_at_once() -> None:
    current = state({NS: {"memory": "16Gi"}})
    decision = decide(request("Thing", NS, "x", {"memory": "5Gi"}), current, POLICY)
    admitted = decision.admitted
    assert admitted is not None
    assert replace(decision, admitting=admitted) == decision
    assert decision == replace(decision, admitting=admitted)


def test_a_mutating_reinvocation_on_an_object_carrying_its_record_signs_nothing(
    hmacs: list[str],
) -> None:
    """The API server may call the mutating webhook again on the object it already patched:
    the record there is this request's (same content, its MAC verifies), nothing is patched,
    and nothing is signed just to be compared (one HMAC: the carried record's verification)."""
    current = state({NS: {"memory": "16Gi"}})
    body = request("Thing", NS, "x", {"memory": "5Gi"})
    written = mutate(body, current, POLICY).patch[0]["value"]
    assert isinstance(written, dict)
    again = request("Thing", NS, "x", {"memory": "5Gi"}, annotations=dict(written))
    hmacs.clear()
    decision = mutate(again, current, POLICY)
    assert decision.patch == ()
    assert decision.message == "charge already recorded"
    assert hmacs == ["x"]


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_write_carrying_its_record_under_a_previous_key_is_re_signed_with_the_current_one(
    operation: str,
) -> None:
    """A write in a rotation's window that carries this request's record, signed with the key
    the rotation replaced, gets it re-signed: left as it is, it would stop being believed once
    the window ends (the application then re-priced as it stands), however often it was
    written meanwhile. A record under the current key is still left alone."""
    old_key = RecordKeys(b"tests-record-key-previous-0123456789")
    rotated = RecordKeys(KEYS.current, (old_key.current,))
    spec = {"memory": "5Gi"}
    stored = state({NS: {"memory": "16Gi"}})
    stored.keys = old_key
    update: dict[str, Any] = (
        {"operation": "UPDATE", "old_spec": spec} if operation == "UPDATE" else {}
    )
    body = request("Thing", NS, "x", spec, **update)
    written = mutate(body, stored, POLICY).patch[0]["value"]
    assert isinstance(written, dict)
    stored.keys = rotated  # the rotation: the old key is now the previous one
    again = request("Thing", NS, "x", spec, annotations=dict(written), **update)
    decision = mutate(again, stored, POLICY)
    assert decision.patch, "re-signed with the current key"
    value = decision.patch[-1]["value"]  # the annotation itself: the object carries some
    assert isinstance(value, str)
    record = records.parse_recorded_charge(value)
    assert record is not None
    assert record.kid == KEYS.current_id
    assert decide(again, stored, POLICY).allowed, "the old record still counts for the answer"
    resigned = request("Thing", NS, "x", spec, annotations={CHARGE_ANNOTATION: value}, **update)
    assert mutate(resigned, stored, POLICY).patch == ()

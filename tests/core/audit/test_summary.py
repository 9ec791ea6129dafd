"""The summary counts what the gate decided, as the API server answered each client."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from tests.audit.logs import events, expected_rows, truth, writes
from webhook.core.audit.events import write_from_event
from webhook.core.audit.summary import Filters, SummaryBuilder, touches_spec_or_charge


def summarise(*items: dict[str, Any], filters: Filters | None = None) -> dict[str, Any]:
    builder = SummaryBuilder(filters)
    kinds: dict[str, str] = {}
    for event in items:
        write = write_from_event(event, kinds=kinds)
        if write is not None:
            builder.add(write)
    return builder.result(events=len(items), malformed=[])


def test_counts_per_namespace_and_kind_match_what_each_client_was_answered() -> None:
    result = summarise(*events())
    got = {
        (r["namespace"], r["kind"]): Counter(
            {k: r[k] for k in ("allowed", "denied", "warned", "dryRun") if r[k]}
        )
        for r in result["rows"]
    }
    assert got == expected_rows()
    assert result["undecided"] == []
    assert result["unreachable"] == []


def test_the_expected_rows_agree_with_the_published_totals() -> None:
    totals = truth()["totals"]
    reached = (
        sum(totals[a][k] for a in ("create", "update") for k in ("allowed", "denied", "dry_run"))
        - totals["update"]["denied_rbac"]
        - 1
    )  # the one label-only patch
    assert (
        sum(sum(c[k] for k in ("allowed", "denied", "warned")) for c in expected_rows().values())
        == reached
    )


def test_what_never_reached_the_webhook_is_told_apart() -> None:
    result = summarise(*events())
    assert result["notReachingWebhook"] == {"delete": 16, "rbac": 1, "unchanged": 1}


def test_a_stored_create_without_any_decision_is_listed_as_undecided() -> None:
    create = next(
        e
        for e in events()
        if e["verb"] == "create" and e.get("responseObject", {}).get("kind") == "VMDisk"
    )
    bypassed = copy.deepcopy(create)
    bypassed["annotations"] = {"authorization.k8s.io/decision": "allow"}
    result = summarise(bypassed)
    [entry] = result["undecided"]
    assert entry["auditID"] == create["auditID"]
    assert "neither webhook left a trace" in entry["why"]


def test_an_update_that_changes_the_spec_without_a_decision_is_a_bypass() -> None:
    patch = next(
        e
        for e in events()
        if e["verb"] == "patch"
        and e["responseStatus"]["code"] == 200
        and "spec" in (e.get("requestObject") or {})
        and "reservation.cozystack.io/decision" in e.get("annotations", {})
    )
    bypassed = copy.deepcopy(patch)
    bypassed["annotations"] = {}
    assert [u["auditID"] for u in summarise(bypassed)["undecided"]] == [patch["auditID"]]


def test_a_webhook_the_api_server_could_not_call_is_listed_with_its_message() -> None:
    create = next(
        e
        for e in events()
        if e["verb"] == "create" and e["objectRef"].get("apiGroup") == "apps.cozystack.io"
    )
    failed = copy.deepcopy(create)
    message = (
        'Internal error occurred: failed calling webhook "reservation.cozystack.io": failed to '
        'call webhook: Post "https://reservation-webhook.cozy-reservation.svc:443/validate": '
        "context deadline exceeded"
    )
    failed["responseStatus"] = {"code": 500, "status": "Failure", "message": message}
    failed["responseObject"] = {"kind": "Status", "code": 500, "message": message}
    failed["annotations"] = {}
    result = summarise(failed)
    assert [u["message"] for u in result["unreachable"]] == [message]
    assert result["outcomes"]["error"] == 1
    assert result["undecided"] == []


def test_filters_keep_one_user_and_one_kind() -> None:
    everything = events()
    only = summarise(*everything, filters=Filters(user="dave@gamma.example", kind="VMInstance"))
    assert {(r["namespace"], r["kind"]) for r in only["rows"]} == {("tenant-gamma", "VMInstance")}
    assert [u["user"] for u in only["users"]] == ["dave@gamma.example"]


def test_top_denials_give_an_example_each() -> None:
    result = summarise(*events())
    reasons = {d["reason"]: d for d in result["topDenials"]}
    assert set(reasons) == {"exceeded", "invalid"}
    assert "unknown instance type" in reasons["invalid"]["example"]["message"]
    assert result["deniedUsers"][0]["denied"] == 4


def test_patches_that_leave_spec_and_charge_alone_are_recognised() -> None:
    assert not touches_spec_or_charge({"metadata": {"labels": {"env": "prod"}}})
    assert not touches_spec_or_charge([{"op": "add", "path": "/metadata/labels/x", "value": "1"}])
    assert touches_spec_or_charge({"spec": {"replicas": 3}})
    assert touches_spec_or_charge(
        {"metadata": {"annotations": {"reservation.cozystack.io/charge": "{}"}}}
    )
    assert touches_spec_or_charge([{"op": "replace", "path": "/spec/size", "value": "1Gi"}])
    assert touches_spec_or_charge("not a patch")


def test_every_write_of_the_log_is_read() -> None:
    assert sum(1 for _ in writes()) == 92


def test_since_and_until_keep_one_phase() -> None:
    from tests.audit.logs import phase_of
    from webhook.core.audit.events import parse_time

    enforce = next(p for p in truth()["phases"] if p["name"] == "enforce")
    window = Filters(since=parse_time(enforce["started"]), until=parse_time(enforce["ended"]))
    result = summarise(*events(), filters=window)
    assert result["outcomes"]["warned"] == 0
    assert result["outcomes"]["denied"] == sum(
        1
        for op in truth()["operations"]
        if op["phase"] == "enforce" and op["rc"] != 0 and op["denied_by"] != "rbac"
    )
    assert phase_of(result["topDenials"][0]["example"]["time"]) == "enforce"

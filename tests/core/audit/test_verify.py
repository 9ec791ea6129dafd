"""Verify recomputes every admitted charge and accounts for every stored write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.audit.logs import WEBHOOK, altered_copy, history, writes
from webhook.core.applications import CHARGE_ANNOTATION
from webhook.core.audit.verify import Verifier


def verify(*sources: str | Path) -> dict[str, Any]:
    past = history()
    verifier = Verifier(past)
    for write in writes(*sources, kinds=past.kinds):
        verifier.add(write)
    return verifier.result()


def _allowed_vm_create(event: dict[str, Any]) -> bool:
    return (
        event["verb"] == "create"
        and event.get("annotations", {}).get(WEBHOOK + "decision") == "allowed"
        and event.get("responseObject", {}).get("kind") == "VMInstance"
        and "dryRun" not in event["requestURI"]
    )


def test_the_real_log_holds_no_finding() -> None:
    result = verify()
    assert result["findings"] == []
    assert result["checked"] == 54
    assert result["unverifiable"] == []


def test_a_stored_charge_altered_in_a_copy_of_the_log_is_found(tmp_path: Path) -> None:
    def lower(event: dict[str, Any]) -> bool:
        if not _allowed_vm_create(event):
            return False
        annotations = event["responseObject"]["metadata"]["annotations"]
        record = json.loads(annotations[CHARGE_ANNOTATION])
        record["charge"]["memory"] = "1Mi"
        annotations[CHARGE_ANNOTATION] = json.dumps(record, separators=(",", ":"))
        return True

    copy = tmp_path / "audit.log"
    [altered] = altered_copy(copy, lower)
    findings = verify(copy)["findings"]
    assert [(f["auditID"], f["finding"]) for f in findings] == [(altered, "altered-charge")]


def test_a_charge_recorded_lower_on_both_sides_is_found_by_recomputing(tmp_path: Path) -> None:
    def lower_both(event: dict[str, Any]) -> bool:
        if not _allowed_vm_create(event):
            return False
        annotations = event["responseObject"]["metadata"]["annotations"]
        record = json.loads(annotations[CHARGE_ANNOTATION])
        record["charge"] = {"cpu": "1m"}
        annotations[CHARGE_ANNOTATION] = json.dumps(record, separators=(",", ":"))
        event["annotations"][WEBHOOK + "charge"] = '{"cpu":"1m"}'
        return True

    copy = tmp_path / "audit.log"
    [altered] = altered_copy(copy, lower_both)
    findings = verify(copy)["findings"]
    assert [(f["auditID"], f["finding"]) for f in findings] == [(altered, "charge-mismatch")]


def test_a_write_that_carries_no_decision_is_found(tmp_path: Path) -> None:
    def strip(event: dict[str, Any]) -> bool:
        if not _allowed_vm_create(event):
            return False
        event["annotations"] = {
            k: v for k, v in event["annotations"].items() if not k.startswith(WEBHOOK)
        }
        return True

    copy = tmp_path / "audit.log"
    [stripped] = altered_copy(copy, strip)
    findings = verify(copy)["findings"]
    assert [(f["auditID"], f["finding"]) for f in findings] == [(stripped, "no-decision")]


def test_a_write_recorded_allowed_past_its_budget_is_found(tmp_path: Path) -> None:
    def claim_allowed(event: dict[str, Any]) -> bool:
        annotations = event.get("annotations", {})
        if annotations.get(WEBHOOK + "decision") != "warned" or "dryRun" in event["requestURI"]:
            return False
        annotations[WEBHOOK + "decision"] = "allowed"
        return True

    copy = tmp_path / "audit.log"
    [claimed] = altered_copy(copy, claim_allowed)
    findings = verify(copy)["findings"]
    assert [(f["auditID"], f["finding"]) for f in findings] == [(claimed, "admitted-over-budget")]

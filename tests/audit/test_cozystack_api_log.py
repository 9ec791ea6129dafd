"""The sample log cozystack-api itself wrote (``fixtures/audit/cozystack-api-day.*``): every
command reads it, and agrees with what kubectl was answered (its truth file). Recorded by
``tests/cozystack_api/test_audit.py`` with ``COZYSTACK_API_AUDIT_RECORD=fixtures/audit``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.audit.logs import AUDIT, PLATFORM
from webhook.commands.cli import main
from webhook.core.audit.events import write_from_event
from webhook.core.audit.history import History
from webhook.state.manifests import load_state

LOG = AUDIT / "cozystack-api-day.log"
START = AUDIT / "cozystack-api-day.start-state"
TRUTH = json.loads((AUDIT / "cozystack-api-day.truth.json").read_text())
STATE = ["--state", str(PLATFORM), "--state", str(START), "--dry-runs-stored"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    status = main(["audit", *argv, "-o", "json", "--no-progress"])
    return status, json.loads(capsys.readouterr().out)


def decided() -> list[dict[str, Any]]:
    return [a for a in TRUTH["answered"] if a["operation"] != "delete"]


def test_summary_of_cozystack_apis_log_counts_what_kubectl_was_answered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, result = run(capsys, "summary", str(LOG), "-n", TRUTH["namespace"], "--kind", "VMInstance")
    (row,) = result["rows"]
    assert row["allowed"] == sum(a["allowed"] for a in decided())
    assert row["denied"] == sum(not a["allowed"] for a in decided())
    assert row["dryRun"] == sum(a["operation"] == "dry-run" for a in decided())
    assert result["undecided"] == []


def test_replay_of_cozystack_apis_log_denies_again_exactly_what_was_denied(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, result = run(capsys, "replay", str(LOG), *STATE, "-n", TRUTH["namespace"])
    assert sorted(d["name"] for d in result["denied"]) == sorted(
        a["name"] for a in decided() if not a["allowed"]
    )
    assert result.get("mismatches", []) == []


def test_verify_of_cozystack_apis_log_finds_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    status, result = run(capsys, "verify", str(LOG), *STATE)
    assert (status, result["findings"]) == (0, [])


def test_a_dry_run_cozystack_api_stored_changes_the_history_only_when_told() -> None:
    events = [json.loads(line) for line in LOG.read_text().splitlines()]
    (dry,) = [
        w
        for w in (write_from_event(e) for e in events)
        if w is not None and w.dry_run and w.succeeded and w.verb == "create"
    ]
    for stored, expected in ((False, False), (True, True)):
        history = History(load_state([PLATFORM, START]), stored_dry_runs=stored)
        assert history.apply(dry) is expected
        assert ((dry.kind, dry.namespace, dry.name) in history.objects) is expected

"""``webhook audit``: JSON shapes for tools, exit status for cron and CI, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.audit.logs import LOG, PLATFORM, RULE_CHANGE, WEBHOOK, altered_copy
from webhook.commands.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    status = main(["audit", *argv])
    out, err = capsys.readouterr()
    try:
        return status, json.loads(out), err
    except json.JSONDecodeError:
        return status, out, err


def test_summary_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    status, result, _ = run(capsys, "summary", str(LOG), "-o", "json", "--no-progress")
    assert status == 0
    assert {"events", "malformed", "rows", "undecided", "unreachable"} <= set(result)
    assert result["events"] == 1657
    assert set(result["rows"][0]) >= {
        "namespace",
        "kind",
        "allowed",
        "denied",
        "warned",
        "dryRun",
        "errors",
    }


def test_summary_table_and_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    _, table, _ = run(capsys, "summary", str(LOG), "-o", "table", "-n", "tenant-gamma")
    assert "tenant-gamma" in table
    assert "tenant-acme" not in table.split("Top denial")[0]
    _, yaml_text, _ = run(capsys, "summary", str(LOG), "-o", "yaml")
    assert "rows:" in yaml_text


def test_replay_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    status, result, _ = run(
        capsys,
        "replay",
        str(LOG),
        "--state",
        str(PLATFORM),
        "--mode",
        "enforce",
        "--mode-for",
        "Tenant=warn",
        "--budget",
        "tenant-gamma=memory:64Gi,storage:1Ti",
        "--suggest-budgets",
        "-o",
        "json",
    )
    assert status == 0
    assert set(result["denied"][0]) >= {"auditID", "namespace", "kind", "name", "reason"}
    pool = result["pools"][0]
    assert set(pool) >= {"pool", "peak", "firstOverflow", "suggestedBudget"}
    gamma = next(p for p in result["pools"] if p["pool"] == "tenant-gamma")
    assert gamma["budget"] == {"memory": "64Gi", "storage": "1Ti"}
    assert gamma["firstOverflow"] is None
    assert not [d for d in result["denied"] if d["pool"] == "tenant-gamma"]


def test_verify_exits_zero_when_nothing_is_found_and_one_otherwise(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    clean = tmp_path / "clean.log"
    altered_copy(clean, lambda event: False)
    lines = clean.read_text().splitlines(keepends=True)
    clean.write_text("".join(line for line in lines if RULE_CHANGE not in line))
    status, result, _ = run(capsys, "verify", str(clean), "--state", str(PLATFORM), "-o", "json")
    assert (status, result["findings"]) == (0, [])
    status, result, _ = run(capsys, "verify", str(LOG), "--state", str(PLATFORM), "-o", "json")
    assert status == 1
    assert [f["auditID"] for f in result["findings"]] == [RULE_CHANGE]

    def strip(event: dict[str, Any]) -> bool:
        annotations = event.get("annotations", {})
        if annotations.get(WEBHOOK + "decision") != "allowed" or event["verb"] != "create":
            return False
        event["annotations"] = {k: v for k, v in annotations.items() if not k.startswith(WEBHOOK)}
        return True

    copy = tmp_path / "audit.log"
    [stripped] = altered_copy(copy, strip)
    status, result, _ = run(capsys, "verify", str(copy), "--state", str(PLATFORM), "-o", "json")
    assert status == 1
    assert [(f["auditID"], f["finding"]) for f in result["findings"]] == [
        (stripped, "no-decision"),
        (RULE_CHANGE, "admitted-over-budget"),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["summary", "missing.log"], "missing.log: cannot read", id="missing-log"),
        pytest.param(
            ["summary", str(LOG), "--since", "yesterday"], "--since 'yesterday'", id="bad-time"
        ),
        pytest.param(
            ["replay", str(LOG), "--state", str(PLATFORM), "--budget", "tenant-acme=cpu:lots"],
            "--budget 'tenant-acme=cpu:lots'",
            id="bad-budget",
        ),
        pytest.param(
            ["replay", str(LOG), "--state", str(PLATFORM), "--mode-for", "VMInstance=maybe"],
            "--mode-for",
            id="bad-mode",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_two(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, _, err = run(capsys, *argv)
    assert status == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_one_hostile_event_is_reported_and_the_review_goes_on(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = LOG.read_text(encoding="utf-8").splitlines()
    refused = next(
        i
        for i, line in enumerate(lines)
        if '"verb":"patch"' in line
        and '"code":403' in line
        and '"name":"web-3"' in line  # a merge patch of a stored object: it gets merged
        and "dryRun" not in line
    )
    event = json.loads(lines[refused])
    # nesting deeper than Python's recursion limit, within what the JSON decoder accepts
    deep = '{"spec":' + '{"a":' * 1010 + "1" + "}" * 1011
    text = json.dumps({**event, "requestObject": "DEEP"}).replace('"DEEP"', deep)
    no_time = json.dumps({k: v for k, v in event.items() if not k.endswith("Timestamp")})
    hostile = tmp_path / "audit.log"
    hostile.write_text("\n".join([*lines[:refused], text, no_time, *lines[refused + 1 :]]) + "\n")
    status, result, _ = run(
        capsys, "replay", str(hostile), "--state", str(PLATFORM), "--mode", "enforce", "-o", "json"
    )
    assert status == 0
    assert {"source": str(hostile), "line": refused + 2} == {
        k: result["malformedLines"][0][k] for k in ("source", "line")
    }
    assert result["decided"] > 70
    assert [f["auditID"] for f in result["failed"]] == [event["auditID"]]
    assert result["failed"][0]["error"].startswith("RecursionError")

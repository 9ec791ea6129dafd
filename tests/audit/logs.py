"""The real audit log recorded against this webhook, its ground truth, and altered copies."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from webhook.audit.reader import EventReader
from webhook.core.admission.state import ReservationState
from webhook.core.audit.events import AuditWrite, write_from_event
from webhook.core.audit.history import History
from webhook.core.pricing.platform import Platform
from webhook.state.manifests import load_platform, load_state

ROOT = Path(__file__).resolve().parents[2]
AUDIT = ROOT / "fixtures" / "audit"
LOG = AUDIT / "sample-day.log"
TRUTH = AUDIT / "sample-day.truth.json"
START = AUDIT / "sample-day.start-state"
# the snapshot as applyable manifests (all-apps.raw.yaml holds the same objects again)
START_FILES = tuple(sorted(START.glob("0*.yaml")))
PLATFORM = ROOT / "fixtures" / "cozystack"
WEBHOOK = "reservation.cozystack.io/"
# The one write the webhook that wrote this log (commit 72cf01e) admitted and today's rules deny:
# after tenant-beta-ci's quota was lowered to cpu 2 below its usage of 3, that webhook charged
# the carve-out at its new quota; the design charges the larger of quota and usage (DESIGN,
# "Carve-outs"), so tenant-beta had no room for VMInstance search-7. Replay and verify say so.
RULE_CHANGE = "bf204806-9bd3-4e64-8013-29bddaabfce4"


@cache
def truth() -> dict[str, Any]:
    """The ground truth (shared: do not change it)."""
    loaded: dict[str, Any] = json.loads(TRUTH.read_text(encoding="utf-8"))
    return loaded


def events() -> list[dict[str, Any]]:
    return [json.loads(line) for line in LOG.read_text(encoding="utf-8").splitlines()]


def writes(*sources: str | Path, kinds: dict[str, str] | None = None) -> Iterator[AuditWrite]:
    learned: dict[str, str] = {} if kinds is None else kinds
    for event in EventReader([str(s) for s in (sources or (LOG,))]):
        write = write_from_event(event, kinds=learned)
        if write is not None:
            yield write


def history(*state: Path) -> History:
    if not state:  # the platform alone: parse its definitions once
        return History(ReservationState(platform()))
    return History(load_state([str(p) for p in state]))


@cache
def platform() -> Platform:
    return load_platform([str(PLATFORM)])


def recorded_decisions() -> dict[str, str]:
    """auditID -> the decision the webhook recorded."""
    return {
        e["auditID"]: e["annotations"][WEBHOOK + "decision"]
        for e in events()
        if WEBHOOK + "decision" in e.get("annotations", {})
    }


def phase_of(stamp: str) -> str:
    for phase in reversed(truth()["phases"]):
        if stamp >= phase["started"]:
            return str(phase["name"])
    return "before"


def expected_rows() -> dict[tuple[str, str], Counter[str]]:
    """Per (namespace, kind), what kubectl was answered, for writes that reached the webhook.

    Every create and update except the two kinds that never reach it: an RBAC refusal and a
    label-only patch (the shipped matchConditions skip an UPDATE that leaves the spec alone).
    """
    rows: dict[tuple[str, str], Counter[str]] = {}
    for op in truth()["operations"]:
        if op["action"] not in ("create", "update") or op["denied_by"] == "rbac":
            continue
        if op["tool"] == "label":
            continue
        outcome = ("warned" if op["would_deny"] else "allowed") if op["rc"] == 0 else "denied"
        counts = rows.setdefault((op["namespace"], op["kind"]), Counter())
        counts[outcome] += 1
        if op["dry_run"]:
            counts["dryRun"] += 1
    return rows


def altered_copy(
    target: Path, change: Callable[[dict[str, Any]], bool], *, limit: int = 1
) -> list[str]:
    """Write the log to ``target`` with ``change`` applied to the first ``limit`` events it
    accepts (it returns True when it changed one); return their audit IDs."""
    changed: list[str] = []
    with target.open("w", encoding="utf-8") as out:
        for event in events():
            if len(changed) < limit and change(event):
                changed.append(event["auditID"])
            out.write(json.dumps(event, separators=(",", ":")) + "\n")
    return changed

"""Plain-text tables of the audit reviews, for a person at a terminal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["render_replay", "render_summary", "render_verify", "table"]

_COUNTS = ("allowed", "denied", "warned", "skipped", "dryRun", "errors")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def _counts(rows: Sequence[Mapping[str, Any]], *first: str) -> str:
    return table(
        [*first, *_COUNTS], [[*(r[f] for f in first), *(r[c] for c in _COUNTS)] for r in rows]
    )


def render_summary(result: Mapping[str, Any]) -> str:
    parts = [
        f"{result['events']} events, {result['writes']} application writes, "
        f"{result['malformed']} malformed lines",
        "",
        _counts(result["rows"], "namespace", "kind"),
        "",
        _counts(
            [{**p, "pool": p["pool"] or "(no pool)"} for p in result["pools"]],
            "pool",
        ),
        "",
        _counts(result["users"], "user"),
    ]
    if result["topDenials"]:
        parts += ["", "Top denial reasons:"]
        parts += [
            f"  {d['reason']} x{d['count']}: {d['example']['namespace']}/"
            f"{d['example']['kind']}/{d['example']['name']} by {d['example']['user']}: "
            f"{d['example']['message']}"
            for d in result["topDenials"]
        ]
    if result["deniedUsers"]:
        parts += [
            "",
            "Denied most: "
            + ", ".join(f"{u['user']} ({u['denied']})" for u in result["deniedUsers"]),
        ]
    parts += ["", f"Not reaching the webhook: {_cell(result['notReachingWebhook'])}"]
    parts += _listing("Unreachable webhook", result["unreachable"], "message")
    parts += _listing("Stored without a decision (must be empty)", result["undecided"], "why")
    parts += _malformed(result)
    return "\n".join(parts)


def render_replay(result: Mapping[str, Any]) -> str:
    parts = [
        f"Replayed {result['writes']} writes, decided {result['decided']} "
        f"(policy: {_cell(result['policy'])})",
    ]
    if "note" in result:
        parts += [f"Note: {result['note']}"]
    parts += _listing("Would be denied", result["denied"], "message")
    parts += _listing("Would warn", result["warned"], "message")
    if "mismatches" in result:
        parts += _listing("Differs from the recorded decision", result["mismatches"], "decision")
    pools = result["pools"]
    headers = ["pool", "budget", "peak", "first overflow"]
    suggest = any("suggestedBudget" in p for p in pools)
    if suggest:
        headers.append("suggested budget")
    rows = [
        [p["pool"], p["budget"], p["peak"], p["firstOverflow"]]
        + ([p.get("suggestedBudget")] if suggest else [])
        for p in pools
    ]
    parts += ["", table(headers, rows)]
    parts += _listing("Not replayed", result["notReplayed"], "why")
    parts += _malformed(result)
    return "\n".join(parts)


def render_verify(result: Mapping[str, Any]) -> str:
    parts = [f"Checked {result['checked']} admitted writes: {result['findingCount']} findings"]
    if result["findings"]:
        parts += [""]
        parts += [
            f"  {f['finding']}: {f['namespace']}/{f['kind']}/{f['name']} at {f['time']} "
            f"({f['auditID']}): {f['detail']}"
            for f in result["findings"]
        ]
    parts += _listing("Unverifiable", result["unverifiable"], "why")
    parts += [f"Signatures: {result['signatures']}"]
    parts += _malformed(result)
    return "\n".join(parts)


def _listing(title: str, items: Sequence[Mapping[str, Any]], detail: str) -> list[str]:
    if not items:
        return ["", f"{title}: none"]
    lines = ["", f"{title}:"]
    for item in items:
        dry = " (dry run)" if item.get("dryRun") else ""
        lines.append(
            f"  {item.get('time', '')} {item.get('namespace', '')}/{item.get('kind', '')}/"
            f"{item.get('name', '')}{dry} by {item.get('user', '')}: {_cell(item.get(detail))}"
        )
    return lines


def _malformed(result: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    lines = result.get("malformedLines") or []
    if lines:
        out += ["", f"Malformed lines ({result['malformed']}, skipped):"]
        out += [f"  {m['source']}:{m['line']}: {m['error']}" for m in lines[:20]]
    failed = result.get("failed") or []
    if failed:
        out += ["", f"Events that could not be processed ({len(failed)}, skipped):"]
        out += [f"  {f['source']}:{f['line']} {f['auditID']}: {f['error']}" for f in failed[:20]]
    return out

"""The pools report: budget, reserved, available and overcommitted per pool, as data or a table.

Also lists what an operator must look at, first: applications whose reservation is unknown (they
block their pool), applications whose values no longer evaluate (they keep their recorded charge);
then, after the pools, applications whose recorded charge differs from what today's contract says
(drift).
"""

from __future__ import annotations

from typing import Any

from webhook.core import resources as rl
from webhook.core.evaluation import Charge
from webhook.core.quantities import format_quantity
from webhook.core.state import ReservationState

__all__ = ["build_report", "explain_charge", "render_explanation", "render_report"]


def build_report(state: ReservationState) -> dict[str, Any]:
    pools = []
    for pool in state.tree.pools():
        pools.append(
            {
                "pool": pool.namespace,
                "budget": rl.to_strings(pool.budget),
                "reserved": rl.to_strings(pool.reserved),
                "available": rl.to_strings(pool.available),
                "overcommitted": rl.to_strings(pool.overcommitted),
                "members": list(pool.members),
                "carveOuts": list(pool.carve_outs),
            }
        )
    unknown = [
        {"application": f"{kind}/{name}", "namespace": ns, "reason": reason}
        for (kind, ns, name), reason in sorted(state.unknown().items())
    ]
    failing = []
    drift = []
    for (kind, ns, name), record in sorted(state.records()):
        where = {"application": f"{kind}/{name}", "namespace": ns}
        if record.problem:
            failing.append({**where, "reason": record.problem})
        if record.drifted:
            drift.append({**where, "recorded": record.digest, "current": record.current_digest})
    # What an operator must act on comes first: unknown reservations block their pools.
    return {"unknown": unknown, "unevaluable": failing, "pools": pools, "drift": drift}


def render_report(report: dict[str, Any]) -> str:
    lines: list[str] = []
    for title, key in (
        ("Unknown reservations (their pools grant nothing more until fixed or deleted)", "unknown"),
        ("No longer evaluable (recorded charge kept)", "unevaluable"),
    ):
        if report[key]:
            lines += [f"{title}:"]
            lines += [f"  {i['namespace']} {i['application']}: {i['reason']}" for i in report[key]]
            lines.append("")
    rows = [("POOL", "BUDGET", "RESERVED", "AVAILABLE", "OVERCOMMITTED", "MEMBERS", "CARVE-OUTS")]
    for pool in report["pools"]:
        rows.append(
            (
                pool["pool"],
                _pairs(pool["budget"]),
                _pairs(pool["reserved"]),
                _pairs(pool["available"]),
                _pairs(pool["overcommitted"]) or "-",
                ",".join(pool["members"]),
                ",".join(pool["carveOuts"]) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    if len(rows) == 1:
        lines.append("(no tenant declares a quota)")
    if report["drift"]:
        lines += ["", "Contract drift (recorded charge kept until the next write):"]
        lines += [
            f"  {i['namespace']} {i['application']}: {i['recorded']} -> {i['current']}"
            for i in report["drift"]
        ]
    return "\n".join(lines)


def _pairs(resources: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in resources.items())


def explain_charge(charge: Charge) -> dict[str, Any]:
    """A charge term by term: which path, which instance type or preset, which count."""
    return {
        "kind": charge.kind,
        "charge": charge.as_strings(),
        "digest": charge.digest,
        "contractDigest": charge.contract_digest,
        **({"exempt": charge.exempt_reason} if charge.exempt_reason else {}),
        "terms": [
            {
                "term": term.term,
                **({"path": term.path} if term.path else {}),
                "count": format_quantity(term.count),
                **({"source": term.source} if term.source else {}),
                "resources": rl.to_strings(term.resources),
            }
            for term in charge.terms
        ],
    }


def render_explanation(explained: dict[str, Any], *, recorded: dict[str, Any] | None) -> str:
    """The explanation as a table, with the recorded charge when it differs (drift)."""
    rows = [("TERM", "PATH", "COUNT", "SOURCE", "RESERVES")]
    for term in explained["terms"]:
        rows.append(
            (
                term["term"],
                term.get("path", "-"),
                term["count"],
                term.get("source", "-"),
                _pairs(term["resources"]) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"{explained['kind']} reserves {_pairs(explained['charge']) or 'nothing'}"]
    if explained.get("exempt"):
        lines.append(f"exempt: {explained['exempt']}")
    else:
        lines += [
            "",
            *("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows),
        ]
    lines += ["", f"digest {explained['digest']} (contract {explained['contractDigest']})"]
    if recorded is not None:
        if recorded["digest"] == explained["digest"]:
            lines.append("recorded at admission: the same charge")
        else:
            lines.append(
                f"recorded at admission: {_pairs(recorded['charge']) or 'nothing'} "
                f"(digest {recorded['digest']}): contract drift; the recorded charge stands "
                "until the application is next written"
            )
    return "\n".join(lines)

"""The pools report: budget, reserved, available and overcommitted per pool, as data or a table.

Also lists what an operator must look at, first: applications whose reservation is unknown (they
block their pool), applications whose values no longer evaluate (they keep their recorded charge),
platform objects left out or kept at their last good version, kinds that cannot be listed; then,
after the pools, applications whose recorded charge differs from what today's contract says
(drift).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from webhook.core import resources as rl
from webhook.core.applications import Application
from webhook.core.evaluation import Charge
from webhook.core.overcommit import apply_factors, format_factors
from webhook.core.quantities import format_quantity
from webhook.core.state import ReservationState
from webhook.core.tenants import TENANT_KIND

__all__ = [
    "build_report",
    "explain_charge",
    "explain_factor",
    "render_explanation",
    "render_report",
]

_ZERO = Decimal(0)


def build_report(state: ReservationState) -> dict[str, Any]:
    pools = []
    discounts = state.pool_discounts()
    for pool in state.tree.pools():
        entry = {
            "pool": pool.namespace,
            "budget": rl.to_strings(pool.budget),
            "reserved": rl.to_strings(pool.reserved),
            "available": rl.to_strings(pool.available),
            "overcommitted": rl.to_strings(pool.overcommitted),
            "members": list(pool.members),
            "carveOuts": list(pool.carve_outs),
        }
        discount = {k: v for k, v in discounts.get(pool.namespace, {}).items() if k in pool.budget}
        if discount:
            committed = rl.add(pool.reserved, discount)
            beyond = {
                key: f"{max(committed.get(key, _ZERO) - limit, _ZERO) * 100 / limit:.1f}%"
                for key, limit in pool.budget.items()
                if limit
            }
            entry.update(
                committed=rl.to_strings(committed),
                discount=rl.to_strings(discount),
                soldBeyondBudget=beyond,
            )
        pools.append(entry)
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
            drift.append(
                {
                    **where,
                    "recorded": record.digest,
                    "current": record.current_digest,
                    "recordedCharge": rl.to_strings(record.resources),
                    "currentCharge": rl.to_strings(record.current or {}),
                }
            )
    # What an operator must act on comes first: unknown reservations block their pools.
    unavailable = [
        {"kind": kind, "reason": reason}
        for kind in sorted(state.platform.kinds)
        if (reason := state.kind_unavailable(kind))
    ]
    return {
        "unknown": unknown,
        "unevaluable": failing,
        "platformProblems": list(state.platform.problems),
        "unavailableKinds": unavailable,
        "pools": pools,
        "drift": drift,
    }


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
    if report.get("platformProblems"):
        lines += ["Platform problems (objects left out or kept at their last good version):"]
        lines += [f"  {problem}" for problem in report["platformProblems"]]
        lines.append("")
    if report.get("unavailableKinds"):
        lines += ["Kinds that cannot be listed (their writes are denied):"]
        lines += [f"  {i['kind']}: {i['reason']}" for i in report["unavailableKinds"]]
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
    discounted = [pool for pool in report["pools"] if pool.get("discount")]
    if discounted:
        lines += ["", "Overcommit factors (committed = reserved + discount):"]
        lines += [
            f"  {pool['pool']}: committed {_pairs(pool['committed'])}, discount "
            f"{_pairs(pool['discount'])}, sold beyond budget {_pairs(pool['soldBeyondBudget'])}"
            for pool in discounted
        ]
    if report["drift"]:
        lines += ["", "Contract drift (recorded charge kept until the next write):"]
        lines += [
            f"  {i['namespace']} {i['application']}: "
            f"{_pairs(i['recordedCharge']) or 'nothing'} ({i['recorded']}) -> "
            f"{_pairs(i['currentCharge']) or 'nothing'} ({i['current']})"
            for i in report["drift"]
        ]
    return "\n".join(lines)


def _pairs(resources: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in resources.items())


def explain_factor(state: ReservationState, app: Application, charge: Charge) -> dict[str, Any]:
    """The overcommit factor applied to ``app`` and where it came from: as the state believes
    it when the state can verify the object's record, else as the record on the object says
    (written and signed by the webhook; a reader without the key cannot check the signature)."""
    if state.trusted(app) is not None or app.recorded is None:
        own = state.believed_own(app) if app.kind != TENANT_KIND else None
        factors, source = state.factors_for(app.namespace, own)
        how = "believed"
    else:
        factors, source, how = dict(app.recorded.factor), app.recorded.source, "recorded"
    factors = {key: value for key, value in factors.items() if value != 1}
    if not factors:
        return {}
    where = "the application" if source == "application" else f"tenant {source}"
    return {
        "factor": format_factors(factors),
        "source": where,
        "as": how,
        "committed": charge.as_strings(),
        "reserved": rl.to_strings(apply_factors(charge.resources, factors)),
    }


def explain_charge(charge: Charge, *, overcommit: dict[str, Any] | None = None) -> dict[str, Any]:
    """A charge term by term: which path, which instance type or preset, which count."""
    return {
        **({"overcommit": overcommit} if overcommit else {}),
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
    factor = explained.get("overcommit")
    if factor:
        lines += [
            "",
            f"overcommit {factor['factor']} from {factor['source']} ({factor['as']}): "
            f"reserves {_pairs(factor['reserved'])} of the {_pairs(factor['committed'])} "
            "it commits",
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

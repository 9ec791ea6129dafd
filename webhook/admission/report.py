"""The pools report: data for JSON and YAML, tables for people.

Also lists what an operator must look at, first: applications whose reservation is unknown (they
block their pool), applications whose values no longer evaluate (they keep their recorded charge),
platform objects left out or kept at their last good version, kinds that cannot be listed; then,
after the pools, applications whose recorded charge differs from what today's contract says
(drift).

Data (``-o json``, ``-o yaml``) carries exact canonical quantities (``13056Mi``); tables carry
human ones (``12.75Gi``, :mod:`webhook.admission.rendering`), and ``-o wide`` adds every
column. Charge explanations are :mod:`webhook.admission.explanations`, re-exported here for the
commands that import them from this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from webhook.admission.explanations import explain_charge, explain_factor, render_explanation
from webhook.admission.rendering import dump, human_quantity, pairs, table
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.tenancy.counts import counted_plural, is_count_key
from webhook.core.tenancy.tenants import ancestors

__all__ = [
    "FAIL_ON",
    "OUTPUTS",
    "build_report",
    "dump",
    "explain_charge",
    "explain_factor",
    "failures",
    "human_quantity",
    "render_explanation",
    "render_report",
]

OUTPUTS: Final = ("table", "wide", "json", "yaml")
FAIL_ON: Final = ("unknown", "drift", "overcommitted")
_ZERO = Decimal(0)


def build_report(state: ReservationState, *, namespace: str = "") -> dict[str, Any]:
    """Every pool, or with ``namespace`` the pool it is in and every pool below it."""
    inside = _scope(state, namespace)
    pools = []
    discounts = state.pool_discounts()
    for pool in state.tree.pools():
        if inside is not None and pool.namespace not in inside["pools"]:
            continue
        entry = {
            "pool": pool.namespace,
            "budget": rl.to_strings(pool.budget),
            "reserved": rl.to_strings(pool.reserved),
            "available": rl.to_strings(pool.available),
            "overcommitted": rl.to_strings(pool.overcommitted),
            "members": list(pool.members),
            "carveOuts": list(pool.carve_outs),
            # Applications per kind the pool holds now (its subtree, less carve-outs that count
            # that kind themselves), limited or not: what a count budget would start from.
            "counts": _counts(state, pool.namespace),
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

    def wanted(ns: str) -> bool:
        return not namespace or namespace in ancestors(ns)

    unknown = [
        {"application": f"{kind}/{name}", "namespace": ns, "reason": reason}
        for (kind, ns, name), reason in sorted(state.unknown().items())
        if wanted(ns)
    ]
    failing = []
    drift = []
    for (kind, ns, name), record in sorted(state.records()):
        if not wanted(ns):
            continue
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
    mislabelled = [
        {
            "application": f"{kind}/{name}",
            "namespace": ns,
            "helmRelease": found.release,
            "nameLabel": found.label,
            "reason": found.explain((kind, ns, name)),
        }
        for (kind, ns, name), found in state.mislabelled().items()
        if wanted(ns)
    ]
    # What an operator must act on comes first: unknown reservations block their pools.
    unavailable = [
        {"kind": kind, "reason": reason}
        for kind in sorted(state.platform.kinds)
        if (reason := state.kind_unavailable(kind))
    ]
    report: dict[str, Any] = {
        "unknown": unknown,
        "unevaluable": failing,
        "mislabelled": mislabelled,
        "platformProblems": list(state.platform.problems),
        "unavailableKinds": unavailable,
        "pools": pools,
        "drift": drift,
    }
    if inside is not None:
        report["namespace"] = {
            "name": namespace,
            "known": inside["known"],
            "pool": inside["pool"],
            # Cozystack's EnforcedHard: what this namespace's own applications could still hold.
            "ceiling": rl.to_strings(state.tree.ceiling(namespace)),
        }
    return report


def _counts(state: ReservationState, pool: str) -> dict[str, str]:
    node = state.tree.get(pool)
    usage = node.usage if node is not None else {}
    return rl.to_strings({k: v for k, v in sorted(usage.items()) if is_count_key(k) and v})


def _scope(state: ReservationState, namespace: str) -> dict[str, Any] | None:
    if not namespace:
        return None
    root = state.tree.pool_root(namespace)
    below = {
        pool.namespace for pool in state.tree.pools() if namespace in ancestors(pool.namespace)
    }
    return {
        "known": state.tree.get(namespace) is not None,
        "pool": root.namespace if root is not None else None,
        "pools": below | ({root.namespace} if root is not None else set()),
    }


def failures(report: Mapping[str, Any], fail_on: Sequence[str]) -> list[str]:
    """What ``--fail-on`` asked about and the report found, one phrase each."""
    found = []
    if "unknown" in fail_on:
        count = len(report["unknown"]) + len(report["unevaluable"])
        if count:
            found.append(f"{count} application(s) with an unknown or unevaluable reservation")
    if "drift" in fail_on and report["drift"]:
        found.append(f"{len(report['drift'])} application(s) with contract drift")
    if "overcommitted" in fail_on:
        over = [p["pool"] for p in report["pools"] if p["overcommitted"]]
        if over:
            found.append(f"{len(over)} overcommitted pool(s): {', '.join(over)}")
    return found


def render_report(report: dict[str, Any], *, wide: bool = False) -> str:
    """The report as tables: a row per pool and resource, then what needs a look.

    One row per resource keeps the table narrow whatever keys a budget sets; ``wide`` adds who
    is in each pool and its carve-outs.
    """
    header = ["POOL", "RESOURCE", "BUDGET", "RESERVED", "AVAILABLE", "OVERCOMMITTED", "MEMBERS"]
    if wide:
        header.append("CARVE-OUTS")
    rows = [tuple(header)]
    for pool in report["pools"]:
        for index, key in enumerate(pool["budget"]):
            first = index == 0
            members = ",".join(pool["members"]) if wide else str(len(pool["members"]))
            row = [
                pool["pool"] if first else "",
                key,
                human_quantity(pool["budget"][key]),
                human_quantity(pool["reserved"].get(key, "0")),
                human_quantity(pool["available"].get(key, "0")),
                human_quantity(pool["overcommitted"][key]) if key in pool["overcommitted"] else "-",
                members if first else "",
            ]
            if wide:
                row.append((",".join(pool["carveOuts"]) or "-") if first else "")
            rows.append(tuple(row))
    # What an operator must act on comes first: unknown reservations block their pools.
    lines: list[str] = []
    for title, key in (
        ("Unknown reservations (their pools grant nothing more until fixed or deleted)", "unknown"),
        ("No longer evaluable (recorded charge kept)", "unevaluable"),
        ("HelmReleases labelled with another application's name (remove each)", "mislabelled"),
    ):
        if report.get(key):
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
    lines += table(rows)
    scope = report.get("namespace")
    if len(rows) == 1:
        if scope is None:
            lines.append("(no tenant declares a quota)")
        elif not scope["known"]:
            lines.append(
                f"(namespace {scope['name']} is unknown: no tenant owns it and no application "
                "lives in it)"
            )
        else:
            lines.append(f"(no quota at or above {scope['name']}: it is in no pool)")
    if scope is not None and scope["known"]:
        where = f"in pool {scope['pool']}" if scope["pool"] else "in no pool"
        lines += ["", f"{scope['name']} is {where}."]
        if scope["ceiling"]:
            ceiling = pairs(scope["ceiling"], human=True).replace(",", ", ")
            lines.append(f"{scope['name']}'s own applications can reserve at most: {ceiling}")
    counted = [pool for pool in report["pools"] if pool.get("counts")]
    if counted:
        lines += ["", "Applications per pool (count/<plural>.apps.cozystack.io, limited or not):"]
        lines += [f"  {pool['pool']}: {pairs(_short_counts(pool['counts']))}" for pool in counted]
    discounted = [pool for pool in report["pools"] if pool.get("discount")]
    if discounted:
        lines += ["", "Overcommit factors (committed = reserved + discount):"]
        lines += [
            f"  {pool['pool']}: committed {pairs(pool['committed'])}, discount "
            f"{pairs(pool['discount'])}, sold beyond budget {pairs(pool['soldBeyondBudget'])}"
            for pool in discounted
        ]
    if report["drift"]:
        lines += ["", "Contract drift (recorded charge kept until the next write):"]
        lines += [
            f"  {i['namespace']} {i['application']}: "
            f"{pairs(i['recordedCharge']) or 'nothing'} ({i['recorded']}) -> "
            f"{pairs(i['currentCharge']) or 'nothing'} ({i['current']})"
            for i in report["drift"]
        ]
    return "\n".join(lines)


def _short_counts(counts: Mapping[str, str]) -> dict[str, str]:
    """``count/vminstances.apps.cozystack.io`` reads ``vminstances`` in a table line."""
    return {counted_plural(key) or key: value for key, value in counts.items()}

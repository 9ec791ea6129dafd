"""The pools report and charge explanations: data for JSON and YAML, tables for people.

Also lists what an operator must look at, first: applications whose reservation is unknown (they
block their pool), applications whose values no longer evaluate (they keep their recorded charge),
platform objects left out or kept at their last good version, kinds that cannot be listed; then,
after the pools, applications whose recorded charge differs from what today's contract says
(drift).

Data (``-o json``, ``-o yaml``) carries exact canonical quantities (``13056Mi``); tables carry
human ones (``12.75Gi``), and ``-o wide`` adds every column.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Final

from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.quantities import format_quantity, parse_quantity
from webhook.core.pricing.evaluation import Charge
from webhook.core.pricing.volumes import hold, mark_key
from webhook.core.tenancy.applications import Application
from webhook.core.tenancy.counts import counted_plural, is_count_key
from webhook.core.tenancy.overcommit import apply_factors, format_factors
from webhook.core.tenancy.tenants import TENANT_KIND, ancestors

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
_BINARY: Final = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20))
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
    # What an operator must act on comes first: unknown reservations block their pools.
    unavailable = [
        {"kind": kind, "reason": reason}
        for kind in sorted(state.platform.kinds)
        if (reason := state.kind_unavailable(kind))
    ]
    report: dict[str, Any] = {
        "unknown": unknown,
        "unevaluable": failing,
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


def dump(data: Any, output: str) -> str:
    """Data as JSON (indented) or YAML, exact quantities as they are."""
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False)).rstrip("\n")
    return json.dumps(data, indent=2)


def human_quantity(text: str) -> str:
    """A canonical quantity for a table: ``13056Mi`` reads ``12.75Gi``, ``7500m`` reads ``7.5``.

    Binary byte quantities are shown in the largest unit they reach, to two decimals at most;
    the exact figure is what JSON and YAML carry.
    """
    if text.endswith("m") and text[:-1].isdigit() and int(text[:-1]) >= 1000:
        return f"{Decimal(text[:-1]).scaleb(-3).normalize():f}"  # 7500m of CPU reads 7.5
    if not text.endswith(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")):
        return text
    value = parse_quantity(text)
    for suffix, unit in _BINARY:
        if value >= unit:
            shown = (value / unit).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
            return f"{shown.normalize():f}{suffix}"
    return text


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
    lines += _table(rows)
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
            pairs = _pairs(scope["ceiling"], human=True).replace(",", ", ")
            lines.append(f"{scope['name']}'s own applications can reserve at most: {pairs}")
    counted = [pool for pool in report["pools"] if pool.get("counts")]
    if counted:
        lines += ["", "Applications per pool (count/<plural>.apps.cozystack.io, limited or not):"]
        lines += [f"  {pool['pool']}: {_pairs(_short_counts(pool['counts']))}" for pool in counted]
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


def _short_counts(counts: Mapping[str, str]) -> dict[str, str]:
    """``count/vminstances.apps.cozystack.io`` reads ``vminstances`` in a table line."""
    return {counted_plural(key) or key: value for key, value in counts.items()}


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _pairs(resources: Mapping[str, str], *, human: bool = False) -> str:
    return ",".join(f"{k}={human_quantity(v) if human else v}" for k, v in resources.items())


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


def explain_charge(
    charge: Charge,
    *,
    written: object = None,
    defaulted: object = None,
    overcommit: dict[str, Any] | None = None,
    marks: Mapping[str, Decimal] | None = None,
    released: Iterable[str] = (),
) -> dict[str, Any]:
    """A charge term by term: which path, which instance type or preset, which count.

    Given the values as ``written`` and as ``defaulted`` by the schema, it also lists the
    defaults the tenant did not write, and marks a term whose source is one of them. Given the
    volume ``marks`` of the object's record, a volume term the marks hold above what its values
    say shows ``heldAt`` (a persistent volume never shrinks), and the charge is the held one.
    """
    defaults = schema_defaults(written, defaulted) if defaulted is not None else {}
    default_names = {v for v in defaults.values() if isinstance(v, str)}
    held = hold(charge, marks or {}, released)
    terms = []
    for term in charge.terms:
        entry: dict[str, Any] = {"term": term.term}
        if term.path:
            entry["path"] = term.path
        entry["count"] = format_quantity(term.count)
        if term.source:
            entry["source"] = term.source
            used = sorted(n for n in default_names if n and _names(term.source, n))
            if used:
                entry["schemaDefaults"] = used
        entry["resources"] = rl.to_strings(term.resources)
        if term.volume:
            entry["volume"] = term.volume
            kept = held.held.get(mark_key(term))
            if kept is not None:
                entry["heldAt"] = format_quantity(kept[1])
        terms.append(entry)
    gone = {k: v for k, v in held.held.items() if k not in {mark_key(t) for t in charge.terms}}
    return {
        **({"overcommit": overcommit} if overcommit else {}),
        "kind": charge.kind,
        "charge": rl.to_strings(held.charge.resources),
        **({"evaluated": charge.as_strings()} if held.held else {}),
        **(
            {"heldVolumes": {k: format_quantity(v[1]) for k, v in sorted(gone.items())}}
            if gone
            else {}
        ),
        "digest": charge.digest,
        "contractDigest": charge.contract_digest,
        **({"exempt": charge.exempt_reason} if charge.exempt_reason else {}),
        "terms": terms,
        **({"defaults": defaults} if defaults else {}),
    }


MAX_DEFAULTS: Final = 40


def _names(text: str, name: str) -> bool:
    """Whether ``text`` mentions ``name`` as a whole word (``u1.medium``, not ``u1.medium2``)."""
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", text) is not None


def schema_defaults(written: object, defaulted: object, path: str = "") -> dict[str, Any]:
    """The scalar values present in ``defaulted`` but not in ``written``, by dotted path."""
    found: dict[str, Any] = {}
    if isinstance(defaulted, Mapping):
        mine = written if isinstance(written, Mapping) else {}
        for key, value in defaulted.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in mine:
                if isinstance(value, Mapping | list):
                    found.update(schema_defaults(None, value, where))
                else:
                    found[where] = value
            else:
                found.update(schema_defaults(mine[key], value, where))
            if len(found) >= MAX_DEFAULTS:
                break
    elif isinstance(defaulted, list) and not isinstance(written, list):
        for index, value in enumerate(defaulted):
            found.update(schema_defaults(None, value, f"{path}[{index}]"))
    return dict(list(found.items())[:MAX_DEFAULTS])


def render_explanation(
    explained: dict[str, Any], *, recorded: dict[str, Any] | None = None, wide: bool = False
) -> str:
    """The explanation as a table, with the recorded charge when it differs (drift)."""
    human = True
    rows = [("TERM", "PATH", "COUNT", "SOURCE", "RESERVES")]
    for term in explained["terms"]:
        source = term.get("source", "-")
        if term.get("schemaDefaults"):
            source += f" ({', '.join(term['schemaDefaults'])}: schema default, not written)"
        reserves = _pairs(term["resources"], human=human) or "-"
        if term.get("heldAt"):
            reserves += f"; storage held at its high mark {term['heldAt']}"
        rows.append((term["term"], term.get("path", "-"), term["count"], source, reserves))
    charge = _pairs(explained["charge"], human=human) or "nothing"
    lines = [f"{explained['kind']} reserves {charge}"]
    if explained.get("exempt"):
        lines.append(f"exempt: {explained['exempt']}")
    else:
        lines += ["", *_table(rows)]
    if explained.get("evaluated"):
        lines += [
            "",
            f"its values alone say {_pairs(explained['evaluated'], human=human) or 'nothing'}: "
            "a persistent volume never shrinks and removed replicas keep theirs, so volumes are "
            "held at their high mark until the application is deleted",
        ]
        for where, size in (explained.get("heldVolumes") or {}).items():
            lines.append(f"  {where}: {size} (its replicas or item are gone, its volumes are not)")
    if explained.get("defaults"):
        lines += ["", "Not written, so the schema's defaults were used:"]
        lines += [f"  {k}: {json.dumps(v)}" for k, v in explained["defaults"].items()]
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

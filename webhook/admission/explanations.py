"""Charge explanations: a charge term by term, and where its overcommit factor came from.

``webhook explain`` and ``kubectl reservation explain`` show which path of the values each term
read, which instance type or preset it resolved, which count it multiplied by, which of those
the schema defaulted rather than the tenant wrote, and what a persistent volume is held at (a
volume never shrinks); then, beside the recorded charge, whether the contract has drifted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, Final

from webhook.admission.rendering import pairs, table
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.quantities import format_quantity
from webhook.core.pricing.evaluation import Charge
from webhook.core.pricing.volumes import hold, mark_key
from webhook.core.tenancy.applications import Application
from webhook.core.tenancy.overcommit import apply_factors, format_factors
from webhook.core.tenancy.tenants import TENANT_KIND

__all__ = ["explain_charge", "explain_factor", "render_explanation", "schema_defaults"]


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
        reserves = pairs(term["resources"], human=human) or "-"
        if term.get("heldAt"):
            reserves += f"; storage held at its high mark {term['heldAt']}"
        rows.append((term["term"], term.get("path", "-"), term["count"], source, reserves))
    charge = pairs(explained["charge"], human=human) or "nothing"
    lines = [f"{explained['kind']} reserves {charge}"]
    if explained.get("exempt"):
        lines.append(f"exempt: {explained['exempt']}")
    else:
        lines += ["", *table(rows)]
    if explained.get("evaluated"):
        lines += [
            "",
            f"its values alone say {pairs(explained['evaluated'], human=human) or 'nothing'}: "
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
            f"reserves {pairs(factor['reserved'])} of the {pairs(factor['committed'])} "
            "it commits",
        ]
    lines += ["", f"digest {explained['digest']} (contract {explained['contractDigest']})"]
    if recorded is not None:
        if recorded["digest"] == explained["digest"]:
            lines.append("recorded at admission: the same charge")
        else:
            lines.append(
                f"recorded at admission: {pairs(recorded['charge']) or 'nothing'} "
                f"(digest {recorded['digest']}): contract drift; the recorded charge stands "
                "until the application is next written"
            )
    return "\n".join(lines)

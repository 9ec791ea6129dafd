"""What the live state holds of each application: its canonical spec, charge record and version.

Of each application only what re-pricing it needs is held, reduced from each list page as it
arrives (never whole objects), its strings interned; the long-lived state this builds is then
moved out of the garbage collector's way, so a full collection does not pause admission.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any, Final

import orjson

from webhook.core.base.json_codec import decode_json
from webhook.core.pricing.bounds import DEFAULT_VALUES_LIMITS
from webhook.core.tenancy.applications import (
    CHARGE_ANNOTATION,
    Application,
    parse_recorded_charge,
    resource_version,
)

__all__ = [
    "CANONICAL",
    "Held",
    "held_application",
    "held_from_object",
    "holds_same",
    "settle_memory",
]

log = logging.getLogger("webhook.state.live")
Obj = dict[str, Any]
# An application's canonical spec (JSON), charge annotation, and resourceVersion (which orders
# observations for the ledger: only one newer than an admission settles its entry).
Held = tuple[str, str | None, int]
CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
# Where a spec nested past what CANONICAL recurses is cut (twice the values' depth bound).
_CUT: Final = 2 * DEFAULT_VALUES_LIMITS.max_depth


def settle_memory(*, first: bool) -> None:
    """Move the long-lived state out of the garbage collector's way.

    A full collection walks every tracked object: with 200,000 applications it pauses for
    tens of milliseconds, behind the admission tail. Once the state is built, frozen objects
    are skipped. After a swap the old state's objects are unfrozen first, so what is garbage
    among them is collected once.
    """
    if not first:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


def held_from_object(kind: str, obj: Obj) -> tuple[tuple[str, str], Held] | None:
    """What the state needs from an application object (its spec and charge annotation);
    ``None``, logged, for one that names no application."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        reason = "metadata: missing"
    else:
        name, namespace = metadata.get("name"), metadata.get("namespace")
        if not isinstance(name, str) or not name:
            reason = "metadata.name: missing"
        elif not isinstance(namespace, str) or not namespace:
            reason = "metadata.namespace: missing"
        else:
            annotations = metadata.get("annotations")
            note = annotations.get(CHARGE_ANNOTATION) if isinstance(annotations, Mapping) else None
            spec = sys.intern(_canonical_spec(obj.get("spec")))
            recorded = sys.intern(note) if isinstance(note, str) else None
            version = resource_version(metadata.get("resourceVersion"))
            return (sys.intern(namespace), name), (spec, recorded, version)
    log.warning("application ignored", extra={"fields": {"kind": kind, "reason": reason}})
    return None


def holds_same(held: Held, obj: Obj) -> bool:
    """Whether ``obj`` carries exactly the spec and charge annotation ``held`` holds, told at a
    small part of what reducing it again costs (about 1 ms for a spec of 28,000 keys, against
    some 30 ms to encode it canonically, decode it and price it again).

    orjson's compact encoding with sorted keys is the canonical JSON's text whenever it is
    ASCII, as the canonical text always is, and equal texts are equal values. Where the two
    encoders differ (a non-ASCII string, a float orjson writes otherwise, an integer past 64
    bits or nesting past 254 levels, which orjson refuses) the answer is no, and the object is
    reduced as before: a wrong "no" costs time, never a "yes" for a spec that changed. orjson
    writes NaN and infinities as ``null``; a watch event never holds them (the API server's
    JSON encoder refuses to write them)."""
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    note = annotations.get(CHARGE_ANNOTATION) if isinstance(annotations, Mapping) else None
    if (note if isinstance(note, str) else None) != held[1]:
        return False
    try:
        encoded = orjson.dumps(obj.get("spec"), option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError: what only the canonical encoder writes
        return False
    return len(encoded) == len(held[0]) and encoded == held[0].encode()


def _canonical_spec(spec: object) -> str:
    """The spec's canonical JSON; for one nested past what the encoder recurses (some 950
    levels, which a review decodes to: admitted in warn or off, where the values bound only
    warns), the spec cut :data:`_CUT` levels down. The cut is refused by that bound as the
    whole is, so the application is held as one that cannot be evaluated (its last believed
    record counts, else it is unknown), never raised out of the list page carrying it: that
    would stop its kind's reflector for good, and with it every tenant's admissions."""
    try:
        return CANONICAL.encode(spec)
    except RecursionError:
        return CANONICAL.encode(_cut(spec, _CUT))


def _cut(value: object, levels: int) -> object:
    """``value`` down to ``levels`` levels of maps and lists, each deeper one left empty."""
    if isinstance(value, Mapping):
        return {k: _cut(v, levels - 1) for k, v in value.items()} if levels > 1 else {}
    if isinstance(value, list | tuple):
        return [_cut(v, levels - 1) for v in value] if levels > 1 else []
    return value


def held_application(kind: str, namespace: str, name: str, held: Held) -> Application:
    spec, recorded, version = held
    # Decoded as json.loads would (by orjson where that is the same): once per event, and
    # once per held application at every re-price.
    return Application(
        kind,
        namespace,
        name,
        decode_json(spec.encode()),
        parse_recorded_charge(recorded),
        version=version,
    )

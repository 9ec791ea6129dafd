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
from typing import Any

from webhook.core.base.json_codec import decode_json
from webhook.core.tenancy.applications import (
    CHARGE_ANNOTATION,
    Application,
    parse_recorded_charge,
    resource_version,
)

__all__ = ["CANONICAL", "Held", "held_application", "held_from_object", "settle_memory"]

log = logging.getLogger("webhook.state.live")
Obj = dict[str, Any]
# An application's canonical spec (JSON), charge annotation, and resourceVersion (which orders
# observations for the ledger: only one newer than an admission settles its entry).
Held = tuple[str, str | None, int]
CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


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
            spec = sys.intern(CANONICAL.encode(obj.get("spec")))
            recorded = sys.intern(note) if isinstance(note, str) else None
            version = resource_version(metadata.get("resourceVersion"))
            return (sys.intern(namespace), name), (spec, recorded, version)
    log.warning("application ignored", extra={"fields": {"kind": kind, "reason": reason}})
    return None


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

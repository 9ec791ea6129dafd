"""What a pool's ``TenantReservation`` lists, field by field: entries, their holds, caps, counts.

Each entry is one admitted increase not yet observed: its request uid, its object
(``kind/namespace/name``), what it adds to the pool (``charge``), the charge its object is
expected to carry (``expected``, left out when it is the ``charge``, as a CREATE's is), its
expiry, the replica that wrote it, the ledger revision that admitted it, ``update`` for an
UPDATE (whose charge stays a floor under its application until it expires) and, for a dry run,
``dryRun`` and the previews it ``replaces``. Everything here reads what any
replica, or a tenant able to write the object, may have put there: a malformed field counts as
absent, never as a crash. Expiries are RFC 3339 in one fixed UTC form, so comparing one costs a
string comparison, not a parse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from webhook.admission.ledger import bounds
from webhook.core.admission.carveouts import Cap
from webhook.core.admission.decisions import Decision
from webhook.core.admission.pending import Hold
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.base import resources as rl
from webhook.core.base.json_codec import encode_json
from webhook.core.base.quantities import parse_quantity
from webhook.core.tenancy.applications import AppKey, resource_version
from webhook.core.tenancy.tenants import TENANT_KIND
from webhook.kube.client import ResourceRef

__all__ = [
    "TENANT_RESERVATIONS",
    "Obj",
    "caps",
    "expired",
    "expiry",
    "hold_of",
    "kind_of",
    "listed",
    "listed_size",
    "parse_hold",
    "previews",
    "quantities",
    "raw_caps",
    "released",
    "same",
    "size",
    "version",
]

Obj = dict[str, Any]

TENANT_RESERVATIONS: Final = ResourceRef(
    "reservation.cozystack.io", "v1alpha1", "tenantreservations"
)
# Expiries: RFC 3339 with microseconds, always this width, UTC: they compare in time order as
# strings (whole seconds would expire an entry up to a second early).
_EXPIRY: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def expiry(seconds: float) -> str:
    """``seconds`` (since the epoch) as expiries are written: ``strftime(_EXPIRY)``, with
    the whole second formatted once per second rather than once per entry."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return f"{whole_second(moment.replace(microsecond=0))}.{moment.microsecond:06d}Z"


@functools.lru_cache(maxsize=8)
def whole_second(moment: datetime) -> str:
    """``moment`` to the second, as RFC 3339 without a zone (the same one asked again and
    again: every entry and status of a busy second)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def listed(obj: Mapping[str, Any]) -> list[Obj]:
    """The entries ``obj`` lists (anything but an object left out)."""
    entries = (obj.get("status") or {}).get("pending") or []
    return [e for e in entries if isinstance(e, dict)]


def expired(entry: Mapping[str, Any], now: str) -> bool:
    expires = entry.get("expires")
    return not isinstance(expires, str) or len(expires) != len(now) or expires <= now


def kind_of(entry: Mapping[str, Any]) -> str:
    return str(entry.get("application") or "").partition("/")[0]


def released(status: Mapping[str, Any]) -> dict[str, int]:
    """The object's removal counts by kind (a hostile or missing value counts as none)."""
    counts = status.get("released")
    if not isinstance(counts, Mapping):
        return {}
    return {
        str(kind): count
        for kind, count in counts.items()
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0
    }


def raw_caps(status: Mapping[str, Any]) -> dict[str, Any]:
    caps = status.get("capped")
    return dict(caps) if isinstance(caps, Mapping) else {}


def caps(status: Mapping[str, Any]) -> dict[str, Cap]:
    """The caps a ledger object lists (a malformed one is left out)."""
    found = {}
    for owned, raw in raw_caps(status).items():
        if isinstance(raw, Mapping) and isinstance(raw.get("digest"), str):
            declared, counted = quantities(raw.get("declared")), quantities(raw.get("counted"))
            found[str(owned)] = Cap(raw["digest"], declared, counted)
    return found


def parse_hold(pool: str, entry: Obj, version: int, known: Mapping[str, tuple[Obj, Hold]]) -> Hold:
    """The entry as a hold; parsed once per entry, not once per version of the object."""
    hold_id = str(entry.get("id") or "")
    after = resource_version(entry.get("revision")) or version
    cached = known.get(hold_id)
    if cached is not None and same(cached[0], entry):
        hold = cached[1]
        return hold if hold.after == after else dataclasses.replace(hold, after=after)
    _, _, rest = str(entry.get("application") or "").partition("/")
    namespace, _, name = rest.partition("/")
    key: AppKey = (kind_of(entry), namespace, name)
    return Hold(
        id=hold_id,
        key=key,
        namespace=pool,
        increase=quantities(entry.get("charge")),
        charge=quantities(entry["expected"] if "expected" in entry else entry.get("charge")),
        after=after,
        preview=entry.get("dryRun") is True,
        until=str(entry.get("expires") or ""),
        update=entry.get("update") is True,
    )


def hold_of(entry: Obj, decision: Decision, pool: str) -> Hold:
    """The hold for an entry this replica writes, without parsing back what it formatted
    (an entry replacing previews holds more than the decision charged: it is parsed)."""
    kind, namespace, name = str(entry["application"]).split("/", 2)
    increase = dict(decision.charged_pools[pool])
    if entry["charge"] != rl.to_strings(increase):
        increase = quantities(entry["charge"])
    expected = dict(decision.expected or {})
    if kind == TENANT_KIND:  # its entry lists only the quota keys its pool bounds
        expected = quantities(entry["expected"]) if "expected" in entry else increase
    return Hold(
        id=str(entry["id"]),
        key=(kind, namespace, name),
        namespace=pool,
        increase=increase,
        charge=expected,
        preview=entry.get("dryRun") is True,
        until=str(entry.get("expires") or ""),
        update=entry.get("update") is True,
    )


def previews(request: AdmissionRequest, entries: Iterable[Obj], taken: set[str]) -> list[str]:
    """The ids of the preview entries among ``entries`` that ``request`` replaces: dry-run
    entries of the same object (never a real one, never the request's own, never ``taken``)."""
    application = f"{request.kind}/{request.namespace}/{request.name}"
    return [
        str(entry["id"])
        for entry in entries
        if entry.get("dryRun") is True
        and entry.get("application") == application
        and entry.get("id") != request.uid
        and entry.get("id") not in taken
    ]


def size(entry: Mapping[str, Any]) -> int:
    """An entry's size as the ledger writes it (compact JSON): serialised by orjson, which
    takes a microsecond for an entry, less than estimating it field by field would."""
    return len(encode_json(entry))


def listed_size(entry: Mapping[str, Any]) -> int:
    """:func:`size` of ``entry`` as every later write lists it: stamped with its revision
    (``,"revision":""`` and its digits), and the comma that follows it in the list."""
    grown = 0 if "revision" in entry else len(',"revision":""') + bounds.REVISION_BYTES
    return size(entry) + grown + 1


def same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = ("application", "charge", "expected", "dryRun", "update")
    return all(a.get(k) == b.get(k) for k in keys)


def quantities(values: object) -> dict[str, Decimal]:
    if not isinstance(values, Mapping):
        return {}
    result = {}
    for key, value in values.items():
        with contextlib.suppress(Exception):
            result[str(key)] = parse_quantity(value)
    return result


def version(obj: Mapping[str, Any]) -> int:
    return resource_version((obj.get("metadata") or {}).get("resourceVersion"))

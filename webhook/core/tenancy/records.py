"""Signed charge records: what the webhook writes on an object, and the only thing it trusts back.

The charge annotation is authoritative for pool usage and is the "old charge" of an UPDATE, so a
value a tenant could write would be a discount on its own budget. The webhook therefore signs
what it records with a key only it holds (HMAC-SHA256), over everything the figure depends on:

    the id of the key, kind, namespace, name, the object's uid (once the API server has given
    it one: every record written on an UPDATE), the digest of the (defaulted) values it charged,
    the charge, the charge digest (contract and catalog entries used), the overcommit factor
    applied, what was committed (declared) before the factor, the object's own factor, the high
    marks of its persistent volumes, whether it was computed for a dry run, and on a CREATE the
    uid of the admission call that computed it (the request it was minted for: a later create
    of the same name carries another, so the record names one request, not only the object).

A record is believed only when its MAC verifies under the key its id names *and* its values
digest matches the object's values as they stand *and* it was not minted by a dry run *and* its
uid, when it has one, is the object's. Anything else (forged, copied from another object or
from a deleted one of the same name, left over from an older spec, signed with a retired key)
is ignored and the object is evaluated as it stands. Which record an UPDATE may carry is
narrower still, and decided by :mod:`webhook.core.admission.resolve`: the stored object's own
record, unchanged, or the one computed for this very request (:meth:`RecordedCharge.content`).

The keys, and their ids, are :mod:`webhook.core.tenancy.record_keys` (re-exported here); see
:mod:`webhook.tenancy.record_keys` for where they come from and how they rotate.

Pure: the key is passed in. Over 400 lines: the record's format, its signing (at once, or
content first and signed when read) and its verification (v1 and v2) are one contract; split,
what the signer and the verifier feed the MAC could drift apart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import lru_cache
from itertools import compress
from types import MappingProxyType
from typing import Final

import orjson

from webhook.core.base import resources as rl
from webhook.core.base.errors import QuantityError
from webhook.core.base.quantities import parse_quantity
from webhook.core.tenancy.record_keys import MIN_KEY_BYTES, RecordKeys, key_id

__all__ = [
    "MIN_KEY_BYTES",
    "RecordKeys",
    "RecordedCharge",
    "believed",
    "canonical_sha256",
    "digest_text",
    "key_id",
    "mac",
    "parse_recorded_charge",
    "plain_json",
    "record_annotation",
    "sign",
    "sign_record",
    "signed_annotation",
    "unsigned",
    "values_digest",
    "verifies",
]

# Kubernetes caps all of an object's annotations at 256 KiB; a record is well under 1 KiB.
# A record keeps about one volume mark per forEach item once it has many
# (webhook.core.pricing.volumes): bounded by the values' bounds, and in any case by the 256 KiB all
# annotations may take.
MAX_ANNOTATION_CHARS: Final = 262144
MAC_PREFIX: Final = "hmac-sha256:"
VERSION: Final = "v2"  # v1 records carried no key id, uid, volume marks or dry-run flag
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
# orjson writes the same text as _CANONICAL for str-keyed maps, lists, ASCII strings, booleans,
# ``None`` and 64-bit integers, several times faster; it writes floats (``1e-7`` for ``1e-07``,
# ``null`` for NaN), DEL and non-ASCII characters otherwise, and types _CANONICAL turns into
# ``str()`` not at all. Its text is used only when it holds no float (a scan of a short text; a
# walk over the values' types for a long one, as a scan costs per byte: six million colons
# made it take half a second), no DEL and no byte past ASCII; anything else is written by
# _CANONICAL, as records have always been.
_FAST_OPTIONS: Final = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
_PLAIN_SCALARS: Final = frozenset({str, int, bool, type(None)})
_CONTAINERS: Final = frozenset({dict, list})
_WIDE: Final = 32  # children past which a container's are picked out in C, not one by one
_PLAIN: Final = _PLAIN_SCALARS | _CONTAINERS
# A number token with a fraction or an exponent after what a value follows in compact JSON
# (or a text that is one number): where a float is written. A string that looks like one
# matches too, and merely costs the slow path. Scanned only in texts up to _SCANNED_BYTES: its
# cost is per byte and up to some 70 ns a byte (a string of colons), 4.5 ms at the most.
_FLOAT: Final = re.compile(rb"[:,\[]-?[0-9]+[.eE]")
_NUMBER_START: Final = frozenset(b"-0123456789")  # a text that is one number, maybe a float
_SCANNED_BYTES: Final = 64 * 1024
_COMPACT = json.JSONEncoder(separators=(",", ":"))
_EMPTY: Mapping[str, Decimal] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RecordedCharge:
    """A charge record as read from an object: believed only once :func:`verifies` says so.

    ``resources`` is what the pool is charged (after any overcommit factor); ``factor`` the
    factor applied per key (empty: none); ``committed`` what was declared before the factor
    (empty: the same as ``resources``); ``own`` the object's own overcommit annotation as the
    platform set it (``None``: none), so a factor on a stored object is believed only when a
    record vouches for it; ``values`` the digest of the values charged.
    """

    resources: Mapping[str, Decimal]
    digest: str
    values: str = ""
    mac: str = ""
    factor: Mapping[str, Decimal] = field(default_factory=lambda: _EMPTY)
    committed: Mapping[str, Decimal] = field(default_factory=lambda: _EMPTY)
    own: Mapping[str, Decimal] | None = None
    source: str = ""  # where ``factor`` came from: "application" or a tenant's namespace
    kid: str = ""  # the id of the key that signed it
    uid: str = ""  # the object's uid when the record was computed ("" on CREATE)
    marks: Mapping[str, Decimal] = field(default_factory=lambda: _EMPTY)  # volume high marks
    dry: bool = False  # computed for a dry run: never believed
    # The uid of the admission call that computed it, on a CREATE ("" otherwise, and on every
    # record from before it was kept): only the request it was minted for carries it.
    request: str = ""

    @property
    def declared(self) -> Mapping[str, Decimal]:
        """What was committed before any factor."""
        return self.committed or self.resources

    def content(self) -> tuple[object, ...]:
        """Everything the record says, without who signed it (key id and MAC) and which call it
        was minted for (:attr:`request`, which the validating call cannot recompute): two
        replicas holding different keys during a rotation compute records of equal content."""
        return (
            self.values,
            rl.to_strings(self.resources),
            self.digest,
            rl.to_strings(self.factor),
            rl.to_strings(self.committed),
            None if self.own is None else rl.to_strings(self.own),
            self.source,
            self.uid,
            rl.to_strings(self.marks),
            self.dry,
        )


def values_digest(values: object) -> str:
    """``sha256:<hex>`` of canonical JSON of the values (pass them defaulted)."""
    try:
        return digest_text(canonical_sha256(values))
    except (TypeError, ValueError, RecursionError):
        text = repr(type(values))  # not JSON: no record can match it
    return digest_text(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())


def canonical_sha256(values: object) -> bytes:
    """The SHA-256 of the values' canonical JSON; raises ``TypeError`` or ``ValueError`` for
    values JSON cannot hold. The charge cache keys on it, and :func:`values_digest` shows it."""
    return hashlib.sha256(canonical_json(values)).digest()


def canonical_json(value: object) -> bytes:
    """The canonical JSON of ``value`` as UTF-8: keys sorted, no spaces, ASCII only (the text
    every digest and MAC is taken over); raises as :func:`json.dumps` does."""
    try:
        text = orjson.dumps(value, option=_FAST_OPTIONS)
    except TypeError:  # not plain JSON, an integer past 64 bits, nested past orjson's limit
        pass
    else:
        if text.isascii() and b"\x7f" not in text and _no_float(value, text):
            return text
    return _CANONICAL.encode(value).encode("utf-8", "surrogatepass")


def _no_float(value: object, text: bytes) -> bool:
    """Whether orjson's ``text`` of ``value`` holds no float (so no NaN either): a scan of a
    short text (fast for the values most writes carry), a walk over the types of a long one."""
    if len(text) > _SCANNED_BYTES:
        return plain_json(value)
    return (
        _FLOAT.search(text) is None
        and not (text[0] in _NUMBER_START and (b"." in text or b"e" in text))
        # ``null`` is None, or a NaN or an infinity: only the first reads back as it was
        and (b"null" not in text or orjson.loads(text) == value)
    )


def plain_json(value: object) -> bool:
    """Whether ``value`` holds only maps, lists, strings, integers, booleans and ``None`` (no
    float, so every ``null`` is a None, and no subclass): one look at each container's
    children's types, in C (``map(type, ...)``), so the cost is per container and per entry."""
    if type(value) not in _PLAIN:
        return False
    stack = [value] if type(value) is dict or type(value) is list else []
    while stack:
        current = stack.pop()
        children = current.values() if type(current) is dict else current
        kinds = set(map(type, children))
        if not kinds <= _PLAIN:
            return False
        if (dict in kinds or list in kinds) and len(current) > _WIDE:  # picked out in C
            stack.extend(compress(children, map(_CONTAINERS.__contains__, map(type, children))))
        elif dict in kinds or list in kinds:
            stack.extend(child for child in children if type(child) is dict or type(child) is list)
    return True


def _message_json(value: object) -> bytes:
    """:func:`canonical_json` of a MAC's message: strings, booleans, ``None`` and maps of
    strings only (never a float), so only DEL and characters past ASCII are written apart."""
    try:
        text = orjson.dumps(value, option=_FAST_OPTIONS)
    except TypeError:  # a subclass of str (orjson passes them through)
        pass
    else:
        if text.isascii() and b"\x7f" not in text:
            return text
    return _CANONICAL.encode(value).encode("utf-8", "surrogatepass")


def digest_text(sha256: bytes) -> str:
    """A values digest as records carry it: ``sha256:<hex>``."""
    return "sha256:" + sha256.hex()


def mac(
    key: bytes,
    app: tuple[str, str, str],
    values: str,
    charge: Mapping[str, Decimal],
    digest: str,
    factor: Mapping[str, Decimal] = _EMPTY,
    committed: Mapping[str, Decimal] = _EMPTY,
    own: Mapping[str, Decimal] | None = None,
    source: str = "",
    *,
    uid: str = "",
    marks: Mapping[str, Decimal] = _EMPTY,
    dry: bool = False,
    request: str = "",
) -> str:
    """The MAC of one record under ``key``: ``hmac-sha256:<hex>``. A record naming no request
    is signed exactly as before that field was kept, so records already stored still verify;
    one naming a request is signed over it too, and verifies with it only."""
    kind, namespace, name = app
    message = _message_json(
        [
            VERSION,
            _key_id(key),
            uid,
            rl.to_strings(marks),
            dry,
            kind,
            namespace,
            name,
            values,
            rl.to_strings(charge),
            digest,
            rl.to_strings(factor),
            rl.to_strings(committed),
            None if own is None else rl.to_strings(own),
            source,
            *([request] if request else []),
        ]
    )
    return MAC_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


@lru_cache(maxsize=64)
def _key_id(key: bytes) -> str:
    """:func:`key_id`, once per key (a process holds a handful)."""
    return key_id(key)


def sign(
    keys: RecordKeys,
    app: tuple[str, str, str],
    values: str,
    charge: Mapping[str, Decimal],
    digest: str,
    factor: Mapping[str, Decimal] = _EMPTY,
    committed: Mapping[str, Decimal] = _EMPTY,
    own: Mapping[str, Decimal] | None = None,
    source: str = "",
    *,
    uid: str = "",
    marks: Mapping[str, Decimal] = _EMPTY,
    dry: bool = False,
    request: str = "",
) -> RecordedCharge:
    """The record of ``charge`` for this object and values, signed with the current key.

    ``committed`` is kept only when it differs from ``charge`` (a factor applied).
    """
    content = unsigned(
        values,
        charge,
        digest,
        factor,
        committed,
        own,
        source,
        uid=uid,
        marks=marks,
        dry=dry,
        request=request,
    )
    return sign_record(keys, app, content)


def unsigned(
    values: str,
    charge: Mapping[str, Decimal],
    digest: str,
    factor: Mapping[str, Decimal] = _EMPTY,
    committed: Mapping[str, Decimal] = _EMPTY,
    own: Mapping[str, Decimal] | None = None,
    source: str = "",
    *,
    uid: str = "",
    marks: Mapping[str, Decimal] = _EMPTY,
    dry: bool = False,
    request: str = "",
) -> RecordedCharge:
    """What :func:`sign` would record, without the key id and MAC: its
    :meth:`~RecordedCharge.content` is the signed record's, at no HMAC's cost, for comparing a
    record carried on an object with the one this request computes."""
    committed = dict(committed) if dict(committed) != dict(charge) else {}
    return RecordedCharge(
        dict(charge),
        digest,
        values,
        "",
        dict(factor),
        committed,
        dict(own) if own is not None else None,
        source if factor else "",
        "",
        uid,
        dict(marks),
        dry,
        request,
    )


def sign_record(
    keys: RecordKeys, app: tuple[str, str, str], record: RecordedCharge
) -> RecordedCharge:
    """``record`` (from :func:`unsigned`) signed for ``app`` with the current key."""
    return replace(record, mac=_record_mac(keys.current, app, record), kid=keys.current_id)


def _record_mac(key: bytes, app: tuple[str, str, str], record: RecordedCharge) -> str:
    """:func:`mac` over what ``record`` says."""
    return mac(
        key,
        app,
        record.values,
        record.resources,
        record.digest,
        record.factor,
        record.committed,
        record.own,
        record.source,
        uid=record.uid,
        marks=record.marks,
        dry=record.dry,
        request=record.request,
    )


def verifies(
    keys: RecordKeys,
    app: tuple[str, str, str],
    values: str,
    record: RecordedCharge,
    *,
    uid: str = "",
    marks_only: bool = False,
) -> bool:
    """Whether ``record`` was signed by one of ``keys`` for exactly this object and values.

    ``uid`` is the object's uid where known: a record bound to another uid (an earlier object
    of the same name) does not verify. Dry-run records verify here (their high marks may still
    count, see the state); :func:`believed` is the test for everything else. With
    ``marks_only`` a retired key verifies too: for the record's volume marks, nothing else.
    """
    if not record.mac.startswith(MAC_PREFIX) or record.values != values:
        return False
    if uid and record.uid and record.uid != uid:
        return False
    if not record.kid:
        return _verifies_v1(keys, app, values, record)
    key = keys.key_for(record.kid)
    if key is None and marks_only:
        key = keys._retired_for(record.kid)
    if key is None:
        return False
    return hmac.compare_digest(_record_mac(key, app, record), record.mac)


def _verifies_v1(
    keys: RecordKeys, app: tuple[str, str, str], values: str, record: RecordedCharge
) -> bool:
    """A record an earlier version wrote (no key id, uid, marks or dry-run flag): it verifies
    under any key held, so audit logs from before an upgrade still verify, and a stored object
    keeps its record until it is next written (every decided write replaces it with a v2
    record). Those never carry a uid, marks or the dry-run flag."""
    if record.uid or record.marks or record.dry or record.request:
        return False
    kind, namespace, name = app
    message = _message_json(
        [
            "v1",
            kind,
            namespace,
            name,
            values,
            rl.to_strings(record.resources),
            record.digest,
            rl.to_strings(record.factor),
            rl.to_strings(record.committed),
            None if record.own is None else rl.to_strings(record.own),
            record.source,
        ]
    )
    for key in (keys.current, *keys.published, *keys.previous):
        expected = MAC_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected, record.mac):
            return True
    return False


def believed(
    keys: RecordKeys,
    app: tuple[str, str, str],
    values: str,
    record: RecordedCharge,
    *,
    uid: str = "",
) -> bool:
    """Whether ``record`` counts for this object: it verifies and no dry run minted it."""
    return not record.dry and verifies(keys, app, values, record, uid=uid)


def signed_annotation(
    keys: RecordKeys,
    app: tuple[str, str, str],
    values: str,
    charge: Mapping[str, Decimal],
    digest: str,
) -> str:
    """The annotation the webhook writes for a charge without a factor: signed, compact."""
    return record_annotation(sign(keys, app, values, charge, digest))


def record_annotation(record: RecordedCharge) -> str:
    """The annotation value: compact JSON, keys in a fixed order."""
    body: dict[str, object] = {"charge": rl.to_strings(record.resources), "digest": record.digest}
    if record.committed:
        body["committed"] = rl.to_strings(record.committed)
    if record.factor:
        body["factor"] = rl.to_strings(record.factor)
        body["source"] = record.source
    if record.own is not None:
        body["own"] = rl.to_strings(record.own)
    if record.marks:
        body["marks"] = rl.to_strings(record.marks)
    if record.uid:
        body["uid"] = record.uid
    if record.dry:
        body["dry"] = True
    if record.request:
        body["request"] = record.request
    body["values"] = record.values
    body["kid"] = record.kid
    body["mac"] = record.mac
    return _COMPACT.encode(body)


def _loads(text: str) -> object:
    """``json.loads(text)``, by orjson where it reads the same: it refuses what only the standard
    library reads (NaN, lone surrogates, numbers past a double), which is then read by it; and
    it reads an integer past 64 bits as a float, which the quantity maps (the only numbers a
    record's reading looks at) are read again for."""
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    if isinstance(body, dict):
        for field_name in _QUANTITY_FIELDS:
            found = body.get(field_name)
            if isinstance(found, dict) and any(type(v) is float for v in found.values()):
                return json.loads(text)
    return body


_QUANTITY_FIELDS: Final = ("charge", "factor", "committed", "own", "marks")


# Records this short are read through a small cache: one admission reads its object's record
# four times (the key check, the price, the spend, the watch echo), and a record is some 600
# characters. A longer annotation, tenant-made, is read each time and never kept.
_CACHED_CHARS: Final = 4096


def parse_recorded_charge(text: object) -> RecordedCharge | None:
    """The annotation's content, unverified; ``None`` when absent or unreadable. The record is
    shared between callers (a short one is cached): read it, never change it."""
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION_CHARS:
        return None
    if len(text) <= _CACHED_CHARS:
        return _parse_cached(text)
    return _parse(text)


def _parse(text: str) -> RecordedCharge | None:
    try:
        body = _loads(text)
        if not isinstance(body, Mapping):
            return None
        charge, digest = body["charge"], body["digest"]
        values, signature = body.get("values", ""), body.get("mac", "")
        factor, committed = body.get("factor") or {}, body.get("committed") or {}
        own, source = body.get("own"), body.get("source", "")
        kid, uid, marks = body.get("kid", ""), body.get("uid", ""), body.get("marks") or {}
        dry, request = body.get("dry", False), body.get("request", "")
        if not (
            isinstance(charge, Mapping)
            and isinstance(factor, Mapping)
            and isinstance(committed, Mapping)
            and isinstance(marks, Mapping)
            and (own is None or isinstance(own, Mapping))
            and isinstance(dry, bool)
            and all(
                isinstance(v, str) for v in (digest, values, signature, source, kid, uid, request)
            )
        ):
            return None
        resources = {str(k): parse_quantity(v) for k, v in charge.items()}
        factors = {str(k): parse_quantity(v) for k, v in factor.items()}
        declared = {str(k): parse_quantity(v) for k, v in committed.items()}
        owned = {str(k): parse_quantity(v) for k, v in own.items()} if own is not None else None
        held = {str(k): parse_quantity(v) for k, v in marks.items()}
    except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError, QuantityError):
        return None
    amounts = [*resources.values(), *declared.values(), *held.values()]
    if any(v < 0 for v in amounts) or any(
        v <= 0 for v in [*factors.values(), *(owned or {}).values()]
    ):
        return None
    return RecordedCharge(
        resources,
        digest,
        values,
        signature,
        factors,
        declared,
        owned,
        source,
        kid,
        uid,
        held,
        dry,
        request,
    )


_parse_cached = lru_cache(maxsize=256)(_parse)

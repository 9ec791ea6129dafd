"""JSON in and out of the process: orjson where it gives what the stdlib gives.

Every review and every API server answer and watch event is decoded, and every answer and API
request body encoded, on the event loop, so all use orjson (a C codec, several times faster
than :mod:`json`), but only where its result is the one the stdlib would give, so no body
decodes to other values than before and nothing encoded says anything else:

- decoding: orjson turns an integer past 64 bits into a float (the stdlib keeps it exact, and
  the values digest a record is bound to would change), so a body with a run of 19 digits or
  more after ``:``, ``,``, ``[`` or at its start is decoded by the stdlib; so is any body
  orjson refuses (a lone surrogate escape, ``NaN``, a number that overflows, UTF-16, nesting
  past 1024 levels), which the stdlib then decodes or refuses exactly as before. One change:
  a body nested up to 1024 levels now decodes (and is decided: values past 64 levels are
  refused by their bounds), where the stdlib's limit was the stack, some 950 levels here.
  So does one the stdlib must read (an integer of 19 digits beside such nesting: one list page
  can carry both, from two tenants): orjson reading it proves it nests at most 1024 levels,
  and the stdlib is then given the stack for that many;
- encoding: orjson writes UTF-8 where the stdlib writes ``\\uXXXX`` escapes (the same JSON
  strings, never longer), and refuses a string holding a lone surrogate or nesting past 254
  levels, which the stdlib then encodes.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, Final

import orjson

__all__ = [
    "decode_json",
    "encode_json",
    "json_values_at_most",
    "json_values_beyond",
    "may_hold_long_integers",
]

# Digits become "0", the three characters a number may follow become ":", anything else "x";
# whitespace and minus signs are dropped, so ":" then 19 zeros is a long integer token, or a
# false alarm in a string, which only costs the stdlib's decoding.
_SHAPE: Final = bytes(
    0x30 if 0x30 <= c <= 0x39 else 0x3A if c in b":,[" else 0x78 for c in range(256)
)
_DROPPED: Final = b" \t\r\n-"
_LONG: Final = b":" + b"0" * 19
_COMPACT: Final = json.JSONEncoder(separators=(",", ":"))
_LEVELS: Final = 1024  # how deep orjson reads, whatever the stack
_DEEP: Final = threading.Lock()  # the recursion limit is the interpreter's: one raise at a time


def may_hold_long_integers(raw: bytes) -> bool:
    """Whether ``raw`` may hold an integer of 19 digits or more (never false when it does)."""
    shape = raw.translate(_SHAPE, _DROPPED)
    return _LONG in shape or shape.startswith(_LONG[1:])  # a number the whole body is


def json_values_at_most(raw: bytes) -> int:
    """At most how many values (maps, lists and scalars) ``raw`` decodes to, counted without
    decoding it: every value but a container's first follows a comma, every first one opens a
    container or is the whole text. A comma inside a string counts too (never fewer). Decoding
    costs per value made (some 60 ns each, a seven-MiB body of empty lists past 100 ms), so a
    body is bounded by this before it is decoded; the count itself is three passes in C."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1


def json_values_beyond(raw: bytes, bound: int) -> int | None:
    """``None`` when ``raw`` decodes to at most ``bound`` values, counted without decoding it;
    else about how many it holds (more than ``bound``).

    :func:`json_values_at_most` first; past ``bound``, the commas and brackets inside strings
    are taken out of the count: a cloud-init holding a JSON file, or the
    ``kubectl.kubernetes.io/last-applied-configuration`` annotation holding the whole object,
    carries thousands, and a body is bounded by the values it holds, not by what its strings
    say. Escaped quotes and backslashes are dropped first (they occur in strings only), so every
    quote left opens or closes a string. Taking the strings out costs some 100 ns a string (a
    split in C), so a body with more than ``4 * bound`` quotes is not split: every string is a
    key or a value, and every key has a value, so it holds more than ``bound`` values."""
    counted = json_values_at_most(raw)
    if counted <= bound:
        return None
    if b'"' not in raw:
        return counted
    plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    strings = plain.count(b'"') // 2
    if strings > 2 * bound:
        return strings // 2
    outside = json_values_at_most(b"".join(plain.split(b'"')[::2]))
    return outside if outside > bound else None


def decode_json(raw: bytes) -> Any:
    """``json.loads(raw)``, the same values and the same exceptions, mostly by orjson."""
    if not may_hold_long_integers(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # refused: the stdlib decodes it, or says why not as it always did
    try:
        return json.loads(raw)
    except RecursionError:
        if not _within_orjsons_depth(raw):
            raise  # deeper than orjson reads too: refused as it always was
    with _DEEP:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + 2 * _LEVELS)  # the scanner recurses once per level
        try:
            return json.loads(raw)
        finally:
            sys.setrecursionlimit(limit)


def _within_orjsons_depth(raw: bytes) -> bool:
    """Whether orjson reads ``raw`` (so it nests at most :data:`_LEVELS` levels)."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return True


def encode_json(value: object) -> bytes:
    """``value`` as compact JSON in UTF-8, meaning what ``json.dumps`` of it means."""
    try:
        return orjson.dumps(value)
    # A lone surrogate, deep nesting, an integer past 64 bits, a key not a string
    # (orjson.JSONEncodeError is a TypeError).
    except TypeError:
        return _COMPACT.encode(value).encode()

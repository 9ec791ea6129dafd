"""A list decoded as it is read, one item at a time: for a page too large to hold decoded.

cozystack-api sends every object of a kind in one page, whatever ``limit`` asks; decoded at
once, that page costs some 13 times its bytes, past a replica's memory for a few hundred fat
objects. Decoded by ijson's push parser (yajl, in C) as its chunks come, each item is handed on
once whole and then dropped: what is held is a chunk, the parser's buffer and one object.

Only ijson's basic events are used (no prefixes): its ``items`` names every event by a prefix
it builds at each map key from its parent's and keeps for every open level, so a spec of one
long key over many keys (the values bound counts nodes and depth, never a key's length) cost
the key's length at each of them, seconds of the event loop for one 1.3 MB object, and deep
levels of long keys held hundreds of times an object's bytes. :class:`_Split` builds the items
and the metadata from the events alone, by their depth.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable
from decimal import Decimal
from typing import Any, Final

import ijson

__all__ = ["NotAList", "decode_list"]

Obj = dict[str, Any]


class NotAList(ValueError):
    """The body is no JSON list of objects, or holds an item longer than any object can be."""


class _Split:
    """ijson's basic events (no prefixes) made into each item of the top-level ``items`` and
    the top-level ``metadata``, each put in its list once whole; other top-level values are
    skipped. Iterative, whatever the nesting (:class:`ijson.ObjectBuilder`)."""

    __slots__ = ("building", "depth", "into", "items", "key", "metadata", "open", "skip")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.metadata: list[Any] = []
        self.depth = 0  # 0: before the body's object, 1: in it, 2: in its items list
        self.key: object = None  # the body's key whose value is under way
        self.building: Any = None  # the item (or metadata) under way
        self.into: list[Any] = self.items
        self.open = 0  # containers open in what is being built
        self.skip = 0  # containers open in a top-level value skipped

    def send(self, pair: tuple[str, Any]) -> None:
        event, value = pair
        starts = event in _STARTS
        building = self.building
        if building is not None:
            building.event(event, value)
            if starts:
                self.open += 1
            elif event in _ENDS:
                self.open -= 1
                if not self.open:
                    self.into.append(building.value)
                    self.building = None
        elif self.skip:
            self.skip += 1 if starts else -1 if event in _ENDS else 0
        elif self.depth == 2:
            if event == "end_array":
                self.depth = 1
            elif starts:
                self._build(event, self.items)
            else:
                self.items.append(value)  # refused by the caller: not an object
        elif self.depth == 1:
            if event == "map_key":
                self.key = value
            elif event == "end_map":
                self.depth = 0
            elif self.key == "items" and event == "start_array":
                self.depth = 2
            elif self.key == "metadata":
                if starts:
                    self._build(event, self.metadata)
                else:
                    self.metadata.append(value)  # refused by the caller: not an object
            elif starts:
                self.skip = 1
        elif event == "start_map":
            self.depth = 1

    def _build(self, event: str, into: list[Any]) -> None:
        self.building = ijson.ObjectBuilder()
        self.building.event(event, None)
        self.open, self.into = 1, into


_STARTS: Final = frozenset({"start_map", "start_array"})
_ENDS: Final = frozenset({"end_map", "end_array"})


async def decode_list(
    chunks: AsyncIterable[bytes], each: Callable[[Obj], None], max_item_bytes: int
) -> tuple[Obj, int]:
    """Hand each item of the list ``chunks`` make to ``each`` as soon as it is whole; the
    list's ``metadata`` (its resourceVersion and continue token), in a page without ``items``,
    and the bytes read. An item still incomplete ``max_item_bytes`` (plus a chunk) after the
    last one ended raises :class:`NotAList`, unread past that: no object is that long, and
    decoded whole it could be a replica's memory. So does a body malformed or cut short, or
    an item that is not an object."""
    split = _Split()
    items, found = split.items, split.metadata
    # Not use_float: yajl then parses integers as C long longs and refuses any past 64 bits,
    # which a list may carry; numbers with a fraction or exponent come as Decimal instead.
    parser = ijson.basic_parse_coro(split)
    size = since = 0
    opened = False
    try:
        async for chunk in chunks:
            if not opened and (start := chunk.lstrip()[:1]):
                if start != b"{":
                    raise NotAList("the answer is not a JSON object")
                opened = True
            size += len(chunk)
            parser.send(chunk)
            if items:
                since = 0
                for item in items:
                    if not isinstance(item, dict):
                        raise NotAList("an item that is not an object")
                    each(_floats(item))
                items.clear()
            else:
                since += len(chunk)
                if since > max_item_bytes:
                    raise NotAList(f"an item longer than {max_item_bytes} bytes")
            await asyncio.sleep(0)  # a whole kind decodes for seconds: others run meanwhile
        parser.close()
    except ijson.JSONError as exc:
        said = exc.args[0] if exc.args else ""
        text = said.decode(errors="replace") if isinstance(said, bytes) else str(said)
        reason = text.partition("\n")[0]
        raise NotAList(f"not a JSON list after {size} bytes ({reason})") from None
    meta = found[0] if found else {}
    if not isinstance(meta, dict):
        raise NotAList("the list's metadata is not an object")
    return {"metadata": meta}, size


def _floats(item: Obj) -> Obj:
    """``item`` with the Decimals ijson decodes fractions and exponents to made floats, as
    :func:`~webhook.core.base.json_codec.decode_json` gives them (``float`` of a Decimal
    rounds as the stdlib's parse does)."""
    stack: list[Any] = [item]
    while stack:
        node = stack.pop()
        pairs = node.items() if type(node) is dict else enumerate(node)
        for key, value in pairs:
            kind = type(value)
            if kind is dict or kind is list:
                stack.append(value)
            elif kind is Decimal:
                node[key] = float(value)
    return item

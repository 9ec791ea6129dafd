"""A list decoded as it is read, one item at a time: for a page too large to hold decoded.

cozystack-api sends every object of a kind in one page, whatever ``limit`` asks; decoded at
once, that page costs some 13 times its bytes, past a replica's memory for a few hundred fat
objects. Decoded by ijson's push parser (yajl, in C) as its chunks come, each item is handed on
once whole and then dropped: what is held is a chunk, the parser's buffer and one object.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable
from decimal import Decimal
from typing import Any

import ijson

__all__ = ["NotAList", "decode_list"]

Obj = dict[str, Any]


class NotAList(ValueError):
    """The body is no JSON list of objects, or holds an item longer than any object can be."""


class _Sink(list[Any]):
    """Where ijson's push parser puts what it decoded, until it is taken."""

    send = list.append


async def decode_list(
    chunks: AsyncIterable[bytes], each: Callable[[Obj], None], max_item_bytes: int
) -> tuple[Obj, int]:
    """Hand each item of the list ``chunks`` make to ``each`` as soon as it is whole; the
    list's ``metadata`` (its resourceVersion and continue token), in a page without ``items``,
    and the bytes read. An item still incomplete ``max_item_bytes`` (plus a chunk) after the
    last one ended raises :class:`NotAList`, unread past that: no object is that long, and
    decoded whole it could be a replica's memory. So does a body malformed or cut short, or
    an item that is not an object."""
    items, found = _Sink(), _Sink()
    # Not use_float: yajl then parses integers as C long longs and refuses any past 64 bits,
    # which a list may carry; numbers with a fraction or exponent come as Decimal instead.
    parser = ijson.items_coro(items, "items.item")
    metadata = ijson.items_coro(found, "metadata")
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
            if not found:
                metadata.send(chunk)  # Go servers send it first: read once, then no more
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
        if not found:
            metadata.close()
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

"""The API client's JSON: orjson where it reads and writes what the standard library would.

Every body the client sends and every answer and watch event it reads goes through the core's
JSON codec (``encode_json``, ``decode_json``); what orjson would read differently (integers
past 64 bits, NaN, lone surrogates) is left to the standard library, so a tenant's odd value
is read exactly, and never breaks the watch that carries it.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.apiserver.server import EmulatedAPIServer
from tests.kube.reflecting import THINGS, running
from tests.waiting import eventually
from webhook.core.base.json_codec import decode_json, encode_json
from webhook.kube.client import KubeClient
from webhook.kube.reflector import Reflector

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, with the types too (1 is not 1.0, nor True), NaN equal to NaN, order kept."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@settings(max_examples=400)
@given(values, st.booleans())
def test_decoding_equals_the_standard_librarys(value: Any, ascii_only: bool) -> None:
    for data in (
        json.dumps(value, ensure_ascii=ascii_only).encode(),
        json.dumps(value, separators=(",", ":"), sort_keys=True).encode(),
    ):
        assert _same(decode_json(data), json.loads(data))


@settings(max_examples=400)
@given(values)
def test_encoding_reads_back_as_the_standard_librarys(value: Any) -> None:
    standard = json.dumps(value, separators=(",", ":")).encode()
    assert _same(json.loads(encode_json(value)), json.loads(standard))


@pytest.mark.parametrize(
    "data",
    [
        b"222222222222222222222222222222",
        b"-9223372036854775809",
        b"18446744073709551616",
        b'{"a":[1,{"b":123456789012345678901234567890}]}',
        b'"\\ud800"',
        b'{"x":"\\udfff tail"}',
        b"NaN",
        b'{"x":[Infinity,-Infinity]}',
        b"1e400",
        b"{}",
        b"[]",
        b'""',
        b"-0.0",
        b"1.5e-320",
        b'{"k":1,"k":2}',
        b'{"a":1,"b":2,"a":3}',
    ],
)
def test_what_orjson_reads_otherwise_is_read_as_the_standard_library_does(data: bytes) -> None:
    assert _same(decode_json(data), json.loads(data))


@pytest.mark.parametrize("data", [b"", b"{", b"\xff\xfe{}", b'{"a":1}x', b"[1,]", b"\x80"])
def test_what_is_not_json_fails_as_the_standard_library_does(data: bytes) -> None:
    try:
        json.loads(data)
    except ValueError as exc:
        standard: ValueError = exc
    else:
        pytest.fail(f"{data!r} is JSON")
    with pytest.raises(type(standard)):
        decode_json(data)


def test_a_body_orjson_refuses_is_written_by_the_standard_library() -> None:
    body = {"big": 2**70, 3: "an int key"}
    assert encode_json(body) == json.dumps(body, separators=(",", ":")).encode()


# -- through a watch: what a tenant may store in an object the webhook follows ----------------


def thing(name: str, spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1",
        "kind": "Thing",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": spec,
    }


@asynccontextmanager
async def follow(client: KubeClient, seen: dict[str, Any]) -> AsyncIterator[Reflector]:
    """A reflector of Things keeping each one's spec in ``seen``, running and synced for the
    block."""

    def replace(items: list[dict[str, Any]]) -> None:
        seen.clear()
        seen.update({i["metadata"]["name"]: i["spec"] for i in items})

    def event(kind: str, obj: dict[str, Any]) -> None:
        seen[obj["metadata"]["name"]] = obj["spec"]

    watcher = Reflector(
        client,
        THINGS,
        on_replace=replace,
        on_event=event,
        read_timeout=0.5,
        watch_timeout=2,
        backoff=(0.02, 0.1),
    )
    async with running(watcher):
        await eventually(lambda: watcher.synced)
        yield watcher


async def test_a_tenant_spec_with_a_thirty_digit_number_is_read_exactly(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    """orjson would read it as a float: a size past 64 bits priced as another number."""
    huge = 123456789012345678901234567890
    server.create(thing("listed", {"replicas": huge}))
    seen: dict[str, Any] = {}
    async with follow(client, seen):
        server.create(thing("watched", {"replicas": -huge}))
        await eventually(lambda: "watched" in seen)
        assert _same(seen["listed"], {"replicas": huge})
        assert _same(seen["watched"], {"replicas": -huge})


async def test_a_tenant_object_with_a_lone_surrogate_does_not_break_the_watch(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    """orjson refuses it: the watch would break, reopen, and break again on each event."""
    seen: dict[str, Any] = {}
    async with follow(client, seen) as watcher:
        relists, errors = watcher.relists, watcher.last_error
        server.create(thing("odd", {"note": "\ud800"}))
        server.create(thing("after", {"note": "fine"}))
        await eventually(lambda: "after" in seen)
        assert seen["odd"] == {"note": "\ud800"}
        assert watcher.synced
        assert watcher.relists == relists
        assert watcher.last_error == errors


@settings(max_examples=1000)
@given(st.from_regex(r"\A-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][-+]?[0-9]{1,3})?\Z"))
def test_every_number_literal_reads_as_the_standard_librarys(literal: str) -> None:
    """Every JSON number as written (long mantissas, exponents past a double's range)."""
    data = f'[{literal},{{"n":{literal}}}]'.encode()
    try:
        expected = json.loads(data)
    except ValueError as exc:
        with pytest.raises(type(exc)):
            decode_json(data)
        return
    assert _same(decode_json(data), expected)

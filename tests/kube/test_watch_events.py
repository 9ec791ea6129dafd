"""A watch reads every event the API server may send, and one it cannot read never stops it.

kube-apiserver stores objects up to etcd's 1.5 MiB and sends each watch event as one line of
JSON. The client splits lines itself, bounded by what the API server may send
(:data:`~webhook.kube.client.MAX_WATCH_EVENT_BYTES`), never by aiohttp's 512 KiB line limit;
an event past the bound, or not JSON, makes the reflector list again instead of reopening the
watch from before the event, where it would meet it again, for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.apiserver.server import EmulatedAPIServer
from tests.cluster import kube_client
from tests.kube.reflecting import THINGS, EmptyList, Mirror, following, reflector, running, thing
from tests.waiting import eventually
from webhook.core.base.kube_limits import ETCD_MAX_REQUEST_BYTES
from webhook.kube.client import (
    MAX_WATCH_EVENT_BYTES,
    ApiError,
    KubeClient,
    WatchEventUnreadable,
    bounded_lines,
)
from webhook.kube.reflector import STUCK_WATCHES

CLOUD_INIT = 600_000  # one value, over aiohttp's 524,288-byte line limit, far under etcd's


class Chunks:
    """A response body arriving in the given chunks (what ``iter_any`` yields)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


async def lines_of(chunks: list[bytes], limit: int) -> list[bytes]:
    return [line async for line in bounded_lines(Chunks(chunks), limit)]  # type: ignore[arg-type]


def split(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(body)) for c in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    limit=st.integers(min_value=0, max_value=48),
    trailing=st.booleans(),
)
def test_lines_are_split_as_sent_however_chunked_and_none_is_longer_than_the_bound(
    lines: list[bytes], cuts: list[int], limit: int, trailing: bool
) -> None:
    body = b"\n".join(lines) + (b"\n" if trailing else b"")
    sent = body.split(b"\n")
    if sent[-1] == b"":  # what follows the last newline, when nothing does
        sent.pop()
    chunks = split(body, cuts)
    if all(len(line) <= limit for line in sent):
        assert asyncio.run(lines_of(chunks, limit)) == sent
    else:
        with pytest.raises(WatchEventUnreadable, match=f"longer than {limit} bytes"):
            asyncio.run(lines_of(chunks, limit))


async def test_a_line_past_the_bound_is_refused_without_reading_the_rest_of_it() -> None:
    read: list[int] = []

    class Endless:
        async def iter_any(self) -> AsyncIterator[bytes]:
            for index in range(1000):
                read.append(index)
                yield b"x" * 1024

    with pytest.raises(WatchEventUnreadable):
        async for _ in bounded_lines(Endless(), 10 * 1024):  # type: ignore[arg-type]
            pass
    assert len(read) == 11, "read up to the bound, and the chunk that passed it"


def test_the_event_bound_is_what_the_api_server_may_send_never_less() -> None:
    assert ETCD_MAX_REQUEST_BYTES == 1_572_864  # etcd's default --max-request-bytes
    assert MAX_WATCH_EVENT_BYTES >= 3 * 1024 * 1024  # kube-apiserver's request body limit
    assert MAX_WATCH_EVENT_BYTES >= 6 * ETCD_MAX_REQUEST_BYTES  # "<" served as "\u003c"


def large(name: str, size: int, value: int = 1) -> dict[str, Any]:
    obj = thing(name, value)
    obj["spec"]["cloudInit"] = "#cloud-config\n" + "x" * size
    return obj


async def test_a_watch_event_over_aiohttps_line_limit_is_read_and_the_watch_stays_synced(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    # aiohttp's line iterator refused it ("Chunk too big"): the watch broke, was reopened from
    # before the event, met it again, and never was synced again.
    async with following(client) as (watcher, mirror):
        server.create(large("big", CLOUD_INIT))
        server.create(thing("after", 2))
        await eventually(lambda: mirror.items == {"big": 1, "after": 2})
        assert watcher.synced, watcher.last_error
        assert watcher.last_error == ""
        assert watcher.relists == watcher.unreadable_relists == 0
        assert client.unreadable_events == 0


async def test_an_event_the_watch_cannot_read_is_listed_past_never_met_again(
    server: EmulatedAPIServer, tmp_path: Path
) -> None:
    # A bound below the event (a hostile proxy, or an operator's etcd allowing more than ours):
    # resumed from before it, the watch would break on it forever; listed, it is read whole,
    # and the watch goes on from the list's version.
    async with kube_client(server.kubeconfig(tmp_path / "small")) as small:
        small.max_event_bytes = 64 * 1024
        async with following(small) as (watcher, mirror):
            server.create(large("big", 100_000))
            await eventually(lambda: watcher.unreadable_relists == 1)
            server.create(thing("after", 2))
            await eventually(lambda: mirror.items == {"big": 1, "after": 2} and watcher.synced)
            assert small.unreadable_events == 1, "met once, then listed past"
            assert "longer than 65536 bytes" in watcher.last_error
            assert str(THINGS.path("")) in watcher.last_error


class LinesClient(EmptyList):
    """Lists one empty page at version 5; every watch sends ``lines`` through the real
    decoding of events, then breaks."""

    def __init__(self, lines: list[bytes]) -> None:
        super().__init__()
        self.lines = lines
        self.unreadable_events = 0

    async def watch(self, path: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        for line in self.lines:
            try:
                yield KubeClient._event(line)
            except WatchEventUnreadable:
                self.unreadable_events += 1
                raise
        raise ApiError(0, "WatchBroken", f"watch {path}: connection reset")


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b'{"type":"ADDED","object":', id="cut-short"),
        pytest.param(b"[1,2,3]", id="a-list"),
        pytest.param(b'{"type":"ADDED","object":"text"}', id="object-not-an-object"),
        pytest.param(b'{"object":{}}', id="no-type"),
        pytest.param(b"\xff\xfe", id="not-utf-8"),
    ],
)
async def test_a_line_that_is_no_watch_event_is_listed_past_and_reported(line: bytes) -> None:
    client = LinesClient([line])
    watcher = reflector(client, Mirror(), backoff=(0.001, 0.01))  # type: ignore[arg-type]
    async with running(watcher):
        # The count grows when the event is met; the list it calls for follows after the
        # backoff: wait for the lists themselves, not only for the count.
        await eventually(lambda: watcher.unreadable_relists >= 2 and client.lists >= 3)
    assert client.watches <= client.lists, "each unreadable event: a list, never a resume"
    assert client.unreadable_events == watcher.unreadable_relists
    assert "watch event" in watcher.last_error or "not JSON" in watcher.last_error


async def test_watches_breaking_again_and_again_at_one_version_list_again() -> None:
    # Whatever breaks every watch that reaches one event (a proxy cutting one long line, a
    # decoder that crashes on it), reopening from before it meets it again: after a few
    # breaks in a row there, with nothing delivered, the reflector lists instead.
    client = LinesClient([])
    watcher = reflector(client, Mirror(), backoff=(0.001, 0.01))  # type: ignore[arg-type]
    async with running(watcher):
        await eventually(lambda: client.lists >= 3)
    assert client.watches >= 2 * STUCK_WATCHES
    assert client.lists - 1 <= watcher.stuck_relists <= client.lists
    assert client.watches <= STUCK_WATCHES * client.lists, "never more in a row than the bound"


async def test_a_watch_that_delivers_between_breaks_is_never_taken_for_stuck() -> None:
    event = b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"%d"}}}'
    versions = iter(range(6, 10_000))

    class Moving(LinesClient):
        async def watch(self, path: str, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
            self.lines = [event % next(versions)]
            async for item in super().watch(path, **kwargs):
                yield item

    client = Moving([])
    mirror = Mirror()
    mirror.event = lambda kind, obj: None  # type: ignore[method-assign]
    watcher = reflector(client, mirror, backoff=(0.001, 0.01))  # type: ignore[arg-type]
    async with running(watcher):
        await eventually(lambda: client.watches >= 4 * STUCK_WATCHES)
    # Each break after an object was delivered is listed past (cozystack-api's burst may have
    # had an older object still to send), never counted as a watch stuck at one version.
    assert client.lists - 1 <= watcher.broken_relists <= client.lists
    assert watcher.stuck_relists == 0

"""A list page past its bound that cannot be asked for smaller is read as a stream.

cozystack-api sends a whole kind whatever ``limit`` asks; read whole, it is larger than a
replica's memory. Past the page's bound it is decoded one item at a time instead, each handed
to the reducer and dropped; these tests hold it to what a list must still be: its
resourceVersion and every item as the standard library reads them, bad bodies refused as
unreadable (never a crash, never decoded whole), an item past any object's size refused, its
time bounded per read rather than by the request deadline (its first byte too: a server that
builds a whole kind before it answers), and a server that honours ``limit`` paged exactly as
before.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from tests.apiserver.server import EmulatedAPIServer
from tests.kube.loopback import client_of
from tests.kube.reflecting import THINGS, Mirror, reflector
from tests.kube.test_pages import Recording
from tests.waiting import eventually
from webhook.kube.client import ApiError, KubeClient, ListUnreadable
from webhook.kube.pages import PageSizes, consistent_read

BUDGET = 16 * 1024  # a page's bytes here: read whole up to twice that, streamed past it


def thing(name: str, note: int = 4_000, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1",
        "kind": "Thing",
        "metadata": {"name": name, "namespace": "ns", "annotations": {"note": "x" * note}},
        "spec": spec or {},
    }


def listing(items: list[Any], version: str = "7", *, metadata_last: bool = False) -> bytes:
    head = {"apiVersion": "example.io/v1", "kind": "ThingList"}
    metadata = {"metadata": {"resourceVersion": version}}
    body = {**head, "items": items, **metadata} if metadata_last else {**head, **metadata}
    return json.dumps({**body, "items": items}, separators=(",", ":")).encode()


class Whole:
    """A server that sends ``body`` whatever a list asks (as cozystack-api does), in chunks,
    ``pause`` seconds apart, the first ``first_byte`` seconds after its headers; the limits it
    was asked for."""

    def __init__(self) -> None:
        self.body = listing([])
        self.pause = 0.0
        self.first_byte = 0.0
        self.limits: list[str] = []

    async def serve(self, request: web.Request) -> web.StreamResponse:
        self.limits.append(request.query.get("limit", ""))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await asyncio.sleep(self.first_byte)  # the whole kind built before it is sent
        for start in range(0, len(self.body), 1 << 14):
            await response.write(self.body[start : start + (1 << 14)])
            if self.pause:
                await asyncio.sleep(self.pause)
        await response.write_eof()
        return response


@pytest.fixture
async def whole() -> AsyncIterator[tuple[Whole, KubeClient]]:
    served = Whole()
    async with client_of(THINGS.path(), served.serve, max_event_bytes=256 * 1024) as client:
        yield served, client


async def names(client: KubeClient, pages: PageSizes, **options: Any) -> tuple[str, list[Any]]:
    return await consistent_read(
        client,
        THINGS,
        lambda obj: obj["metadata"]["name"],
        **{
            "pages": pages,
            **options,
        },
    )


@pytest.mark.parametrize("metadata_last", [False, True])
async def test_a_whole_kind_past_the_bound_is_streamed_with_its_resource_version(
    whole: tuple[Whole, KubeClient], metadata_last: bool
) -> None:
    served, client = whole
    odd = {"half": 1.5, "big": 2**70, "exp": 1e3, "tiny": -0.0, "text": "é\u2028"}
    items = [thing(f"t{index:02d}") for index in range(40)] + [thing("odd", spec=odd)]
    served.body = listing(items, "4242", metadata_last=metadata_last)
    assert len(served.body) > 4 * BUDGET
    pages = PageSizes(page_bytes=BUDGET)
    kept: list[Any] = []

    def whole_object(obj: dict[str, Any]) -> dict[str, Any]:
        kept.append(obj)
        return obj

    version, listed = await consistent_read(client, THINGS, whole_object, pages=pages)
    assert version == "4242"
    assert listed == json.loads(served.body)["items"]  # the values the stdlib reads
    assert type(kept[-1]["spec"]["half"]) is float
    assert served.limits == ["500", "125", "31", "7", "1"]  # cut short until one was asked
    assert pages.unlimited
    assert pages.listed_bytes == len(served.body)


async def test_a_server_known_to_ignore_limit_is_streamed_at_once_on_the_next_list(
    whole: tuple[Whole, KubeClient],
) -> None:
    served, client = whole
    served.body = listing([thing(f"t{index:02d}") for index in range(40)])
    pages = PageSizes(page_bytes=BUDGET)
    await names(client, pages)
    first = len(served.limits)
    cut = pages.cut_short
    version, listed = await names(client, pages)
    assert (version, len(listed)) == ("7", 40)
    assert len(served.limits) == first + 1  # one request: no page cut short again
    assert pages.cut_short == cut


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (listing([thing(f"t{index:02d}") for index in range(20)])[:-300], "not a JSON list"),
        (listing([thing(f"t{index:02d}") for index in range(20)]).replace(b"t07", b't"7'), "JSON"),
        (listing([*(thing(f"t{index:02d}") for index in range(10)), "t10"]), "not an object"),
        (json.dumps([thing(f"t{index:02d}") for index in range(20)]).encode(), "not a JSON obj"),
    ],
    ids=["truncated", "malformed", "an item not an object", "not an object"],
)
async def test_a_streamed_list_that_is_no_list_of_objects_is_refused_as_unreadable(
    whole: tuple[Whole, KubeClient], body: bytes, said: str
) -> None:
    served, client = whole
    served.body = body
    assert len(body) > 2 * BUDGET
    with pytest.raises(ListUnreadable, match=said) as caught:
        await names(client, PageSizes(page_bytes=BUDGET, limit=1))
    assert isinstance(caught.value, ApiError)
    assert THINGS.path() in caught.value.message  # named by its resource


async def test_an_unreadable_list_is_a_list_failure_retried_never_the_reflectors_end(
    whole: tuple[Whole, KubeClient],
) -> None:
    served, client = whole
    served.body = listing([thing(f"t{index:02d}") for index in range(20)])[:-300]
    mirror = Mirror()
    watcher = reflector(client, mirror)
    watcher.pages = PageSizes(page_bytes=BUDGET, limit=1)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        await eventually(lambda: watcher.list_failures >= 2)
        assert "ListUnreadable" in watcher.list_error
        assert THINGS.path() in watcher.list_error
        assert not task.done()
    finally:
        stop.set()
        await task


async def test_an_item_longer_than_any_object_is_refused_before_it_is_decoded_whole(
    whole: tuple[Whole, KubeClient],
) -> None:
    served, client = whole
    bound = client.max_event_bytes
    huge = thing("huge")
    huge["metadata"]["annotations"] = {f"example.com/a{j}": "x" * 100 for j in range(80_000)}
    served.body = listing([thing("t00"), huge, thing("t01")])
    assert len(served.body) > 30 * bound
    tracemalloc.start()
    try:
        with pytest.raises(ListUnreadable, match=f"longer than {bound} bytes"):
            await names(client, PageSizes(page_bytes=BUDGET, limit=1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Decoded whole, its 80,000 annotations are some 15 MB of objects; refused at the bound.
    assert peak < 20 * bound, peak


async def test_a_streamed_list_outlasts_the_request_deadline_within_its_read_timeout(
    whole: tuple[Whole, KubeClient],
) -> None:
    served, client = whole
    served.body = listing([thing(f"t{index:02d}") for index in range(40)])  # 12 chunks
    served.pause = 0.1
    client.timeout = 0.5
    version, listed = await names(client, PageSizes(page_bytes=BUDGET, limit=1), read_timeout=1)
    assert (version, len(listed)) == ("7", 40)
    served.pause = 1.0  # silent past the read timeout between two chunks: given up on
    with pytest.raises(ApiError, match="Unreachable"):
        await names(client, PageSizes(page_bytes=BUDGET, limit=1), read_timeout=0.3)


async def test_a_streamed_list_waits_the_read_timeout_not_the_request_deadline_for_its_first_byte(
    whole: tuple[Whole, KubeClient],
) -> None:
    # cozystack-api builds a whole kind before it sends a byte of it: seconds for a kind a
    # tenant fattens. The request deadline (10 s) ran from the request to the end of the part
    # read whole, so such a list failed every time before it could stream, the kind never
    # listed again.
    served, client = whole
    served.body = listing([thing(f"t{index:02d}") for index in range(40)])
    served.first_byte = 0.8
    client.timeout = 0.3
    pages = PageSizes(page_bytes=BUDGET, limit=1)
    version, listed = await names(client, pages, read_timeout=2)
    assert (version, len(listed)) == ("7", 40)
    with pytest.raises(ApiError, match="Unreachable"):  # still bounded: by the read timeout
        await names(client, PageSizes(page_bytes=BUDGET, limit=1), read_timeout=0.4)
    with pytest.raises(ApiError, match="Unreachable"):  # a page never streamed: the deadline
        await names(client, PageSizes(page_bytes=BUDGET), read_timeout=2)


async def test_a_server_that_honours_limit_is_paged_as_before_never_streamed(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    expected = [f"t{index:03d}" for index in range(60)]
    for name in expected:
        server.create(thing(name, 4_000))
    pages = PageSizes(page_bytes=BUDGET)
    recording = Recording(client)
    for _ in range(2):
        _, listed = await names(recording, pages)  # type: ignore[arg-type]
        assert listed == expected
    assert not pages.unlimited
    pairs = zip(recording.limits, recording.streamed, strict=True)
    assert all(not streamed for limit, streamed in pairs if limit > 1)
    assert max(recording.sizes) <= 2 * BUDGET
    assert len(recording.sizes) > 4  # paged, with continue tokens

"""A kind relisted as a stream holds every tenant's admissions for as long as it streams.

A kind listed before that lists again (its watch broke after delivering objects, which a
tenant's churn of its own applications makes every break) is not excused by readiness: stale,
it counts in shared pools, so the whole state is unsynced until the list ends, or fails (then
only that kind is denied). A list of it used to end within the request deadline
(``REQUEST_TIMEOUT``, 10 s); streamed (cozystack-api sends the whole kind, which a tenant fills
with fat applications) it may run for ``STREAMED_LIST_SECONDS`` (600 s), each read within the
read timeout: every tenant's writes of every kind are refused meanwhile, at every relist, in
every replica.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

import pytest
from aiohttp import web

from tests.kube.loopback import client_of
from tests.waiting import eventually
from webhook.core.pricing.platform import Platform
from webhook.core.tenancy.tenants import TENANT_KIND
from webhook.kube.client import KubeClient
from webhook.kube.pages import PageSizes
from webhook.state.live import LiveSettings, LiveState

BASE = "/apis/apps.cozystack.io/v1alpha1"
DEADLINE = 0.5  # the client's request deadline here (REQUEST_TIMEOUT in a replica)
BUDGET = 16 * 1024  # a page's bytes here: read whole up to twice that, streamed past it


def disk(name: str, version: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "Bucket",
        "metadata": {
            "name": name,
            "namespace": "tenant-evil",
            "resourceVersion": str(version),
            "annotations": {"example.com/fat": "x" * 4_000},
        },
        "spec": {},
    }


class CozystackLike:
    """Lists of a whole kind (whatever ``limit`` says), sent ``pause`` seconds a chunk, and
    watches that send bookmarks, or (``churn``) one tenant's write and then break."""

    def __init__(self) -> None:
        self.pause = 0.0
        self.churn = asyncio.Event()
        self.lists = 0

    def body(self, plural: str) -> bytes:
        items = (
            []
            if plural == "tenants"
            else [disk(f"d{index:02d}", 10 + index) for index in range(60)]
        )
        page = {"kind": "List", "metadata": {"resourceVersion": "100"}, "items": items}
        return json.dumps(page, separators=(",", ":")).encode()

    async def serve(self, request: web.Request) -> web.StreamResponse:
        plural = request.match_info["plural"]
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if request.query.get("watch") == "true":
            return await self._watch(plural, request, response)
        self.lists += 1
        body = self.body(plural)
        for start in range(0, len(body), 1 << 13):
            await response.write(body[start : start + (1 << 13)])
            if plural == "buckets" and self.pause:
                await asyncio.sleep(self.pause)
        await response.write_eof()
        return response

    async def _watch(
        self, plural: str, request: web.Request, response: web.StreamResponse
    ) -> web.StreamResponse:
        bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "100"}}}
        for _ in range(200):
            if plural == "buckets" and self.churn.is_set():
                self.churn.clear()
                event = {"type": "MODIFIED", "object": disk("d00", 101)}
                await response.write(json.dumps(event).encode() + b"\n")
                await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.close()  # the stream breaks (a blip, a restart)
                return response
            await response.write(json.dumps(bookmark).encode() + b"\n")
            await asyncio.sleep(0.05)
        await response.write_eof()
        return response


@pytest.fixture
async def served() -> AsyncIterator[tuple[CozystackLike, KubeClient]]:
    server = CozystackLike()
    async with client_of(BASE + "/{plural}", server.serve, timeout=DEADLINE) as client:
        yield server, client


def platform_of(kinds: dict[str, str]) -> Platform:
    found = {kind: SimpleNamespace(plural=plural, kind=kind) for plural, kind in kinds.items()}
    return cast(Platform, SimpleNamespace(kinds=found))


async def test_a_tenants_fat_kind_relisted_as_a_stream_refuses_every_admission_past_the_deadline(
    served: tuple[CozystackLike, KubeClient],
) -> None:
    server, client = served
    live = LiveState(
        client, LiveSettings(read_timeout=30.0, watch_timeout=5, relist_patience=DEADLINE)
    )
    live.platform_generation = 1
    for reflector in live._platform_reflectors:  # the platform's lists are not at stake here
        reflector.listed = reflector.watching = True
        reflector.last_activity = reflector.clock()
        reflector.first_sync_seconds = 0.1
    live._sync_app_watches(platform_of({"tenants": TENANT_KIND, "buckets": "Bucket"}))
    buckets = live._apps["buckets"].reflector
    buckets.pages = PageSizes(page_bytes=BUDGET, limit=1)  # as a large kind is: streamed
    try:
        await eventually(lambda: all(w.reflector.synced for w in live._apps.values()))
        with mock.patch("webhook.state.live.settle_memory"):
            live._note_first_sync()
        assert live.state.synced
        server.pause = 0.1  # the whole kind now streams for some 3 s, each read well in time
        server.churn.set()  # the tenant writes one of its disks; then the watch breaks
        await eventually(lambda: buckets.broken_relists == 1)
        await asyncio.sleep(3 * DEADLINE)
        assert not buckets.listed, "the relist is still streaming"
        # Past the request deadline, a list that had not ended failed: its kind denied alone.
        assert live.state.synced or live.kind_unavailable("Bucket"), (
            "every kind's admissions refused while one kind streams, "
            f"{3 * DEADLINE:g}s past the request deadline of {DEADLINE:g}s"
        )
    finally:
        for watch in live._apps.values():
            watch.stop.set()
            watch.task.cancel()
        await asyncio.gather(*(w.task for w in live._apps.values()), return_exceptions=True)

"""A kind relisted as a stream holds every tenant's admissions for as long as it streams.

A kind listed before that lists again (its watch broke after delivering objects, which a
tenant's churn of its own applications makes every break) is not excused by readiness: stale,
it counts in shared pools, so the whole state is unsynced until the list ends, or fails (then
only that kind is denied). A list of it used to end within the request deadline
(``REQUEST_TIMEOUT``, 10 s); streamed (cozystack-api sends the whole kind, which a tenant fills
with fat applications) it may run for ``STREAMED_LIST_SECONDS`` (600 s), each read within the
read timeout: every tenant's writes of every kind are refused meanwhile, at every relist, in
every replica. Tenants were never excused at all: a tenant's fat sub-tenants stopped every
admission for the whole of each Tenant relist, and again at each relist its next write forced.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from webhook.kube.pages import PageSizes
from webhook.state.live import LiveSettings, LiveState

BASE = "/apis/apps.cozystack.io/v1alpha1"
DEADLINE = 0.5  # the client's request deadline here (REQUEST_TIMEOUT in a replica)
BUDGET = 16 * 1024  # a page's bytes here: read whole up to twice that, streamed past it


def disk(name: str, version: int, kind: str = "Bucket") -> dict[str, Any]:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "tenant-evil",
            "resourceVersion": str(version),
            "annotations": {"example.com/fat": "x" * 4_000},
        },
        "spec": {},
    }


class CozystackLike:
    """Lists of a whole kind (whatever ``limit`` says), the ``fat`` one's sent ``pause``
    seconds a chunk, and watches that send bookmarks, or (``churn``) one tenant's write of the
    fat kind and then break."""

    def __init__(self, fat: str = "buckets") -> None:
        self.fat = fat
        self.kind = {"buckets": "Bucket", "tenants": TENANT_KIND}[fat]
        self.pause = 0.0
        self.churn = asyncio.Event()
        self.lists = 0

    def body(self, plural: str) -> bytes:
        items = (
            [disk(f"d{index:02d}", 10 + index, self.kind) for index in range(60)]
            if plural == self.fat
            else []
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
            if plural == self.fat and self.pause:
                await asyncio.sleep(self.pause)
        await response.write_eof()
        return response

    async def _watch(
        self, plural: str, request: web.Request, response: web.StreamResponse
    ) -> web.StreamResponse:
        bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "100"}}}
        for _ in range(200):
            if plural == self.fat and self.churn.is_set():
                self.churn.clear()
                event = {"type": "MODIFIED", "object": disk("d00", 101, self.kind)}
                await response.write(json.dumps(event).encode() + b"\n")
                await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.close()  # the stream breaks (a blip, a restart)
                return response
            await response.write(json.dumps(bookmark).encode() + b"\n")
            await asyncio.sleep(0.05)
        await response.write_eof()
        return response


@contextlib.asynccontextmanager
async def streaming(fat: str) -> AsyncIterator[tuple[CozystackLike, LiveState]]:
    """A :class:`CozystackLike` of ``fat``, and a live state of its Tenants and Buckets,
    synced, the ``fat`` kind's lists streamed (as a large kind's are); stopped after."""
    server = CozystackLike(fat)
    async with client_of(BASE + "/{plural}", server.serve, timeout=DEADLINE) as client:
        live = LiveState(
            client, LiveSettings(read_timeout=30.0, watch_timeout=5, relist_patience=DEADLINE)
        )
        live.platform_generation = 1
        for reflector in live._platform_reflectors:  # the platform's lists are not at stake
            reflector.listed = reflector.watching = True
            reflector.last_activity = reflector.clock()
            reflector.first_sync_seconds = 0.1
        live._sync_app_watches(platform_of({"tenants": TENANT_KIND, "buckets": "Bucket"}))
        live._apps[fat].reflector.pages = PageSizes(page_bytes=BUDGET, limit=1)
        try:
            await eventually(lambda: all(w.reflector.synced for w in live._apps.values()))
            with mock.patch("webhook.state.live.settle_memory"):
                live._note_first_sync()
            assert live.state.synced
            yield server, live
        finally:
            for watch in live._apps.values():
                watch.stop.set()
                watch.task.cancel()
            await asyncio.gather(*(w.task for w in live._apps.values()), return_exceptions=True)


@pytest.fixture
async def fat_buckets() -> AsyncIterator[tuple[CozystackLike, LiveState]]:
    async with streaming("buckets") as served:
        yield served


@pytest.fixture
async def fat_tenants() -> AsyncIterator[tuple[CozystackLike, LiveState]]:
    async with streaming("tenants") as served:
        yield served


def platform_of(kinds: dict[str, str]) -> Platform:
    found = {kind: SimpleNamespace(plural=plural, kind=kind) for plural, kind in kinds.items()}
    return cast(Platform, SimpleNamespace(kinds=found))


async def test_a_tenants_fat_kind_relisted_as_a_stream_refuses_every_admission_past_the_deadline(
    fat_buckets: tuple[CozystackLike, LiveState],
) -> None:
    server, live = fat_buckets
    buckets = live._apps["buckets"].reflector
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


@pytest.mark.xfail(
    reason="not built: a Tenant relist stops every admission for its whole length; deciding "
    "from the tree last listed lets a quota shrunk through another replica be filled again "
    "here at its old size, past the parent pool's budget (docs/security/threat-model.md)",
    strict=False,
)
async def test_a_tenants_fat_sub_tenants_relisted_as_a_stream_do_not_refuse_every_admission(
    fat_tenants: tuple[CozystackLike, LiveState],
) -> None:
    server, live = fat_tenants
    tenants = live._apps["tenants"].reflector
    server.pause = 0.1  # the tenant's 60 sub-tenants now stream for some 3 s
    server.churn.set()  # it writes one of them; then the watch breaks
    await eventually(lambda: tenants.broken_relists == 1)
    await asyncio.sleep(3 * DEADLINE)
    assert not tenants.listed, "the relist is still streaming"
    # Past its patience, every other kind is decided from the tree last listed; the
    # Tenants' own writes are refused until the list ends.
    decided, why = live.state.synced, live.kind_unavailable(TENANT_KIND)
    await eventually(lambda: tenants.synced, timeout=15)  # nothing left streaming after
    assert decided, (
        "every admission refused while the Tenants stream, "
        f"{3 * DEADLINE:g}s past the relist patience of {DEADLINE:g}s"
    )
    assert why.startswith("listing again for")
    assert live.state.synced
    assert not live.kind_unavailable(TENANT_KIND)
    # It breaks the next watch at once: a run of relists stops everything once, not at
    # each relist (whose wait now grows, too).
    server.churn.set()
    await eventually(lambda: tenants.broken_relists == 2)
    assert live.state.synced, "a relist a watch forced again stopped every admission again"
    assert live.kind_unavailable(TENANT_KIND).startswith("listing again for")

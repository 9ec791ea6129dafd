"""A kind whose every watch expires as it opens stops only itself, also while it backs off.

A watch that gets ``410 Expired`` before it delivers anything is listed again only after the
reflector's backoff (up to 30 s). Were that wait not part of the relist, the kind's reflector
would be neither listed, nor failing to list, nor listing: readiness would not excuse it (a kind
listed before "counts in shared pools: stale, it stops all"), and every tenant's admissions of
every kind would be refused for the whole backoff, at every cycle. Counted as relisting, past
the relist patience it is denied alone.

A tenant who slides its kind's watch-cache window faster than the kind is listed (its own
writes, at the fairness limit) makes every watch expire as it opens.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from unittest import mock

from aiohttp import web

from tests.kube.loopback import client_of
from tests.state.test_streamed_relists import (
    BASE,
    BUDGET,
    DEADLINE,
    CozystackLike,
    platform_of,
)
from tests.waiting import eventually
from webhook.core.tenancy.tenants import TENANT_KIND
from webhook.kube.pages import PageSizes
from webhook.state.live import LiveSettings, LiveState


class ExpiringWatches(CozystackLike):
    """As :class:`CozystackLike`; once ``expire`` is set, every watch of the fat kind answers
    one ERROR 410 at once (its history compacted past the version its list gave)."""

    def __init__(self) -> None:
        super().__init__("buckets")
        self.expire = False
        self.expired = 0

    async def _watch(
        self, plural: str, request: web.Request, response: web.StreamResponse
    ) -> web.StreamResponse:
        if plural == self.fat and self.expire:
            self.expired += 1
            status: dict[str, Any] = {"kind": "Status", "code": 410, "reason": "Expired"}
            event = {"type": "ERROR", "object": {**status, "message": "too old resource version"}}
            await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
            return response
        return await super()._watch(plural, request, response)


async def test_a_kind_whose_watches_expire_as_they_open_stops_only_itself_while_it_backs_off() -> (
    None
):
    server = ExpiringWatches()
    async with client_of(BASE + "/{plural}", server.serve, timeout=DEADLINE) as client:
        live = LiveState(
            client, LiveSettings(read_timeout=30.0, watch_timeout=5, relist_patience=DEADLINE)
        )
        live.platform_generation = 1
        for reflector in live._platform_reflectors:
            reflector.listed = reflector.watching = True
            reflector.last_activity = reflector.clock()
            reflector.first_sync_seconds = 0.1
        live._sync_app_watches(platform_of({"tenants": TENANT_KIND, "buckets": "Bucket"}))
        live._apps["buckets"].reflector.pages = PageSizes(page_bytes=BUDGET, limit=1)
        try:
            await eventually(lambda: all(w.reflector.synced for w in live._apps.values()))
            with mock.patch("webhook.state.live.settle_memory"):
                live._note_first_sync()
            assert live.state.synced
            server.pause = 0.02  # a list of the kind now takes some 0.6 s
            server.expire = True
            server.churn.set()  # the tenant writes; the watch breaks and is reopened
            blocked, longest, step = 0.0, 0.0, 0.05
            loop = asyncio.get_running_loop()
            end = loop.time() + 12.0
            while loop.time() < end:
                await asyncio.sleep(step)
                if live.state.synced or live.kind_unavailable("Bucket"):
                    blocked = 0.0
                else:
                    blocked += step
                    longest = max(longest, blocked)
            assert server.expired >= 3, server.expired
            # Relisted at once, the whole state waits at most the relist patience per cycle
            # (and a little scheduling); it must not wait out the backoff too.
            assert longest <= DEADLINE + 0.5, (
                f"every admission refused for {longest:.1f}s in a row while one kind's "
                f"watches expire as they open (relist patience {DEADLINE:g}s)"
            )
        finally:
            for watch in live._apps.values():
                watch.stop.set()
                watch.task.cancel()
            await asyncio.gather(*(w.task for w in live._apps.values()), return_exceptions=True)

"""A client of one aiohttp handler served on 127.0.0.1: a stand-in server a test shapes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from kubernetes import client as k8s_client

from webhook.kube.client import KubeClient

Handler = Any  # an aiohttp request handler


@contextlib.asynccontextmanager
async def client_of(path: str, handler: Handler, **options: Any) -> AsyncIterator[KubeClient]:
    """A :class:`KubeClient` (with ``options``) of a server answering every request for
    ``path`` (GETs, writes, watches) with ``handler``; both closed after."""
    app = web.Application()
    app.router.add_route("*", path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    configuration = k8s_client.Configuration()
    configuration.host = f"http://127.0.0.1:{runner.addresses[0][1]}"
    client = KubeClient(configuration, **options)
    try:
        yield client
    finally:
        await client.close()
        await runner.cleanup()

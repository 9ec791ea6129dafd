"""A closed client stays closed: a task still ending when the replica stops (a resync, a
roll-back, a confirmation a last sweep asked for) fails its call as if the server could not
be reached, instead of opening connections that nothing closes and that outlive the replica."""

from __future__ import annotations

from collections.abc import Awaitable

import pytest
from aiohttp import web

from tests.kube.loopback import client_of
from webhook.kube.client import ApiError, KubeClient


def recording(served: list[str]) -> object:
    async def answer(request: web.Request) -> web.Response:
        served.append(request.method)
        return web.json_response({"kind": "List", "items": [], "metadata": {}})

    return answer


async def refused(call: Awaitable[object]) -> ApiError:
    with pytest.raises(ApiError, match="the client is closed") as caught:
        await call
    return caught.value


async def watched(client: KubeClient) -> None:
    watch = client.watch("/api/v1/things", resource_version="1", timeout_seconds=60, read_timeout=5)
    async for _ in watch:
        raise AssertionError("a closed client watched")


async def test_a_call_made_after_the_client_closed_opens_no_connection() -> None:
    served: list[str] = []
    async with client_of("/api/v1/things", recording(served)) as client:
        await client.request("GET", "/api/v1/things")
        await client.close()
        calls = [
            client.request("GET", "/api/v1/things"),
            client.request("PUT", "/api/v1/things", body={}),
            client.list_page("/api/v1/things"),
            watched(client),
        ]
        for call in calls:
            error = await refused(call)
            assert error.status == 0, "unreachable: its caller retries later or gives up"
        assert client._session is None, "no session opened again"
    assert served == ["GET"]

"""An error answer is read, kept and logged within a bound, whatever its size.

The API server's error answers are Status objects whose message may quote what was written (a
TenantReservation refused by validation echoes its entries; an object a tenant made large
can come back inside a message), and a proxy or an aggregated server in between can answer
anything. An error is logged, counted and may be quoted in a denial: read whole, one
answer would hold the whole body in memory and copy it into every log line and denial that
names the error.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from aiohttp import web

from tests.kube.loopback import client_of
from tests.kube.reflecting import THINGS, Mirror, reflector, running
from tests.waiting import eventually
from webhook.kube.client import MAX_ERROR_BYTES, MAX_ERROR_MESSAGE, ApiError, ResourceRef

LEDGERS = ResourceRef("reservations.cozystack.io", "v1alpha1", "tenantreservations")
HUGE = 32 * 1024 * 1024  # bytes of error body the server offers


def status(message: str, code: int = 422) -> bytes:
    body = {"kind": "Status", "status": "Failure", "reason": "Invalid", "code": code}
    return json.dumps({**body, "message": message}).encode()


async def endless_error(request: web.Request) -> web.StreamResponse:
    """A 500 whose body goes on for :data:`HUGE` bytes, sent as it is read."""
    response = web.StreamResponse(status=500, headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    chunk = b"x" * 65_536
    try:
        for _ in range(HUGE // len(chunk)):
            await response.write(chunk)
    except (ConnectionResetError, RuntimeError):
        pass  # the client stopped reading
    return response


async def long_status(request: web.Request) -> web.Response:
    """A 422 Status whose message is long, within :data:`MAX_ERROR_BYTES`."""
    return web.Response(status=422, body=status("spec: Invalid value: " + "y" * 50_000))


async def raised(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await call
    return caught.value


@pytest.mark.parametrize("method", ["GET", "PUT"])
async def test_an_endless_error_body_is_read_no_further_than_its_bound(method: str) -> None:
    async with client_of(LEDGERS.path("cozy-reservation"), endless_error) as client:
        tracemalloc.start()
        try:
            body = {"metadata": {"name": "tenant-root"}} if method == "PUT" else None
            error = await raised(
                client.request(method, LEDGERS.path("cozy-reservation"), body=body)
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert error.status == 500
    assert len(error.message) <= MAX_ERROR_MESSAGE + 64
    assert peak < 8 * MAX_ERROR_BYTES  # not the 32 MiB offered


async def test_a_watch_refused_with_an_endless_body_is_read_no_further_than_its_bound() -> None:
    async with client_of(LEDGERS.path("cozy-reservation"), endless_error) as client:
        tracemalloc.start()
        try:
            events = client.watch(
                LEDGERS.path("cozy-reservation"),
                resource_version="1",
                timeout_seconds=5,
                read_timeout=5.0,
            )
            error = await raised(anext(events))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert error.status == 500
    assert peak < 8 * MAX_ERROR_BYTES


async def test_an_api_error_message_is_cut_before_it_is_logged() -> None:
    async with client_of(LEDGERS.path("cozy-reservation"), long_status) as client:
        error = await raised(
            client.request("PUT", LEDGERS.path("cozy-reservation"), body={"metadata": {}})
        )
    assert (error.status, error.reason) == (422, "Invalid")
    assert error.message.startswith("spec: Invalid value: yyy")  # what it says comes first
    assert len(error.message) <= MAX_ERROR_MESSAGE + 64
    assert "50021 characters" in error.message  # and how much was left out
    assert len(str(error)) <= MAX_ERROR_MESSAGE + 128


async def test_a_watch_error_event_with_a_long_message_is_cut_too() -> None:
    # An ERROR event is read within the watch event bound (megabytes), not the error bound.
    async def erroring(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"kind": "ThingList", "metadata": {"resourceVersion": "5"}})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        event = {"type": "ERROR", "object": json.loads(status("z" * 2_000_000, code=500))}
        await response.write(json.dumps(event).encode() + b"\n")
        return response

    async with client_of(THINGS.path(), erroring) as client:
        watcher = reflector(client, Mirror())
        async with running(watcher):
            await eventually(lambda: watcher.last_error != "")
    assert "zzz" in watcher.last_error
    assert len(watcher.last_error) <= MAX_ERROR_MESSAGE + 128


def test_an_api_errors_reason_is_cut_in_what_it_says_too() -> None:
    error = ApiError(500, "R" * 100_000, "m")
    assert len(error.reason) == 200
    assert len(str(error)) < 300

"""A list served whole, whatever ``limit`` asks: cozystack-api's, of every application kind.

cozystack-api answers a list of applications from its cache and ignores ``limit``: it sends
every object of the kind in one response, without a ``continue`` token (measured against the
real binary of ``../shared/cozystack-api``: ``?limit=1`` of 29 VMDisks brought all 29, 6 MB).
The page sizing (:mod:`webhook.kube.pages`) cuts such a page short four times (500, 125, 31,
7 objects asked) and then asks for one object, which it reads whole, without a bound: the whole
kind, every tenant's objects of it, in one body, decoded at once, within one request's
deadline. A tenant's zero-charge applications with 256 KiB of annotations each (a few hundred
of them) make that body larger than a replica's memory limit, and every replica lists the same
kind: each is killed in its list, so none is ever ready, and every tenant's admissions fail.
Decoding makes it worse: orjson's decode of one body peaks at some 13 times the body's bytes,
so a kind of about 30 MB (120 such objects) passes the Deployment's 512 MiB limit.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator

import pytest
from kubernetes import client as k8s_client

from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.kube.pages import MAX_PAGE_BYTES, PageSizes, consistent_read

VMDISKS = ResourceRef("apps.cozystack.io", "v1alpha1", "vmdisks")
OBJECTS = 64
ANNOTATIONS = 250_000  # bytes of annotations per object, under Kubernetes' 256 KiB


SERVER = """
import json, socket, sys
from aiohttp import web
objects, annotations = int(sys.argv[1]), int(sys.argv[2])
notes = {f"example.com/a{j}": "x" * 995 for j in range(annotations // 1000)}
items = [
    {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMDisk",
        "metadata": {
            "name": f"disk{i:03d}",
            "namespace": "tenant-evil",
            "resourceVersion": str(100 + i),
            "annotations": notes,
        },
        "spec": {"storage": "1Gi"},
    }
    for i in range(objects)
]
body = json.dumps(
    {"apiVersion": "apps.cozystack.io/v1alpha1", "kind": "VMDiskList",
     "metadata": {"resourceVersion": str(100 + objects)}, "items": items},
    separators=(",", ":"),
).encode()
limits = []

async def serve(request):
    limits.append(request.query.get("limit", ""))
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()  # as a Go server streams a large answer
    await response.prepare(request)
    for start in range(0, len(body), 1 << 16):
        await response.write(body[start : start + (1 << 16)])
    await response.write_eof()
    return response

async def asked(request):
    return web.json_response({"limits": limits, "bytes": len(body)})

app = web.Application()
app.router.add_get("/apis/apps.cozystack.io/v1alpha1/vmdisks", serve)
app.router.add_get("/asked", asked)
listener = socket.socket(fileno=int(sys.argv[3]))  # bound by the test: no port to race for
web.run_app(app, sock=listener, print=lambda *_: None)
"""


@pytest.fixture
async def whole_lists() -> AsyncIterator[tuple[KubeClient, str]]:
    """A server that lists as cozystack-api does: every object, whatever ``limit`` says (in
    its own process, so that only the replica's memory is measured here)."""
    with socket.socket() as listener:  # bound and listening here, served by the process
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        fd = listener.fileno()
        process = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(OBJECTS), str(ANNOTATIONS), str(fd)],
            pass_fds=[fd],
        )
    configuration = k8s_client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    client = KubeClient(configuration)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                await client.request("GET", "/asked")
                break
            except ApiError:
                assert time.monotonic() < deadline, "the listing server did not start"
                await asyncio.sleep(0.1)
        yield client, "/asked"
    finally:
        await client.close()
        process.terminate()
        process.wait(10)


async def test_a_kind_listed_whole_by_cozystack_api_is_never_held_whole_by_a_replica(
    whole_lists: tuple[KubeClient, str],
) -> None:
    client, asked = whole_lists
    pages = PageSizes()
    tracemalloc.start()
    try:
        _, names = await consistent_read(
            client, VMDISKS, lambda obj: obj["metadata"]["name"], pages=pages
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert names == [f"disk{i:03d}" for i in range(OBJECTS)]
    served = await client.request("GET", asked)
    assert served["bytes"] > 3 * MAX_PAGE_BYTES
    assert "1" in served["limits"], served  # asked for one object, it sent them all
    # A list is read a bounded part at a time, whatever the server sends: never the kind's
    # whole body decoded at once. orjson's decode of a body peaks at some 13 times its bytes
    # (229 MB for this 16 MB list), so what one page may cost is MAX_PAGE_BYTES times that.
    bound = 16 * MAX_PAGE_BYTES
    assert peak < bound, f"peak {peak} bytes reading a list of {pages.listed_bytes}"

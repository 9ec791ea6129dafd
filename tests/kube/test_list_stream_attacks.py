"""A tenant's object against the streamed decode of a list (:mod:`webhook.kube.list_stream`).

A kind cozystack-api lists whole is decoded by ijson as it arrives, past the page bound. ijson
names every event by its prefix (``items.item.spec.<key>.<key>``), a string it builds at every
map key from its parent's: a map under one long key costs that key's length at each of its
own keys. cozystack-api stores a spec as the tenant sent it (no schema pruning, only the ``_``
check), and the values bound counts nodes and depth, never a key's length: one application
with a 1 MiB key over 20,000 small keys is some 1.2 MB of JSON, orjson decodes it in a few
milliseconds, and the stream copies 20 GB for it, on the event loop every admission shares,
in every replica, at every list of its kind.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

from tests.waiting import loop_gaps
from webhook.kube.list_stream import decode_list

ITEM_BYTES = 9 * 2**20  # what the client lets one item be (about its max_event_bytes)


def body_of(spec: dict[str, Any]) -> bytes:
    items = [
        {
            "apiVersion": "apps.cozystack.io/v1alpha1",
            "kind": "VMDisk",
            "metadata": {"name": "disk", "namespace": "tenant-evil", "resourceVersion": "5"},
            "spec": spec,
        }
    ]
    head = {"apiVersion": "apps.cozystack.io/v1alpha1", "kind": "VMDiskList"}
    page = {**head, "metadata": {"resourceVersion": "5"}, "items": items}
    return json.dumps(page, separators=(",", ":")).encode()


async def chunks_of(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 1 << 16):
        yield body[start : start + (1 << 16)]


async def streamed_seconds(body: bytes) -> float:
    names: list[str] = []
    began = time.perf_counter()
    await decode_list(
        chunks_of(body), lambda obj: names.append(obj["metadata"]["name"]), ITEM_BYTES
    )
    assert names == ["disk"]
    return time.perf_counter() - began


async def test_a_tenants_long_map_key_over_many_keys_makes_a_streamed_list_quadratic() -> None:
    keys = 6_000  # of the 20,000 values the bound allows: under a third of the attack
    long_key = "k" * (1024 * 1024)
    hostile = {long_key: {f"x{index}": 0 for index in range(keys)}}
    # The same bytes and the same number of keys, the long text a value instead of a key.
    plain = {"k": {f"x{index}": 0 for index in range(keys)}, "note": long_key}
    hostile_body, plain_body = body_of(hostile), body_of(plain)
    assert abs(len(hostile_body) - len(plain_body)) < 16
    await streamed_seconds(plain_body)  # warmed up
    plain_seconds = await streamed_seconds(plain_body)
    hostile_seconds = await streamed_seconds(hostile_body)
    # A decode costs what its bytes cost, whoever chose where its long string sits.
    assert hostile_seconds < 5 * plain_seconds + 0.02, (
        f"{len(hostile_body)} bytes streamed in {hostile_seconds:.3f}s with a long key, "
        f"{plain_seconds:.3f}s with it a value"
    )


async def test_a_long_key_blocks_the_event_loop_for_one_chunk_of_its_map() -> None:
    """What every admission waits behind: one ``parser.send`` of one 64 KiB chunk."""
    long_key = "k" * (1024 * 1024)
    hostile = {long_key: {f"x{index}": 0 for index in range(6_000)}}  # some 60 KB of keys
    body = body_of(hostile)
    async with loop_gaps() as stalls:
        await streamed_seconds(body)
    # The webhook answers an admission in milliseconds; kube-apiserver gives it 10 s at most.
    assert max(stalls) < 0.1, f"the event loop stalled {max(stalls):.2f}s on one chunk"


async def test_a_tenants_deep_spec_of_long_keys_holds_a_streamed_list_at_150_times_its_bytes() -> (
    None
):
    """ijson keeps the prefix of every open level: ``depth`` levels of ``key``-long keys hold
    ``depth**2 * key / 2`` bytes of prefixes at once, for an object of ``depth * key`` bytes.
    300 levels of 1,400-byte keys (421 KB) hold some 66 MB; 1,000 of them (1.4 MB, a depth a
    review decodes and warn or off admits) some 700 MB, past a replica's 512 MiB. Within the
    values bound (64 levels) a 1.4 MB object holds 50 MB, 36 times its bytes, in every kind's
    stream at once."""
    spec: Any = 0
    for level in range(300):
        spec = {f"{level:05d}" + "k" * 1_395: spec}
    body = body_of(spec)
    tracemalloc.start()
    try:
        await streamed_seconds(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # One object decoded costs some 13 times its bytes (orjson's, and about ijson's too).
    assert peak < 20 * len(body), f"{len(body)} bytes streamed, {peak} bytes held at once"

"""A small probe's latency while hostile reviews arrive, against the same probe alone.

Issue 9's attack: 16 reviews of a Kubernetes with 250,000 node groups each. Bounded before work
(values are measured before defaulting), each is refused in the time it takes to decode it, so
the probe sent among them still answers far inside the API server's 10 s timeout. Rounds of
"alone" and "under attack" are interleaved and the medians compared as a ratio.

Run: python -m benchmarks.hostile [ROUNDS]
"""

from __future__ import annotations

import asyncio
import io
import json
import statistics
import sys
import time
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from tests.builders import review, state
from webhook.admission.admit import Admission
from webhook.core.admission.decisions import Policy
from webhook.http.app import create_app
from webhook.settings import Settings

HEAVY_REVIEWS = 16
NODE_GROUPS = 250_000
JSON = {"Content-Type": "application/json"}


async def main(rounds: int) -> None:
    current = state({"tenant-acme": {"memory": "1Ti"}})
    app = create_app(Admission(current, Policy()), Settings())
    groups: dict[str, Any] = {f"g{i}": {} for i in range(NODE_GROUPS)}
    heavy = json.dumps(review("Kubernetes", "tenant-acme", "k", {"nodeGroups": groups})).encode()
    async with TestClient(TestServer(app)) as client:

        async def probe(index: int) -> float:
            body = review("VMInstance", "tenant-acme", f"p{index}", {"instanceType": "u1.micro"})
            started = time.perf_counter()
            response = await client.post("/validate", json=body)
            assert (await response.json())["response"]["allowed"]
            return time.perf_counter() - started

        async def attack() -> None:
            response = await client.post("/validate", data=io.BytesIO(heavy), headers=JSON)
            if response.status == 200:  # refused on its size; 408 when its upload was too slow
                assert not (await response.json())["response"]["allowed"]
            else:
                assert response.status == 408, response.status

        alone: list[float] = []
        attacked: list[float] = []
        attack_total: list[float] = []
        for index in range(rounds):
            alone.append(await probe(2 * index))
            started = time.perf_counter()
            heavy_tasks = [asyncio.create_task(attack()) for _ in range(HEAVY_REVIEWS)]
            await asyncio.sleep(0)
            attacked.append(await probe(2 * index + 1))
            await asyncio.gather(*heavy_tasks)
            attack_total.append(time.perf_counter() - started)
    median_alone, median_attacked = statistics.median(alone), statistics.median(attacked)
    print(f"rounds: {rounds}; {HEAVY_REVIEWS} reviews of {NODE_GROUPS} node groups per attack")
    print(f"probe alone:           median {median_alone * 1000:8.1f} ms")
    print(f"probe under attack:    median {median_attacked * 1000:8.1f} ms")
    print(f"whole attack refused:  median {statistics.median(attack_total) * 1000:8.1f} ms")
    print(f"ratio under attack / alone: {median_attacked / median_alone:.1f}x")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))

"""Webhook throughput and latency over loopback TLS, next to a bare aiohttp TLS server.

Starts each server in its own process (the webhook with `webhook serve` on the fixtures state,
the baseline with benchmarks.bare_server), then drives both with the same client: the same
number of dry-run VMInstance CREATE reviews over six instance types (the full decision,
nothing reserved, so every request costs the same), over keep-alive TLS connections with a
fixed concurrency. Prints requests per second and p50/p99 latency side by side, and the
webhook's share of the baseline's throughput (the target is at least 60%).

Run: .venv/bin/python -m benchmarks.server [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.builders import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Instance types that fit tenant-acme's free 12Gi: the requests vary like a real cluster's.
TYPES = ("u1.micro", "u1.small", "u1.medium", "u1.large", "cx1.medium", "o1.small")


def review(index: int) -> bytes:
    obj = {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMInstance",
        "metadata": {"name": f"vm{index}", "namespace": "tenant-acme"},
        "spec": {"instanceType": "u1.micro"},
    }
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"bench-{index}",
            "operation": "CREATE",
            "namespace": "tenant-acme",
            "name": f"vm{index}",
            "dryRun": True,
            "userInfo": {"username": "bench"},
            "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": "VMInstance"},
            "resource": {
                "group": "apps.cozystack.io",
                "version": "v1alpha1",
                "resource": "vminstances",
            },
            "object": obj,
        },
    }
    return json.dumps(body).encode()


async def wait_ready(base: str, context: ssl.SSLContext) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.get(f"{base}/livez", ssl=context) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{base} did not start")


async def drive(
    base: str, context: ssl.SSLContext, requests: int, concurrency: int
) -> tuple[float, list[float]]:
    bodies = [review(i) for i in range(requests)]
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=context)
    async with aiohttp.ClientSession(connector=connector) as session:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        for body in bodies:
            queue.put_nowait(body)

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                started = time.perf_counter()
                async with session.post(
                    f"{base}/validate", data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    answer = await r.json()
                    assert answer["response"]["allowed"], answer
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return requests / elapsed, sorted(latencies)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as certs:
        subprocess.run(
            [
                BIN / "webhook",
                "certs",
                "generate",
                "--out",
                certs,
                "--dns",
                "localhost",
                "--ip",
                "127.0.0.1",
            ],
            check=True,
            capture_output=True,
        )
        context = ssl.create_default_context(cafile=f"{certs}/ca.crt")
        results = {}
        for name in ("bare", "webhook"):
            port = free_port()
            if name == "bare":
                command = [sys.executable, "-m", "benchmarks.bare_server", certs, str(port)]
            else:
                command = [
                    str(BIN / "webhook"),
                    "serve",
                    "--state",
                    "fixtures/cozystack",
                    "--state",
                    "fixtures/tenants",
                    "--cert-dir",
                    certs,
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--log-level",
                    "WARNING",
                ]
            process = subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                base = f"https://127.0.0.1:{port}"
                asyncio.run(wait_ready(base, context))
                asyncio.run(drive(base, context, 200, args.concurrency))  # warm up
                results[name] = asyncio.run(drive(base, context, args.requests, args.concurrency))
            finally:
                process.terminate()
                process.wait(timeout=30)
    print(f"{args.requests} dry-run CREATE reviews, concurrency {args.concurrency}, loopback TLS")
    print(f"{'server':>8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for name, (rate, latencies) in results.items():
        p50 = latencies[len(latencies) // 2] * 1000
        p99 = latencies[int(len(latencies) * 0.99)] * 1000
        print(f"{name:>8} {rate:>9.0f} {p50:>8.2f} {p99:>8.2f}")
    share = results["webhook"][0] / results["bare"][0]
    print(f"webhook throughput / bare throughput: {share:.0%} (target >= 60%)")


if __name__ == "__main__":
    main()

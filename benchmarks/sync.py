"""Time to first sync and memory of the live state, for 10,000 and 100,000 applications.

An emulated API server in another process holds the applications (VMInstances over 1,000
tenants, the real platform data); this process runs the webhook's live state against it and
prints, side by side, the time from start to the first complete sync and the memory it took:
resident set growth, and Python allocations per application (tracemalloc, in a second sync,
since tracing slows allocation down). Targets: under 10 s
to sync 100,000 applications, under 1 KiB of state per application.

Run: .venv/bin/python -m benchmarks.sync
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from webhook.kube.client import KubeClient
from webhook.state.live import LiveSettings, LiveState

SIZES = (10_000, 100_000)
ROOT = Path(__file__).resolve().parent.parent


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def measure(kubeconfig: str, *, trace: bool) -> tuple[float, int, int, int]:
    """Sync once; with ``trace``, count Python allocations (which slows the sync down)."""
    gc.collect()
    before_rss = rss()
    if trace:
        tracemalloc.start()
    client = KubeClient.from_kubeconfig(kubeconfig)
    live = LiveState(client, LiveSettings(read_timeout=30.0))
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(live.run(stop))
    while not live.synced:
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - started
    applications = len(live.state)
    gc.collect()
    allocated = tracemalloc.get_traced_memory()[0] if trace else 0
    tracemalloc.stop()
    grown = rss() - before_rss
    stop.set()
    await task
    await client.close()
    return elapsed, applications, grown, allocated


def main() -> None:
    results = {}
    for size in SIZES:
        with tempfile.TemporaryDirectory() as directory:
            server = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.emulated_cluster", str(size), directory],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert server.stdout is not None
            assert server.stdin is not None
            kubeconfig = server.stdout.readline().strip()
            try:
                elapsed, applications, grown, _ = asyncio.run(measure(kubeconfig, trace=False))
                _, _, _, allocated = asyncio.run(measure(kubeconfig, trace=True))
                results[size] = (elapsed, applications, grown, allocated)
            finally:
                server.stdin.close()
                server.wait(timeout=60)
    print("live state: first sync against an emulated API server (VMInstances, 1,000 tenants)")
    print(f"{'applications':>13} {'sync s':>7} {'RSS MiB':>8} {'B/app (alloc)':>14}")
    for elapsed, applications, grown, allocated in results.values():
        print(
            f"{applications:>13,} {elapsed:>7.2f} {grown / 2**20:>8.1f} "
            f"{allocated / applications:>14,.0f}"
        )
    (_small, _, _, a_small), (large, _, _, a_large) = results[SIZES[0]], results[SIZES[1]]
    per_app = (a_large - a_small) / (SIZES[1] - SIZES[0])
    print(
        f"state growth from {SIZES[0]:,} to {SIZES[1]:,}: {per_app:,.0f} bytes per application "
        f"(target < 1024); sync of {SIZES[1]:,}: {large:.1f} s (target < 10 s)"
    )


if __name__ == "__main__":
    main()

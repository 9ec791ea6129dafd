"""Peak memory and time of the live state's first sync and of a relist, per application.

An emulated API server in one process holds realistic VMInstances (about 2.9 KB of JSON each:
labels, annotations, managedFields, status; see ``benchmarks.emulated_cluster``) over 1,000
tenants, with the real platform data. A fresh process runs the webhook's live state against
it, so its figures are its own: the time to the first complete sync, then a forced relist
(history compacted, watches cut: ``410 Gone``). It reports resident memory from
``/proc/self/status``: ``VmHWM`` (the peak, which is what a memory limit kills on) and
``VmRSS`` after each phase, all measured, none traced.

The goal (issue: peak memory at first sync): 150,000 realistic applications within the
Deployment's memory limit (``deploy/base/deployment.yaml``). The script prints the measured
peak, the peak per application, and the peak projected at 150,000 next to the limit.

Run: .venv/bin/python -m benchmarks.sync [SIZE ...]     (default: 10000 50000 150000)
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cluster_process import ask, start_cluster

ROOT = Path(__file__).resolve().parent.parent
SIZES = (10_000, 50_000, 150_000)
GOAL_APPLICATIONS = 150_000
TENANTS = 1_000


def memory() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found


async def measure(kubeconfig: str) -> dict[str, Any]:
    """In the measuring process: sync, report, wait for the relist, report again."""
    from webhook.kube.client import KubeClient
    from webhook.state.live import LiveSettings, LiveState

    baseline = memory()
    client = KubeClient.from_kubeconfig(kubeconfig)
    live = LiveState(client, LiveSettings(read_timeout=60.0))
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(live.run(stop))
    while not live.first_sync_seconds:
        await asyncio.sleep(0.01)
    synced = {"seconds": time.perf_counter() - started, **memory()}
    print("synced", flush=True)  # the parent now forces a relist
    reflector = live._apps["vminstances"].reflector
    started = time.perf_counter()
    while reflector.relists == 0 or not live.synced:
        await asyncio.sleep(0.01)
    relisted = {"seconds": time.perf_counter() - started, **memory()}
    result = {
        "applications": len(live.state),
        "baseline": baseline,
        "synced": synced,
        "relisted": relisted,
    }
    stop.set()
    await task
    await client.close()
    return result


def run_size(size: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        command = [sys.executable, "-m", "benchmarks.emulated_cluster", str(size), directory]
        server, kubeconfig = start_cluster([*command, "--realistic"])
        try:
            measurer = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.sync", "--measure", kubeconfig],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert measurer.stdout is not None
            assert measurer.stdout.readline().strip() == "synced"
            assert ask(server, "relist") == "ok"
            result: dict[str, Any] = json.loads(measurer.stdout.read())
            measurer.wait(timeout=120)
            return result
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(timeout=120)


def memory_limit() -> int:
    """The memory limit the Deployment ships with, in bytes."""
    text = (ROOT / "deploy" / "base" / "deployment.yaml").read_text()
    match = re.search(r"limits:\s*\n\s*memory:\s*(\d+)(Mi|Gi)", text)
    assert match is not None, "no memory limit in deploy/base/deployment.yaml"
    return int(match.group(1)) * (2**20 if match.group(2) == "Mi" else 2**30)


def main(sizes: tuple[int, ...]) -> None:
    results = [run_size(size) for size in sizes]
    mib = 2**20
    print("live state against an emulated API server: realistic VMInstances, 1,000 tenants")
    print("(RSS of a fresh measuring process; peak = VmHWM, what a memory limit acts on)")
    header = (
        f"{'applications':>13} {'sync s':>7} {'relist s':>9} {'base MiB':>9} "
        f"{'peak MiB':>9} {'after MiB':>10} {'peak B/app':>11} {'held B/app':>11}"
    )
    print(header)
    for result in results:
        apps = result["applications"]
        base = result["baseline"]["VmRSS"]
        peak = result["relisted"]["VmHWM"]
        after = result["relisted"]["VmRSS"]
        print(
            f"{apps:>13,} {result['synced']['seconds']:>7.1f} "
            f"{result['relisted']['seconds']:>9.1f} {base / mib:>9.0f} {peak / mib:>9.0f} "
            f"{after / mib:>10.0f} {(peak - base) / apps:>11,.0f} {(after - base) / apps:>11,.0f}"
        )
    largest = max(results, key=lambda r: r["applications"])
    smallest = min(results, key=lambda r: r["applications"])
    if largest["applications"] >= GOAL_APPLICATIONS:
        projected = largest["relisted"]["VmHWM"]
        how = "measured"
    else:
        slope = (largest["relisted"]["VmHWM"] - smallest["relisted"]["VmHWM"]) / max(
            1, largest["applications"] - smallest["applications"]
        )
        projected = int(
            largest["relisted"]["VmHWM"] + slope * (GOAL_APPLICATIONS - largest["applications"])
        )
        how = "projected"
    limit = memory_limit()
    verdict = "met" if projected <= limit else "NOT met"
    print(
        f"goal: {GOAL_APPLICATIONS:,} realistic applications within the shipped limit "
        f"({limit / mib:,.0f} MiB): peak {projected / mib:,.0f} MiB ({how}): {verdict}"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(asyncio.run(measure(sys.argv[2]))), flush=True)
    else:
        main(tuple(int(a) for a in sys.argv[1:]) or SIZES)

"""Another tenant's latency and the replica's memory while one tenant's objects are big or busy.

Three attacks of one tenant on the shared replica, each against the same scenario without it,
in one run: the emulated API server (``tests.apiserver``, with the real platform data) in its
own process (niced: in a cluster it runs elsewhere), one replica (``webhook serve``, default
settings) in another, and the load generator (this process) posting reviews to it over TLS.

- ``storm``: one stored VMInstance with 28,000 spec keys (about 460 KB), its label patched 25
  times a second (what the shipped matchConditions let through undecided). Without: the same
  VMInstance, never patched.
- ``fat``: 500 VMDisks and 500 VMInstances with 248 KB of annotations each (Kubernetes allows
  256 KiB), in the attacker's namespace; during the window every watch is cut and its history
  compacted, so both kinds are listed again at once (what a relist or resync does).
  Without: no fat objects, the same relist.
- ``expiring``: the fat objects, plus 3 VMDisk CREATEs a second admitted but never stored,
  which make the ledger wait for VMDisk (consistent reads of the kind) once their holds
  expire (25 s), so this window is 45 s. Without: the fat objects alone.

The victim: another tenant's UPDATE of its VMInstance that makes no API call (the same size),
sent one after another, 20 a second at most, for the window. Printed per scenario: the victim's
p50, p99 and max, how many it sent, the replica's CPU seconds per second of the window, its
peak resident memory (``VmHWM``: what a memory limit acts on) next to the shipped limit, and
the list requests the server answered for VMDisks during the window.

With ``--before DIR`` each scenario also runs with the replica of another checkout (``git
archive`` of an earlier commit; the cluster and the load generator are this one's), before
this one's: before and after on the same machine, in one run.

Run: .venv/bin/python -m benchmarks.heavy_objects [--before DIR] [--seconds 12] [SCENARIO ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cluster_process import ask, start_cluster
from benchmarks.server import cpu_seconds
from benchmarks.sync import memory_limit

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("storm", "fat", "expiring")
HEAVY_KEYS = 28_000
STORM_PER_SECOND = 25
FAT_OBJECTS = 500  # of each kind
FAT_BYTES = 248_000
EXPIRING_PER_SECOND = 3
EXPIRING_SECONDS = 45.0  # the window of the expiring scenarios: past the holds' 25 s grace
VICTIM_PER_SECOND = 20
MICRO = {"instanceType": "u1.micro"}


# -- the cluster process ------------------------------------------------------------------


async def serve_cluster(attack: str, directory: Path) -> None:
    """The emulated API server with the scenario's objects; ``start`` on stdin starts the
    window (the storm, the relist), ``stats`` prints the list requests since."""
    from tests.cluster import app, cluster, tenant

    async with cluster(directory, bookmark_interval=5.0) as (server, kubeconfig):
        for name in ("victim", "attacker"):
            server.create(tenant("tenant-root", name, {"memory": "100000Gi", "storage": "1Pi"}))
        server.create(app("VMInstance", "tenant-victim", "vm", MICRO))
        heavy = {**MICRO, "cloudInit": {f"k{i:05d}": i for i in range(HEAVY_KEYS)}}
        server.create(app("VMInstance", "tenant-attacker", "heavy", heavy))
        if attack in ("fat", "fat-quiet", "expiring"):
            for index in range(FAT_OBJECTS):
                for kind, spec in (("VMDisk", {"storage": "1Gi"}), ("VMInstance", MICRO)):
                    obj = app(kind, "tenant-attacker", f"fat{index:04d}", spec)
                    obj["metadata"]["annotations"] = {"note": "x" * FAT_BYTES}
                    server.create(obj)
        print(kubeconfig, flush=True)
        loop = asyncio.get_running_loop()
        storm: asyncio.Task[None] | None = None
        mark = 0
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = line.split()
            if command == ["start"]:
                mark = len(server.requests)
                if attack == "storm":
                    storm = asyncio.create_task(label_storm(server))
                if attack in ("fat", "baseline-fat"):
                    server.drop_watches()
                    server.create(app("VMInstance", "tenant-victim", "bump", MICRO))
                    server.compact()
                print("ok", flush=True)
            elif command == ["stats"]:
                lists = [
                    r
                    for r in server.requests[mark:]
                    if r.method == "GET"
                    and r.path.endswith("/vmdisks")
                    and r.query.get("watch") not in ("true", "1")
                ]
                reads = sum(1 for r in lists if "continue" not in r.query)
                figures = {"disk_pages": len(lists), "disk_reads": reads, "patches": PATCHES[0]}
                print(json.dumps(figures), flush=True)
        if storm is not None:
            storm.cancel()


PATCHES = [0]  # label patches made so far


async def label_storm(server: Any) -> None:
    started = time.monotonic()
    while True:
        PATCHES[0] += 1
        patch = {"metadata": {"labels": {"storm": str(PATCHES[0])}}}
        server.patch("apps.cozystack.io", "vminstances", "tenant-attacker", "heavy", patch)
        await asyncio.sleep(max(0.0, started + PATCHES[0] / STORM_PER_SECOND - time.monotonic()))


# -- the replica --------------------------------------------------------------------------


def spawn_replica(kubeconfig: str, certs: Path, port: int, tree: Path) -> subprocess.Popen[bytes]:
    environment = {
        **os.environ,
        "POD_NAME": "replica-a",
        "POD_NAMESPACE": "cozy-reservation",
        "WEBHOOK_LOG_LEVEL": "ERROR",
        "PYTHONPATH": str(tree),
    }
    command = [sys.executable, "-m", "webhook", "serve", "--kubeconfig", kubeconfig]
    command += ["--cert-dir", str(certs), "--listen", f"127.0.0.1:{port}"]
    command += ["--metrics-listen", "127.0.0.1:0"]
    return subprocess.Popen(
        command, cwd=tree, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def proc_status(pid: int) -> dict[str, int]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found


# -- the load generator -------------------------------------------------------------------


async def window(port: int, certs: Path, seconds: float, *, expiring: bool) -> list[float]:
    """The victim's latencies over ``seconds`` (and, with ``expiring``, the attacker's
    never-stored VMDisk CREATEs beside it)."""
    import aiohttp

    from tests.builders import review

    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    url = f"https://localhost:{port}/validate"
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:

        async def victim() -> None:
            body = review(
                "VMInstance", "tenant-victim", "vm", MICRO, operation="UPDATE", old_spec=MICRO
            )
            for _ in range(5):  # warm up: the TLS connection, the first decisions
                async with session.post(url, json=body) as response:
                    await response.read()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.monotonic()
                async with session.post(url, json=body) as response:
                    answer = (await response.json())["response"]
                latencies.append(time.monotonic() - started)
                assert answer["allowed"], answer
                await asyncio.sleep(max(0.0, started + 1 / VICTIM_PER_SECOND - time.monotonic()))

        async def attacker() -> None:
            end, index = time.monotonic() + seconds, 0
            while time.monotonic() < end:
                index += 1
                name = f"never{index:05d}"
                body = review("VMDisk", "tenant-attacker", name, {"storage": "1Gi"}, uid=name)
                async with session.post(url, json=body) as response:
                    await response.read()
                await asyncio.sleep(1 / EXPIRING_PER_SECOND)

        await asyncio.gather(victim(), *([attacker()] if expiring else []))
    return latencies


async def ready(port: int, certs: Path, timeout: float = 300.0) -> None:
    import aiohttp

    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"https://localhost:{port}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError("the replica never became ready")


def run(attack: str, tree: Path, seconds: float) -> dict[str, Any]:
    """One scenario in fresh processes: its victim latencies and the replica's figures."""
    from tests.builders import free_port
    from webhook.tls.certificates import generate

    with tempfile.TemporaryDirectory() as directory:
        certs = Path(directory) / "certs"
        generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
        # The API server is niced: in a cluster it runs elsewhere, and here its encoding of
        # the fat pages would otherwise compete with the replica for the same cores.
        command = [sys.executable, "-m", "benchmarks.heavy_objects", "--cluster", attack]
        cluster, kubeconfig = start_cluster(["nice", "-n", "10", *command, directory])
        port = free_port()
        replica = spawn_replica(kubeconfig, certs, port, tree)
        try:
            asyncio.run(ready(port, certs))
            synced = proc_status(replica.pid)
            assert ask(cluster, "start") == "ok"
            cpu = cpu_seconds(replica.pid)
            if attack in ("expiring", "fat-quiet"):  # holds expire after 25 s: watch past it
                seconds = max(seconds, EXPIRING_SECONDS)
            latencies = asyncio.run(window(port, certs, seconds, expiring=attack == "expiring"))
            cpu = (cpu_seconds(replica.pid) - cpu) / seconds
            memory = proc_status(replica.pid)
            stats = json.loads(ask(cluster, "stats"))
        finally:
            replica.terminate()
            replica.wait(timeout=60)
            assert cluster.stdin is not None
            cluster.stdin.close()
            cluster.wait(timeout=120)
    ordered = sorted(latencies)
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
        "sent": len(ordered),
        "cpu": cpu,
        "synced_peak": synced["VmHWM"],
        "peak": memory["VmHWM"],
        **stats,
    }


# Each scenario with the attack, and the same without it.
WITHOUT = {"storm": "baseline", "fat": "baseline-fat", "expiring": "fat-quiet"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, help="another checkout, run beside this one")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = parser.parse_args()
    trees = [*([args.before] if args.before else []), ROOT]
    mib, limit = 2**20, memory_limit()
    print(f"window {args.seconds:g} s; shipped memory limit {limit / mib:.0f} MiB")
    print(
        f"{'code':<8} {'scenario':<13} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'sent':>5} "
        f"{'cpu s/s':>8} {'sync MiB':>9} {'peak MiB':>9} {'disk reads':>10} {'pages':>6} "
        f"{'patches':>8}"
    )
    for attack in args.scenarios:
        for tree in trees:  # before and after, each without the attack and then with it
            code = "this" if tree == ROOT else "before"
            for scenario in (WITHOUT[attack], attack):
                figures = run(scenario, tree, args.seconds)
                print(
                    f"{code:<8} {scenario:<13} {figures['p50'] * 1000:>7.1f} "
                    f"{figures['p99'] * 1000:>7.1f} {figures['max'] * 1000:>7.1f} "
                    f"{figures['sent']:>5} {figures['cpu']:>8.2f} "
                    f"{figures['synced_peak'] / mib:>9.0f} {figures['peak'] / mib:>9.0f} "
                    f"{figures['disk_reads']:>10} {figures['disk_pages']:>6} "
                    f"{figures['patches']:>8}",
                    flush=True,
                )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cluster"]:
        asyncio.run(serve_cluster(sys.argv[2], Path(sys.argv[3])))
    else:
        main()

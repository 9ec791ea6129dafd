"""The reservation ledger under load: non-dry-run CREATEs through the real server.

Starts three processes: the emulated API server (``tests/apiserver``, with the Cozystack
platform and 20 tenants of ample budget), ``webhook serve`` against it (default log level),
and wrk (Debian's, installed with apt-get if missing) as an independent load generator. wrk's
Lua script sends a distinct VMInstance name per request (thread id and counter), into one pool
or spread over 20. The emulated API server plays the part of the real one after admission:
each charge that appears in a TenantReservation is stored as its object, so the webhook's
watch sees it and its entry settles, as in a cluster.

Each round runs both scenarios back to back (interleaved), and the table prints the median,
min and max over the rounds of: admissions per second (allowed CREATEs), p99 latency, API
writes per admission (TenantReservation writes the API server received), and the largest
TenantReservation it stored, beside the goals of issue 14.

With ``--profile`` the webhook runs under cProfile and the functions taking the most time
(cumulative and own) are printed after the table: where the time goes when a goal is missed.

With ``--against DIR`` (another checkout, with its own ``.venv``: the code before a change) both
checkouts' stacks (emulated API server and webhook) are served at once, and every scenario of
every round runs on each in turn, the order swapped each round: before and after under the same
neighbours' load, with the ratio of the medians.

Run: .venv/bin/python -m benchmarks.ledger [--seconds 10] [--rounds 3] [--connections 16]
     [--profile] [--against DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks.cluster_process import ask, start_cluster

ROOT = Path(__file__).resolve().parent.parent
POOLS = 20
SPEC = {"instanceType": "u1.micro"}  # 1 vCPU, 1Gi: the charge the stored object carries
GOALS = {"admissions/s": ">= 1000", "p99 ms": "<= 100", "writes/admission": "< 0.2"}

LUA = r"""
local pools = tonumber(os.getenv("BENCH_POOLS") or "1")
local prefix = os.getenv("BENCH_PREFIX") or "r"
local threads = {}
counter = 0
allowed = 0
denied = 0

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

local template = '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'
  .. '{"uid":"%s","operation":"CREATE","namespace":"%s","name":"%s",'
  .. '"userInfo":{"username":"bench"},'
  .. '"kind":{"group":"apps.cozystack.io","version":"v1alpha1","kind":"VMInstance"},'
  .. '"resource":{"group":"apps.cozystack.io","version":"v1alpha1","resource":"vminstances"},'
  .. '"object":{"apiVersion":"apps.cozystack.io/v1alpha1","kind":"VMInstance",'
  .. '"metadata":{"name":"%s","namespace":"%s"},"spec":{"instanceType":"u1.micro"}}}}'

function request()
  counter = counter + 1
  local name = string.format("%s-%d-%d", prefix, tid, counter)
  local namespace = string.format("tenant-t%d", counter %% pools)
  return wrk.format(nil, nil, nil, string.format(template, name, namespace, name, name, namespace))
end

function response(status, headers, body)
  if status == 200 and string.find(body, '"allowed":true', 1, true) then
    allowed = allowed + 1
  else
    denied = denied + 1
  end
end

function done(summary, latency, requests)
  local a, d = 0, 0
  for _, t in ipairs(threads) do
    a = a + t:get("allowed")
    d = d + t:get("denied")
  end
  local e = summary.errors
  io.write(string.format(
    "RESULT {\"requests\":%d,\"micros\":%d,\"allowed\":%d,\"denied\":%d,"
    .. "\"p50\":%d,\"p99\":%d,\"errors\":%d}\n",
    summary.requests, summary.duration, a, d, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
"""


# --- the emulated cluster (run in its own process with --cluster DIR) -----------------------


async def run_cluster(directory: Path) -> None:
    from tests.apiserver.server import MODIFIED, EmulatedAPIServer, Resource
    from tests.cluster import app, platform_manifests, register, tenant

    class StoringAPIServer(EmulatedAPIServer):
        """Stores each newly admitted charge as its object, as the API server would."""

        writes = 0
        largest = 0

        def _commit(self, resource: Resource, kind: str, obj: Any, prev: Any) -> None:
            super()._commit(resource, kind, obj, prev)
            if resource.plural != "tenantreservations" or kind != MODIFIED:
                return
            StoringAPIServer.writes += 1
            StoringAPIServer.largest = max(StoringAPIServer.largest, len(json.dumps(obj)))
            before = {e.get("id") for e in ((prev or {}).get("status") or {}).get("pending") or []}
            for entry in (obj.get("status") or {}).get("pending") or []:
                if entry.get("id") not in before:
                    kind_name, namespace, name = entry["application"].split("/")
                    asyncio.get_running_loop().call_soon(
                        self._store_app, app(kind_name, namespace, name, SPEC)
                    )

        def _store_app(self, obj: Any) -> None:
            with contextlib.suppress(Exception):  # stored already: the API server says 409
                self.create(obj)

    server = StoringAPIServer(bookmark_interval=0.2)
    register(server)
    for manifest in platform_manifests():
        server.create(manifest)
    for index in range(POOLS):
        server.create(
            tenant("tenant-root", f"t{index}", {"cpu": "10000000", "memory": "10000000Gi"})
        )
    async with server:
        print(server.kubeconfig(directory / "kubeconfig"), flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            stats = {"writes": StoringAPIServer.writes, "largest": StoringAPIServer.largest}
            StoringAPIServer.largest = 0
            print(json.dumps(stats), flush=True)


# --- the driver -----------------------------------------------------------------------------


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    print("wrk not found: installing Debian's package", file=sys.stderr)
    command = ["apt-get", "install", "-y", "wrk"]
    if os.geteuid() != 0:
        command = ["sudo", *command]
    subprocess.run(command, check=True)
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("wrk could not be installed; install it and run again")
    return found


def wait_ready(port: int, context: ssl.SSLContext, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}/readyz", context=context, timeout=2
            ) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the webhook did not become ready")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cluster_stats(cluster: subprocess.Popen[str]) -> dict[str, int]:
    stats: dict[str, int] = json.loads(ask(cluster, "stats"))
    return stats


def run_wrk(
    wrk: str, script: Path, port: int, *, pools: int, prefix: str, seconds: int, connections: int
) -> dict[str, int]:
    environment = {**os.environ, "BENCH_POOLS": str(pools), "BENCH_PREFIX": prefix}
    result = subprocess.run(
        [
            wrk,
            "-t2",
            f"-c{connections}",
            f"-d{seconds}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            f"https://127.0.0.1:{port}/validate",
        ],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            figures: dict[str, int] = json.loads(line.removeprefix("RESULT "))
            return figures
    raise SystemExit(f"wrk printed no result:\n{result.stdout}\n{result.stderr}")


@dataclass
class Stack:
    """One emulated API server and the webhook serving against it, from one checkout."""

    name: str
    cluster: subprocess.Popen[str]
    webhook: subprocess.Popen[bytes]
    port: int


def start_stack(name: str, tree: Path, directory: Path, certs: Path, profiler: list[str]) -> Stack:
    """The emulated API server and ``webhook serve`` of ``tree`` (with its own ``.venv``)."""
    from tests.builders import free_port

    venv = tree / ".venv" / "bin" / "python"
    python = str(venv) if tree != ROOT and venv.exists() else sys.executable
    directory.mkdir(parents=True, exist_ok=True)
    cluster, kubeconfig = start_cluster(
        [python, "-m", "benchmarks.ledger", "--cluster", str(directory)], cwd=tree
    )
    port = free_port()
    log: IO[bytes]
    with (directory / "webhook.log").open("wb") as log:
        webhook = subprocess.Popen(
            [
                python,
                *profiler,
                "-m",
                "webhook",
                "serve",
                "--kubeconfig",
                kubeconfig,
                "--cert-dir",
                str(certs),
                "--listen",
                f"127.0.0.1:{port}",
                # A free port, not the default 8080: another run on the machine may hold it.
                "--metrics-listen",
                f"127.0.0.1:{free_port()}",
            ],
            cwd=tree,
            env={**os.environ, "POD_NAME": "bench", "POD_NAMESPACE": "cozy-reservation"},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    return Stack(name, cluster, webhook, port)


def stop_stack(stack: Stack) -> None:
    for process in (stack.webhook, stack.cluster):
        process.terminate()
    for process in (stack.webhook, stack.cluster):
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--profile", action="store_true", help="profile the webhook")
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout (with its own .venv): both served at once, wrk alternating",
    )
    parser.add_argument("--cluster", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cluster:
        asyncio.run(run_cluster(args.cluster))
        return
    if args.profile and args.against:
        parser.error("--profile profiles one webhook: run it without --against")
    from webhook.tls.certificates import generate

    wrk = ensure_wrk()
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        script = directory / "ledger.lua"
        script.write_text(LUA.replace("%%", "%"))
        certs = directory / "certs"
        generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        profile = Path(tempfile.gettempdir()) / "webhook-ledger.prof"
        profiler = ["-m", "cProfile", "-o", str(profile)] if args.profile else []
        trees = [("before", args.against.resolve()), ("after", ROOT)] if args.against else []
        stacks: list[Stack] = []
        try:
            for name, tree in trees or [("", ROOT)]:
                stacks.append(
                    start_stack(name, tree, directory / (name or "stack"), certs, profiler)
                )
            for stack in stacks:
                wait_ready(stack.port, context)
            rows = measure(wrk, script, stacks, args)
        finally:
            for stack in stacks:
                stop_stack(stack)
        report(rows, args)
        if args.profile:
            show_profile(profile)


def show_profile(path: Path) -> None:
    import pstats

    for order in ("cumulative", "tottime"):
        print(f"webhook profile, by {order}:")
        stats = pstats.Stats(str(path))
        stats.strip_dirs().sort_stats(order).print_stats(35)


def measure(
    wrk: str, script: Path, stacks: list[Stack], args: argparse.Namespace
) -> dict[str, list[dict[str, float]]]:
    """Each round runs both scenarios on each stack, the stacks' order swapped every round."""
    rows: dict[str, list[dict[str, float]]] = {}
    for round_index in range(args.rounds):
        order = stacks if round_index % 2 == 0 else stacks[::-1]
        for scenario, pools in (("one pool", 1), (f"{POOLS} pools", POOLS)):
            for stack in order:
                label = f"{scenario} {stack.name}".strip()
                cluster, webhook = stack.cluster, stack.webhook.pid
                cluster_stats(cluster)  # reset the largest size
                before = cluster_stats(cluster)["writes"]
                cpu = (cpu_seconds(webhook), cpu_seconds(cluster.pid))
                figures = run_wrk(
                    wrk,
                    script,
                    stack.port,
                    pools=pools,
                    prefix=f"r{round_index}p{pools}{stack.name}",
                    seconds=args.seconds,
                    connections=args.connections,
                )
                stats = cluster_stats(cluster)
                webhook_cpu = cpu_seconds(webhook) - cpu[0]
                cluster_cpu = cpu_seconds(cluster.pid) - cpu[1]
                seconds = figures["micros"] / 1e6
                allowed = figures["allowed"]
                row = {
                    "admissions/s": allowed / seconds,
                    "p99 ms": figures["p99"] / 1000,
                    "writes/admission": (stats["writes"] - before) / max(allowed, 1),
                    "largest KiB": stats["largest"] / 1024,
                    # CPU per admission: the figures without the machine's other load
                    "webhook CPU us": webhook_cpu / max(allowed, 1) * 1e6,
                    "apiserver CPU us": cluster_cpu / max(allowed, 1) * 1e6,
                    "denied": float(figures["denied"]),
                    "errors": float(figures["errors"]),
                }
                rows.setdefault(label, []).append(row)
                print(
                    f"round {round_index + 1} {label}: "
                    + ", ".join(f"{k} {v:.3g}" for k, v in row.items()),
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def report(rows: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    print(
        f"ledger: non-dry-run VMInstance CREATEs, {args.connections} connections (wrk), "
        f"{args.rounds} rounds x {args.seconds} s, median [min-max]"
    )
    metrics = [
        "admissions/s",
        "p99 ms",
        "writes/admission",
        "largest KiB",
        "webhook CPU us",
        "apiserver CPU us",
        "denied",
        "errors",
    ]
    width = max(10, *(len(label) + 1 for label in rows))
    header = f"{'scenario':<{width}}" + "".join(f"{m:>24}" for m in metrics)
    print(header)
    for scenario, measured in rows.items():
        cells = []
        for metric in metrics:
            values = [row[metric] for row in measured]
            cells.append(
                f"{statistics.median(values):.3g} [{min(values):.3g}-{max(values):.3g}]".rjust(24)
            )
        print(f"{scenario:<{width}}" + "".join(cells))
    if args.against:
        print(f"after / before (medians; before: {args.against}):")
        for scenario in ("one pool", f"{POOLS} pools"):
            ratios = []
            for metric in metrics[:6]:
                before, after = (
                    statistics.median(row[metric] for row in rows[f"{scenario} {side}"])
                    for side in ("before", "after")
                )
                ratios.append(f"{metric} {after / before:.2f}" if before else f"{metric} -")
            print(f"  {scenario:<9} " + ", ".join(ratios))
    for side in ("before", "after") if args.against else ("",):
        one = rows[f"one pool {side}".strip()]
        print(f"goals (one pool{', ' + side if side else ''}):")
        for metric, goal in GOALS.items():
            value = statistics.median(row[metric] for row in one)
            print(f"  {metric:<18} goal {goal:<8} measured {value:.3g}")
        cpu = statistics.median(row["webhook CPU us"] for row in one)
        print(
            f"  the webhook used {cpu:.0f} us of CPU per admission: about {1e6 / cpu:.0f} "
            f"admissions/s per core it has to itself (load average now "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        )


if __name__ == "__main__":
    main()

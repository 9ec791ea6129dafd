"""Another tenant's admission latency while one tenant floods the webhook, against it alone.

The attack: a user in ``tenant-acme-dev`` opens 12 connections and sends, on each, dry-run
CREATEs of a VMInstance whose spec carries thousands of made-up keys (one number changed per
request, so no memo hits), the next as soon as the last is answered. The victim, a user of
tenant ``beta``, sends u1.micro VMInstance CREATEs one at a time (10 ms apart) on a connection
of its own. Both are separate processes (the load generator spends nothing of the webhook's
interpreter) talking TLS to ``webhook serve`` on the fixtures with its default settings.

Each round runs the victim alone, then beside the heavy-values flood's bodies (45,000 keys,
743 KB: past the values bound now, so refused after decoding) and beside a flood of the
costliest bodies still decided in full (19,990 keys, just under the bound), for ``--seconds``
each; rounds are interleaved, and with ``--before DIR`` another checkout's webhook is driven the
same way in the same rounds. It prints the victim's p50 and p99 per phase (all rounds pooled),
p99 during the flood over p99 alone, the attacker's answers per second, and the CPU the
webhook spent per second of the flood: what the attacker can still take of the loop.

Run: .venv/bin/python -m benchmarks.fairness [--rounds N] [--seconds S] [--before DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.server import BIN, ROOT, cpu_seconds, generate_certs, running, webhook_command
from tests.builders import free_port

CONNECTIONS = 12
ISSUE_KEYS = 45_000
ALLOWED_KEYS = 19_990
VICTIM_PAUSE = 0.010
BETA = """apiVersion: apps.cozystack.io/v1alpha1
kind: Tenant
metadata:
  name: beta
  namespace: tenant-root
spec:
  resourceQuotas:
    cpu: 32
    memory: 16Gi
"""
JSON = {"Content-Type": "application/json"}


def _review(namespace: str, name: str, spec: dict[str, Any], uid: str) -> bytes:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": "VMInstance"},
            "resource": {
                "group": "apps.cozystack.io",
                "version": "v1alpha1",
                "resource": "vminstances",
            },
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "mallory", "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "apps.cozystack.io/v1alpha1",
                "kind": "VMInstance",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            },
            "dryRun": True,
        },
    }
    return json.dumps(body).encode()


def heavy_bodies(keys: int, count: int) -> list[bytes]:
    spec: dict[str, Any] = {"instanceType": "u1.micro", "marker": 0}
    spec.update({f"x{key:05d}": key for key in range(keys - 3)})
    template = _review("tenant-acme-dev", "flood", spec, "flood")
    return [template.replace(b'"marker": 0', f'"marker": {i}'.encode()) for i in range(count)]


def _connection(port: int, cafile: str) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=cafile)
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)


def attacker(port: int, cafile: str, keys: int, seconds: float, done: Any) -> None:
    """The flood: CONNECTIONS threads, each sending the next heavy review once answered."""
    bodies = heavy_bodies(keys, 64)
    answered = [0] * CONNECTIONS
    stop = time.monotonic() + seconds

    def connection(index: int) -> None:
        sent = _connection(port, cafile)
        turn = index
        while time.monotonic() < stop:
            sent.request("POST", "/validate", bodies[turn % len(bodies)], JSON)
            sent.getresponse().read()
            answered[index] += 1
            turn += CONNECTIONS
        sent.close()

    threads = [threading.Thread(target=connection, args=(i,)) for i in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.put(sum(answered))


def victim(port: int, cafile: str, seconds: float, done: Any) -> None:
    """The other tenant: u1.micro CREATEs one at a time; the latency of each, in ms."""
    sent = _connection(port, cafile)
    sent.connect()
    latencies = []
    stop = time.monotonic() + seconds
    index = 0
    while time.monotonic() < stop:
        body = _review("tenant-beta", f"vm{index}", {"instanceType": "u1.micro"}, f"v{index}")
        started = time.perf_counter()
        sent.request("POST", "/validate", body, JSON)
        answer = json.loads(sent.getresponse().read())["response"]
        latencies.append((time.perf_counter() - started) * 1000)
        if not answer["allowed"]:
            raise SystemExit(f"the victim was refused: {answer}")
        index += 1
        time.sleep(VICTIM_PAUSE)
    sent.close()
    done.put(latencies)


def phase(port: int, pid: int, cafile: str, keys: int | None, seconds: float) -> dict[str, Any]:
    """One phase: the victim alone (``keys`` None) or beside a flood of ``keys``-key bodies."""
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    processes = []
    if keys is not None:
        processes.append(
            spawn.Process(target=attacker, args=(port, cafile, keys, seconds, results))
        )
    processes.append(spawn.Process(target=victim, args=(port, cafile, seconds, results)))
    cpu = cpu_seconds(pid)
    started = time.monotonic()
    for process in processes:
        process.start()
    outcome = [results.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join()
    elapsed = time.monotonic() - started
    used = cpu_seconds(pid) - cpu
    latencies = next(item for item in outcome if isinstance(item, list))
    flood = next((item for item in outcome if isinstance(item, int)), 0)
    return {"latencies": latencies, "flood": flood / elapsed, "cpu_ms": used / elapsed * 1000}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--before", type=Path, help="another checkout, driven in the same rounds")
    args = parser.parse_args()
    phases = {"alone": None, f"flood {ISSUE_KEYS} keys": ISSUE_KEYS}
    phases[f"flood {ALLOWED_KEYS} keys"] = ALLOWED_KEYS
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        certs = generate_certs(work)
        (work / "beta").mkdir()
        (work / "beta" / "tenant.yaml").write_text(BETA)
        cafile = str(certs / "ca.crt")
        context = ssl.create_default_context(cafile=cafile)
        served = [("after", BIN / "webhook", ROOT)]
        if args.before is not None:
            before = args.before.resolve()
            served.insert(0, ("before", before / ".venv" / "bin" / "webhook", before))
        rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
        with contextlib.ExitStack() as stack:
            servers = []
            for label, program, cwd in served:
                port = free_port()
                command = [*webhook_command(program, certs, port), "--state", str(work / "beta")]
                base = f"https://127.0.0.1:{port}"
                pid = stack.enter_context(running(command, base, context, cwd))
                servers.append((label, port, pid))
            for _, port, pid in servers:  # warm up: imports, compiled schemas, TLS
                phase(port, pid, cafile, None, 1.0)
            for round_ in range(args.rounds):
                for name, keys in phases.items():
                    for label, port, pid in servers:
                        result = phase(port, pid, cafile, keys, args.seconds)
                        rows.setdefault((label, name), []).append(result)
                print(f"round {round_ + 1} of {args.rounds} done", file=sys.stderr)
    print(
        f"victim: u1.micro dry-run CREATEs in tenant-beta, one at a time, "
        f"{VICTIM_PAUSE * 1000:g} ms apart; flood: {CONNECTIONS} connections from "
        f"tenant-acme-dev; {args.rounds} interleaved rounds of {args.seconds:g}s per phase "
        "(latencies pooled over the rounds)"
    )
    print(
        f"{'server':<7} {'phase':<18} {'victim n':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'p99 x alone':>11} {'flood req/s':>11} {'webhook CPU ms/s':>16}"
    )
    for label, _, _ in served:
        alone = [ms for result in rows[(label, "alone")] for ms in result["latencies"]]
        alone_p99 = _quantile(alone, 0.99)
        for name in phases:
            results = rows[(label, name)]
            latencies = [ms for result in results for ms in result["latencies"]]
            p99 = _quantile(latencies, 0.99)
            flood = statistics.median(result["flood"] for result in results)
            cpu = statistics.median(result["cpu_ms"] for result in results)
            print(
                f"{label:<7} {name:<18} {len(latencies):>8} {_quantile(latencies, 0.5):>8.1f} "
                f"{p99:>8.1f} {p99 / alone_p99:>11.1f} {flood:>11.1f} {cpu:>16.0f}"
            )
    print("goals: victim p50 / p99 during the flood <= 25 / 50 ms; p99 during / alone <= 5x")


if __name__ == "__main__":
    main()

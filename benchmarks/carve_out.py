"""A carve-out's two-pool burst against its parent pool's other tenants, through a real API server.

A carve-out is a sub-tenant whose quota bounds only some keys: here ``tenant-p-burst``, whose
Tenant bounds cpu only, under ``tenant-p``, which bounds memory. A VMInstance created in the
carve-out charges cpu to pool ``tenant-p-burst`` and memory to pool ``tenant-p``: one admission
writes two pools' TenantReservations. Holding both pools across both writes makes every other
tenant charging ``tenant-p`` wait behind the carve-out's burst; writing each pool's part in that
pool's own batch does not.

Set-up, as ``benchmarks.write_path`` has it (and built from its pieces): the real kube-apiserver
and etcd of ``../shared/kube`` (absent: says so and exits 0), the shipped CRDs and webhook
configurations pointed by URL at two ``webhook serve --kubeconfig`` replicas with default
settings. Tenants: ``p`` (memory, ample) under ``tenant-root``; under it ``burst`` (cpu, ample:
the carve-out), ``plain`` (no quota: its writes charge ``tenant-p`` only) and ``victim`` (no
quota). An independent load generator (its own process) runs 16 clients creating ``u1.micro``
VMInstances into the burst child and one victim client creating VMInstances into
``tenant-p-victim`` one at a time. The two set-ups, the burst into the carve-out (two pools per
write) and into the plain child (one pool per write), run in interleaved rounds (their order
turns each round); printed: median [min-max] of the victim's p50/p99 and the burst's creates/s,
and, round by round, victim p50 carve-out / one-pool.

``--tree DIR`` runs the replicas of another checkout (``DIR/.venv/bin/webhook``), to measure the
code before a change with the same benchmark.

Goal: victim p50 under the carve-out's burst <= 1.2x its p50 under the one-pool burst.

Run: .venv/bin/python -m benchmarks.carve_out [--seconds 8] [--rounds 3] [--clients 16]
     [--tree DIR] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from benchmarks.write_path import (
    NAMESPACE,
    ROOT,
    UP,
    Cluster,
    cluster_documents,
    failure_reason,
    free_port,
    platform_documents,
    processes,
    wait_ready,
    webhook_configurations,
)

PARENT = "tenant-p"
VICTIM = f"{PARENT}-victim"
AGENT = "carve-out-benchmark"
TOKEN_VARIABLE = "CARVE_OUT_TOKEN"  # the admin token, handed to the load generator
AMPLE = "10000000"
# set-up -> (the burst child's Tenant name, its resourceQuotas or None)
CHILDREN: dict[str, tuple[str, dict[str, str] | None]] = {
    "carve-out": ("burst", {"cpu": AMPLE}),
    "one-pool": ("plain", None),
}
SETUPS = tuple(CHILDREN)
GOAL = 1.2  # victim p50 under the carve-out's burst / under the one-pool burst
MAX_CREATES = 20_000  # per run, whatever --seconds says


def burst_namespace(setup: str) -> str:
    return f"{PARENT}-{CHILDREN[setup][0]}"


def tenant_documents() -> list[dict[str, Any]]:
    """Namespaces and Tenants: the parent bounds memory, the carve-out cpu, the others nothing."""

    def tenant(name: str, namespace: str, quota: dict[str, str] | None) -> dict[str, Any]:
        return {
            "apiVersion": "apps.cozystack.io/v1alpha1",
            "kind": "Tenant",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"resourceQuotas": quota} if quota else {},
        }

    children = [*CHILDREN.values(), ("victim", None)]
    namespaces = [NAMESPACE, "tenant-root", PARENT, *(f"{PARENT}-{n}" for n, _ in children)]
    return [
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces),
        tenant("p", "tenant-root", {"memory": f"{AMPLE}Gi"}),
        *(tenant(name, PARENT, quota) for name, quota in children),
    ]


def vm(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMInstance",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"instanceType": "u1.micro"},
    }


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * share), len(ordered) - 1)] if ordered else 0.0


# -- the load generator (its own process) -----------------------------------------------------


async def generate(args: argparse.Namespace) -> dict[str, Any]:
    """The burst's clients and the victim's one client, for the same fixed time."""
    import aiohttp

    context = ssl.create_default_context(cafile=args.ca)
    headers = {
        "Authorization": f"Bearer {os.environ[TOKEN_VARIABLE]}",
        "Content-Type": "application/json",
        "User-Agent": AGENT,
    }
    latencies: dict[str, list[float]] = {"burst": [], "victim": []}
    statuses: dict[str, Counter[int]] = {"burst": Counter(), "victim": Counter()}
    reasons: Counter[str] = Counter()
    deadline = time.monotonic() + args.seconds
    timeout = aiohttp.ClientTimeout(total=30)

    async def client(session: aiohttp.ClientSession, role: str, namespace: str, n: int) -> None:
        sent = 0
        while time.monotonic() < deadline and len(latencies[role]) < MAX_CREATES:
            sent += 1
            body = vm(f"{args.prefix}-{role[0]}{n}-{sent}", namespace)
            url = f"{args.url}/apis/apps.cozystack.io/v1alpha1/namespaces/{namespace}/vminstances"
            started = time.perf_counter()
            try:
                async with session.post(url, json=body) as answer:
                    text = await answer.read()
                    status = answer.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                status, text = 0, repr(exc).encode()
            latencies[role].append(time.perf_counter() - started)
            statuses[role][status] += 1
            if status != 201:
                reasons[f"{role}: {failure_reason(text)}"] += 1

    started = time.perf_counter()
    async with (  # the victim has its own connection: it never queues behind the burst's
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=args.clients, ssl=context),
            headers=headers,
            timeout=timeout,
        ) as burst,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1, ssl=context), headers=headers, timeout=timeout
        ) as victim,
    ):
        await asyncio.gather(
            *(client(burst, "burst", args.namespace, n) for n in range(args.clients)),
            client(victim, "victim", VICTIM, 0),
        )
    elapsed = time.perf_counter() - started
    return {
        "seconds": elapsed,
        "created": statuses["burst"].get(201, 0),
        "victim created": statuses["victim"].get(201, 0),
        "failed": sum(v for c in statuses.values() for k, v in c.items() if k != 201),
        "reasons": dict(reasons.most_common(3)),
        "victim p50": percentile(latencies["victim"], 0.5),
        "victim p99": percentile(latencies["victim"], 0.99),
        "burst p50": percentile(latencies["burst"], 0.5),
    }


# -- the cluster and the rounds ----------------------------------------------------------------


def webhook_program(tree: Path | None) -> list[str]:
    if tree is None:
        return [sys.executable, "-m", "webhook"]
    program = tree.resolve() / ".venv" / "bin" / "webhook"
    if not program.exists():
        raise SystemExit(f"carve out: {program} is absent (make the tree's venv first)")
    return [str(program)]


def create_until_admitted(cluster: Cluster, namespace: str, name: str) -> None:
    """One create in each namespace before measuring: the replicas have seen the Tenants."""
    context = ssl.create_default_context(cafile=str(cluster.ca))
    url = f"{cluster.url}/apis/apps.cozystack.io/v1alpha1/namespaces/{namespace}/vminstances"
    deadline = time.monotonic() + 90
    last = ""
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            url,
            data=json.dumps(vm(name, namespace)).encode(),
            headers={
                "Authorization": f"Bearer {cluster.token}",
                "Content-Type": "application/json",
                "User-Agent": AGENT,
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, context=context, timeout=30):
                return
        except urllib.error.HTTPError as exc:
            if exc.code == 409:  # created by an earlier try whose answer was lost
                return
            last = failure_reason(exc.read())
        except OSError as exc:
            last = repr(exc)
        time.sleep(1)
    raise SystemExit(f"carve out: no create admitted in {namespace}: {last}")


def load(cluster: Cluster, args: argparse.Namespace, setup: str, prefix: str) -> dict[str, Any]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.carve_out",
            "--load",
            "--url",
            cluster.url,
            "--ca",
            str(cluster.ca),
            "--namespace",
            burst_namespace(setup),
            "--prefix",
            prefix,
            "--seconds",
            str(args.seconds),
            "--clients",
            str(args.clients),
        ],
        cwd=ROOT,
        env={**os.environ, TOKEN_VARIABLE: cluster.token},  # not in the process list
        capture_output=True,
        text=True,
        check=True,
        timeout=args.seconds + 120,
    )
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def row(figures: dict[str, Any]) -> dict[str, float]:
    return {
        "victim p50 ms": figures["victim p50"] * 1000,
        "victim p99 ms": figures["victim p99"] * 1000,
        "victim creates": float(figures["victim created"]),
        "burst creates/s": figures["created"] / figures["seconds"],
        "burst p50 ms": figures["burst p50"] * 1000,
        "failed": float(figures["failed"]),
    }


def run(directory: Path, args: argparse.Namespace) -> None:
    from webhook.tls.certificates import generate as generate_certificates

    rendered = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy")], capture_output=True, text=True, check=True
    ).stdout
    deploy = [d for d in yaml.safe_load_all(rendered) if d]
    certs = directory / "certs"
    generate_certificates(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    ca = (certs / "ca.crt").read_bytes()
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    program = webhook_program(args.tree)
    print(f"starting a real kube-apiserver ({UP})", file=sys.stderr, flush=True)
    with Cluster(directory / "kube") as cluster:
        cluster.kubectl("apply", "-f", "-", documents=cluster_documents(deploy))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        cluster.kubectl("apply", "-f", "-", documents=[*platform_documents(), *tenant_documents()])
        ports = {name: free_port() for name in ("mutate", "validate")}
        commands = [
            (
                [
                    *program,
                    "serve",
                    "--kubeconfig",
                    str(cluster.work / "kubeconfig"),
                    "--cert-dir",
                    str(certs),
                    "--listen",
                    f"127.0.0.1:{ports[name]}",
                    "--metrics-listen",
                    f"127.0.0.1:{free_port()}",
                ],
                {
                    "POD_NAME": f"replica-{name}",
                    "POD_NAMESPACE": NAMESPACE,
                    "WEBHOOK_CERTS": "cert-manager",  # the certificates here are ours
                },
                directory / f"{name}.log",
            )
            for name in ("mutate", "validate")
        ]
        with processes(commands):
            for name in ports:
                wait_ready(ports[name], context, "/readyz")
            cluster.kubectl(
                "apply",
                "-f",
                "-",
                documents=webhook_configurations(deploy, ca, ports["mutate"], ports["validate"]),
            )
            time.sleep(3)  # the API server picks configurations up from its own watch
            for namespace in (VICTIM, *(burst_namespace(s) for s in SETUPS)):
                create_until_admitted(cluster, namespace, "warm-up")
            rows = measure(cluster, args)
    print(report(rows, args, os.getloadavg()[0]))


def measure(cluster: Cluster, args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    rows: dict[str, list[dict[str, float]]] = {setup: [] for setup in SETUPS}
    for round_index in range(args.rounds):
        order = SETUPS[round_index % 2 :] + SETUPS[: round_index % 2]
        for setup in order:
            figures = load(cluster, args, setup, f"r{round_index}-{setup[:3]}")
            found = row(figures)
            rows[setup].append(found)
            print(
                f"round {round_index + 1} {setup}: "
                + ", ".join(f"{k} {v:.3g}" for k, v in found.items())
                + (f", why {figures['reasons']}" if found["failed"] else ""),
                file=sys.stderr,
                flush=True,
            )
    return rows


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}-{max(values):.3g}]"


def report(
    rows: dict[str, list[dict[str, float]]], args: argparse.Namespace, load_average: float
) -> str:
    """The table: each set-up's figures, then the round-by-round ratio against the goal."""
    tree = str(args.tree) if args.tree is not None else "this tree"
    lines = [
        f"carve out ({tree}): {args.clients} burst clients into {PARENT}-burst (cpu carved out "
        f"of {PARENT}, which bounds memory) or {PARENT}-plain (no quota), one victim client into "
        f"{VICTIM}; {args.rounds} interleaved rounds x {args.seconds:g} s, median [min-max]; "
        f"load average {load_average:.1f} on {os.cpu_count()} cores",
        f"  {'':20}" + "".join(f"{setup:>24}" for setup in SETUPS),
    ]
    for metric in rows[SETUPS[0]][0] if rows[SETUPS[0]] else []:
        lines.append(
            f"  {metric:20}"
            + "".join(f" {cell([r[metric] for r in rows[s]])}".rjust(24) for s in SETUPS)
        )
    ratios = [
        c["victim p50 ms"] / max(o["victim p50 ms"], 1e-6)
        for c, o in zip(rows["carve-out"], rows["one-pool"], strict=True)
    ]
    if ratios:
        verdict = "met" if statistics.median(ratios) <= GOAL else "NOT met"
        lines.append(
            f"  victim p50 carve-out / one-pool  {cell(ratios)}   goal <= {GOAL}  {verdict}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tree", type=Path, help="run the webhook of this checkout's .venv")
    parser.add_argument("--keep", type=Path, help="work in this directory, and keep its logs")
    parser.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--ca", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="vm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        print(json.dumps(asyncio.run(generate(args))))
        return
    if not UP.exists():
        print(f"carve out: no real kube-apiserver here ({UP} is absent); nothing measured")
        return
    for tool in ("openssl", "curl", "kubectl"):
        if shutil.which(tool) is None:
            print(f"carve out: the real kube-apiserver needs {tool} on PATH; nothing measured")
            return
    webhook_program(args.tree)  # an absent tree fails before a cluster starts
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        run(args.keep, args)
        return
    with tempfile.TemporaryDirectory(prefix="carve-out-") as temporary:
        run(Path(temporary), args)


if __name__ == "__main__":
    main()

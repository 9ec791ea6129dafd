"""Webhook throughput and latency under an independent load generator, beside an echo server.

What users run: ``webhook serve`` with its default settings (log level INFO, one JSON line per
request) on the fixtures state, driven over loopback TLS by wrk (Debian's package; installed with
apt-get when missing), a separate process that spends nothing of the webhook's interpreter. The
baseline is ``benchmarks.bare_server``: an aiohttp TLS server that decodes the review and answers
"allowed", so the difference is the decision and its logging.

The requests are realistic, not one repeated spec: every VMInstance names its own disks and
networks and varies its instance type, every Kubernetes application has its own node groups, so
the charge cache misses as it does for real writes (the bodies outnumber the cache, and wrk walks
them in order). All are dry runs: the full decision, nothing reserved, the same cost each time.

Rounds are interleaved (echo, webhook on VMs, webhook on Kubernetes apps, then again), and each
figure is printed as the median with min and max over the rounds, with the ratio to the echo
server's median from the same run, next to the goals. ``--before DIR`` also serves the webhook
of another checkout (``DIR/.venv/bin/webhook``, run in ``DIR`` on its own fixtures) in the same
rounds, each of its runs just before the same run of this tree's, and prints after/before.

Run: .venv/bin/python -m benchmarks.server [--rounds N] [--seconds S] [--connections C]
[--before DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tests.builders import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LOCALHOST = ("--dns", "localhost", "--ip", "127.0.0.1")
BODIES = 8192  # twice the charge cache's entries: a cyclic walk over them never hits
VM_TYPES = ("u1.micro", "u1.small", "u1.medium", "u1.large", "cx1.medium", "o1.small", "o1.medium")
NODE_TYPES = ("u1.medium", "u1.large", "cx1.large", "o1.large", "u1.xlarge")


def ensure_wrk() -> str:
    """wrk's path, installing Debian's package when it is missing."""
    found = shutil.which("wrk")
    if found:
        return found
    print("wrk not found: installing Debian's package", file=sys.stderr)
    subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("wrk is needed: apt-get install wrk")
    return found


def _review(index: int, kind: str, resource: str, spec: dict[str, Any]) -> dict[str, Any]:
    name = f"{kind.lower()}-{index}"
    namespace = "tenant-acme"
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"00000000-0000-4000-8000-{index:012d}",
            "operation": "CREATE",
            "namespace": namespace,
            "name": name,
            "dryRun": True,
            "userInfo": {
                "username": "system:serviceaccount:cozy-system:cozystack-api",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "apps.cozystack.io", "version": "v1alpha1", "resource": resource},
            "requestKind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": kind},
            "object": {
                "apiVersion": "apps.cozystack.io/v1alpha1",
                "kind": kind,
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {
                        "app.kubernetes.io/managed-by": "dashboard",
                        "team": f"t{index % 7}",
                    },
                },
                "spec": spec,
            },
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def vm_review(index: int) -> dict[str, Any]:
    """A VMInstance as a tenant writes one: its own disks and network, a key, a small cloud-init."""
    spec = {
        "instanceType": VM_TYPES[index % len(VM_TYPES)],
        "instanceProfile": "ubuntu",
        "runStrategy": "Always",
        "disks": [{"name": f"vm{index}-system"}, {"name": f"vm{index}-data", "bus": "sata"}],
        "networks": [{"name": f"subnet-{index:08x}"}],
        "sshKeys": [f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{index:032d} user@host"],
        "cloudInit": f"#cloud-config\nhostname: vm{index}\npackages: [nginx]\n",
        "external": index % 5 == 0,
        "externalPorts": [22, 443],
    }
    return _review(index, "VMInstance", "vminstances", spec)


def kubernetes_review(index: int) -> dict[str, Any]:
    """A Kubernetes application with its own node groups, one to three of them."""
    groups = {}
    for group in range(1 + index % 3):
        groups[f"md{group}-{index}"] = {
            "minReplicas": 0,
            "maxReplicas": 1 + (index + group) % 4,
            "instanceType": NODE_TYPES[(index + group) % len(NODE_TYPES)],
            "ephemeralStorage": f"{20 + group * 10}Gi",
            "roles": ["ingress-nginx"] if group == 0 else [],
            "resources": {},
            "gpus": [],
        }
    spec = {
        "version": "v1.33",
        "storageClass": "replicated",
        "nodeGroups": groups,
        "controlPlane": {"replicas": 2 + index % 2},
        "addons": {"ingressNginx": {"enabled": index % 2 == 0, "hosts": [f"app{index}.example"]}},
    }
    return _review(index, "Kubernetes", "kubernetes", spec)


def write_script(path: Path, bodies: list[bytes]) -> None:
    """A wrk Lua script that POSTs the bodies in order, round and round."""
    lines = ["local bodies = {"]
    lines += [f"  {json.dumps(body.decode())}," for body in bodies]
    lines += [
        "}",
        "local headers = {['Content-Type'] = 'application/json'}",
        "local i = 0",
        "request = function()",
        "  i = i % #bodies + 1",
        "  return wrk.format('POST', '/validate', headers, bodies[i])",
        "end",
    ]
    path.write_text("\n".join(lines) + "\n")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def running(
    command: list[str], base: str, context: ssl.SSLContext, cwd: Path = ROOT
) -> Iterator[int]:
    with tempfile.TemporaryFile() as log:
        yield from _serve(command, base, context, log, cwd)


def _serve(
    command: list[str], base: str, context: ssl.SSLContext, log: IO[bytes], cwd: Path
) -> Iterator[int]:
    process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/livez", context=context, timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    output = log.read().decode()
                    raise SystemExit(f"{command[0]} did not start:\n{output}") from None
                time.sleep(0.1)
        yield process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


_LATENCY = re.compile(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_RATE = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_ERRORS = re.compile(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)")
_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def generate_certs(work: Path) -> Path:
    """A CA and a serving pair for 127.0.0.1 in ``work/certs``, made by ``webhook certs``."""
    certs = work / "certs"
    subprocess.run(
        [str(BIN / "webhook"), "certs", "generate", "--out", str(certs), *LOCALHOST],
        check=True,
        capture_output=True,
    )
    return certs


def webhook_command(program: Path, certs: Path, port: int) -> list[str]:
    """``webhook serve`` on the fixtures with its default settings, TLS on ``port``."""
    states = ["--state", "fixtures/cozystack", "--state", "fixtures/tenants"]
    listen = ["--listen", f"127.0.0.1:{port}", "--metrics-listen", "127.0.0.1:0"]
    return [str(program), "serve", *states, "--cert-dir", str(certs), *listen]


def drive(wrk: str, base: str, script: Path, seconds: int, connections: int) -> tuple[float, float]:
    """Requests per second and p99 latency in milliseconds, from one wrk run."""
    done = subprocess.run(
        [
            wrk,
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            f"{base}/validate",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    errors = _ERRORS.search(done.stdout)
    if errors:
        raise SystemExit(f"wrk saw errors:\n{done.stdout}")
    rate = _RATE.search(done.stdout)
    p99 = _LATENCY.search(done.stdout)
    if not rate or not p99:
        raise SystemExit(f"cannot read wrk's output:\n{done.stdout}")
    return float(rate.group(1)), float(p99.group(1)) * _UNIT[p99.group(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--before", type=Path, help="another checkout whose webhook runs in the same rounds"
    )
    args = parser.parse_args()
    wrk = ensure_wrk()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        certs = generate_certs(work)
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        scripts = {
            "vm": work / "vm.lua",
            "kubernetes": work / "kubernetes.lua",
        }
        write_script(scripts["vm"], [json.dumps(vm_review(i)).encode() for i in range(BODIES)])
        write_script(
            scripts["kubernetes"],
            [json.dumps(kubernetes_review(i)).encode() for i in range(BODIES)],
        )
        echo_port = free_port()
        echo = [sys.executable, "-m", "benchmarks.bare_server", str(certs), str(echo_port)]
        echo_base = f"https://127.0.0.1:{echo_port}"
        rows: dict[str, list[tuple[float, float, float]]] = {}
        with contextlib.ExitStack() as stack:
            echo_pid = stack.enter_context(running(echo, echo_base, context))
            runs = [("echo", echo_base, echo_pid, scripts["vm"])]
            served = [("webhook", BIN / "webhook", ROOT)]
            if args.before is not None:
                before = args.before.resolve()
                served.insert(0, ("before", before / ".venv" / "bin" / "webhook", before))
            bases = {}
            for label, program, cwd in served:
                port = free_port()
                base = f"https://127.0.0.1:{port}"
                pid = stack.enter_context(
                    running(webhook_command(program, certs, port), base, context, cwd)
                )
                bases[label] = (base, pid)
            for kind, script in (
                ("VMInstance", scripts["vm"]),
                ("Kubernetes", scripts["kubernetes"]),
            ):
                for label, _, _ in served:
                    base, pid = bases[label]
                    runs.append((f"{label} {kind}", base, pid, script))
            for _, base, _, script in runs:  # warm up: imports, compiled schemas, TLS sessions
                drive(wrk, base, script, 2, args.connections)
            for _ in range(args.rounds):
                for name, base, pid, script in runs:
                    cpu = cpu_seconds(pid)
                    rate, p99 = drive(wrk, base, script, args.seconds, args.connections)
                    used = cpu_seconds(pid) - cpu
                    cpu_us = used / (rate * args.seconds) * 1e6
                    rows.setdefault(name, []).append((rate, p99, cpu_us))
    print(
        f"wrk -t1 -c{args.connections}, {args.rounds} interleaved rounds of {args.seconds}s, "
        f"dry-run CREATEs over loopback TLS, {BODIES} distinct bodies per kind, log level INFO"
    )
    print(
        f"{'server':<20} {'req/s median':>12} {'(min-max)':>15} {'p99 ms':>8} "
        f"{'(min-max)':>13} {'CPU us/req':>10} {'x echo':>7} {'p99 x echo':>10}"
    )
    echo_rate = statistics.median(r for r, _, _ in rows["echo"])
    echo_p99 = statistics.median(p for _, p, _ in rows["echo"])
    for name, figures in rows.items():
        rates = [r for r, _, _ in figures]
        p99s = [p for _, p, _ in figures]
        cpu = statistics.median(c for _, _, c in figures)
        rate = statistics.median(rates)
        p99 = statistics.median(p99s)
        print(
            f"{name:<20} {rate:>12.0f} {f'({min(rates):.0f}-{max(rates):.0f})':>15} "
            f"{p99:>8.2f} {f'({min(p99s):.1f}-{max(p99s):.1f})':>13} "
            f"{cpu:>10.0f} {rate / echo_rate:>7.2f} {p99 / echo_p99:>10.2f}"
        )
    if args.before is not None:
        for kind in ("VMInstance", "Kubernetes"):
            old, new = rows[f"before {kind}"], rows[f"webhook {kind}"]
            ratios = []
            for what, i in (("req/s", 0), ("p99", 1), ("CPU/req", 2)):
                ratio = statistics.median(n[i] for n in new) / statistics.median(o[i] for o in old)
                ratios.append(f"{what} x{ratio:.2f}")
            print(f"after/before {kind}: " + ", ".join(ratios))
    vm_rate = statistics.median(r for r, _, _ in rows["webhook VMInstance"])
    vm_p99 = statistics.median(p for _, p, _ in rows["webhook VMInstance"])
    print(
        f"goal: VMInstance cache miss >= 0.60x echo throughput: "
        f"{vm_rate / echo_rate:.2f}x {'met' if vm_rate / echo_rate >= 0.6 else 'NOT met'}"
    )
    print(
        f"goal: VMInstance p99 <= 2x echo's p99: {vm_p99 / echo_p99:.2f}x "
        f"{'met' if vm_p99 <= 2 * echo_p99 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()

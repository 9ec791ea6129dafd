"""The write path through a real API server: CREATEs with both webhooks, none, a do-nothing pair.

Uses the real kube-apiserver and etcd of ``../shared/kube`` (found beside the project, or
beside the folder holding it); where it is absent the benchmark says so and exits cleanly (0).
It starts on free ports in a temporary directory and stops what it started.

The cluster: CRDs standing in for ``apps.cozystack.io`` (one per real ApplicationDefinition in
``fixtures/cozystack``, with its kind and plural; their values are kept as written, as
cozystack-api keeps them), the ApplicationDefinitions and KubeVirt instance types themselves,
the shipped ``tenantreservations`` CRD, and 20 Tenants of ample budget. Two ``webhook serve
--kubeconfig`` replicas (default settings) run as the Deployment's two do; the shipped
Mutating- and ValidatingWebhookConfigurations (``kubectl kustomize deploy``) are pointed by URL,
with a caBundle, at the replicas: ``/mutate`` at one, ``/validate`` at the other (a Service
would spread both over both; a URL names one). The do-nothing pair is two
``benchmarks.bare_server`` processes behind the same configurations, rules and
matchConditions; "no webhooks" deletes both configurations.

An independent load generator (its own process: an aiohttp client with the admin token, 16
concurrent clients by default) creates real VMInstances (``u1.micro``) with distinct names,
into one pool (``tenant-t0``) or spread over 20, for a fixed time. The three set-ups run in
interleaved rounds (their order turns each round). Only the set-up being measured has its
servers running: the others' replicas are stopped (SIGSTOP), so none of them spends the machine
on the watch echo of creates it does not serve, and each set-up's are resumed and waited for
(ready, and their CPU quiet: the events they missed applied) before its bursts.

Two more set-ups: "built-in quota" (``quota``: no webhooks; in each tenant namespace a
ResourceQuota on ``count/vminstances.apps.cozystack.io``, hard far above the load, its status set
by the benchmark as kube-controller-manager would, so kube-apiserver's own quota admission plugin
checks and writes it, batching its status writes) and "both webhooks, escrow on" (``escrow``: a
second pair of replicas serving with ``--escrow on``). Every figure is printed beside both
baselines (the do-nothing pair and the built-in quota), with, per scenario, TenantReservation
writes per admission (to the pools the scenario creates in: a burst's slices are given back
after it, and those writes fall in the next scenario's time, where "every pool" counts them)
and the ratios to each baseline. Printed per set-up and scenario, median
[min-max] over the rounds: creates/s, p50/p99 latency, the ratio of creates/s to no webhooks,
the latency added over no webhooks and its ratio to what the do-nothing pair adds, the API
writes per admission other than the create itself (from the API server's audit log, by
resource), the CPU used per create by each process (API server, etcd, webhooks, load
generator), and the time the webhooks spend per request by their own histograms
(``reservation_admission_duration_seconds``) against the latency the clients see. With
``--profile`` the replicas run under cProfile and their top functions are printed.

Goals: both webhooks >= 0.5x the creates/s of no webhooks; the latency they add <= 1.2x what
the do-nothing pair adds. With escrow on: <= 0.05 TenantReservation writes per admission in every
scenario; one client's added latency <= 1.5x the do-nothing pair's; creates/s >= 0.9x the
do-nothing pair's in one pool and >= 0.85x over 20 pools.

Run: .venv/bin/python -m benchmarks.write_path [--seconds 8] [--rounds 3] [--clients 16]
     [--profile] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SHARED = next(
    (p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()),
    ROOT.parent / "shared",
)
UP = SHARED / "kube" / "up.sh"
POOLS = 20
NAMESPACE = "cozy-reservation"
AGENT = "write-path-benchmark"
TOKEN_VARIABLE = "WRITE_PATH_TOKEN"  # the admin token, handed to the load generator
SETUPS = ("none", "do-nothing", "quota", "webhooks", "escrow")
BASELINES = ("do-nothing", "quota")  # what every webhook set-up is set beside
OURS = ("webhooks", "escrow")  # both webhooks, escrow off (the default) and on
QUOTA_KEY = "count/vminstances.apps.cozystack.io"
# (name, pools, clients or None for --clients): creates/s under load, and one client alone
# for the latency a create pays with no queue in front of it.
SCENARIOS: tuple[tuple[str, int, int | None], ...] = (
    ("one pool", 1, None),
    (f"{POOLS} pools", POOLS, None),
    ("one client", 1, 1),
)
MAX_CREATES = 20_000  # per run, whatever --seconds says
GOAL_THROUGHPUT = 0.5  # both webhooks: at least this share of the creates/s of none
WRITES = ("create", "update", "patch", "delete")
CALL = "per admission: "  # a row per verb and resource the audit log shows
FALLBACK = "escrow fallbacks/admission: "  # a row per reason the slices did not answer
GOAL_ADDED = 1.2  # latency added by both webhooks: at most this times the do-nothing pair's
# With escrow on: TenantReservation writes per admission, one client's added latency over the
# do-nothing pair's, and creates/s over the do-nothing pair's (one pool, 20 pools).
GOAL_ESCROW_WRITES = 0.05
GOAL_ESCROW_ADDED = 1.5
GOAL_ESCROW_THROUGHPUT = {"one pool": 0.9, f"{POOLS} pools": 0.85}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- the load generator (its own process) -----------------------------------------------------


def failure_reason(text: bytes) -> str:
    """A failed create's Status message, shortened (the webhook's reason is in it)."""
    try:
        message = str(json.loads(text).get("message", ""))
    except (ValueError, AttributeError):
        message = text.decode(errors="replace")
    return message[:160]


async def generate(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    context = ssl.create_default_context(cafile=args.ca)
    headers = {
        "Authorization": f"Bearer {os.environ[TOKEN_VARIABLE]}",
        "Content-Type": "application/json",
        "User-Agent": AGENT,
    }
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    reasons: Counter[str] = Counter()
    deadline = time.monotonic() + args.seconds
    connector = aiohttp.TCPConnector(limit=args.clients, ssl=context)
    timeout = aiohttp.ClientTimeout(total=30)

    async def client(session: aiohttp.ClientSession, number: int) -> None:
        sent = 0
        while time.monotonic() < deadline and len(latencies) < MAX_CREATES:
            sent += 1
            namespace = f"tenant-t{(number + sent) % args.pools}"
            name = f"{args.prefix}-{number}-{sent}"
            body = {
                "apiVersion": "apps.cozystack.io/v1alpha1",
                "kind": "VMInstance",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"instanceType": "u1.micro"},
            }
            url = f"{args.url}/apis/apps.cozystack.io/v1alpha1/namespaces/{namespace}/vminstances"
            started = time.perf_counter()
            try:
                async with session.post(url, json=body) as answer:
                    text = await answer.read()
                    status = answer.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                status, text = 0, repr(exc).encode()
            latencies.append(time.perf_counter() - started)
            statuses[status] += 1
            if status != 201:  # why, in the API server's words (its Status message)
                reasons[failure_reason(text)] += 1

    cpu = time.process_time()
    started = time.perf_counter()
    async with aiohttp.ClientSession(
        connector=connector, headers=headers, timeout=timeout
    ) as session:
        await asyncio.gather(*(client(session, n) for n in range(args.clients)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "seconds": elapsed,
        "created": statuses.get(201, 0),
        "statuses": {str(k): v for k, v in statuses.items()},
        "reasons": dict(reasons.most_common(3)),
        "p50": ordered[len(ordered) // 2] if ordered else 0.0,
        "p99": ordered[int(len(ordered) * 0.99)] if ordered else 0.0,
        "mean": statistics.fmean(ordered) if ordered else 0.0,
        "cpu": time.process_time() - cpu,
    }


# -- the cluster ------------------------------------------------------------------------------


def crd(
    group: str, plural: str, kind: str, *, namespaced: bool, versions: tuple[str, ...]
) -> dict[str, Any]:
    keep = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": plural, "kind": kind, "singular": kind.lower()},
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": index == 0,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": keep, "status": keep},
                        }
                    },
                    "subresources": {"status": {}},
                }
                for index, version in enumerate(versions)
            ],
        },
    }


def platform_documents() -> list[dict[str, Any]]:
    from webhook.state.manifests import read_manifests

    wanted = {"ApplicationDefinition", "VirtualMachineClusterInstancetype"}
    found = read_manifests([ROOT / "fixtures" / "cozystack"])
    return [dict(m.body) for m in found if m.body.get("kind") in wanted]


def cluster_documents(deploy: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every CRD, then the platform objects, namespaces and Tenants the benchmark needs."""
    platform = platform_documents()
    documents: list[dict[str, Any]] = [
        crd(
            "cozystack.io",
            "applicationdefinitions",
            "ApplicationDefinition",
            namespaced=False,
            versions=("v1alpha1",),
        ),
        crd(
            "instancetype.kubevirt.io",
            "virtualmachineclusterinstancetypes",
            "VirtualMachineClusterInstancetype",
            namespaced=False,
            versions=("v1beta1", "v1alpha2", "v1alpha1"),
        ),
        crd(
            "instancetype.kubevirt.io",
            "virtualmachineinstancetypes",
            "VirtualMachineInstancetype",
            namespaced=True,
            versions=("v1beta1", "v1alpha2", "v1alpha1"),
        ),
        *(d for d in deploy if d["kind"] == "CustomResourceDefinition"),
    ]
    for document in platform:
        if document["kind"] == "ApplicationDefinition":
            application = document["spec"]["application"]
            documents.append(
                crd(
                    "apps.cozystack.io",
                    application["plural"],
                    application["kind"],
                    namespaced=True,
                    versions=("v1alpha1",),
                )
            )
    return documents


def objects(platform: list[dict[str, Any]]) -> list[dict[str, Any]]:
    namespaces = [NAMESPACE, "tenant-root", *(f"tenant-t{i}" for i in range(POOLS))]
    found: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in namespaces
    ]
    found += platform
    found += [
        {
            "apiVersion": "apps.cozystack.io/v1alpha1",
            "kind": "Tenant",
            "metadata": {"name": f"t{i}", "namespace": "tenant-root"},
            "spec": {"resourceQuotas": {"cpu": "10000000", "memory": "10000000Gi"}},
        }
        for i in range(POOLS)
    ]
    return found


def quotas() -> list[dict[str, Any]]:
    """The built-in quota's ResourceQuotas: one per tenant namespace, on VMInstances' count."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "write-path", "namespace": f"tenant-t{i}"},
            "spec": {"hard": {QUOTA_KEY: "100000000"}},
        }
        for i in range(POOLS)
    ]


def webhook_configurations(
    deploy: list[dict[str, Any]], ca: bytes, mutate: int, validate: int
) -> list[dict[str, Any]]:
    """The shipped configurations, pointed by URL at two local servers."""
    found = []
    bundle = base64.b64encode(ca).decode()
    for document in deploy:
        if document["kind"] not in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            continue
        document = json.loads(json.dumps(document))
        for webhook in document["webhooks"]:
            path = webhook["clientConfig"]["service"].get("path", "/")
            port = mutate if path == "/mutate" else validate
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
        found.append(document)
    return found


class Cluster:
    def __init__(self, work: Path, *, keep: bool = False) -> None:
        self.work = work
        self.keep = keep  # the audit log stays (with --keep)
        self.port, self.etcd = free_port(), free_port()
        self.environment = {
            **os.environ,
            "KAPI_FRESH": "1",
            "KAPI_PORT": str(self.port),
            "KAPI_ETCD_PORT": str(self.etcd),
            "KAPI_TIMEOUT": "100",
        }

    def __enter__(self) -> Cluster:
        subprocess.run(
            [str(UP), str(self.work)],
            env=self.environment,
            check=True,
            timeout=150,
            stdout=subprocess.DEVNULL,
        )
        config = yaml.safe_load((self.work / "kubeconfig").read_text())
        self.token: str = config["users"][0]["user"]["token"]
        self.ca = self.work / "pki" / "ca.crt"
        self.url = f"https://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc: object) -> None:
        stop = self.work / "stop.sh"
        if stop.exists():
            subprocess.run(
                [str(stop)],
                env={**self.environment, "KAPI_WIPE": "0" if self.keep else "1"},
                timeout=60,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def pid(self, daemon: str) -> int:
        return int((self.work / "run" / f"{daemon}.pid").read_text())

    def kubectl(self, *arguments: str, documents: list[dict[str, Any]] | None = None) -> None:
        text = yaml.safe_dump_all(documents) if documents is not None else None
        subprocess.run(
            ["kubectl", "--kubeconfig", str(self.work / "kubeconfig"), *arguments],
            input=text,
            text=True,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=120,
        )


# -- measuring ---------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def histogram(port: int) -> dict[str, tuple[float, float]]:
    """Per endpoint, (seconds, requests) the webhook's own latency histogram holds so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    totals: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line.startswith("reservation_admission_duration_seconds_"):
            continue
        name, _, value = line.rpartition(" ")
        endpoint = name.split('endpoint="', 1)[1].split('"', 1)[0] if "endpoint=" in name else ""
        entry = totals.setdefault(endpoint, [0.0, 0.0])
        if name.startswith("reservation_admission_duration_seconds_sum"):
            entry[0] += float(value)
        elif name.startswith("reservation_admission_duration_seconds_count"):
            entry[1] += float(value)
    return {endpoint: (s, n) for endpoint, (s, n) in totals.items()}


def fallbacks(port: int) -> dict[str, float]:
    """Per reason, admissions the escrow replica's slices did not answer, so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("reservation_escrow_fallbacks_total{"):
            name, _, value = line.rpartition(" ")
            reason = name.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = float(value)
    return found


def audit_calls(
    log: Path, offset: int, pools: frozenset[str] = frozenset()
) -> tuple[Counter[str], Counter[str], int, int]:
    """API calls the API server logged past ``offset`` other than the load's own, and sizes.

    Every verb counts, reads too (a LIST or a consistent GET costs the API server more than
    a small write): the first counter is keyed ``verb resource[/subresource]`` (a watch once,
    when it ends or is logged), the second holds, per written resource, the bytes of the
    objects written (the request body as the audit log keeps it, compact JSON); the fourth
    figure is how many TenantReservation writes were to one of ``pools``.
    """
    own = 0
    calls: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    with log.open("rb") as stream:
        stream.seek(offset)
        for line in stream:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("stage") != "ResponseComplete":
                    continue
                if event.get("userAgent") == AGENT:
                    continue
                reference = event.get("objectRef") or {}
                resource = reference.get("resource") or event.get("requestURI", "?")
                if reference.get("subresource"):
                    resource += "/" + reference["subresource"]
                verb = event.get("verb", "?")
                calls[f"{verb} {resource}"] += 1
                if verb in WRITES and reference.get("resource") == "tenantreservations":
                    own += reference.get("namespace") in pools
                if verb in WRITES and event.get("requestObject") is not None:
                    body = json.dumps(event["requestObject"], separators=(",", ":"))
                    sizes[resource.partition("/")[0]] += len(body)
        end = stream.tell()
    return calls, sizes, end, own


def wait_ready(port: int, context: ssl.SSLContext, path: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(
                f"https://127.0.0.1:{port}{path}", context=context, timeout=2
            ) as answer,
        ):
            if answer.status == 200:
                return
        time.sleep(0.3)
    raise SystemExit(f"a webhook on port {port} did not become ready")


@contextlib.contextmanager
def processes(commands: list[tuple[list[str], dict[str, str], Path]]) -> Iterator[list[int]]:
    started: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    try:
        for command, environment, log in commands:
            opened: IO[bytes] = log.open("wb")
            logs.append(opened)
            started.append(
                subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env={**os.environ, **environment},
                    stdout=subprocess.DEVNULL,
                    stderr=opened,
                )
            )
        yield [p.pid for p in started]
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        for stream in logs:
            stream.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--profile", action="store_true", help="profile the two replicas")
    parser.add_argument("--keep", type=Path, help="work in this directory, and keep its logs")
    parser.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--ca", help=argparse.SUPPRESS)
    parser.add_argument("--pools", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="vm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        print(json.dumps(asyncio.run(generate(args))))
        return
    if not UP.exists():
        print(f"write path: no real kube-apiserver here ({UP} is absent); nothing measured")
        return
    for tool in ("openssl", "curl", "kubectl"):
        if shutil.which(tool) is None:
            print(f"write path: the real kube-apiserver needs {tool} on PATH; nothing measured")
            return
    if args.keep:  # the replicas' logs, the audit log and the profiles stay for reading
        args.keep.mkdir(parents=True, exist_ok=True)
        run(args.keep, args)
        return
    with tempfile.TemporaryDirectory(prefix="write-path-") as temporary:
        run(Path(temporary), args)


def run(directory: Path, args: argparse.Namespace) -> None:
    from webhook.tls.certificates import generate as generate_certificates

    rendered = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    deploy = [d for d in yaml.safe_load_all(rendered) if d]
    certs = directory / "certs"
    generate_certificates(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    ca = (certs / "ca.crt").read_bytes()
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    print(f"starting a real kube-apiserver ({UP})", file=sys.stderr, flush=True)
    with Cluster(directory / "kube", keep=args.keep is not None) as cluster:
        cluster.kubectl("apply", "-f", "-", documents=cluster_documents(deploy))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        cluster.kubectl("apply", "-f", "-", documents=objects(platform_documents()))
        replicas = ("mutate", "validate", "escrow-mutate", "escrow-validate")
        ports = {name: free_port() for name in (*replicas, "bare-mutate", "bare-validate")}
        metrics = {name: free_port() for name in replicas}
        profiles = {name: directory / f"{name}.prof" for name in replicas}
        commands = []
        for name in replicas:
            profiler = ["-m", "cProfile", "-o", str(profiles[name])] if args.profile else []
            commands.append(
                (
                    [
                        sys.executable,
                        *profiler,
                        "-m",
                        "webhook",
                        "serve",
                        "--kubeconfig",
                        str(cluster.work / "kubeconfig"),
                        "--cert-dir",
                        str(certs),
                        "--listen",
                        f"127.0.0.1:{ports[name]}",
                        "--metrics-listen",
                        f"127.0.0.1:{metrics[name]}",
                        "--escrow",
                        "on" if name.startswith("escrow-") else "off",
                    ],
                    {
                        "POD_NAME": f"replica-{name}",
                        "POD_NAMESPACE": NAMESPACE,
                        "WEBHOOK_CERTS": "cert-manager",  # the certificates here are ours
                    },
                    directory / f"{name}.log",
                )
            )
        for name in ("bare-mutate", "bare-validate"):
            commands.append(
                (
                    [sys.executable, "-m", "benchmarks.bare_server", str(certs), str(ports[name])],
                    {},
                    directory / f"{name}.log",
                )
            )
        with processes(commands) as pids:
            for name in replicas:
                wait_ready(ports[name], context, "/readyz")
            for name in ("bare-mutate", "bare-validate"):
                wait_ready(ports[name], context, "/livez")
            configurations = {
                "webhooks": webhook_configurations(deploy, ca, ports["mutate"], ports["validate"]),
                "escrow": webhook_configurations(
                    deploy, ca, ports["escrow-mutate"], ports["escrow-validate"]
                ),
                "do-nothing": webhook_configurations(
                    deploy, ca, ports["bare-mutate"], ports["bare-validate"]
                ),
            }
            readiness = {
                "webhooks": [(ports["mutate"], "/readyz"), (ports["validate"], "/readyz")],
                "escrow": [
                    (ports["escrow-mutate"], "/readyz"),
                    (ports["escrow-validate"], "/readyz"),
                ],
                "do-nothing": [
                    (ports["bare-mutate"], "/livez"),
                    (ports["bare-validate"], "/livez"),
                ],
            }
            servers = servers_of(pids)

            def serve(setup: str) -> None:
                pause_others(servers, setup)
                settle(servers[setup], context, readiness.get(setup, []))

            try:
                rows = measure(cluster, configurations, pids, metrics, args, serve)
            finally:
                for pid in pids:  # stopped, they would never see the SIGTERM that ends them
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
        report(rows, args)
        if args.profile:
            show_profiles(profiles)


def configure(
    cluster: Cluster, configurations: dict[str, list[dict[str, Any]]], setup: str
) -> None:
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, "reservation-webhook", "--ignore-not-found")
    for index in range(POOLS):
        cluster.kubectl(
            "delete", "resourcequota", "write-path", "-n", f"tenant-t{index}", "--ignore-not-found"
        )
    if setup == "quota":
        cluster.kubectl("apply", "-f", "-", documents=quotas())
        for index in range(POOLS):
            # What kube-controller-manager would set: with no status the plugin refuses writes.
            status = {"status": {"hard": {QUOTA_KEY: "100000000"}, "used": {QUOTA_KEY: "0"}}}
            cluster.kubectl(
                "patch",
                "resourcequota",
                "write-path",
                "-n",
                f"tenant-t{index}",
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps(status),
            )
    elif setup != "none":
        cluster.kubectl("apply", "-f", "-", documents=configurations[setup])
    time.sleep(3)  # the API server picks configurations up from its own watch


def load(
    cluster: Cluster, args: argparse.Namespace, pools: int, prefix: str, clients: int
) -> dict[str, Any]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.write_path",
            "--load",
            "--url",
            cluster.url,
            "--ca",
            str(cluster.ca),
            "--pools",
            str(pools),
            "--prefix",
            prefix,
            "--seconds",
            str(args.seconds),
            "--clients",
            str(clients),
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


def servers_of(pids: list[int]) -> dict[str, list[int]]:
    """Each set-up's server processes, from the pids in the order ``run`` starts them."""
    return {
        "webhooks": pids[:2],
        "escrow": pids[2:4],
        "do-nothing": pids[4:],
        "quota": [],
        "none": [],
    }


def pause_others(servers: dict[str, list[int]], setup: str) -> None:
    """Stop every set-up's servers but ``setup``'s (SIGSTOP: they keep their state)."""
    for other, pids in servers.items():
        if other != setup:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)


def settle(pids: list[int], context: ssl.SSLContext, ready: list[tuple[int, str]]) -> None:
    """Resume ``pids`` and wait until they serve and have caught up: ready, and using under 5 %
    of a core over half a second (the watch events they were stopped behind, applied)."""
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    for port, path in ready:
        wait_ready(port, context, path)
    deadline = time.monotonic() + 60
    used = sum(cpu_seconds(pid) for pid in pids)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = sum(cpu_seconds(pid) for pid in pids)
        if now - used < 0.025 * max(len(pids), 1):
            return
        used = now


def measure(
    cluster: Cluster,
    configurations: dict[str, list[dict[str, Any]]],
    pids: list[int],
    metrics: dict[str, int],
    args: argparse.Namespace,
    serve: Callable[[str], None] = lambda setup: None,
) -> dict[tuple[str, str], list[dict[str, float]]]:
    daemons = {"apiserver": cluster.pid("kube-apiserver"), "etcd": cluster.pid("etcd")}
    servers = servers_of(pids)
    ports = {
        "webhooks": {"mutate": metrics["mutate"], "validate": metrics["validate"]},
        "escrow": {"mutate": metrics["escrow-mutate"], "validate": metrics["escrow-validate"]},
    }
    audit = cluster.work / "audit.log"
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_index in range(args.rounds):
        turn = round_index % len(SETUPS)
        order = SETUPS[turn:] + SETUPS[:turn]
        for setup in order:
            # Only this set-up's servers run: the others' replicas, stopped, spend no CPU on the
            # watch echo of creates they do not serve (four of them took a fifth of the
            # machine under the baselines' bursts).
            serve(setup)
            configure(cluster, configurations, setup)
            for scenario, pools, clients in SCENARIOS:
                _, _, offset, _ = audit_calls(audit, audit.stat().st_size)
                cpu = {name: cpu_seconds(pid) for name, pid in daemons.items()}
                served = sum(cpu_seconds(pid) for pid in servers[setup])
                watched = ports.get(setup, {})
                before = {n: histogram(p) for n, p in watched.items()}
                fell_before = fallbacks(ports["escrow"]["validate"]) if setup == "escrow" else {}
                figures = load(
                    cluster,
                    args,
                    pools,
                    f"r{round_index}-{setup[:4]}-{pools}-{clients or args.clients}",
                    clients or args.clients,
                )
                created = max(figures["created"], 1)
                own = frozenset(f"tenant-t{index}" for index in range(pools))
                calls, sizes, _, to_own = audit_calls(audit, offset, own)
                writes: Counter[str] = Counter()
                for key, count in calls.items():
                    verb, _, resource = key.partition(" ")
                    if verb in WRITES:  # the object or its status: one write of the resource
                        writes[resource.partition("/")[0]] += count
                row: dict[str, float] = {
                    "creates/s": figures["created"] / figures["seconds"],
                    "p50 ms": figures["p50"] * 1000,
                    "p99 ms": figures["p99"] * 1000,
                    "mean ms": figures["mean"] * 1000,
                    "failed": float(sum(v for k, v in figures["statuses"].items() if k != "201")),
                    "writes/admission": sum(writes.values()) / created,
                    "tenantreservation writes/admission": to_own / created,
                    "tenantreservation writes/admission, every pool": writes["tenantreservations"]
                    / created,
                    "resourcequota writes/admission": writes["resourcequotas"] / created,
                    "tenantreservation bytes/write": sizes["tenantreservations"]
                    / max(writes["tenantreservations"], 1),
                    "api calls/admission": sum(calls.values()) / created,
                    "apiserver CPU us": (cpu_seconds(daemons["apiserver"]) - cpu["apiserver"])
                    / created
                    * 1e6,
                    "etcd CPU us": (cpu_seconds(daemons["etcd"]) - cpu["etcd"]) / created * 1e6,
                    "webhook CPU us": (sum(cpu_seconds(pid) for pid in servers[setup]) - served)
                    / created
                    * 1e6,
                    "load CPU us": figures["cpu"] / created * 1e6,
                }
                for key, count in calls.items():
                    row[f"{CALL}{key}"] = count / created
                for name, port in watched.items():
                    after = histogram(port)
                    seconds = sum(s for s, _ in after.values()) - sum(
                        s for s, _ in before[name].values()
                    )
                    requests = sum(n for _, n in after.values()) - sum(
                        n for _, n in before[name].values()
                    )
                    row[f"/{name} ms"] = seconds / max(requests, 1) * 1000
                    row[f"/{name} calls/create"] = requests / created
                if setup == "escrow":
                    fell = fallbacks(ports["escrow"]["validate"])
                    for reason, total in fell.items():
                        change = total - fell_before.get(reason, 0.0)
                        if change:
                            row[f"{FALLBACK}{reason}"] = change / created
                rows.setdefault((setup, scenario), []).append(row)
                print(
                    f"round {round_index + 1} {setup} {scenario}: "
                    + ", ".join(f"{k} {v:.3g}" for k, v in row.items() if not k.startswith(CALL))
                    + (
                        f", statuses {figures['statuses']}, why {figures['reasons']}"
                        if row["failed"]
                        else ""
                    ),
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}-{max(values):.3g}]"


def report(rows: dict[tuple[str, str], list[dict[str, float]]], args: argparse.Namespace) -> None:
    load_average = os.getloadavg()
    print(
        f"write path: VMInstance CREATEs through a real kube-apiserver, {args.clients} clients "
        f"(and one alone), {args.rounds} interleaved rounds x {args.seconds:g} s, median "
        f"[min-max]; load average {load_average[0]:.1f} on {os.cpu_count()} cores"
    )
    metrics = [
        "creates/s",
        "p50 ms",
        "p99 ms",
        "failed",
        "writes/admission",
        "tenantreservation writes/admission",
        "tenantreservation writes/admission, every pool",
        "resourcequota writes/admission",
        "tenantreservation bytes/write",
        "api calls/admission",
        "apiserver CPU us",
        "etcd CPU us",
        "webhook CPU us",
        "load CPU us",
        "/mutate ms",
        "/validate ms",
        "/mutate calls/create",
        "/validate calls/create",
    ]
    width = 24
    for scenario, _, clients in SCENARIOS:
        print(f"\n{scenario} ({clients or args.clients} clients)")
        called = sorted(
            {k for setup in SETUPS for row in rows[(setup, scenario)] for k in row} - set(metrics),
            key=lambda key: (
                -sum(row.get(key, 0.0) for setup in OURS for row in rows[(setup, scenario)])
            ),
        )
        print(f"  {'':52}" + "".join(f"{setup:>{width}}" for setup in SETUPS))
        counted = (CALL, FALLBACK)
        seen = [  # the calls some set-up makes in most rounds
            k
            for k in called
            if k.startswith(counted)
            and any(
                statistics.median(row.get(k, 0.0) for row in rows[(setup, scenario)])
                for setup in SETUPS
            )
        ]
        for metric in metrics + seen:
            cells = []
            for setup in SETUPS:
                found = rows[(setup, scenario)]
                values = (
                    [row.get(metric, 0.0) for row in found]
                    if metric.startswith(counted) and (setup == "escrow" or metric.startswith(CALL))
                    else [row[metric] for row in found if metric in row]
                )
                cells.append((" " + cell(values) if values else "").rjust(width))
            print(f"  {metric[:52]:52}" + "".join(cells))
        none = rows[("none", scenario)]
        for baseline in BASELINES:
            print(
                f"  {baseline} / none, creates/s".ljust(48)
                + cell(ratio(rows[(baseline, scenario)], none, "creates/s"))
            )
        added = {
            setup: [
                o["p50 ms"] - n["p50 ms"]
                for n, o in zip(none, rows[(setup, scenario)], strict=True)
            ]
            for setup in SETUPS
        }
        print(
            "  p50 added over none, ms: "
            + ", ".join(f"{setup} {cell(added[setup])}" for setup in SETUPS[1:])
        )
        for setup in OURS:
            ours = rows[(setup, scenario)]
            throughput = ratio(ours, none, "creates/s")
            verdict = "met" if statistics.median(throughput) >= GOAL_THROUGHPUT else "NOT met"
            goal = f"goal >= {GOAL_THROUGHPUT}  {verdict}" if clients is None else ""
            print(f"  {setup} / none, creates/s".ljust(48) + f"{cell(throughput)}   {goal}")
            for baseline in BASELINES:
                against = ratio(ours, rows[(baseline, scenario)], "creates/s")
                goal = ""
                wanted = GOAL_ESCROW_THROUGHPUT.get(scenario)
                if setup == "escrow" and baseline == "do-nothing" and wanted is not None:
                    verdict = "met" if statistics.median(against) >= wanted else "NOT met"
                    goal = f"goal >= {wanted}  {verdict}"
                print(f"  {setup} / {baseline}, creates/s".ljust(48) + f"{cell(against)}   {goal}")
            for baseline in BASELINES:
                share = [
                    o / max(b, 1e-3) for o, b in zip(added[setup], added[baseline], strict=True)
                ]
                goal = ""
                if clients == 1 and baseline == "do-nothing":
                    limit = GOAL_ESCROW_ADDED if setup == "escrow" else GOAL_ADDED
                    verdict = "met" if statistics.median(share) <= limit else "NOT met"
                    goal = f"goal <= {limit}  {verdict}"
                print(f"  p50 added: {setup} / {baseline}".ljust(48) + f"{cell(share)}   {goal}")
            writes = [row["tenantreservation writes/admission"] for row in ours]
            goal = ""
            if setup == "escrow":
                verdict = "met" if statistics.median(writes) <= GOAL_ESCROW_WRITES else "NOT met"
                goal = f"goal <= {GOAL_ESCROW_WRITES}  {verdict}"
            print(
                f"  {setup}: tenantreservation writes/admission".ljust(48)
                + f"{cell(writes)}   {goal}"
            )


def ratio(
    measured: list[dict[str, float]], baseline: list[dict[str, float]], metric: str
) -> list[float]:
    """Round by round: the runs of one round ran minutes apart at most, under the same load."""
    return [m[metric] / b[metric] for m, b in zip(measured, baseline, strict=True)]


def show_profiles(profiles: dict[str, Path]) -> None:
    import pstats

    for name, path in profiles.items():
        if not path.exists():
            continue
        print(f"\n/{name} replica profile, the project's functions by cumulative time:")
        pstats.Stats(str(path)).sort_stats("cumulative").print_stats(r"webhook/", 30)
        print(f"/{name} replica profile, by own time:")
        pstats.Stats(str(path)).strip_dirs().sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()

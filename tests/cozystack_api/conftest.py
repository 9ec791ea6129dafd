"""The webhook behind the real cozystack-api: one instance per test module, started on free ports.

``../shared/cozystack-api/up.sh`` starts Cozystack's aggregated API server beside a real
kube-apiserver; the webhook is installed from ``deploy/`` as an operator would (``kubectl
kustomize``), except that its configurations point at the replicas by URL (there is no cluster
network) with the ``caBundle`` of the spare serving pair ``up.sh`` leaves in ``DIR/pki``. The
replicas run ``webhook serve --kubeconfig`` with a token of the shipped ServiceAccount, so they
have exactly the shipped RBAC. Two replicas sit behind a small round-robin TCP proxy, since a
webhook configuration names one URL. Everything is stopped when the module ends, even when a
test fails. Tenants are built as Cozystack builds them: a Tenant application in its parent's
namespace and the namespace ``tenant-<path>`` labelled for each ancestor and itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import FIXTURES, ROOT, free_port, review

# ../shared beside the project; WEBHOOK_TEST_SHARED names it elsewhere (as for ../shared/kube),
# and a checkout in a folder of worktrees may have it one level higher.
SHARED = next(
    (
        base / "cozystack-api"
        for base in (
            *(
                [Path(os.environ["WEBHOOK_TEST_SHARED"])]
                if os.environ.get("WEBHOOK_TEST_SHARED")
                else []
            ),
            ROOT.parent / "shared",
            ROOT.parent.parent / "shared",
        )
        if (base / "cozystack-api").exists()
    ),
    ROOT.parent / "shared" / "cozystack-api",
)
UP = SHARED / "up.sh"
HERE = Path(__file__).resolve().parent
NAMESPACE = "cozy-reservation"
SERVICE_ACCOUNT = "reservation-webhook"


def _absent() -> str:
    if not UP.exists():
        return f"the real cozystack-api is not here ({UP} is absent)"
    for tool in ("kubectl", "openssl", "curl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return ""


def _free_pair() -> int:
    """A port P with P + 10 free too (etcd's client and peer ports)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10))
            except OSError:
                continue
        return port
    raise RuntimeError("no free etcd port pair")


class Proxy:
    """Round-robin TCP proxy (TLS passes through): one connection to each replica in turn."""

    def __init__(self, targets: Sequence[int]) -> None:
        self.targets = list(targets)
        self.port = free_port()
        self.connections = [0] * len(self.targets)
        self._turn = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.run_until_complete(server.wait_closed())
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self._turn % len(self.targets)
        self._turn += 1
        self.connections[index] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.targets[index])
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class CozystackAPI:
    """A running cozystack-api with the webhook installed; see the module docstring."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "cz"
        self.kapi_port = _free_pair()
        self.etcd_port = _free_pair()
        self.cozy_port = free_port()
        self.kubeconfig = self.dir / "kube" / "kubeconfig"
        self.replicas: list[tuple[subprocess.Popen[bytes], int, Path]] = []
        self.proxy: Proxy | None = None
        self.certs = base / "certs"
        self.base = base
        self._logs: list[Any] = []

    # -- running things --------------------------------------------------------------------

    def start(self) -> None:
        """Start the servers; once more on fresh ports when a port picked free was taken
        before its server bound it (other workers pick ports too): a race, not a failure."""
        for attempt in range(3):
            done = self._up()
            if done.returncode == 0:
                return
            said = done.stdout.decode()[-3000:] + done.stderr.decode()
            if "address already in use" not in said or attempt == 2:
                pytest.fail(f"up.sh failed:\n{said}")
            self.stop()
            self.dir = self.base / f"cz{attempt + 1}"
            self.kubeconfig = self.dir / "kube" / "kubeconfig"
            self.kapi_port, self.etcd_port = _free_pair(), _free_pair()
            self.cozy_port = free_port()

    def _up(self) -> subprocess.CompletedProcess[bytes]:
        env = {
            **os.environ,
            "KAPI_PORT": str(self.kapi_port),
            "KAPI_ETCD_PORT": str(self.etcd_port),
            "KAPI_KCM_PORT": str(free_port()),  # never up.sh's default, shared by every worker
            "COZY_PORT": str(self.cozy_port),
            "COZY_FRESH": "1",
        }
        return subprocess.run(
            [str(UP), str(self.dir)], env=env, capture_output=True, timeout=180, check=False
        )

    def stop(self) -> None:
        for process, _, _ in self.replicas:
            process.terminate()
        for process, _, _ in self.replicas:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            if process.poll() is None:
                process.kill()
        for out in self._logs:
            out.close()
        if self.proxy is not None:
            self.proxy.close()
        stop = self.dir / "stop.sh"
        if stop.exists():
            subprocess.run([str(stop)], capture_output=True, timeout=60, check=False)

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        kubeconfig: Path | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig or self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done

    def apply(self, objects: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        docs = objects if isinstance(objects, list) else [objects]
        return self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs), **kwargs)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    # -- the install -----------------------------------------------------------------------

    def install(self) -> None:
        """Instance types, then ``deploy/`` without its webhook configurations."""
        self.kubectl("apply", "-f", str(HERE / "kubevirt-crds.yaml"))
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "crd/virtualmachineclusterinstancetypes.instancetype.kubevirt.io",
        )
        types = [
            doc
            for path in sorted((FIXTURES / "cozystack" / "instancetypes").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") == "VirtualMachineClusterInstancetype"
        ]
        self.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(types))
        rendered = self.kubectl("kustomize", str(ROOT / "deploy")).stdout
        self.shipped = [d for d in yaml.safe_load_all(rendered) if d]
        rest = [d for d in self.shipped if not d["kind"].endswith("WebhookConfiguration")]
        self.apply(rest)
        # The root tenant's namespace: Cozystack's own, without tenant labels (NOTES.md).
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-root"}})
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "crd/tenantreservations.reservation.cozystack.io",
        )
        # The replicas serve the spare pair up.sh made for 127.0.0.1 (the CA is DIR/pki/ca.crt).
        self.certs.mkdir(exist_ok=True)
        shutil.copy(self.dir / "pki" / "webhook.crt", self.certs / "tls.crt")
        shutil.copy(self.dir / "pki" / "webhook.key", self.certs / "tls.key")
        shutil.copy(self.dir / "pki" / "ca.crt", self.certs / "ca.crt")

    def service_account_kubeconfig(self) -> Path:
        """A kubeconfig for the shipped ServiceAccount (its token, the admin's server and CA)."""
        token = self.kubectl(
            "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration=2h"
        ).stdout.strip()
        admin = yaml.safe_load(self.kubeconfig.read_text())
        cluster = admin["clusters"][0]["cluster"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cz", "cluster": cluster}],
            "users": [{"name": "webhook", "user": {"token": token}}],
            "contexts": [{"name": "cz", "context": {"cluster": "cz", "user": "webhook"}}],
            "current-context": "cz",
        }
        path = self.base / "webhook.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_replicas(self, count: int, **env: str) -> None:
        kubeconfig = self.service_account_kubeconfig()
        for index in range(count):
            port, metrics = free_port(), free_port()
            log = self.base / f"replica-{index}.log"
            out = log.open("wb")
            self._logs.append(out)
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "webhook",
                    "serve",
                    "--kubeconfig",
                    str(kubeconfig),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--metrics-listen",
                    f"127.0.0.1:{metrics}",
                    "--cert-dir",
                    str(self.certs),
                    "--timeout-seconds",
                    "10",
                ],
                env={
                    **os.environ,
                    "POD_NAMESPACE": NAMESPACE,
                    "POD_NAME": f"replica-{index}",
                    "WEBHOOK_CERTS": "cert-manager",  # the pair in --cert-dir, caBundle ours
                    "WEBHOOK_MODE": "enforce",
                    "WEBHOOK_LOG_LEVEL": os.environ.get("WEBHOOK_LOG_LEVEL", "WARNING"),
                    # cozystack-api's watches can lose an event: a resync every 10 s (not 300)
                    # puts it right within the tests' waits, and exercises the repair here.
                    "WEBHOOK_WATCH_RESYNC_SECONDS": "10",
                    **env,
                },
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(ROOT),
            )
            self.replicas.append((process, port, log))
        for process, port, log in self.replicas:
            self._wait_ready(process, port, log)
        if count > 1:
            self.proxy = Proxy([port for _, port, _ in self.replicas])

    def _wait_ready(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        context = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"replica exited:\n{log.read_text()[-3000:]}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/readyz", context=context, timeout=2
                ) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.2)
        pytest.fail(f"replica not ready in 60 s:\n{log.read_text()[-3000:]}")

    def point_webhooks(self, port: int) -> None:
        """Apply the shipped webhook configurations, pointed at ``127.0.0.1:port`` by URL."""
        bundle = base64.b64encode((self.dir / "pki" / "ca.crt").read_bytes()).decode()
        configurations = []
        for doc in self.shipped:
            if not doc["kind"].endswith("WebhookConfiguration"):
                continue
            doc = json.loads(json.dumps(doc))
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"].get("path", "/")
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{port}{path}",
                    "caBundle": bundle,
                }
            configurations.append(doc)
        self.apply(configurations)
        time.sleep(1.0)  # cozystack-api's informer picks them up within a fraction of a second

    @property
    def entry_port(self) -> int:
        """Where the configurations point: the proxy with two replicas, else the replica."""
        return self.proxy.port if self.proxy is not None else self.replicas[0][1]

    # -- tenants as Cozystack builds them ----------------------------------------------------

    def tenant(self, name: str, quota: dict[str, str] | None, parent: str = "tenant-root") -> str:
        """Tenant ``name`` in ``parent``'s namespace, and its namespace; returns the namespace."""
        namespace = f"{parent}-{name}" if parent != "tenant-root" else f"tenant-{name}"
        chain = (
            [parent, namespace] if parent == "tenant-root" else [*self.ancestors(parent), namespace]
        )
        labels = {f"tenant.cozystack.io/{ns}": "" for ns in chain}
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": labels},
            }
        )
        spec: dict[str, Any] = {"resourceQuotas": quota} if quota else {}
        self.apply(
            {
                "apiVersion": "apps.cozystack.io/v1alpha1",
                "kind": "Tenant",
                "metadata": {"name": name, "namespace": parent},
                "spec": spec,
            }
        )
        self.wait_pool(namespace if quota else "")
        return namespace

    def wait_pool(
        self, namespace: str, timeout: float = 30, *, reserved: dict[str, str] | None = None
    ) -> None:
        """Until every replica charges ``namespace`` to its own pool (its watch of Tenants,
        through the aggregation layer, has delivered the Tenant) and, given ``reserved``, counts
        that much reserved there: asked with an UPDATE of an object no replica knows that changes
        a value the charge does not read, which adds nothing to the pool (its ``reserved-after``
        is the pool's usage as the replica counts it; its entry, one per pool, keeps no floor)."""
        if not namespace or not self.replicas:
            return
        body = review(
            "VMInstance",
            namespace,
            "probe",
            {"instanceType": "u1.micro", "external": False},
            operation="UPDATE",
            old_spec={"instanceType": "u1.micro"},
            uid="probe",
        )
        context = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        deadline = time.monotonic() + timeout
        for _, port, _ in self.replicas:
            while True:
                request = urllib.request.Request(
                    f"https://127.0.0.1:{port}/validate",
                    data=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                )
                try:
                    with urllib.request.urlopen(request, context=context, timeout=5) as answer:
                        response = json.loads(answer.read())["response"]
                except (TimeoutError, urllib.error.URLError) as exc:
                    # A replica just started may take longer than the probe waits: its first
                    # admission waits for the consistent reads that prove its kinds complete.
                    response = {"error": repr(exc)}
                audit = response.get("auditAnnotations") or {}
                counted = json.loads(audit.get("reserved-after") or "{}")
                if audit.get("pool") == namespace and (
                    reserved is None or all(counted.get(k) == v for k, v in reserved.items())
                ):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"replica on {port} never saw pool {namespace}: {response}"[:2000]
                    )
                time.sleep(0.1)

    def ancestors(self, namespace: str) -> list[str]:
        found = self.get("namespace", namespace)
        labels = found["metadata"].get("labels") or {}
        prefix = "tenant.cozystack.io/"
        return sorted(k[len(prefix) :] for k in labels if k.startswith(prefix))


def vm(name: str, namespace: str, instance_type: str = "u1.micro") -> dict[str, Any]:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMInstance",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"instanceType": instance_type},
    }


def request_name(factory: pytest.TempPathFactory) -> str:
    """A name for a module's kept directory: each parallel worker numbers its own temporary
    directories from 0, so the worker's name keeps two workers' apart."""
    return f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{factory.mktemp('cozystack-api').name}"


@pytest.fixture(scope="module")
def cozystack_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CozystackAPI]:
    """cozystack-api and kube-apiserver with the webhook's objects from deploy/ (no replicas)."""
    absent = _absent()
    if absent:
        pytest.skip(absent)
    # COZYSTACK_API_TEST_DIR keeps the logs (replicas', cozystack-api's) where pytest's
    # temporary directories would be rotated away.
    keep = os.environ.get("COZYSTACK_API_TEST_DIR")
    base = Path(keep) / request_name(tmp_path_factory) if keep else None
    if base is not None:
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
    env = CozystackAPI(base or tmp_path_factory.mktemp("cozystack-api"))
    try:
        env.start()
        env.install()
        yield env
    finally:
        env.stop()

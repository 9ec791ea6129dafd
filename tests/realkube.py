"""A real kube-apiserver (and etcd) from ``../shared/kube`` for tests marked ``kube``.

The binaries are not in the repository: a fresh clone has no ``../shared``, and the test skips
saying so. Each use starts on free loopback ports in a temporary directory and is always
stopped, even when the test fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from tests.builders import ROOT, free_port
from webhook.kube.client import KubeClient

# ../shared beside the project; WEBHOOK_TEST_SHARED names it elsewhere (a checkout kept apart).
UP = Path(os.environ.get("WEBHOOK_TEST_SHARED") or ROOT.parent / "shared") / "kube" / "up.sh"


@contextmanager
def real_apiserver(workdir: Path) -> Iterator[Path]:
    """A started API server; yields its cluster-admin kubeconfig (its port in ``server``)."""
    if not UP.is_file():
        pytest.skip(f"no real API server here: {UP} is absent (it ships beside the project)")
    for tool in ("openssl", "curl", "kubectl"):
        if shutil.which(tool) is None:
            pytest.skip(f"the real API server needs {tool} on PATH")
    env: dict[str, str] = {}
    try:
        # Ports are free when chosen, not when bound: another process may take one in between,
        # so a start that fails is tried once more on new ports before the test fails.
        for attempt in (1, 2):
            env = {
                **os.environ,
                "KAPI_FRESH": "1",
                "KAPI_PORT": str(free_port()),
                "KAPI_ETCD_PORT": str(etcd_port()),
                # Unused unless KAPI_KCM=1 is inherited; never its default, which another
                # worker's server would take too.
                "KAPI_KCM_PORT": str(free_port()),
                "KAPI_TIMEOUT": "120",
            }
            started = subprocess.run(
                [str(UP), str(workdir)], env=env, capture_output=True, text=True, timeout=180
            )
            if started.returncode == 0:
                break
            assert attempt == 1, started.stdout[-1000:] + started.stderr[-2000:]
        yield workdir / "kubeconfig"
    finally:
        stop = workdir / "stop.sh"
        if stop.exists():
            subprocess.run(
                [str(stop)],
                env={**env, "KAPI_WIPE": "1"},
                capture_output=True,
                timeout=60,
                check=False,
            )


def etcd_port() -> int:
    """A free etcd client port whose peer port (the client port + 10) is free too."""
    while True:
        port = free_port()
        if port + 10 < 65536 and port_is_free(port + 10):
            return port


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@asynccontextmanager
async def reservations_on_real_apiserver(
    workdir: Path, namespace: str
) -> AsyncIterator[KubeClient]:
    """A started API server with the shipped TenantReservation CRD and ``namespace``; yields a
    client of it (closed, and the server stopped, after)."""
    with real_apiserver(workdir) as kubeconfig:
        kubectl(kubeconfig, "apply", "-f", str(ROOT / "deploy/base/crd-tenantreservations.yaml"))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd", "--all")
        kubectl(kubeconfig, "create", "namespace", namespace)
        client = KubeClient.from_kubeconfig(str(kubeconfig))
        try:
            yield client
        finally:
            await client.close()

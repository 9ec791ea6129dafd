"""A real kube-apiserver (and etcd) from ``../shared/kube`` for tests marked ``kube``.

The binaries are not in the repository: a fresh clone has no ``../shared``, and the test skips
saying so. Each use starts on free loopback ports in a temporary directory and is always
stopped, even when the test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.builders import ROOT, free_port

# ../shared beside the project; WEBHOOK_TEST_SHARED names it elsewhere (a checkout kept apart).
UP = Path(os.environ.get("WEBHOOK_TEST_SHARED") or ROOT.parent / "shared") / "kube" / "up.sh"


@contextmanager
def real_apiserver(workdir: Path) -> Iterator[Path]:
    """A started API server; yields its cluster-admin kubeconfig."""
    if not UP.is_file():
        pytest.skip(f"no real API server here: {UP} is absent (it ships beside the project)")
    for tool in ("openssl", "curl", "kubectl"):
        if shutil.which(tool) is None:
            pytest.skip(f"the real API server needs {tool} on PATH")
    env = {
        **os.environ,
        "KAPI_FRESH": "1",
        "KAPI_PORT": str(free_port()),
        "KAPI_ETCD_PORT": str(free_port()),
        "KAPI_TIMEOUT": "120",
    }
    try:
        started = subprocess.run(
            [str(UP), str(workdir)], env=env, capture_output=True, text=True, timeout=180
        )
        assert started.returncode == 0, started.stderr[-2000:]
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

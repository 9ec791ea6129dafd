"""An emulated API server in a child process, as the benchmarks drive it: it prints its
kubeconfig's path when it is ready, then answers each line sent on its stdin with one line, and
ends when its stdin closes."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_cluster(command: list[str], *, cwd: Path = ROOT) -> tuple[subprocess.Popen[str], str]:
    """The process of ``command``, started in ``cwd``, and the kubeconfig it printed."""
    cluster = subprocess.Popen(
        command, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert cluster.stdout is not None
    return cluster, cluster.stdout.readline().strip()


def ask(cluster: subprocess.Popen[str], line: str) -> str:
    """Send ``line`` to the cluster; its answer, without the newline."""
    assert cluster.stdin is not None
    assert cluster.stdout is not None
    cluster.stdin.write(line + "\n")
    cluster.stdin.flush()
    return cluster.stdout.readline().strip()

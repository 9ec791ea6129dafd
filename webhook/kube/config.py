"""Connecting to a cluster as kubectl would, with one clear error when that is impossible.

kubectl resolves ``--kubeconfig``, else every file in ``$KUBECONFIG`` (merged, first file wins
per entry), else ``~/.kube/config``, then picks ``--context`` or the current context. The
official ``kubernetes`` package does the same when given no file; here it is asked for that,
and each way it can fail (no file, a file that is not a kubeconfig, a context that does not
exist, no service account outside a pod) becomes a :class:`KubeConfigError` naming the file or
context and what to pass instead. Nothing heavy is imported until a connection is made.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from webhook.kube.client import KubeClient

__all__ = ["KubeConfigError", "connect", "in_cluster"]


class KubeConfigError(Exception):
    """No cluster can be reached with the configuration given; the message says why."""


def connect(
    kubeconfig: str | None, *, context: str | None = None, timeout: float | None = None
) -> KubeClient:
    """A client for ``kubeconfig`` (None: ``$KUBECONFIG`` files, else ``~/.kube/config``)."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    from webhook.kube.client import KubeClient

    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            raise KubeConfigError(
                f"--kubeconfig {kubeconfig}: no such file; pass the file kubectl uses"
            )
    elif not any(os.path.isfile(os.path.expanduser(p)) for p in where.split(os.pathsep) if p):
        raise KubeConfigError(
            f"no kubeconfig: {where} does not exist; pass --kubeconfig FILE, set KUBECONFIG, "
            "or use --state DIR for manifest directories"
        )
    configuration = k8s_client.Configuration()
    try:
        # Given "a:b", the package merges the files as kubectl does (first file wins per
        # entry). $KUBECONFIG is passed explicitly: the package reads it once, at import.
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig or os.environ.get("KUBECONFIG") or None,
            context=context,
            client_configuration=configuration,
        )
    except k8s_config.ConfigException as exc:
        raise KubeConfigError(f"kubeconfig {where}: {_one_line(exc)}") from None
    except Exception as exc:  # YAML errors, wrong shapes: a file that is not a kubeconfig
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or type(exc).__name__
        raise KubeConfigError(f"kubeconfig {where}: not a kubeconfig{at}: {reason}") from None
    return KubeClient(configuration, timeout=timeout) if timeout else KubeClient(configuration)


def in_cluster() -> KubeClient:
    """A client with the pod's service account; outside a pod, an error naming the fix."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    from webhook.kube.client import KubeClient

    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    except k8s_config.ConfigException as exc:
        raise KubeConfigError(
            f"not in a cluster ({_one_line(exc)}): pass --state DIR for manifest directories "
            "or --kubeconfig FILE for a cluster"
        ) from None
    return KubeClient(configuration)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()).rstrip(".")

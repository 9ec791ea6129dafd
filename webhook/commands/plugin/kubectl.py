"""What the plugin's subcommands share: kubectl's flags for where to read, and asking the cluster.

``report``, ``explain`` and ``guard`` read either manifest directories (``--state``) or a
cluster reached as kubectl reaches it (``--kubeconfig``, ``--context``, ``--request-timeout``,
``--webhook-namespace`` for the preset ConfigMap); the flags are spelt once here, and
:func:`ask` is the one place that connects, bounds every request and closes the client.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import TYPE_CHECKING, Any, Final

from webhook.commands.console import CommandError

if TYPE_CHECKING:
    from webhook.kube.client import KubeClient
    from webhook.state.one_shot import Snapshot

__all__ = ["DEFAULT_TIMEOUT", "PROG", "add_source", "ask", "read_snapshot"]

PROG: Final = "kubectl reservation"
DEFAULT_TIMEOUT: Final = 30.0


def add_source(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--state", action="append", metavar="DIR", help="manifest directories")
    source.add_argument(
        "--kubeconfig", metavar="FILE", help="default: $KUBECONFIG (all its files), ~/.kube/config"
    )
    parser.add_argument("--context", help="the kubeconfig context to use (default: current)")
    parser.add_argument(
        "--request-timeout",
        type=_duration,
        default=DEFAULT_TIMEOUT,
        metavar="DURATION",
        help=f"bound on each API request: seconds, or 30s, 2m (default {DEFAULT_TIMEOUT:g}s)",
    )
    parser.add_argument(
        "--webhook-namespace",
        default="cozy-reservation",
        metavar="NS",
        help="where the webhook's preset ConfigMap lives (default cozy-reservation)",
    )


def _duration(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", text.strip())
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30, 30s or 2m")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match[2] or "s"]
    return float(match[1]) * scale


async def read_snapshot(client: KubeClient, args: argparse.Namespace, namespace: str) -> Snapshot:
    """What ``report`` and ``guard`` ask the cluster: the pools around ``namespace``."""
    from webhook.state import one_shot

    return await one_shot.read_snapshot(
        client, namespace=namespace, webhook_namespace=args.webhook_namespace
    )


def ask(args: argparse.Namespace, question: Any) -> Any:
    """Connect as kubectl would and run ``question(client)``, closing the client after."""
    from webhook.kube.config import connect
    from webhook.state.one_shot import SnapshotError

    client = connect(args.kubeconfig, context=args.context, timeout=args.request_timeout)

    async def asked() -> Any:
        try:
            return await question(client)
        finally:
            await client.close()

    try:
        return asyncio.run(asked())
    except SnapshotError as exc:
        raise CommandError(str(exc)) from None

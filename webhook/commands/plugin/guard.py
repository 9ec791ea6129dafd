"""``kubectl reservation guard``: will admitted applications' pods fit their ResourceQuotas?

The plugin's spelling of ``webhook guard`` (``-n``/``-A``, a cluster or ``--state``): it reads
the pools and the namespaces' ResourceQuotas, only those of the namespaces asked about with
``-n``. Its flags and its handler live here; what it shares with the other subcommands is in
``kubectl``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from webhook.commands.console import EXIT_CODES, add_output
from webhook.commands.plugin.kubectl import add_source, ask, read_snapshot

if TYPE_CHECKING:
    from webhook.kube.client import KubeClient

__all__ = ["add_parser"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``guard`` to the ``kubectl reservation`` command line."""
    guard = commands.add_parser(
        "guard",
        help="will admitted applications' pods fit their namespace's ResourceQuotas?",
        epilog=EXIT_CODES,
    )
    add_source(guard)
    guard_scope = guard.add_mutually_exclusive_group()
    guard_scope.add_argument(
        "-n", "--namespace", default="", help="this namespace and the tenant namespaces below it"
    )
    guard_scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace (the default)"
    )
    guard.add_argument(
        "--mix",
        action="append",
        default=[],
        metavar="SIZE",
        help="a target VM memory size (e.g. 1Gi): the factor a budget of such VMs needs",
    )
    add_output(guard, ("table", "json", "yaml"), default="table")
    guard.add_argument(
        "--fail-on",
        choices=("short",),
        help="exit 1 when admitted applications cannot all run in some namespace",
    )
    guard.set_defaults(handler=_guard)


def _guard(args: argparse.Namespace) -> int:
    from webhook.capacity.guard_report import build_guard_report, parse_mixes, print_guard_report
    from webhook.core.capacity.guard import QuotaBook

    namespace = "" if args.all_namespaces else args.namespace
    mixes = parse_mixes(args.mix)
    if args.state:
        from webhook.commands.console import load_state_showing_progress

        quotas = QuotaBook()
        state = load_state_showing_progress(args.state, quotas=quotas)
    else:
        state, quotas = ask(args, lambda client: _guard_snapshot(client, args, namespace))
    report = build_guard_report(state, quotas, mixes, namespace=namespace)
    return print_guard_report(report, args.output, fail_on_short=args.fail_on == "short")


async def _guard_snapshot(
    client: KubeClient, args: argparse.Namespace, namespace: str
) -> tuple[Any, Any]:
    from webhook.state.one_shot import read_quotas

    snapshot = await read_snapshot(client, args, namespace)
    for note in snapshot.notes:
        print(f"note: {note}", file=sys.stderr)
    scope = None
    if namespace:
        scope = sorted({node.namespace for node in snapshot.state.tree.nodes()} | {namespace})
    return snapshot.state, await read_quotas(client, scope)

"""``webhook guard``: will the pods of admitted applications fit their namespaces' ResourceQuotas?

Reservations are checked against tenants' budgets at admission; the pods they start are checked
again by Kubernetes against the ResourceQuotas the tenant chart writes. This command compares
the two offline and prints the factor that lets every admitted application run. Its flags and
its handler live here; the capacity code loads when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from webhook.commands.console import EXIT_CODES, add_output
from webhook.commands.options import add_state, load_state

__all__ = ["add_parser"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``guard`` to the ``webhook`` command line."""
    guard = commands.add_parser(
        "guard",
        help="will admitted applications' pods fit their namespace's ResourceQuotas?",
        description="Per tenant namespace: the pod-level guard (ResourceQuotas), what admitted "
        "applications' pods will request, and the factor on resourceQuotas that lets them all "
        "run. Exit status 1 with --fail-on short when some namespace is short.",
        epilog=EXIT_CODES,
    )
    add_state(guard)
    guard.add_argument(
        "--mix",
        action="append",
        default=[],
        metavar="SIZE",
        help="a target VM memory size (e.g. 1Gi): print the factor a budget of such VMs needs",
    )
    guard.add_argument(
        "-n", "--namespace", default="", help="this namespace and the tenant namespaces below it"
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

    mixes = parse_mixes(args.mix)
    quotas = QuotaBook()
    state = load_state(args.state, quotas=quotas)
    report = build_guard_report(state, quotas, mixes, namespace=args.namespace)
    return print_guard_report(report, args.output, fail_on_short=args.fail_on == "short")

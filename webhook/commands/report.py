"""``webhook report``: every pool of a state, its budget, what is reserved and what is left.

The offline twin of ``kubectl reservation report`` and of the policy reports the leader writes
(``-o openreports`` prints those); ``--fail-on`` makes it a check for CI and cron. Its flags and
its handler live here; the report code loads when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from webhook.commands.console import EXIT_CODES, EXIT_FOUND, add_fail_on, add_output
from webhook.commands.options import add_state, load_state, record_keys

__all__ = ["add_parser"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``report`` to the ``webhook`` command line."""
    report = commands.add_parser(
        "report", help="print every pool: budget, reserved, available", epilog=EXIT_CODES
    )
    add_state(report)
    report.add_argument(
        "-n", "--namespace", default="", help="only the pool this namespace is in, and below"
    )
    add_output(report, ("table", "wide", "json", "yaml", "openreports"), default="table")
    add_fail_on(report)
    report.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    from webhook.admission.report import build_report, dump, failures, render_report
    from webhook.admission.room_report import add_room, render_room, reservations_in
    from webhook.core.capacity.guard import QuotaBook

    quotas = QuotaBook()
    state = load_state(args.state, quotas=quotas, keys=record_keys(args.record_key_file))
    report = add_room(
        build_report(state, namespace=args.namespace), state, reservations_in(args.state)
    )
    if args.output == "openreports":
        # What the leader writes: one OpenReports Report per tenant namespace, for kubectl apply.
        import yaml

        from webhook.core.admission.policy_reports import build_reports

        reports = build_reports(state, quotas=quotas, namespace=args.namespace)
        print(yaml.safe_dump_all(list(reports.values()), sort_keys=False).rstrip("\n"))
    elif args.output in ("json", "yaml"):
        print(dump(report, args.output))
    else:
        print(
            "\n".join(
                [
                    render_report(report, wide=args.output == "wide"),
                    *render_room(report.get("room") or []),
                ]
            )
        )
    found = failures(report, args.fail_on)
    if found:
        print(f"webhook report: --fail-on: {'; '.join(found)}", file=sys.stderr)
        return EXIT_FOUND
    return 0

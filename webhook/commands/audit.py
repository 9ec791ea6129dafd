"""``webhook audit``'s flags; the commands' code (:mod:`webhook.audit.command`) loads when one runs.

The audit review imports the decision code, the planner and the page renderer: building the
``webhook`` parser must not, so that every other command starts fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from webhook.core.admission.modes import MODES

__all__ = ["add_parser"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``audit`` and its subcommands to the ``webhook`` command line."""
    audit = commands.add_parser(
        "audit", help="review an audit log: summary, what-if replay, verification"
    )
    sub = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")

    summary = sub.add_parser("summary", help="what the gate decided, and whom it touched")
    _add_logs(summary)
    _add_filters(summary)
    _add_output(summary, html=True)
    summary.set_defaults(handler=_summary)

    replay = sub.add_parser("replay", help="decide every write again under a what-if policy")
    _add_logs(replay)
    _add_state(replay)
    _add_record_keys(replay)
    _add_filters(replay)
    replay.add_argument(
        "--mode", choices=MODES, help="what-if mode (default: each write's recorded mode)"
    )
    replay.add_argument(
        "--mode-for", action="append", default=[], metavar="KIND=MODE", help="repeatable"
    )
    replay.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="NAMESPACE=KEY:QTY,...",
        help="a what-if budget for a pool (repeatable), e.g. tenant-acme=cpu:40,memory:80Gi",
    )
    replay.add_argument(
        "--contracts", action="append", default=[], metavar="DIR", help="what-if contracts"
    )
    replay.add_argument(
        "--suggest-budgets",
        action="store_true",
        help="print per pool the smallest budget that would have denied nothing",
    )
    _add_output(replay, html=True)
    replay.set_defaults(handler=_replay)

    verify = sub.add_parser(
        "verify", help="recompute every admitted charge; exit 1 when anything is found"
    )
    _add_logs(verify)
    _add_state(verify)
    _add_record_keys(verify)
    _add_output(verify, html=False)
    verify.set_defaults(handler=_verify)


def _add_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "logs",
        nargs="+",
        metavar="LOG",
        help="audit log files (JSON lines, rotated, .gz, EventList batches); - is stdin",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar even on a terminal"
    )


def _add_state(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        action="append",
        required=True,
        metavar="DIR",
        help="manifests the log starts from (repeatable), e.g. fixtures/cozystack",
    )
    parser.add_argument(
        "--dry-runs-stored",
        action="store_true",
        help="the API server stored what it answered as dry runs (cozystack-api does): "
        "apply them to the history like any write",
    )


def _add_record_keys(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record-key-file",
        metavar="FILE",
        help="the webhook's record keys (line 1: current; more lines: previous): charge "
        "records are believed, and verify checks signatures, only with them",
    )


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", metavar="TIME", help="RFC 3339, e.g. 2026-11-30T23:44:33Z")
    parser.add_argument("--until", metavar="TIME", help="RFC 3339")
    parser.add_argument("-n", "--namespace", default="", help="only this namespace")
    parser.add_argument("--kind", default="", help="only this kind, e.g. VMInstance")
    parser.add_argument("--user", default="", help="only this user")


def _add_output(parser: argparse.ArgumentParser, *, html: bool) -> None:
    parser.add_argument(
        "-o", "--output", choices=("table", "json", "yaml"), help="default: table on a terminal"
    )
    if html:
        parser.add_argument("--html", metavar="FILE", help="also write a self-contained page")


def _summary(args: argparse.Namespace) -> int:
    from webhook.audit.command import summary

    return summary(args)


def _replay(args: argparse.Namespace) -> int:
    from webhook.audit.command import replay

    return replay(args)


def _verify(args: argparse.Namespace) -> int:
    from webhook.audit.command import verify

    return verify(args)

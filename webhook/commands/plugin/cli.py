"""The ``kubectl reservation`` command line: the parser that registers the plugin's subcommands.

Each subcommand is a module beside this one (``report``, ``explain``, ``guard``) holding its
flags and its handler; ``completion`` is the one ``webhook`` has, drawn from this parser.
:func:`main` runs every handler through :func:`webhook.commands.console.run`, so the plugin
fails, exits and stops on a closed pipe as ``webhook`` does.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from webhook.commands import completion
from webhook.commands.console import EXIT_CODES, Parser, VersionAction, run
from webhook.commands.plugin import explain, guard, report
from webhook.commands.plugin.kubectl import PROG

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run(f"{PROG} {args.command}", args.handler, args)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG, description="Tenant reservations: pools and charges.", epilog=EXIT_CODES
    )
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In the order ``kubectl reservation --help`` lists them.
    report.add_parser(commands)
    explain.add_parser(commands)
    guard.add_parser(commands)
    completion.add_parser(commands, parser)
    return parser

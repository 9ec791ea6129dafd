"""The command line: ``webhook <command>``, the parser that registers every command.

Each command is a module of its own beside this one, named after it (``evaluate``, ``review``,
``report``, ``guard``, ``serve``, ``certs``, ``plan``, ``rebalance``, ``audit``,
``contract_schema``, ``completion``), holding its flags and its handler, a thin shell over the
core: parse arguments, load what it needs, call one pure function, print. A command registers
itself with ``add_parser(commands)`` and ``set_defaults(handler=...)``; :func:`main` runs every
handler through :func:`webhook.commands.console.run`, so each one, present or added later, fails
the same way: one line on stderr naming the file, flag or path and the fix, exit status 2 (the
exit codes are in ``--help``). Heavy modules (aiohttp, the Kubernetes client, the audit review)
are imported inside the handlers that use them, so a command that reads files starts fast:
building the parser imports argparse-level code only, and
``tests/commands/test_cli_startup.py`` keeps it so.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from webhook.commands import (
    audit,
    certs,
    completion,
    contract_schema,
    evaluate,
    guard,
    plan,
    rebalance,
    report,
    review,
    serve,
)
from webhook.commands.console import EXIT_CODES, Parser, VersionAction, run

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    parts = (args.command, getattr(args, "certs_command", ""))
    name = " ".join(str(part) for part in parts if part)
    return run(f"webhook {name}", args.handler, args)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="webhook",
        description="Cozystack tenant quotas as reservation limits.",
        epilog=EXIT_CODES,
    )
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In the order ``webhook --help`` lists them.
    evaluate.add_parser(commands)
    review.add_parser(commands)
    report.add_parser(commands)
    guard.add_parser(commands)
    serve.add_parser(commands)
    certs.add_parser(commands)
    plan.add_parser(commands)
    rebalance.add_parser(commands)
    audit.add_parser(commands)
    contract_schema.add_parser(commands)
    completion.add_parser(
        commands,
        parser,
        description="Print a completion script generated from this parser. Bash: "
        "source <(webhook completion bash). Zsh: webhook completion zsh > "
        '"${fpath[1]}/_webhook".',
    )
    return parser

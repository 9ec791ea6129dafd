"""``completion``: a shell completion script generated from the command line's own parser.

Both command lines have it (``webhook completion``, ``kubectl reservation completion``): the
script is drawn from the parser it is registered on, so it lists exactly the commands and flags
that parser has, and there is nothing to keep in step by hand. shtab loads only when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser"]


def add_parser(
    commands: argparse._SubParsersAction[Any],
    parser: argparse.ArgumentParser,
    *,
    description: str | None = None,
) -> None:
    """Add ``completion`` to a command line: ``parser``, whose ``commands`` these are."""
    completion = commands.add_parser(
        "completion", help="print a shell completion script", description=description
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(handler=_completion, parser=parser)


def _completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(args.parser, shell=args.shell))
    return 0

"""``webhook review``: decide AdmissionReview requests in order against a state, offline.

The same decision the server makes, from files: each admitted request is applied before the next
is decided, so a sequence of writes reads as it would against a live pool. Its flags (the
policy: modes and overcommit rules) and its handler live here; the decision code loads when it
runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from webhook.commands.console import EXIT_CODES, EXIT_INPUT, CommandError
from webhook.commands.options import (
    add_overcommit,
    add_state,
    load_state,
    overcommit_flags,
    record_keys,
)
from webhook.core.admission.modes import MODES, Mode

if TYPE_CHECKING:
    from webhook.core.admission.decisions import Policy

__all__ = ["add_parser"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``review`` to the ``webhook`` command line."""
    review = commands.add_parser(
        "review", help="decide AdmissionReview requests in order against a state", epilog=EXIT_CODES
    )
    add_state(review)
    _add_policy(review)
    review.add_argument("files", nargs="+", metavar="FILE", help="AdmissionReview JSON; - is stdin")
    review.set_defaults(handler=_review)


def _add_policy(parser: argparse.ArgumentParser) -> None:
    add_overcommit(parser)
    parser.add_argument("--mode", choices=MODES, default="enforce", help="default: enforce")
    parser.add_argument(
        "--mode-for",
        action="append",
        default=[],
        metavar="KIND=MODE",
        help="a mode for one kind (repeatable), e.g. Kubernetes=warn",
    )


def _policy(args: argparse.Namespace, known: Sequence[str]) -> Policy:
    from webhook.core.admission.decisions import Policy
    from webhook.settings import SettingsError, check_mode_kinds, load_settings

    per_kind: dict[str, Mode] = {}
    for item in args.mode_for:
        kind, _, mode = item.partition("=")
        if not kind or mode not in MODES:
            raise CommandError(
                f"--mode-for {item!r}: expected KIND=MODE, MODE one of {', '.join(MODES)}"
            )
        per_kind[kind] = cast(Mode, mode)  # checked against MODES above
    check_mode_kinds(per_kind, known)
    try:
        rules = load_settings(overcommit_flags(args), environ={}).policy.overcommit
    except SettingsError as exc:
        raise CommandError(str(exc)) from None
    return Policy(args.mode, per_kind, rules)


def _review(args: argparse.Namespace) -> int:
    from webhook.admission.admit import admit, apply_admitted
    from webhook.core.admission.reviews import ReviewError
    from webhook.core.capacity.guard import QuotaBook

    quotas = QuotaBook()
    state = load_state(args.state, quotas=quotas, keys=record_keys(args.record_key_file))
    policy = _policy(args, list(state.platform.kinds))
    status = 0
    for name in args.files:
        for index, body in enumerate(_read_reviews(name)):
            where = name if index == 0 else f"{name}#{index}"
            try:
                outcome = admit(body, state, policy, quotas=quotas)
            except ReviewError as exc:
                print(f"webhook review: {where}: {exc}", file=sys.stderr)
                status = EXIT_INPUT
                continue
            print(json.dumps(outcome.review, separators=(",", ":")))
            apply_admitted(state, outcome.request, outcome.decision)
    return status


def _read_reviews(name: str) -> list[Any]:
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{name}: cannot read: {exc}") from None
    try:
        return [json.loads(text)]
    except RecursionError:
        raise CommandError(f"{name}: not JSON: nested too deeply") from None
    except ValueError:  # JSONDecodeError, or a number past Python's digit limit
        pass
    bodies = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                bodies.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise CommandError(f"{name}: line {number}: not JSON: {exc.msg}") from None
            except (ValueError, RecursionError) as exc:
                reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                raise CommandError(f"{name}: line {number}: not JSON: {reason}") from None
    return bodies

"""The flags several ``webhook`` commands share, and what they load from them.

``--state`` and ``--record-key-file`` (review, report, guard, serve) and the overcommit rules
(review, serve) are spelt once here, so the commands that take them say the same thing in
``--help`` and refuse the same input with the same line. Like every module the parser imports,
this one imports nothing heavy: what a flag names is loaded only when a handler runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from webhook.commands.console import CommandError, load_state_showing_progress

if TYPE_CHECKING:
    from webhook.core.admission.state import ReservationState
    from webhook.core.capacity.guard import QuotaBook
    from webhook.core.pricing.platform import Platform
    from webhook.core.tenancy.records import RecordKeys

__all__ = [
    "add_overcommit",
    "add_record_key",
    "add_state",
    "load_state",
    "overcommit_flags",
    "record_keys",
    "require_platform",
]


def add_state(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        action="append",
        required=True,
        metavar="DIR",
        help="directory of manifests (repeatable), e.g. fixtures/cozystack",
    )
    add_record_key(parser)


def add_record_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record-key-file",
        metavar="FILE",
        help="key signing charge records (line 1; more lines: previous keys); "
        "default: a key of this process, so records written elsewhere are not believed",
    )


def record_keys(path: str | None) -> RecordKeys | None:
    from webhook.tenancy.record_keys import RecordKeyError, keys_from_file

    if not path:
        return None
    try:
        return keys_from_file(path)
    except RecordKeyError as exc:
        raise CommandError(str(exc)) from None


def add_overcommit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--overcommit-admins",
        action="append",
        metavar="NAMES",
        help="groups or users who may set overcommit factors (comma-separated, repeatable); "
        "default: system:masters,cozystack-cluster-admin",
    )
    parser.add_argument(
        "--overcommit-max",
        action="append",
        metavar="KEY=DECIMAL",
        help="largest overcommit factor for a key (repeatable); default cpu=4, memory=1.5",
    )
    parser.add_argument(
        "--overcommit-step", metavar="DECIMAL", help="largest change of a factor per update (0.1)"
    )


def overcommit_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "overcommit_admins": args.overcommit_admins,
        "overcommit_max": args.overcommit_max,
        "overcommit_step": args.overcommit_step,
    }


def load_state(
    paths: Sequence[str], *, quotas: QuotaBook | None = None, keys: RecordKeys | None = None
) -> ReservationState:
    state = cast("ReservationState", load_state_showing_progress(paths, quotas=quotas, keys=keys))
    require_platform(state.platform, paths)
    return state


def require_platform(platform: Platform, paths: Sequence[str]) -> None:
    if not platform.kinds:
        raise CommandError(
            f"--state {' '.join(paths)}: no ApplicationDefinition found; add the platform's "
            "definitions (e.g. --state fixtures/cozystack)"
        )

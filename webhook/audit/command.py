"""``webhook audit summary|replay|verify``: the shell around the pure audit review.

Parses flags, reads events (:mod:`.reader`), feeds them one at a time to the pure folds in
``webhook.core.audit``, and prints a table on a terminal or JSON/YAML for tools; ``--html``
writes a self-contained page (:mod:`.html`). Exit status: 0, or 1 when ``verify`` found
something, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, cast

from webhook.audit.reader import MALFORMED_KEPT, EventReader, ReadError
from webhook.audit.render import render_replay, render_summary, render_verify
from webhook.core.applications import APPS_API_VERSION, AppKey
from webhook.core.audit.events import AuditWrite, parse_time, write_from_event
from webhook.core.audit.history import History
from webhook.core.audit.replay import Replayer
from webhook.core.audit.summary import Filters, SummaryBuilder
from webhook.core.audit.verify import Verifier
from webhook.core.decisions import MODES, Mode, Policy
from webhook.core.errors import QuantityError, ReservationError
from webhook.core.quantities import parse_quantity
from webhook.core.records import RecordKeys

__all__ = ["AuditInputError", "register"]

EXIT_FOUND = 1


class AuditInputError(ReservationError):
    """Bad flags or unreadable input: printed as one line, exit 2."""


def register(commands: argparse._SubParsersAction[Any]) -> None:
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


# -- handlers ----------------------------------------------------------------------------------


def _summary(args: argparse.Namespace) -> int:
    reader = _reader(args)
    builder = SummaryBuilder(_filters(args), series=bool(args.html))
    failed = _fold(reader, {}, builder.add)
    result = builder.result(events=reader.events, malformed=reader.malformed_json())
    result["failed"] = failed
    result["malformed"] = reader.malformed_count
    _print(args, result, render_summary)
    if args.html:
        _write_html(args.html, "Audit summary", result, builder.chart())
    return 0


def _replay(args: argparse.Namespace) -> int:
    history = _history(args, budgets=_budgets(args.budget), keys=_keys(args))
    policy = _policy(args)
    replayer = Replayer(history, policy, filters=_filters(args), chart=bool(args.html))
    reader = _reader(args)
    failed = _fold(reader, history.kinds, replayer.add)
    result = replayer.result(suggest=args.suggest_budgets)
    result["failed"] = failed
    result["events"] = reader.events
    result["malformed"] = reader.malformed_count
    result["malformedLines"] = reader.malformed_json()
    _print(args, result, render_replay)
    if args.html:
        _write_html(args.html, "Audit replay", result, replayer.chart())
    return 0


def _verify(args: argparse.Namespace) -> int:
    keys = _keys(args)
    history = _history(args, keys=keys)
    verifier = Verifier(history, keys)
    reader = _reader(args)
    failed = _fold(reader, history.kinds, verifier.add)
    result = verifier.result()
    result["failed"] = failed
    result["events"] = reader.events
    result["malformed"] = reader.malformed_count
    result["malformedLines"] = reader.malformed_json()
    _print(args, result, render_verify)
    return EXIT_FOUND if result["findingCount"] or failed else 0


# -- pieces ------------------------------------------------------------------------------------


def _reader(args: argparse.Namespace) -> EventReader:
    progress = not args.no_progress and sys.stderr.isatty()
    return EventReader(list(args.logs), progress=progress)


def _writes(reader: EventReader, kinds: dict[str, str]) -> Iterator[AuditWrite]:
    """The ``apps.cozystack.io`` writes among the events; a malformed event is reported."""
    try:
        for event in reader:
            try:
                write = write_from_event(event, kinds=kinds)
            except (ValueError, TypeError, AttributeError) as exc:
                reader.reject(f"not an audit event: {exc}")
                continue
            if write is not None:
                yield write
    except ReadError as exc:
        raise AuditInputError(str(exc)) from None


def _fold(
    reader: EventReader, kinds: dict[str, str], add: Callable[[AuditWrite], None]
) -> list[dict[str, str]]:
    """Feed every write to ``add``; one that cannot be processed is reported, never fatal."""
    failed: list[dict[str, str]] = []
    for write in _writes(reader, kinds):
        try:
            add(write)
        except Exception as exc:  # one hostile event must not end the review
            if len(failed) < MALFORMED_KEPT:
                source, line = reader.where
                failed.append(
                    {
                        "auditID": write.audit_id,
                        "source": source,
                        "line": str(line),
                        "error": f"{type(exc).__name__}: {exc}"[:300],
                    }
                )
    return failed


def _history(
    args: argparse.Namespace,
    *,
    budgets: dict[str, dict[str, Decimal]] | None = None,
    keys: RecordKeys | None = None,
) -> History:
    from webhook.state.manifests import load_state, read_manifests

    paths = [*args.state, *getattr(args, "contracts", [])]
    state = load_state(paths, keys=keys)
    objects: dict[AppKey, dict[str, Any]] = {}
    for manifest in read_manifests(args.state):
        body = manifest.body
        metadata = body.get("metadata")
        if body.get("apiVersion") == APPS_API_VERSION and isinstance(metadata, dict):
            key = (str(body.get("kind")), str(metadata.get("namespace")), str(metadata.get("name")))
            objects[key] = dict(body)
    return History(state, objects, budgets=budgets)


def _keys(args: argparse.Namespace) -> RecordKeys | None:
    if not args.record_key_file:
        return None
    from webhook.record_keys import RecordKeyError, keys_from_file

    try:
        return keys_from_file(args.record_key_file)
    except RecordKeyError as exc:
        raise AuditInputError(str(exc)) from None


def _filters(args: argparse.Namespace) -> Filters:
    return Filters(
        since=_time(args.since, "--since"),
        until=_time(args.until, "--until"),
        namespace=args.namespace,
        kind=args.kind,
        user=args.user,
    )


def _time(text: str | None, flag: str) -> datetime | None:
    if not text:
        return None
    try:
        value = parse_time(text)
    except ValueError:
        raise AuditInputError(f"{flag} {text!r}: not an RFC 3339 time") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _policy(args: argparse.Namespace) -> Policy | None:
    per_kind: dict[str, Mode] = {}
    for item in args.mode_for:
        kind, _, mode = item.partition("=")
        if not kind or mode not in MODES:
            raise AuditInputError(f"--mode-for {item!r}: expected KIND=MODE, MODE one of {MODES}")
        per_kind[kind] = cast(Mode, mode)
    if args.mode is None and not per_kind:
        return None
    return Policy(args.mode or "enforce", per_kind)


def _budgets(items: list[str]) -> dict[str, dict[str, Decimal]]:
    budgets: dict[str, dict[str, Decimal]] = {}
    for item in items:
        namespace, _, rest = item.partition("=")
        if not namespace or not rest:
            raise AuditInputError(f"--budget {item!r}: expected NAMESPACE=KEY:QTY,...")
        budget = budgets.setdefault(namespace, {})
        for part in rest.split(","):
            key, _, quantity = part.partition(":")
            try:
                value = parse_quantity(quantity)
            except QuantityError as exc:
                raise AuditInputError(f"--budget {item!r}: {key}: {exc}") from None
            if not key or value < 0:
                raise AuditInputError(f"--budget {item!r}: expected KEY:QTY with QTY >= 0")
            budget[key] = value
    return budgets


def _print(args: argparse.Namespace, result: dict[str, Any], render: Any) -> None:
    output = args.output or ("table" if sys.stdout.isatty() else "json")
    if output == "json":
        print(json.dumps(result, indent=2))
    elif output == "yaml":
        import yaml

        print(yaml.safe_dump(result, sort_keys=False), end="")
    else:
        print(render(result))


def _write_html(path: str, title: str, result: dict[str, Any], chart: dict[str, Any]) -> None:
    from webhook.audit.html import render_page

    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(render_page(title, result, chart))
    except OSError as exc:
        raise AuditInputError(f"{path}: cannot write: {exc.strerror or exc}") from None

"""``webhook audit summary|replay|verify``: the shell around the pure audit review.

Its flags are defined in :mod:`webhook.commands.audit`. Reads events (:mod:`.reader`), feeds
them one at a time to the pure folds in ``webhook.core.audit``, and prints a table on a
terminal or JSON/YAML for tools; ``--html`` writes a self-contained page (:mod:`.html`). Exit
status: 0, or 1 when ``verify`` found something, 2 for bad input.
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
from webhook.core.admission.decisions import Policy
from webhook.core.admission.modes import MODES, Mode
from webhook.core.audit.events import AuditWrite, parse_time, write_from_event
from webhook.core.audit.history import History
from webhook.core.audit.replay import Replayer
from webhook.core.audit.summary import Filters, SummaryBuilder
from webhook.core.audit.verify import Verifier
from webhook.core.base.errors import QuantityError, ReservationError
from webhook.core.base.quantities import parse_quantity
from webhook.core.tenancy.applications import APPS_API_VERSION, AppKey
from webhook.core.tenancy.records import RecordKeys

__all__ = ["AuditInputError", "replay", "summary", "verify"]

EXIT_FOUND = 1


class AuditInputError(ReservationError):
    """Bad flags or unreadable input: printed as one line, exit 2."""


# -- handlers ----------------------------------------------------------------------------------


def summary(args: argparse.Namespace) -> int:
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


def replay(args: argparse.Namespace) -> int:
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


def verify(args: argparse.Namespace) -> int:
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
    return History(
        state, objects, budgets=budgets, stored_dry_runs=getattr(args, "dry_runs_stored", False)
    )


def _keys(args: argparse.Namespace) -> RecordKeys | None:
    if not args.record_key_file:
        return None
    from webhook.tenancy.record_keys import RecordKeyError, keys_from_file

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

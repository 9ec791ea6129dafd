"""``webhook evaluate``: the charge of an application's values, offline, term by term on request.

What an operator runs before a write to see what it reserves; it reads a platform (the bundled
one by default) and one document, and prints. Its flags and its handler live here together; the
pricing code loads when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from webhook.commands.console import EXIT_CODES, CommandError
from webhook.commands.options import require_platform

__all__ = ["add_parser"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``evaluate`` to the ``webhook`` command line."""
    evaluate = commands.add_parser(
        "evaluate", help="print the charge of an application's values", epilog=EXIT_CODES
    )
    evaluate.add_argument(
        "--state",
        action="append",
        metavar="DIR",
        help="manifest directories holding the platform (repeatable); "
        "default: the Cozystack platform bundled with the package",
    )
    evaluate.add_argument("--kind", help="application kind (default: the --object's kind)")
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--values", metavar="FILE", help="values (the spec), YAML or JSON; - is stdin"
    )
    source.add_argument("--object", metavar="FILE", help="an apps.cozystack.io object; - is stdin")
    evaluate.add_argument(
        "-n", "--namespace", default="", help="namespace for namespaced instance types"
    )
    evaluate.add_argument(
        "--explain",
        action="store_true",
        help="each term's contribution and where it came from "
        "(a table on a terminal, JSON otherwise)",
    )
    evaluate.add_argument("-o", "--output", choices=("json", "yaml", "table"), help="output format")
    evaluate.set_defaults(handler=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    from webhook.admission.report import dump, explain_charge, render_explanation
    from webhook.core.pricing.unknown_keys import unknown_key_warnings
    from webhook.state.manifests import load_platform

    if args.state:
        platform = load_platform(args.state)
        require_platform(platform, args.state)
    else:
        from webhook.defaults import platform_dir

        platform = load_platform([platform_dir()])
    namespace = args.namespace
    marks = None
    if args.object:
        document = _read_document(args.object)
        written = document.get("kind")
        if args.kind and isinstance(written, str) and written and written != args.kind:
            raise CommandError(
                f"--kind {args.kind} contradicts {args.object}, which is a {written}; "
                "drop --kind or pass the right object"
            )
        kind = args.kind or written
        if not isinstance(kind, str) or not kind:
            raise CommandError(f"{args.object}: kind: missing (or pass --kind)")
        spec = document.get("spec")
        metadata = document.get("metadata")
        if not namespace and isinstance(metadata, Mapping):
            namespace = str(metadata.get("namespace") or "")
        marks = _record_marks(metadata)
    else:
        if not args.kind:
            raise CommandError("--values needs --kind KIND, e.g. --kind VMInstance")
        kind, spec = args.kind, _read_document(args.values, allow_empty=True)
    found = platform.kind(kind)
    if found is None:
        from webhook.core.base.spelling import did_you_mean

        raise CommandError(
            f"{kind}: unknown application kind{did_you_mean(kind, platform.kinds)}; "
            f"known kinds: {', '.join(sorted(platform.kinds))}"
        )
    charge = platform.charge(kind, spec, namespace=namespace)
    for warning in unknown_key_warnings(kind, spec, found.schema):
        print(f"warning: {warning}", file=sys.stderr)
    if not args.explain:
        output = args.output or "json"
        if output == "json":
            print(json.dumps(charge.as_strings(), sort_keys=True))
        elif output == "yaml":
            print(dump(charge.as_strings(), "yaml"))
        else:
            print("\n".join(f"{k}: {v}" for k, v in sorted(charge.as_strings().items())))
        return 0
    contract = found.contract
    released = [t.name for t in contract.terms if t.volume == "released"] if contract else []
    explained = explain_charge(
        charge, written=spec, defaulted=found.defaulted(spec), marks=marks, released=released
    )
    output = args.output or ("table" if sys.stdout.isatty() else "json")
    if output == "table":
        print(render_explanation(explained))
    elif output == "yaml":
        print(dump(explained, "yaml"))
    else:
        print(json.dumps(explained))
    return 0


def _record_marks(metadata: object) -> Any:
    """The volume high marks the object's charge record carries (read, not verified: evaluate
    shows what they hold; admission believes only marks the webhook signed)."""
    from webhook.core.tenancy.applications import CHARGE_ANNOTATION, parse_recorded_charge

    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    text = annotations.get(CHARGE_ANNOTATION) if isinstance(annotations, Mapping) else None
    record = parse_recorded_charge(text)
    return record.marks if record is not None else None


def _read_document(name: str, *, allow_empty: bool = False) -> Any:
    import yaml

    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{name}: cannot read: {exc}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        reason = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise CommandError(f"{name}:{where} not YAML or JSON: {reason}") from None
    if document is None and allow_empty:
        return None
    if not isinstance(document, Mapping):
        raise CommandError(f"{name}: must hold one mapping")
    return document

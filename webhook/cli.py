"""The command line: ``webhook <command>``.

Each command is a thin shell over the core: parse arguments, load the state, call one pure
function, print. Errors print one line naming the file or path and the reason, and exit non-zero
(2 for bad input or usage, 1 for a request that was evaluated and refused).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from webhook.core import resources as rl
from webhook.core.contract_schema import CONTRACT_SCHEMA
from webhook.core.errors import ReservationError
from webhook.core.evaluation import Charge
from webhook.core.quantities import format_quantity
from webhook.state.manifests import load_platform

__all__ = ["main"]

EXIT_INPUT = 2


class CommandError(Exception):
    """Bad input to a command: the message is printed as is."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.handler(args)
    except (ReservationError, CommandError) as exc:
        print(f"webhook {args.command}: {exc}", file=sys.stderr)
        return EXIT_INPUT
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="webhook", description="Cozystack tenant quotas as reservation limits."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    evaluate = commands.add_parser("evaluate", help="print the charge of an application's values")
    _add_state(evaluate)
    evaluate.add_argument("--kind", help="application kind (default: the --object's kind)")
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--values", metavar="FILE", help="values (the spec), YAML or JSON; - is stdin"
    )
    source.add_argument("--object", metavar="FILE", help="an apps.cozystack.io object; - is stdin")
    evaluate.add_argument("--namespace", default="", help="namespace for namespaced instance types")
    evaluate.add_argument("--explain", action="store_true", help="print each term's contribution")
    evaluate.set_defaults(handler=_evaluate)

    schema = commands.add_parser("contract-schema", help="print the contract JSON Schema")
    schema.set_defaults(handler=_contract_schema)
    return parser


def _add_state(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        action="append",
        required=True,
        metavar="DIR",
        help="directory of manifests (repeatable), e.g. fixtures/cozystack",
    )


def _evaluate(args: argparse.Namespace) -> int:
    platform = load_platform(args.state)
    namespace = args.namespace
    if args.object:
        document = _read_document(args.object)
        kind = args.kind or document.get("kind")
        if not isinstance(kind, str) or not kind:
            raise CommandError(f"{args.object}: kind: missing (or pass --kind)")
        spec = document.get("spec")
        metadata = document.get("metadata")
        if not namespace and isinstance(metadata, Mapping):
            namespace = str(metadata.get("namespace") or "")
    else:
        if not args.kind:
            raise CommandError("--values needs --kind")
        kind, spec = args.kind, _read_document(args.values, allow_empty=True)
    charge = platform.charge(kind, spec, namespace=namespace)
    output = _explanation(charge) if args.explain else charge.as_strings()
    print(json.dumps(output, sort_keys=not args.explain))
    return 0


def _explanation(charge: Charge) -> dict[str, Any]:
    return {
        "kind": charge.kind,
        "charge": charge.as_strings(),
        "digest": charge.digest,
        "contractDigest": charge.contract_digest,
        **({"exempt": charge.exempt_reason} if charge.exempt_reason else {}),
        "terms": [
            {
                "term": term.term,
                **({"path": term.path} if term.path else {}),
                "count": format_quantity(term.count),
                **({"source": term.source} if term.source else {}),
                "resources": rl.to_strings(term.resources),
            }
            for term in charge.terms
        ],
    }


def _contract_schema(args: argparse.Namespace) -> int:
    print(json.dumps(CONTRACT_SCHEMA, indent=2))
    return 0


def _read_document(name: str, *, allow_empty: bool = False) -> Any:
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{name}: cannot read: {exc}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CommandError(f"{name}: not YAML or JSON: {exc}") from None
    if document is None and allow_empty:
        return None
    if not isinstance(document, Mapping):
        raise CommandError(f"{name}: must hold one mapping")
    return document

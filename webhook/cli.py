"""The command line: ``webhook <command>``.

Each command is a thin shell over the core: parse arguments, load the state, call one pure
function, print. Errors print one line naming the file or path and the reason, and exit non-zero
(2 for bad input or usage, 1 for a request that was evaluated and refused).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import yaml

from webhook.admission import admit, apply_admitted
from webhook.core.contract_schema import CONTRACT_SCHEMA
from webhook.core.decisions import MODES, Mode, Policy
from webhook.core.errors import QuantityError, ReservationError
from webhook.core.guard import QuotaBook
from webhook.core.quantities import parse_quantity
from webhook.core.records import RecordKeys
from webhook.core.reviews import ReviewError
from webhook.logs import configure as configure_logs
from webhook.record_keys import RecordKeyError, keys_from_file
from webhook.report import build_report, explain_charge, render_report
from webhook.server import serve
from webhook.settings import SettingsError, load_settings
from webhook.state.manifests import load_platform, load_state
from webhook.tls.certificates import CertificateError, generate

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

    review = commands.add_parser(
        "review", help="decide AdmissionReview requests in order against a state"
    )
    _add_state(review)
    _add_policy(review)
    review.add_argument("files", nargs="+", metavar="FILE", help="AdmissionReview JSON; - is stdin")
    review.set_defaults(handler=_review)

    report = commands.add_parser("report", help="print every pool: budget, reserved, available")
    _add_state(report)
    report.add_argument("--json", action="store_true", help="print JSON instead of a table")
    report.set_defaults(handler=_report)

    guard = commands.add_parser(
        "guard",
        help="will admitted applications' pods fit their namespace's ResourceQuotas?",
        description="Per tenant namespace: the pod-level guard (ResourceQuotas), what admitted "
        "applications' pods will request, and the factor on resourceQuotas that lets them all "
        "run. Exit status 1 with --fail-on short when some namespace is short.",
    )
    _add_state(guard)
    guard.add_argument(
        "--mix",
        action="append",
        default=[],
        metavar="SIZE",
        help="a target VM memory size (e.g. 1Gi): print the factor a budget of such VMs needs",
    )
    guard.add_argument("-o", "--output", choices=("table", "json"), default="table")
    guard.add_argument(
        "--fail-on",
        choices=("short",),
        help="exit 1 when admitted applications cannot all run in some namespace",
    )
    guard.set_defaults(handler=_guard)

    serve = commands.add_parser("serve", help="serve AdmissionReviews over TLS")
    serve.add_argument(
        "--state", action="append", metavar="DIR", help="directory of manifests (repeatable)"
    )
    serve.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="read the state from this cluster (default without --state: in-cluster)",
    )
    serve.add_argument("--listen", metavar="HOST:PORT", help="default 127.0.0.1:8443")
    serve.add_argument(
        "--cert-dir",
        metavar="DIR",
        help="holds tls.crt and tls.key (reloaded when they change); default certs",
    )
    serve.add_argument("--client-ca", metavar="FILE", help="require client certificates from it")
    serve.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="plain-HTTP /metrics; default <host>:8080"
    )
    _add_record_key(serve)
    serve.add_argument(
        "--timeout-seconds",
        type=int,
        metavar="N",
        help="the webhook configuration's timeoutSeconds (1-30, default 10)",
    )
    serve.add_argument("--mode", choices=MODES, help="default: enforce")
    _add_overcommit(serve)
    serve.add_argument(
        "--mode-for", action="append", metavar="KIND=MODE", help="a mode for one kind (repeatable)"
    )
    serve.add_argument("--config", metavar="FILE", help="settings file (YAML)")
    serve.add_argument("--log-level", metavar="LEVEL", help="default INFO")
    serve.set_defaults(handler=_serve)

    certs = commands.add_parser("certs", help="certificates for the webhook")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True, metavar="COMMAND")
    generate = certs_commands.add_parser(
        "generate", help="write a CA and a serving certificate (tls.crt, tls.key, ca.crt)"
    )
    generate.add_argument("--out", required=True, metavar="DIR")
    generate.add_argument("--dns", action="append", default=[], metavar="NAME")
    generate.add_argument("--ip", action="append", default=[], metavar="ADDR")
    generate.add_argument("--days", type=int, default=365, help="serving certificate lifetime")
    generate.set_defaults(handler=_certs_generate)

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
    _add_record_key(parser)


def _add_record_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record-key-file",
        metavar="FILE",
        help="key signing charge records (line 1; more lines: previous keys); "
        "default: a key of this process, so records written elsewhere are not believed",
    )


def _record_keys(path: str | None) -> RecordKeys | None:
    if not path:
        return None
    try:
        return keys_from_file(path)
    except RecordKeyError as exc:
        raise CommandError(str(exc)) from None


def _add_overcommit(parser: argparse.ArgumentParser) -> None:
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


def _add_policy(parser: argparse.ArgumentParser) -> None:
    _add_overcommit(parser)
    parser.add_argument("--mode", choices=MODES, default="enforce", help="default: enforce")
    parser.add_argument(
        "--mode-for",
        action="append",
        default=[],
        metavar="KIND=MODE",
        help="a mode for one kind (repeatable), e.g. Kubernetes=warn",
    )


def _policy(args: argparse.Namespace) -> Policy:
    per_kind: dict[str, Mode] = {}
    for item in args.mode_for:
        kind, _, mode = item.partition("=")
        if not kind or mode not in MODES:
            raise CommandError(f"--mode-for {item!r}: expected KIND=MODE, MODE one of {MODES}")
        per_kind[kind] = cast(Mode, mode)  # checked against MODES above
    try:
        rules = load_settings(_overcommit_flags(args), environ={}).policy.overcommit
    except SettingsError as exc:
        raise CommandError(str(exc)) from None
    return Policy(args.mode, per_kind, rules)


def _overcommit_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "overcommit_admins": args.overcommit_admins,
        "overcommit_max": args.overcommit_max,
        "overcommit_step": args.overcommit_step,
    }


def _review(args: argparse.Namespace) -> int:
    quotas = QuotaBook()
    state = load_state(args.state, quotas=quotas, keys=_record_keys(args.record_key_file))
    policy = _policy(args)
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


def _serve(args: argparse.Namespace) -> int:
    flags = {
        "state": args.state,
        "kubeconfig": args.kubeconfig,
        "listen": args.listen,
        "cert_dir": args.cert_dir,
        "client_ca": args.client_ca,
        "metrics_listen": args.metrics_listen,
        "record_key_file": args.record_key_file,
        "timeout_seconds": args.timeout_seconds,
        "mode": args.mode,
        "mode_for": args.mode_for,
        **_overcommit_flags(args),
        "config": args.config,
        "log_level": args.log_level,
    }
    try:
        settings = load_settings(flags)
    except SettingsError as exc:
        raise CommandError(str(exc)) from None
    configure_logs(settings.log_level)
    if settings.state and not settings.record_key_file:
        logging.getLogger("webhook").info(
            "charge records are signed with a key of this process: records written by another "
            "process are not believed (give --record-key-file to keep one)"
        )
    # Manifest directories, or the cluster (--kubeconfig, else the pod's service account).
    quotas = QuotaBook()
    state = (
        load_state(settings.state, quotas=quotas, keys=_record_keys(settings.record_key_file))
        if settings.state
        else None
    )
    try:
        asyncio.run(serve(state, settings, quotas=quotas))
    except CertificateError as exc:
        raise CommandError(str(exc)) from None
    return 0


def _guard(args: argparse.Namespace) -> int:
    from webhook.guard_report import build_guard_report, render_guard_report

    mixes = []
    for size in args.mix:
        try:
            mixes.append(parse_quantity(size))
        except QuantityError as exc:
            raise CommandError(f"--mix {size!r}: {exc}") from None
    quotas = QuotaBook()
    state = load_state(args.state, quotas=quotas)
    report = build_guard_report(state, quotas, mixes)
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        print(render_guard_report(report))
    short = any(row["short"] for row in report["namespaces"])
    return 1 if args.fail_on == "short" and short else 0


def _certs_generate(args: argparse.Namespace) -> int:
    try:
        bundle = generate(
            Path(args.out), dns_names=args.dns, ip_addresses=args.ip, valid_days=args.days
        )
    except CertificateError as exc:
        raise CommandError(str(exc)) from None
    print(
        f"wrote {bundle.cert_file}, {bundle.key_file} and {bundle.ca_file} "
        f"(serial {bundle.serial:x}, valid until {bundle.not_after:%Y-%m-%d})"
    )
    return 0


def _report(args: argparse.Namespace) -> int:
    state = load_state(args.state, keys=_record_keys(args.record_key_file))
    report = build_report(state)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_report(report))
    return 0


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
    output = explain_charge(charge) if args.explain else charge.as_strings()
    print(json.dumps(output, sort_keys=not args.explain))
    return 0


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

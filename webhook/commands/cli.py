"""The command line: ``webhook <command>``.

Each command is a thin shell over the core: parse arguments, load what it needs, call one pure
function, print. A command is a subparser with ``set_defaults(handler=...)``; :func:`main` runs
every handler through :func:`webhook.commands.console.run`, so each one, present or added later,
fails the same way: one line on stderr naming the file, flag or path and the fix, exit status 2 (the
exit codes are in ``--help``). Heavy modules (aiohttp, the Kubernetes client, the audit review)
are imported by the commands that use them, so a command that reads files starts fast: building
the parser imports argparse-level code only (a heavy command's flags are in
:mod:`webhook.commands`), and ``tests/commands/test_cli_startup.py`` keeps it so.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from webhook.commands.audit import add_parser as add_audit_parser
from webhook.commands.console import (
    EXIT_CODES,
    EXIT_FOUND,
    EXIT_INPUT,
    CommandError,
    Parser,
    VersionAction,
    add_fail_on,
    add_output,
    load_state_showing_progress,
    run,
)
from webhook.commands.plan import add_parser as add_plan_parser
from webhook.commands.rebalance import add_parser as add_rebalance_parser
from webhook.core.admission.modes import MODES, Mode

if TYPE_CHECKING:
    from webhook.core.admission.decisions import Policy
    from webhook.core.admission.state import ReservationState
    from webhook.core.capacity.guard import QuotaBook
    from webhook.core.pricing.platform import Platform
    from webhook.core.tenancy.records import RecordKeys

__all__ = ["main"]

log = logging.getLogger("webhook")


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

    review = commands.add_parser(
        "review", help="decide AdmissionReview requests in order against a state", epilog=EXIT_CODES
    )
    _add_state(review)
    _add_policy(review)
    review.add_argument("files", nargs="+", metavar="FILE", help="AdmissionReview JSON; - is stdin")
    review.set_defaults(handler=_review)

    report = commands.add_parser(
        "report", help="print every pool: budget, reserved, available", epilog=EXIT_CODES
    )
    _add_state(report)
    report.add_argument(
        "-n", "--namespace", default="", help="only the pool this namespace is in, and below"
    )
    add_output(report, ("table", "wide", "json", "yaml", "openreports"), default="table")
    add_fail_on(report)
    report.set_defaults(handler=_report)

    guard = commands.add_parser(
        "guard",
        help="will admitted applications' pods fit their namespace's ResourceQuotas?",
        description="Per tenant namespace: the pod-level guard (ResourceQuotas), what admitted "
        "applications' pods will request, and the factor on resourceQuotas that lets them all "
        "run. Exit status 1 with --fail-on short when some namespace is short.",
        epilog=EXIT_CODES,
    )
    _add_state(guard)
    guard.add_argument(
        "--mix",
        action="append",
        default=[],
        metavar="SIZE",
        help="a target VM memory size (e.g. 1Gi): print the factor a budget of such VMs needs",
    )
    guard.add_argument(
        "-n", "--namespace", default="", help="this namespace and the tenant namespaces below it"
    )
    add_output(guard, ("table", "json", "yaml"), default="table")
    guard.add_argument(
        "--fail-on",
        choices=("short",),
        help="exit 1 when admitted applications cannot all run in some namespace",
    )
    guard.set_defaults(handler=_guard)

    serve = commands.add_parser("serve", help="serve AdmissionReviews over TLS", epilog=EXIT_CODES)
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
    serve.add_argument(
        "--ledger-namespace-share",
        metavar="RATIO",
        help="share of a pool's ledger one tenant's unsettled admissions may take "
        "(0-1, default 0.1: 100 of 1,000 entries)",
    )
    serve.add_argument("--mode", choices=MODES, help="default: enforce")
    _add_overcommit(serve)
    serve.add_argument(
        "--mode-for", action="append", metavar="KIND=MODE", help="a mode for one kind (repeatable)"
    )
    serve.add_argument(
        "--dry-run-holds",
        choices=("on", "off"),
        help="hold a dry run's charge like a write's, for API servers that store dry runs "
        "(cozystack-api does); default on",
    )
    serve.add_argument("--config", metavar="FILE", help="settings file (YAML)")
    serve.add_argument(
        "--log-level", metavar="LEVEL", help="debug, info, warning, error (default info)"
    )
    serve.set_defaults(handler=_serve)

    certs = commands.add_parser("certs", help="certificates for the webhook")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True, metavar="COMMAND")
    generate = certs_commands.add_parser(
        "generate",
        help="write a CA and a serving certificate (tls.crt, tls.key, ca.crt)",
        epilog=EXIT_CODES,
    )
    generate.add_argument(
        "--out", required=True, metavar="DIR", help="directory (created when missing)"
    )
    generate.add_argument(
        "--dns", action="append", default=[], metavar="NAME", help="a DNS name (repeatable)"
    )
    generate.add_argument(
        "--ip", action="append", default=[], metavar="ADDR", help="an IP address (repeatable)"
    )
    generate.add_argument("--days", type=int, default=365, help="serving certificate lifetime")
    generate.set_defaults(handler=_certs_generate)

    add_plan_parser(commands)
    add_rebalance_parser(commands)
    add_audit_parser(commands)

    schema = commands.add_parser("contract-schema", help="print the contract JSON Schema")
    schema.set_defaults(handler=_contract_schema)

    completion = commands.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script generated from this parser. Bash: "
        "source <(webhook completion bash). Zsh: webhook completion zsh > "
        '"${fpath[1]}/_webhook".',
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(handler=_completion, parser=parser)
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
    from webhook.tenancy.record_keys import RecordKeyError, keys_from_file

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


def _load_state(
    paths: Sequence[str], *, quotas: QuotaBook | None = None, keys: RecordKeys | None = None
) -> ReservationState:
    state = cast("ReservationState", load_state_showing_progress(paths, quotas=quotas, keys=keys))
    _require_platform(state.platform, paths)
    return state


def _require_platform(platform: Platform, paths: Sequence[str]) -> None:
    if not platform.kinds:
        raise CommandError(
            f"--state {' '.join(paths)}: no ApplicationDefinition found; add the platform's "
            "definitions (e.g. --state fixtures/cozystack)"
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
    from webhook.admission.admit import admit, apply_admitted
    from webhook.core.admission.reviews import ReviewError
    from webhook.core.capacity.guard import QuotaBook

    quotas = QuotaBook()
    state = _load_state(args.state, quotas=quotas, keys=_record_keys(args.record_key_file))
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


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from webhook.logs import configure as configure_logs
    from webhook.server import serve
    from webhook.settings import check_mode_kinds, load_settings

    flags = {
        "state": args.state,
        "kubeconfig": args.kubeconfig,
        "listen": args.listen,
        "cert_dir": args.cert_dir,
        "client_ca": args.client_ca,
        "metrics_listen": args.metrics_listen,
        "record_key_file": args.record_key_file,
        "timeout_seconds": args.timeout_seconds,
        "ledger_namespace_share": args.ledger_namespace_share,
        "mode": args.mode,
        "mode_for": args.mode_for,
        **_overcommit_flags(args),
        "dry_run_holds": args.dry_run_holds,
        "config": args.config,
        "log_level": args.log_level,
    }
    settings = load_settings(flags)
    configure_logs(settings.log_level)
    if settings.state:
        # Check what can be checked before listening: the platform, and the per-kind modes.
        from webhook.state.manifests import load_platform

        platform = load_platform(settings.state)
        _require_platform(platform, settings.state)
        check_mode_kinds(settings.mode_for, list(platform.kinds))
        kinds = sorted(platform.kinds)
    else:
        # Fail before logging anything when there is no cluster to read.
        from webhook.kube.config import connect, in_cluster

        connect(settings.kubeconfig) if settings.kubeconfig else in_cluster()
        # A live cluster may declare kinds beyond the bundled platform: warn, don't refuse.
        from webhook.defaults import platform_dir
        from webhook.state.manifests import load_platform

        kinds = sorted(load_platform([platform_dir()]).kinds)
        for kind in check_mode_kinds(settings.mode_for, kinds, strict=False):
            log.warning(
                "mode for a kind the bundled platform does not declare",
                extra={"fields": {"kind": kind, "mode": settings.mode_for[kind]}},
            )
    modes = {kind: settings.policy.mode_for(kind) for kind in sorted({*kinds, *settings.mode_for})}
    log.info("modes", extra={"fields": {"default": settings.mode, "modes": modes}})
    from webhook.core.capacity.guard import QuotaBook

    if settings.state and not settings.record_key_file:
        log.info(
            "charge records are signed with a key of this process: records written by another "
            "process are not believed (give --record-key-file to keep one)"
        )
    quotas = QuotaBook()  # filled with the state's ResourceQuotas as it loads
    load = None
    if settings.state:
        paths = settings.state
        keys = _record_keys(settings.record_key_file)

        def load() -> ReservationState:
            return _load_state_logging(paths, quotas, keys)

    asyncio.run(serve(None, settings, quotas=quotas, load=load))
    return 0


def _load_state_logging(
    paths: Sequence[str], quotas: QuotaBook, keys: RecordKeys | None
) -> ReservationState:
    """Load manifest directories, logging counts every few seconds (the server's progress)."""
    from webhook.state.manifests import load_state

    started = time.monotonic()
    last = [started]

    def progress(files: int, total: int, manifests: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 2.0:
            last[0] = now
            log.info(
                "loading state",
                extra={"fields": {"files": files, "of": total, "manifests": manifests}},
            )

    state = load_state(paths, quotas=quotas, keys=keys, progress=progress)
    _require_platform(state.platform, paths)
    log.info(
        "state loaded",
        extra={
            "fields": {
                "applications": len(state),
                "kinds": len(state.platform.kinds),
                "seconds": round(time.monotonic() - started, 3),
            }
        },
    )
    return state


def _guard(args: argparse.Namespace) -> int:
    from webhook.capacity.guard_report import build_guard_report, parse_mixes, print_guard_report
    from webhook.core.capacity.guard import QuotaBook

    mixes = parse_mixes(args.mix)
    quotas = QuotaBook()
    state = _load_state(args.state, quotas=quotas)
    report = build_guard_report(state, quotas, mixes, namespace=args.namespace)
    return print_guard_report(report, args.output, fail_on_short=args.fail_on == "short")


def _certs_generate(args: argparse.Namespace) -> int:
    from webhook.tls.certificates import generate

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CommandError(
            f"--out {args.out}: is a file, not a directory; name a directory "
            "(it is created when missing)"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(
            f"--out {args.out}: cannot create the directory: {exc.strerror}; "
            "name a directory you can write"
        ) from None
    bundle = generate(out, dns_names=args.dns, ip_addresses=args.ip, valid_days=args.days)
    print(
        f"wrote {bundle.cert_file}, {bundle.key_file} and {bundle.ca_file} "
        f"(serial {bundle.serial:x}, valid until {bundle.not_after:%Y-%m-%d})"
    )
    return 0


def _report(args: argparse.Namespace) -> int:
    from webhook.admission.report import build_report, dump, failures, render_report
    from webhook.core.capacity.guard import QuotaBook

    quotas = QuotaBook()
    state = _load_state(args.state, quotas=quotas, keys=_record_keys(args.record_key_file))
    report = build_report(state, namespace=args.namespace)
    if args.output == "openreports":
        # What the leader writes: one OpenReports Report per tenant namespace, for kubectl apply.
        import yaml

        from webhook.core.admission.policy_reports import build_reports

        reports = build_reports(state, quotas=quotas, namespace=args.namespace)
        print(yaml.safe_dump_all(list(reports.values()), sort_keys=False).rstrip("\n"))
    elif args.output in ("json", "yaml"):
        print(dump(report, args.output))
    else:
        print(render_report(report, wide=args.output == "wide"))
    found = failures(report, args.fail_on)
    if found:
        print(f"webhook report: --fail-on: {'; '.join(found)}", file=sys.stderr)
        return EXIT_FOUND
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from webhook.admission.report import dump, explain_charge, render_explanation
    from webhook.core.pricing.unknown_keys import unknown_key_warnings
    from webhook.state.manifests import load_platform

    if args.state:
        platform = load_platform(args.state)
        _require_platform(platform, args.state)
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


def _contract_schema(args: argparse.Namespace) -> int:
    from webhook.core.pricing.contract_schema import CONTRACT_SCHEMA

    print(json.dumps(CONTRACT_SCHEMA, indent=2))
    return 0


def _completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(args.parser, shell=args.shell))
    return 0


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

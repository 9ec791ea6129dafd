"""``kubectl reservation``: what the webhook decided and why, from kubectl alone.

Installed as ``kubectl-reservation`` on PATH, so kubectl finds it as a plugin:

- ``kubectl reservation report [-n NS | -A]`` prints pools (budget, reserved, available,
  overcommitted), and the applications an operator must look at;
- ``kubectl reservation explain KIND/NAME -n NS`` prints an application's charge term by term
  and the charge recorded at admission when it differs (contract drift).

It follows kubectl's conventions: ``--kubeconfig``, ``$KUBECONFIG`` with several files,
``--context``, ``-n``/``-A``, ``-o json|yaml|wide``, ``--request-timeout``, short names
(``vm/web1``). Against a cluster it reads only what the question needs (see
``webhook.state.one_shot``) with a timeout on every request, so a tenant's user can ask about
its own namespace and nothing ever hangs; ``--state`` reads manifest directories instead.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from webhook.commands.console import (
    EXIT_CODES,
    EXIT_FOUND,
    CommandError,
    Parser,
    VersionAction,
    add_fail_on,
    add_output,
    run,
)

if TYPE_CHECKING:
    from webhook.core.pricing.kinds import ApplicationKind
    from webhook.core.pricing.platform import Platform
    from webhook.core.tenancy.applications import Application
    from webhook.kube.client import KubeClient
    from webhook.state.one_shot import Snapshot

__all__ = ["SHORT_NAMES", "main"]

PROG: Final = "kubectl reservation"
# Our own short names (Cozystack declares none), kubectl style: ``kubectl reservation explain
# vm/web1``. Kinds are also found by kind, singular and plural, in any case.
SHORT_NAMES: Final = {
    "vm": "VMInstance",
    "vmi": "VMInstance",
    "disk": "VMDisk",
    "k8s": "Kubernetes",
    "pg": "Postgres",
}
DEFAULT_TIMEOUT: Final = 30.0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run(f"{PROG} {args.command}", args.handler, args)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG, description="Tenant reservations: pools and charges.", epilog=EXIT_CODES
    )
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    report = commands.add_parser(
        "report", help="pools: budget, reserved, available", epilog=EXIT_CODES
    )
    _source(report)
    scope = report.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", default="", help="the pool this namespace is in, and pools below it"
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every pool (the default)"
    )
    add_output(report, ("table", "wide", "json", "yaml"), default="table")
    add_fail_on(report)
    report.set_defaults(handler=_report)
    explain = commands.add_parser(
        "explain", help="an application's charge, term by term", epilog=EXIT_CODES
    )
    _source(explain)
    explain.add_argument("target", metavar="KIND/NAME", help="e.g. vminstance/web1 or vm/web1")
    explain.add_argument("-n", "--namespace", required=True)
    add_output(explain, ("table", "wide", "json", "yaml"), default="table")
    explain.set_defaults(handler=_explain)
    guard = commands.add_parser(
        "guard",
        help="will admitted applications' pods fit their namespace's ResourceQuotas?",
        epilog=EXIT_CODES,
    )
    _source(guard)
    guard_scope = guard.add_mutually_exclusive_group()
    guard_scope.add_argument(
        "-n", "--namespace", default="", help="this namespace and the tenant namespaces below it"
    )
    guard_scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace (the default)"
    )
    guard.add_argument(
        "--mix",
        action="append",
        default=[],
        metavar="SIZE",
        help="a target VM memory size (e.g. 1Gi): the factor a budget of such VMs needs",
    )
    add_output(guard, ("table", "json", "yaml"), default="table")
    guard.add_argument(
        "--fail-on",
        choices=("short",),
        help="exit 1 when admitted applications cannot all run in some namespace",
    )
    guard.set_defaults(handler=_guard)
    completion = commands.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(handler=_completion, parser=parser)
    return parser


def _source(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--state", action="append", metavar="DIR", help="manifest directories")
    source.add_argument(
        "--kubeconfig", metavar="FILE", help="default: $KUBECONFIG (all its files), ~/.kube/config"
    )
    parser.add_argument("--context", help="the kubeconfig context to use (default: current)")
    parser.add_argument(
        "--request-timeout",
        type=_duration,
        default=DEFAULT_TIMEOUT,
        metavar="DURATION",
        help=f"bound on each API request: seconds, or 30s, 2m (default {DEFAULT_TIMEOUT:g}s)",
    )
    parser.add_argument(
        "--webhook-namespace",
        default="cozy-reservation",
        metavar="NS",
        help="where the webhook's preset ConfigMap lives (default cozy-reservation)",
    )


def _duration(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", text.strip())
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30, 30s or 2m")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match[2] or "s"]
    return float(match[1]) * scale


def _report(args: argparse.Namespace) -> int:
    from webhook.admission.report import build_report, dump, failures, render_report

    namespace = "" if args.all_namespaces else args.namespace
    if args.state:
        from webhook.commands.console import load_state_showing_progress

        state = load_state_showing_progress(args.state)
        if not state.platform.kinds:
            raise CommandError(
                f"--state {' '.join(args.state)}: no ApplicationDefinition found; add the "
                "platform's definitions (e.g. --state fixtures/cozystack)"
            )
        report = build_report(state, namespace=namespace)
        notes: list[str] = []
    else:
        snapshot = _ask(args, lambda client: _snapshot(client, args, namespace))
        report = build_report(snapshot.state, namespace=namespace)
        notes = snapshot.notes
        if namespace:
            report["namespace"]["known"] = snapshot.known or report["namespace"]["known"]
            if snapshot.pool_above is not None:
                report["namespace"]["pool"] = snapshot.pool_above["pool"]
                report["poolAbove"] = snapshot.pool_above
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.output in ("json", "yaml"):
        print(dump(report, args.output))
    else:
        print(render_report(report, wide=args.output == "wide"))
        above = report.get("poolAbove")
        if above:
            pairs = ", ".join(f"{k}={v}" for k, v in above["budget"].items()) or "none"
            used = ", ".join(f"{k}={v}" for k, v in above["reserved"].items()) or "nothing"
            print(f"pool {above['pool']}: budget {pairs}; reserved {used} ({above['source']})")
    found = failures(report, args.fail_on)
    if found:
        print(f"{PROG} report: --fail-on: {'; '.join(found)}", file=sys.stderr)
        return EXIT_FOUND
    return 0


def _guard(args: argparse.Namespace) -> int:
    from webhook.capacity.guard_report import build_guard_report, parse_mixes, print_guard_report
    from webhook.core.capacity.guard import QuotaBook

    namespace = "" if args.all_namespaces else args.namespace
    mixes = parse_mixes(args.mix)
    if args.state:
        from webhook.commands.console import load_state_showing_progress

        quotas = QuotaBook()
        state = load_state_showing_progress(args.state, quotas=quotas)
    else:
        state, quotas = _ask(args, lambda client: _guard_snapshot(client, args, namespace))
    report = build_guard_report(state, quotas, mixes, namespace=namespace)
    return print_guard_report(report, args.output, fail_on_short=args.fail_on == "short")


async def _guard_snapshot(
    client: KubeClient, args: argparse.Namespace, namespace: str
) -> tuple[Any, Any]:
    from webhook.state.one_shot import read_quotas

    snapshot = await _snapshot(client, args, namespace)
    for note in snapshot.notes:
        print(f"note: {note}", file=sys.stderr)
    scope = None
    if namespace:
        scope = sorted({node.namespace for node in snapshot.state.tree.nodes()} | {namespace})
    return snapshot.state, await read_quotas(client, scope)


async def _snapshot(client: KubeClient, args: argparse.Namespace, namespace: str) -> Snapshot:
    from webhook.state.one_shot import read_snapshot

    return await read_snapshot(
        client, namespace=namespace, webhook_namespace=args.webhook_namespace
    )


def _explain(args: argparse.Namespace) -> int:
    from webhook.admission.report import dump, explain_charge, explain_factor, render_explanation
    from webhook.core.admission.state import ReservationState
    from webhook.core.base.quantities import format_quantity

    kind_text, _, name = str(args.target).partition("/")
    if not kind_text or not name:
        raise CommandError(f"{args.target!r}: expected KIND/NAME, e.g. vminstance/web1")
    if args.state:
        from webhook.state.manifests import load_state

        state = load_state(args.state)
        platform = state.platform
        kind = _kind(platform, kind_text)
        app = _from_manifests(args.state, kind.kind, args.namespace, name)
    else:
        platform, app = _ask(args, lambda client: _live_application(client, args, kind_text, name))
        kind = _kind(platform, app.kind)
        # Without the tenants above, the factor is the one recorded on the object, if any.
        state = ReservationState(platform)
    charge = kind.charge(app.spec, platform.catalog, namespace=args.namespace)
    released = (
        [t.name for t in kind.contract.terms if t.volume == "released"] if kind.contract else []
    )
    explained = explain_charge(
        charge,
        written=app.spec,
        defaulted=kind.defaulted(app.spec),
        overcommit=explain_factor(state, app, charge),
        # The volume marks the object's record carries (read, not verified: explain shows;
        # admission decides with verified marks only).
        marks=app.recorded.marks if app.recorded is not None else None,
        released=released,
    )
    recorded = (
        {
            "charge": {k: format_quantity(v) for k, v in sorted(app.recorded.resources.items())},
            "digest": app.recorded.digest,
        }
        if app.recorded is not None
        else None
    )
    if args.output in ("json", "yaml"):
        print(dump({**explained, "recorded": recorded}, args.output))
    else:
        print(render_explanation(explained, recorded=recorded, wide=args.output == "wide"))
    return 0


async def _live_application(
    client: KubeClient, args: argparse.Namespace, kind_text: str, name: str
) -> tuple[Platform, Application]:
    from webhook.core.tenancy.applications import application_from_object
    from webhook.state.one_shot import get_application, read_platform

    platform, notes = await read_platform(
        client, namespace=args.namespace, webhook_namespace=args.webhook_namespace
    )
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    kind = _kind(platform, kind_text)
    obj = await get_application(client, kind.plural, args.namespace, name)
    if obj is None:
        raise CommandError(f"{kind.kind}/{name} not found in namespace {args.namespace}")
    return platform, application_from_object({**obj, "kind": kind.kind})


def _ask(args: argparse.Namespace, question: Any) -> Any:
    """Connect as kubectl would and run ``question(client)``, closing the client after."""
    from webhook.kube.config import connect
    from webhook.state.one_shot import SnapshotError

    client = connect(args.kubeconfig, context=args.context, timeout=args.request_timeout)

    async def ask() -> Any:
        try:
            return await question(client)
        finally:
            await client.close()

    try:
        return asyncio.run(ask())
    except SnapshotError as exc:
        raise CommandError(str(exc)) from None


def _kind(platform: Platform, text: str) -> ApplicationKind:
    from webhook.core.base.spelling import did_you_mean

    wanted = SHORT_NAMES.get(text.lower(), text).lower()
    for kind in platform.kinds.values():
        names = {kind.kind.lower(), kind.plural.lower(), kind.kind.lower() + "s"}
        if wanted in names:
            return kind
    hint = did_you_mean(text, [*platform.kinds, *SHORT_NAMES])
    raise CommandError(f"{text}: no ApplicationDefinition declares this kind{hint}")


def _from_manifests(paths: list[str], kind: str, namespace: str, name: str) -> Application:
    from webhook.core.tenancy.applications import (
        APPS_API_VERSION,
        application_from_helmrelease,
        application_from_object,
        is_helmrelease,
    )
    from webhook.state.manifests import read_manifests

    for manifest in read_manifests(paths):
        body: Mapping[str, Any] = manifest.body
        app: Application | None = None
        if body.get("apiVersion") == APPS_API_VERSION:
            app = application_from_object(body)
        elif is_helmrelease(body):
            app = application_from_helmrelease(body)
        if app is not None and app.key == (kind, namespace, name):
            return app
    raise CommandError(f"{kind}/{name} not found in namespace {namespace}")


def _completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(args.parser, shell=args.shell))
    return 0

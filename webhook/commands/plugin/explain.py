"""``kubectl reservation explain KIND/NAME``: an application's charge, term by term.

It prints what each term of the kind's contract charged and where the value came from (written
or defaulted), and beside it the charge recorded at admission, so contract drift shows. Kinds
are found kubectl-style, by kind, plural or our short names (``vm/web1``). Its flags and its
handler live here; what it shares with the other subcommands is in ``kubectl``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from webhook.commands.console import EXIT_CODES, CommandError, add_output
from webhook.commands.plugin.kubectl import add_source, ask

if TYPE_CHECKING:
    from webhook.core.pricing.kinds import ApplicationKind
    from webhook.core.pricing.platform import Platform
    from webhook.core.tenancy.applications import Application
    from webhook.kube.client import KubeClient

__all__ = ["SHORT_NAMES", "add_parser"]

# Our own short names (Cozystack declares none), kubectl style: ``kubectl reservation explain
# vm/web1``. Kinds are also found by kind, singular and plural, in any case.
SHORT_NAMES: Final = {
    "vm": "VMInstance",
    "vmi": "VMInstance",
    "disk": "VMDisk",
    "k8s": "Kubernetes",
    "pg": "Postgres",
}


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``explain`` to the ``kubectl reservation`` command line."""
    explain = commands.add_parser(
        "explain", help="an application's charge, term by term", epilog=EXIT_CODES
    )
    add_source(explain)
    explain.add_argument("target", metavar="KIND/NAME", help="e.g. vminstance/web1 or vm/web1")
    explain.add_argument("-n", "--namespace", required=True)
    add_output(explain, ("table", "wide", "json", "yaml"), default="table")
    explain.set_defaults(handler=_explain)


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
        platform, app = ask(args, lambda client: _live_application(client, args, kind_text, name))
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

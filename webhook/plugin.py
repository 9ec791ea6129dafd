"""``kubectl reservation``: what the webhook decided and why, from kubectl alone.

Installed as ``kubectl-reservation`` on PATH, so kubectl finds it as a plugin:

- ``kubectl reservation report [-n NS]`` prints pools (budget, reserved, available,
  overcommitted), and the applications an operator must look at;
- ``kubectl reservation explain KIND/NAME -n NS`` prints an application's charge term by term
  and the charge recorded at admission when it differs (contract drift).

Both read the live cluster (kubectl's kubeconfig, or ``--kubeconfig``) through the same state
code the webhook runs, or manifest directories with ``--state``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core import resources as rl
from webhook.core.applications import (
    APPS_API_VERSION,
    Application,
    application_from_helmrelease,
    application_from_object,
    is_helmrelease,
)
from webhook.core.errors import ReservationError
from webhook.core.kinds import ApplicationKind
from webhook.core.quantities import format_quantity
from webhook.core.state import ReservationState
from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.report import (
    build_report,
    explain_charge,
    explain_factor,
    render_explanation,
    render_report,
)
from webhook.state.live import LiveSettings, LiveState
from webhook.state.manifests import load_state, read_manifests

__all__ = ["main"]

SYNC_TIMEOUT = 120.0


class PluginError(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kubectl reservation", description="Tenant reservations: pools and charges."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    report = commands.add_parser("report", help="pools: budget, reserved, available")
    _source(report)
    report.add_argument("-n", "--namespace", help="only the pool this namespace is in")
    report.add_argument("--json", action="store_true")
    explain = commands.add_parser("explain", help="an application's charge, term by term")
    _source(explain)
    explain.add_argument("target", metavar="KIND/NAME", help="e.g. vminstance/web1")
    explain.add_argument("-n", "--namespace", required=True)
    explain.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "report":
            return _report(args)
        return _explain(args)
    except (PluginError, ReservationError, ApiError) as exc:
        print(f"kubectl reservation {args.command}: {exc}", file=sys.stderr)
        return 1


def _source(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--state", action="append", metavar="DIR", help="manifest directories")
    source.add_argument("--kubeconfig", metavar="FILE", help="default: kubectl's")


def _report(args: argparse.Namespace) -> int:
    state = _load(args)
    report = build_report(state)
    if args.namespace:
        pool = state.tree.pool_root(args.namespace)
        wanted = {pool.namespace} if pool is not None else set()
        report["pools"] = [p for p in report["pools"] if p["pool"] in wanted]
        if not wanted:
            print(
                f"{args.namespace} is in no pool: no tenant above it declares a quota",
                file=sys.stderr,
            )
        # Cozystack's EnforcedHard: what this namespace's own applications could still hold.
        report["ceiling"] = {
            "namespace": args.namespace,
            "resources": rl.to_strings(state.tree.ceiling(args.namespace)),
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(render_report(report))
    ceiling = report.get("ceiling") or {}
    if ceiling.get("resources"):
        pairs = ", ".join(f"{k}={v}" for k, v in ceiling["resources"].items())
        print(f"\n{ceiling['namespace']}'s own applications can reserve at most: {pairs}")
    return 0


def _explain(args: argparse.Namespace) -> int:
    kind_text, _, name = str(args.target).partition("/")
    if not kind_text or not name:
        raise PluginError(f"{args.target!r}: expected KIND/NAME, e.g. vminstance/web1")
    if args.state:
        state = load_state(args.state)
        kind = _kind(state, kind_text)
        app = _from_manifests(args.state, kind.kind, args.namespace, name)
    else:
        state, app = asyncio.run(
            _live_application(args.kubeconfig, kind_text, args.namespace, name)
        )
        kind = _kind(state, app.kind)
    charge = kind.charge(app.spec, state.platform.catalog, namespace=args.namespace)
    explained = explain_charge(charge, overcommit=explain_factor(state, app, charge))
    recorded = (
        {
            "charge": {k: format_quantity(v) for k, v in sorted(app.recorded.resources.items())},
            "digest": app.recorded.digest,
        }
        if app.recorded is not None
        else None
    )
    if args.json:
        print(json.dumps({**explained, "recorded": recorded}, indent=2))
    else:
        print(render_explanation(explained, recorded=recorded))
    return 0


def _kind(state: ReservationState, text: str) -> ApplicationKind:
    wanted = text.lower()
    for kind in state.platform.kinds.values():
        if wanted in (kind.kind.lower(), kind.plural.lower(), kind.kind.lower() + "s"):
            return kind
    raise PluginError(f"{text}: no ApplicationDefinition declares this kind")


def _from_manifests(paths: list[str], kind: str, namespace: str, name: str) -> Application:
    for manifest in read_manifests(paths):
        body: Mapping[str, Any] = manifest.body
        app: Application | None = None
        if body.get("apiVersion") == APPS_API_VERSION:
            app = application_from_object(body)
        elif is_helmrelease(body):
            app = application_from_helmrelease(body)
        if app is not None and app.key == (kind, namespace, name):
            return app
    raise PluginError(f"{kind}/{name} not found in namespace {namespace}")


async def _sync(
    kubeconfig: str | None,
) -> tuple[KubeClient, LiveState, asyncio.Event, asyncio.Task[None]]:
    client = KubeClient.from_kubeconfig(kubeconfig)
    live = LiveState(client, LiveSettings(read_timeout=30.0))
    stop = asyncio.Event()
    task = asyncio.create_task(live.run(stop))
    try:
        async with asyncio.timeout(SYNC_TIMEOUT):
            while not live.synced:
                await asyncio.sleep(0.05)
    except TimeoutError:
        stop.set()
        await task
        await client.close()
        raise PluginError(f"the cluster state did not sync within {SYNC_TIMEOUT:g}s") from None
    return client, live, stop, task


async def _live_state(kubeconfig: str | None) -> ReservationState:
    client, live, stop, task = await _sync(kubeconfig)
    stop.set()
    await task
    await client.close()
    return live.state


async def _live_application(
    kubeconfig: str | None, kind_text: str, namespace: str, name: str
) -> tuple[ReservationState, Application]:
    client, live, stop, task = await _sync(kubeconfig)
    try:
        kind = _kind(live.state, kind_text)
        ref = ResourceRef("apps.cozystack.io", "v1alpha1", kind.plural)
        try:
            obj = await client.get(ref, namespace, name)
        except ApiError as exc:
            if exc.status == 404:
                raise PluginError(
                    f"{kind.kind}/{name} not found in namespace {namespace}"
                ) from None
            raise
        return live.state, application_from_object({**obj, "kind": kind.kind})
    finally:
        stop.set()
        await task
        await client.close()


def _load(args: argparse.Namespace) -> ReservationState:
    if args.state:
        return load_state(args.state)
    return asyncio.run(_live_state(args.kubeconfig))

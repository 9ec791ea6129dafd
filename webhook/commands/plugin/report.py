"""``kubectl reservation report``: pools, budget, reserved and available, from kubectl alone.

With ``-n`` it reads only that namespace's pool and those below it, and the pool above it as
far as the caller may see, so a tenant's user can run it against its own namespace. Its flags
and its handler live here; what it shares with the other subcommands is in ``kubectl``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from webhook.commands.console import (
    EXIT_CODES,
    EXIT_FOUND,
    CommandError,
    add_fail_on,
    add_output,
)
from webhook.commands.plugin.kubectl import PROG, add_source, ask, read_snapshot

__all__ = ["add_parser"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``report`` to the ``kubectl reservation`` command line."""
    report = commands.add_parser(
        "report", help="pools: budget, reserved, available", epilog=EXIT_CODES
    )
    add_source(report)
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


async def _reservations(
    client: Any, pools: list[str] | None, notes: list[str]
) -> list[dict[str, Any]]:
    """The TenantReservation of each of ``pools`` (where its room is; ``None``: every pool's,
    listed at once), leaving out with a note what the caller may not read."""
    from webhook.admission.ledger.entries import TENANT_RESERVATIONS
    from webhook.kube.client import ApiError

    found: list[dict[str, Any]] = []
    try:
        if pools is None:
            listed = await client.request("GET", TENANT_RESERVATIONS.path())
            items = listed.get("items") or []
            return [item for item in items if isinstance(item, dict)]
        for pool in pools:
            try:
                found.append(await client.get(TENANT_RESERVATIONS, pool, pool))
            except ApiError as exc:
                if exc.status != 404:
                    raise
    except ApiError as exc:
        notes.append(f"tenantreservations not read ({exc}): where each pool's room is left out")
    return found


def _report(args: argparse.Namespace) -> int:
    from webhook.admission.report import build_report, dump, failures, render_report
    from webhook.admission.room_report import add_room, render_room, reservations_in

    namespace = "" if args.all_namespaces else args.namespace
    if args.state:
        from webhook.commands.console import load_state_showing_progress

        state = load_state_showing_progress(args.state)
        if not state.platform.kinds:
            raise CommandError(
                f"--state {' '.join(args.state)}: no ApplicationDefinition found; add the "
                "platform's definitions (e.g. --state fixtures/cozystack)"
            )
        report = add_room(
            build_report(state, namespace=namespace), state, reservations_in(args.state)
        )
        notes: list[str] = []
    else:
        notes = []

        async def question(client: Any) -> Any:
            snapshot = await read_snapshot(client, args, namespace)
            pools: list[str] | None = None
            if namespace:  # only the pools in scope: a tenant's user may read no others
                scoped = build_report(snapshot.state, namespace=namespace)
                pools = [pool["pool"] for pool in scoped["pools"]]
            return snapshot, await _reservations(client, pools, notes)

        snapshot, reservations = ask(args, question)
        report = add_room(
            build_report(snapshot.state, namespace=namespace), snapshot.state, reservations
        )
        notes = [*snapshot.notes, *notes]
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
        print(
            "\n".join(
                [
                    render_report(report, wide=args.output == "wide"),
                    *render_room(report.get("room") or []),
                ]
            )
        )
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

"""Where each pool's room is: observed usage, pending entries, every replica's escrowed slice.

Read from the pools' ``TenantReservation`` objects (``status.pending``, ``status.slices``,
``docs/escrow.md``) beside the state: per pool and budget key, the budget, the usage the state
observes, what pending entries hold, each slice's outstanding room (granted - folded - returned,
with its holder, incarnation and expiry), the departed room and what is free. A report reads
one copy, not a replica's watches, so *departed* is what a replica reading that copy for the
first time counts (every record's ``folded``: spent room whose objects it may not have
observed yet), at most; *free* is the budget less observed usage, pending entries and slices'
outstanding room, the room once every replica's watches have caught up.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from webhook.admission.ledger.entries import expired, expiry, listed, quantities
from webhook.admission.ledger.slices import removals, slice_records
from webhook.admission.rendering import human_quantity, table
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl

__all__ = ["add_room", "build_room", "render_room", "reservations_in"]

_ZERO = Decimal(0)


def build_room(
    state: ReservationState, reservations: Iterable[Mapping[str, Any]], *, now: float
) -> list[dict[str, Any]]:
    """A row per pool whose ``TenantReservation`` is given (wall time ``now``, for expiries)."""
    pools = []
    stamp = expiry(now)
    objects = {str((obj.get("metadata") or {}).get("namespace") or ""): obj for obj in reservations}
    for pool, obj in sorted(objects.items()):
        node = state.tree.get(pool)
        status = obj.get("status") or {}
        if not isinstance(status, Mapping):
            status = {}
        budget = dict(node.budget) if node is not None and node.bounded else {}
        if not budget:  # the object's own copy of the budget, when no Tenant is in the state
            budget = quantities(status.get("budget"))
        observed = dict(node.usage) if node is not None else {}
        pending: dict[str, Decimal] = {}
        for entry in listed(obj):
            if not expired(entry, stamp):
                pending = rl.add(pending, quantities(entry.get("charge")))
        slices = []
        outstanding: dict[str, Decimal] = {}
        departed: dict[str, Decimal] = {}
        for incarnation, record in sorted(slice_records(status).items()):
            room = {k: v for k, v in record.outstanding().items() if k in budget}
            outstanding = rl.add(outstanding, room)
            departed = rl.add(departed, {k: v for k, v in record.folded.items() if k in budget})
            slices.append(
                {
                    "incarnation": incarnation,
                    "holder": record.holder,
                    "kinds": sorted(record.kinds),
                    "outstanding": rl.to_strings(room),
                    "granted": rl.to_strings(record.granted),
                    "folded": rl.to_strings(record.folded),
                    "returned": rl.to_strings(record.returned),
                    "expires": expiry(record.expires),
                    "expired": record.expires <= now,
                }
            )
        keys = {}
        for key, limit in sorted(budget.items()):
            used = observed.get(key, _ZERO)
            held = pending.get(key, _ZERO)
            sliced = outstanding.get(key, _ZERO)
            keys[key] = {
                "budget": rl.to_strings({key: limit})[key],
                "observed": rl.to_strings({key: used})[key],
                "pending": rl.to_strings({key: held})[key],
                "slices": rl.to_strings({key: sliced})[key],
                "departed": rl.to_strings({key: departed.get(key, _ZERO)})[key],
                "free": rl.to_strings({key: limit - used - held - sliced})[key],
            }
        pools.append({"pool": pool, "keys": keys, "slices": slices, "removals": removals(status)})
    return pools


def add_room(
    report: dict[str, Any],
    state: ReservationState,
    reservations: Iterable[Mapping[str, Any]],
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """``report`` (:func:`webhook.admission.report.build_report`'s) with ``room``: where the
    room of each pool it shows is, from those pools' ``reservations`` (none given: unchanged)."""
    shown = {pool["pool"] for pool in report["pools"]}
    objects = [o for o in reservations if (o.get("metadata") or {}).get("namespace") in shown]
    if objects:
        report["room"] = build_room(state, objects, now=time.time() if now is None else now)
    return report


def reservations_in(paths: Iterable[str]) -> list[dict[str, Any]]:
    """The TenantReservation objects among the manifests under ``paths``."""
    from webhook.state.manifests import read_manifests

    return [
        dict(m.body)
        for m in read_manifests(paths)
        if m.body.get("kind") == "TenantReservation"
        and str(m.body.get("apiVersion", "")).startswith("reservation.cozystack.io/")
    ]


def render_room(room: list[dict[str, Any]]) -> list[str]:
    """The room as a table per pool and key, then each slice (one row per key it holds)."""
    if not room:
        return []
    header = ("POOL", "RESOURCE", "BUDGET", "OBSERVED", "PENDING", "SLICES", "DEPARTED<=", "FREE")
    rows: list[tuple[str, ...]] = [header]
    for pool in room:
        for index, (key, figures) in enumerate(pool["keys"].items()):
            rows.append(
                (
                    pool["pool"] if index == 0 else "",
                    key,
                    *(
                        human_quantity(figures[column])
                        for column in (
                            "budget",
                            "observed",
                            "pending",
                            "slices",
                            "departed",
                            "free",
                        )
                    ),
                )
            )
    lines = ["", "Where each pool's room is (from its TenantReservation):", *table(rows)]
    held = [(pool["pool"], s) for pool in room for s in pool["slices"]]
    if held:
        slice_rows: list[tuple[str, ...]] = [
            ("POOL", "HOLDER", "INCARNATION", "RESOURCE", "OUTSTANDING", "EXPIRES")
        ]
        for pool, found in held:
            expires = found["expires"] + (" (expired)" if found["expired"] else "")
            keys = found["outstanding"] or {"-": "0"}
            for index, (key, value) in enumerate(keys.items()):
                first = index == 0
                slice_rows.append(
                    (
                        pool if first else "",
                        found["holder"] if first else "",
                        found["incarnation"] if first else "",
                        key,
                        human_quantity(value),
                        expires if first else "",
                    )
                )
        lines += ["", "Escrowed slices (outstanding = granted - folded - returned):"]
        lines += table(slice_rows)
    return lines

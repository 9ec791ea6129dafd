"""The status every write of a pool's ledger object puts, and the leader's reconcile of it.

A write never changes only what it came for: it keeps the entries still held (each stamped with
the revision that admitted it, without those seen settled here or past their grace period), the
caps whose Tenant still declares its quota or whose grace has not passed, adds every removed
entry to the ``released`` counts (so a replica that never saw it knows to wait), and carries the
pool's summary (budget, reserved, committed, and the ``Overcommitted`` condition with the time
it last changed), whole when it fits :data:`~.bounds.MAX_SUMMARY_BYTES`, else cut short (a pool
whose quotas name many long keys never grows its object past what its watch reads back). So a
busy pool needs no separate status write; the replica holding the Lease
writes the pools whose status is no longer true (:meth:`Status.reconcile`), but not one whose
summary alone changed since a write less than a period ago (that rides on the next write), nor,
for ``summary_seconds`` after its last write, one where only how much is reserved moved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from webhook.admission.ledger import bounds
from webhook.admission.ledger.book import Book, Conflict
from webhook.admission.ledger.entries import (
    Obj,
    expired,
    kind_of,
    listed,
    raw_caps,
    released,
    whole_second,
)
from webhook.admission.ledger.wants import wanted_room
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.json_codec import encode_json
from webhook.core.tenancy.applications import resource_version
from webhook.kube.client import ApiError

__all__ = ["Status"]

log = logging.getLogger("webhook.admission.ledger")  # one logger for all of the ledger

_TIME: Final = "%Y-%m-%dT%H:%M:%SZ"  # metav1.Time, for conditions


class Status:
    """Builds each write's status from the book's copy and the live state."""

    def __init__(self, book: Book) -> None:
        self.book = book

    def kept(
        self, pool: str, current: Obj, state: ReservationState, *, without: set[str]
    ) -> list[Obj]:
        """The entries of ``current`` the next write keeps, each stamped with its revision:
        not ``without``, not seen settled here, not past its grace period."""
        now = self.book.now()
        revision = str(resource_version((current.get("metadata") or {}).get("resourceVersion")))
        kept = []
        for entry in listed(current):
            hold_id = str(entry.get("id") or "")
            if hold_id in without or expired(entry, now) or state.pending.resolved(hold_id):
                continue
            kept.append(entry if entry.get("revision") else {**entry, "revision": revision})
        return kept

    def build(self, pool: str, current: Obj, state: ReservationState, entries: list[Obj]) -> Obj:
        """The status of ``pool``'s next write, listing ``entries``."""
        old = current.get("status") or {}
        summary = _bounded(self._summary(pool, state, old))
        status = {**old, **summary, "pending": entries}
        if "wanted" in old and not wanted_room(old, self.book.clock()):
            status["wanted"] = None  # expired: no holder gives back for it any more
        caps = raw_caps(old)
        if caps:  # a cap stays while its Tenant declares its quota, or within its grace
            now = self.book.now()
            status["capped"] = {
                owned: raw
                for owned, raw in caps.items()
                if isinstance(raw, Mapping)
                and (not expired(raw, now) or state.declares(str(owned), str(raw.get("digest"))))
            } or None
        kept = {str(e.get("id") or "") for e in entries}
        removed = [e for e in listed(current) if str(e.get("id") or "") not in kept]
        if removed:  # every removal counted, so a replica that never saw one knows to wait
            counts = released(old)
            for entry in removed:
                kind = kind_of(entry)
                counts[kind] = counts.get(kind, 0) + 1
            status["released"] = counts
        return {k: v for k, v in status.items() if v is not None}

    def _summary(self, pool: str, state: ReservationState, old: Mapping[str, Any]) -> Obj:
        node = state.tree.get(pool)
        if node is None or not node.bounded:
            return {}
        view = state.tree.view(node)
        over = view.overcommitted
        summary: Obj = {
            "budget": rl.to_strings(view.budget),
            "reserved": rl.to_strings(view.reserved),
            "budgetSummary": rl.format_resources(view.budget),
            "reservedSummary": rl.format_resources(view.reserved),
            "overcommitted": rl.to_strings(over),
            "conditions": [_condition(old, over, self._condition_time)],
            "committed": None,
            "discount": None,
        }
        discount = state.pool_discounts().get(pool)
        if discount:  # overcommit factors apply: committed beside reserved
            summary["committed"] = rl.to_strings(rl.add(view.reserved, discount))
            summary["discount"] = rl.to_strings(discount)
        return summary

    def _condition_time(self) -> str:
        """Now, as a condition's lastTransitionTime (asked only when the condition changes)."""
        moment = datetime.fromtimestamp(self.book.clock(), UTC).replace(microsecond=0)
        return f"{whole_second(moment)}Z"  # strftime(_TIME), one format a second

    async def reconcile(self) -> int:
        """Make every pool's TenantReservation status true; returns how many were written."""
        book = self.book
        state = book.current()
        if not state.synced:
            return 0
        written = 0
        quiet, summary = book.settings.reconcile_seconds, book.settings.summary_seconds
        for view in state.tree.pools():
            pool = view.namespace
            changed = book.changed.get(pool)
            recent = changed is not None and book.clock() - changed < quiet
            try:
                async with book.locked([pool]):
                    current = book.objects.get(pool) or await book.ensure(pool)
                    state = book.current()
                    old = current.get("status") or {}
                    kept = self.kept(pool, current, state, without=set())
                    if recent and len(kept) == len(listed(current)):
                        # Only the summary to change, in an object written within the last
                        # period (by an admission, most often): that write carried a summary
                        # and the pool's next one will too, so a busy pool's batches neither
                        # wait for this write nor conflict with it.
                        continue
                    status = self.build(pool, current, state, kept)
                    if _comparable(status) == _comparable(old):
                        continue
                    lately = changed is not None and book.clock() - changed < summary
                    if lately and len(kept) == len(listed(current)) and _usage_only(status, old):
                        continue  # only how much is reserved moved: it waits a while longer
                    await book.write(pool, current, status)
                    written += 1
            except (Conflict, ApiError) as exc:
                log.info(
                    "reconcile deferred",
                    extra={"fields": {"pool": pool, "error": repr(exc)}},
                )
        return written


# What is left of a summary past MAX_SUMMARY_BYTES: its one-line forms and the condition's
# message, each cut to this many characters; its maps are left out. A condition's message is
# never longer than metav1.Condition allows (the CRD refuses a longer one, and the write).
_CUT: Final = 1_024
_MESSAGE: Final = 32_768
_MAPS: Final = ("budget", "reserved", "overcommitted", "committed", "discount")


def _bounded(summary: Obj) -> Obj:
    """``summary`` as written: whole within :data:`~.bounds.MAX_SUMMARY_BYTES` (a budget's 64
    keys take a few KiB), else without its maps and with its lines cut to :data:`_CUT`."""
    if not summary or len(encode_json(summary)) <= bounds.MAX_SUMMARY_BYTES:
        return summary
    cut: Obj = {**summary, **dict.fromkeys(_MAPS)}
    for key in ("budgetSummary", "reservedSummary"):
        cut[key] = _shortened(str(summary.get(key) or ""), _CUT)
    cut["conditions"] = [
        {**c, "message": _shortened(str(c.get("message") or ""), _CUT)}
        for c in summary.get("conditions") or []
    ]
    return cut


def _shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _condition(old: Mapping[str, Any], over: Mapping[str, Decimal], now: Callable[[], str]) -> Obj:
    status = "True" if over else "False"
    previous = next(
        (c for c in old.get("conditions") or [] if c.get("type") == "Overcommitted"), None
    )
    since = (
        previous.get("lastTransitionTime")
        if previous and previous.get("status") == status
        else now()
    )
    message = (
        f"reserved exceeds the budget by {rl.format_resources(over)}; lower a sub-tenant quota "
        "or raise this tenant's quota (nothing is evicted)"
        if over
        else "reserved is within the budget"
    )
    return {
        "type": "Overcommitted",
        "status": status,
        "reason": "BudgetExceeded" if over else "WithinBudget",
        "message": _shortened(message, _MESSAGE),
        "lastTransitionTime": since,
    }


# What moves with every admission and observation in a summary: how much is reserved (and
# committed), and the Overcommitted condition's message, which says by how much.
_USAGE: Final = ("reserved", "reservedSummary", "committed", "overcommitted")


def _usage_only(status: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether ``status`` differs from ``old`` only in what :data:`_USAGE` names (the
    condition's status, reason and every other field as written)."""

    def steady(of: Mapping[str, Any]) -> Obj:
        comparable = _comparable(of)
        conditions = [
            {k: v for k, v in c.items() if k != "message"}
            for c in comparable.get("conditions") or []
        ]
        rest = {k: v for k, v in comparable.items() if k not in _USAGE}
        return {**rest, "conditions": conditions}

    return steady(status) == steady(old)


def _comparable(status: Mapping[str, Any]) -> Obj:
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or []
    ]
    pending = [{k: v for k, v in e.items() if k != "revision"} for e in status.get("pending") or []]
    return {**status, "conditions": conditions, "pending": pending}

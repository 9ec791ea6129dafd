"""The admissions this process answered from its slices, until the state observes their objects.

A spend is folded into its slice's record once the object it admitted is observed (its room is
then counted as usage) or once it can no longer be stored; this keeps, per spend, what tells
the object apart from any other of its name.
"""

from __future__ import annotations

from decimal import Decimal

from webhook.core.admission import escrow as core
from webhook.core.admission.resolve import charge_annotation
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import AppKey
from webhook.core.tenancy.records import parse_recorded_charge

__all__ = ["SpentAdmissions", "minted"]


class SpentAdmissions:
    """Per spend: its object's key, the newest version seen at its decision, its charge, and
    the request its object's signed record names."""

    def __init__(self, escrow: core.Escrow) -> None:
        self.escrow = escrow
        self._spent: dict[str, tuple[AppKey, int, dict[str, Decimal], str]] = {}
        self._marked: set[str] = set()  # spends already marked observed

    def remember(
        self, uid: str, key: AppKey, after: int, expected: dict[str, Decimal], request: str
    ) -> None:
        self._spent[uid] = (key, after, expected, request)

    def observe(self, state: ReservationState) -> None:
        """Mark the spends whose object the state has observed: newer than everything this
        replica had seen at their decision, with the charge they expect, and its believed
        record naming the very request (only a CREATE spends here). Told by name alone,
        another create of the same name (the exact path's, after a delete) would be taken for
        a request still to be stored, and its room folded early."""
        waiting = {spend.uid for spend in self.escrow.spends()}
        for uid in list(self._spent):
            if uid not in waiting:
                del self._spent[uid]
                self._marked.discard(uid)
                continue
            if uid in self._marked:
                continue  # marked once (the holder keeps it): spends wait to be folded together
            key, after, expected, request = self._spent[uid]
            record = state.record(key)
            if (
                record is not None
                and request
                and record.request == request
                and record.version > after
                and record.resources == expected
            ):
                self.escrow.observed(uid)
                self._marked.add(uid)


def minted(request: AdmissionRequest) -> str:
    """The request the charge record on ``request``'s object names ("": none, or unreadable)."""
    parsed = parse_recorded_charge(charge_annotation(request.object))
    return parsed.request if parsed is not None and not parsed.dry else ""

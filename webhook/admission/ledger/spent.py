"""The admissions this process answered from its slices, until the state observes their objects.

A spend is folded into its slice's record once the object it admitted is observed (its room is
then counted as usage) or once it can no longer be stored; this keeps, per spend, what tells
the object apart from any other of its name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from webhook.core.admission import escrow as core
from webhook.core.admission.resolve import charge_annotation
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import AppKey
from webhook.core.tenancy.records import parse_recorded_charge
from webhook.core.tenancy.tenants import below_toward

__all__ = ["SpentAdmissions", "minted"]


class SpentAdmissions:
    """Per spend: its object's key, the newest version seen at its decision, its charge, the
    request its object's signed record names, and the pools it spent in; and per pool and
    tenant (the tenant directly below the pool: sub-tenants count as theirs), how many spends
    wait for their objects, which that tenant's share of a ledger's entries bounds as it
    bounds them on the exact path (one whose object was observed counts as usage, and waits
    only to be folded)."""

    def __init__(self, escrow: core.Escrow) -> None:
        self.escrow = escrow
        self._spent: dict[str, _Spent] = {}
        self._marked: set[str] = set()  # spends already marked observed
        self._shares: Counter[tuple[str, str]] = Counter()  # (pool, tenant) -> spends unobserved

    def remember(
        self,
        uid: str,
        key: AppKey,
        after: int,
        expected: dict[str, Decimal],
        request: str,
        pools: Iterable[str],
    ) -> None:
        shares = tuple(sorted((pool, below_toward(pool, key[1])) for pool in pools))
        self._shares.update(shares)
        self._spent[uid] = _Spent(key, after, expected, request, shares)

    def held(self, pool: str, namespace: str) -> int:
        """How many spends in ``pool`` of the tenant holding ``namespace``'s share wait for
        their objects to be observed."""
        return self._shares[(pool, below_toward(pool, namespace))]

    def observe(self, state: ReservationState, pool: str | None = None) -> None:
        """Mark the spends whose object the state has observed: newer than everything this
        replica had seen at their decision, with the charge they expect, and its believed
        record naming the very request (only a CREATE spends here). Told by name alone,
        another create of the same name (the exact path's, after a delete) would be taken for
        a request still to be stored, and its room folded early.

        Every spend once a round, and forget those folded since (``pool`` None); else only
        ``pool``'s, before a write of its record: each spend is read once a round and once per
        write of a pool it spent in, never once per pool a round takes up."""
        if pool is None:
            waiting = {spend.uid for spend in self.escrow.spends()}
            for uid in [uid for uid in self._spent if uid not in waiting]:
                gone = self._spent.pop(uid)
                if uid not in self._marked:
                    self._shares.subtract(gone.shares)
                self._marked.discard(uid)
            self._shares += Counter()  # drops the counts that reached zero
            uids: Iterable[str] = list(self._spent)
        else:
            uids = [spend.uid for spend in self.escrow.spends(pool)]
        for uid in uids:
            found = self._spent.get(uid)
            if found is None or uid in self._marked:
                continue  # marked once (the holder keeps it): spends wait to be folded together
            record = state.record(found.key)
            if (
                record is not None
                and found.request
                and record.request == found.request
                and record.version > found.after
                and record.resources == found.expected
            ):
                self.escrow.observed(uid)
                self._marked.add(uid)
                self._shares.subtract(found.shares)  # counted as usage now


@dataclass(frozen=True, slots=True)
class _Spent:
    key: AppKey
    after: int  # the newest version this replica had seen at the decision
    expected: dict[str, Decimal]
    request: str  # the request the object's signed record names ("": none)
    shares: tuple[tuple[str, str], ...]  # (pool, tenant) of each pool it spent in


def minted(request: AdmissionRequest) -> str:
    """The request the charge record on ``request``'s object names ("": none, or unreadable)."""
    parsed = parse_recorded_charge(charge_annotation(request.object))
    return parsed.request if parsed is not None and not parsed.dry else ""

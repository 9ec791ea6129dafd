"""Why an admission with escrow on took the exact path rather than this replica's slices.

Worked out after the exact path has answered, from what the holder has now, so the admission
path of :mod:`.escrowed` is left as it is; the reason is one of a fixed few (metrics label it).
"""

from __future__ import annotations

from decimal import Decimal

from webhook.admission.ledger.escrowed import Escrowed
from webhook.core.admission.decisions import Decision
from webhook.core.admission.reviews import AdmissionRequest

__all__ = ["REASONS", "fallback_reason"]

REASONS = (
    "update",  # not a CREATE: slices answer creates only
    "dry-run",
    "denied",  # the exact path refused it too
    "warn",  # allowed only in warn (or a cap): recorded by the exact path
    "uncharged",  # charges no pool
    "fenced",  # a pool's ledger is fenced
    "no-slice",  # this replica holds no slice of a pool it charges
    "slices-full",  # a grant there was not made: the pool's records are at their byte bound
    "deadline",  # the slice's lease deadline passed (or its last write's outcome is unknown)
    "kind",  # the slice does not name the request's kind
    "draining",  # the slice misses kinds lately admitted: drained, then granted anew
    "share",  # the tenant's share of spends waiting for their objects is taken
    "no-room",  # the slice's unspent room does not hold the charge
    "other",  # a held preview, a pool counted past its budget, a change since
)


def fallback_reason(escrowed: Escrowed, request: AdmissionRequest, answer: Decision) -> str:
    """The first of :data:`REASONS` that explains why ``request`` was not answered from the
    slices, ``answer`` being the exact path's."""
    if request.operation != "CREATE":
        return "update"
    if request.dry_run:
        return "dry-run"
    if not answer.allowed:
        return "denied"
    if answer.mode != "enforce":
        return "warn"
    charged = answer.charged_pools
    if not charged:
        return "uncharged"
    escrow, now = escrowed.escrow, escrowed.monotonic()
    for pool in sorted(charged):
        if escrowed.book.fenced(pool):
            return "fenced"
        record = escrow.record(pool)
        if record is None:
            return "slices-full" if escrowed.crowded.get(pool) else "no-slice"
        if not escrow.live(pool, now):
            return "deadline"
        if request.kind not in record.kinds:
            return "kind"
        if escrowed.narrow(pool):
            return "draining"
    limit = escrowed.book.settings.share_limit
    if any(escrowed.spent.held(pool, request.namespace) >= limit for pool in charged):
        return "share"
    for pool, room in sorted(charged.items()):
        left = escrow.available(pool)
        if any(value > left.get(key, Decimal(0)) for key, value in room.items() if value > 0):
            return "slices-full" if escrowed.crowded.get(pool) else "no-room"
    return "other"

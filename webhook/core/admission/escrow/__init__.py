"""Escrowed room: each replica holds a slice of a busy pool's room and admits from it in memory.

A slice is granted by the holder's conditional write of the pool's ``TenantReservation``
(:mod:`.records`), counted whole by every replica, with the room that left it counted as
departed until each replica's state has caught up (:mod:`.counting`), and spent, folded,
refilled and returned by its holder alone (:mod:`.holder`). The design, the bounds and what
the known designs do is ``docs/escrow.md``.
"""

from webhook.core.admission.escrow.counting import SliceCount
from webhook.core.admission.escrow.holder import Escrow, Spend, Write
from webhook.core.admission.escrow.records import (
    EscrowBounds,
    SliceRecord,
    covers_shortfall,
    grant_size,
    reclaimable,
    refill_wanted,
    surplus,
    within,
)

__all__ = [
    "Escrow",
    "EscrowBounds",
    "SliceCount",
    "SliceRecord",
    "Spend",
    "Write",
    "covers_shortfall",
    "grant_size",
    "reclaimable",
    "refill_wanted",
    "surplus",
    "within",
]

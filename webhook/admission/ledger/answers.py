"""The answers the ledger refuses with, each saying why and whether trying again helps.

A refusal from the ledger is never the pool's budget (that is :func:`~webhook.core.admission.
decisions.decide`'s answer): it is the ledger that cannot hold the request now. Each answer
names its cause so the caller knows what to do: the ledger cannot be written or read (503, try
again), this replica has not yet seen what the ledger accounted for (503, try again), too many
concurrent changes or a tenant tree that changed under the decision (409, try again), the pool's
ledger or one tenant's share of it is full (429, try again in a few seconds, or fix the
sub-tenants' quotas), the room is there but escrowed in other replicas' slices (429, try again
in a few seconds), or the entry is too large to list (400).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from webhook.admission.ledger import bounds
from webhook.admission.ledger.bounds import LedgerSettings
from webhook.core.admission.decisions import Decision, errored
from webhook.core.base import resources as rl

__all__ = [
    "behind",
    "cap_share_full",
    "changed",
    "contention",
    "full",
    "held_in_slices",
    "share_full",
    "too_large",
    "too_many_caps",
    "unavailable",
]


def unavailable() -> Decision:
    return errored(
        503,
        "ServiceUnavailable",
        "ledger-unavailable",
        "tenant reservations: the reservation ledger cannot be written right now; try again",
    )


def contention(pools: Iterable[str]) -> Decision:
    return errored(
        409,
        "Conflict",
        "contention",
        f"tenant reservations: too many concurrent changes in pool {', '.join(pools)}; try again",
    )


def held_in_slices(pool: str, held: Mapping[str, Decimal]) -> Decision:
    """Pool ``pool`` may have the room only in slices other replicas hold (``held``), and they
    were asked to give back what they hold unspent: a "try again", for a few seconds only
    (:mod:`.wants`); then what they still hold is spent and the answer is "exceeded"."""
    return errored(
        429,
        "TooManyRequests",
        "escrowed",
        f"tenant reservations: pool {pool} has room for this only in what other replicas hold "
        f"escrowed ({rl.format_resources(held)}), which they are asked to give back; try "
        "again in a few seconds",
    )


def changed(pool: str) -> Decision:
    return errored(
        409,
        "Conflict",
        "contention",
        f"tenant reservations: the tenant tree changed while pool {pool} was decided; try again",
    )


def full(pool: str, *, in_bytes: bool = False, rest: int = 0) -> Decision:
    """The pool's ledger lists all it may: :data:`~.bounds.MAX_ENTRIES` entries or, for long
    names, :data:`~.bounds.MAX_PENDING_BYTES` of them (``in_bytes``), less what its object's
    metadata takes past its share (``rest``: the bytes it takes, when past the share)."""
    limit = bounds.MAX_PENDING_BYTES - max(0, rest - bounds.MAX_REST_BYTES)
    held = (
        f"{max(0, limit)} bytes of admissions" if in_bytes else f"{bounds.MAX_ENTRIES} admissions"
    )
    why = ""
    if rest > bounds.MAX_REST_BYTES:
        why = (
            f" (the metadata of its TenantReservation {pool}/{pool} takes {rest} bytes, "
            f"{rest - bounds.MAX_REST_BYTES} more than its share of the object: an operator "
            "can remove the labels or annotations that are not the webhook's)"
        )
    return errored(
        429,
        "TooManyRequests",
        "ledger-full",
        f"tenant reservations: pool {pool} has {held} not yet observed{why}; try again in a few "
        "seconds",
    )


def too_many_caps(pool: str, *, in_bytes: bool = False) -> Decision:
    """Pool ``pool`` lists :data:`~.bounds.MAX_CAPS` caps, or (``in_bytes``) they would take
    more than :data:`~.bounds.MAX_CAPS_BYTES`."""
    held = f"{bounds.MAX_CAPS_BYTES} bytes of" if in_bytes else f"{bounds.MAX_CAPS}"
    return errored(
        429,
        "TooManyRequests",
        "ledger-full",
        f"tenant reservations: pool {pool} has {held} sub-tenants admitted in warn mode "
        "beyond what fits; fix their quotas, then try again",
    )


def cap_share_full(
    pool: str, who: str, settings: LedgerSettings, *, in_bytes: bool = False
) -> Decision:
    """One tenant's sub-tenants admitted in warn beyond what fits take its whole share of the
    pool's caps, in count or, for caps of many long keys, in bytes (``in_bytes``)."""
    share = f"{settings.namespace_share * 100:g}%"
    held, of = (
        (f"{settings.cap_share_bytes_limit} bytes of", f"{bounds.MAX_CAPS_BYTES} bytes")
        if in_bytes
        else (f"{settings.cap_share_limit}", f"{bounds.MAX_CAPS}")
    )
    return errored(
        429,
        "TooManyRequests",
        "ledger-share",
        f"tenant reservations: {who} already has {held} sub-tenants admitted in warn mode "
        f"beyond what fits in pool {pool}, its share ({share} of {of}); fix their quotas, then "
        "try again",
    )


def share_full(
    pool: str, who: str, settings: LedgerSettings, *, in_bytes: bool = False
) -> Decision:
    """One tenant's entries take its whole share of the pool's ledger, in entries or, for long
    names, in bytes (``in_bytes``)."""
    share = f"{settings.namespace_share * 100:g}%"
    held, of = (
        (f"{settings.share_bytes_limit} bytes of admissions", f"{bounds.MAX_PENDING_BYTES} bytes")
        if in_bytes
        else (f"{settings.share_limit} admissions", f"{bounds.MAX_ENTRIES}")
    )
    return errored(
        429,
        "TooManyRequests",
        "ledger-share",
        f"tenant reservations: {who} already has {held} not yet observed in pool {pool}, its "
        f"share ({share} of {of}); try again in a few seconds",
    )


def behind(pool: str) -> Decision:
    return errored(
        503,
        "ServiceUnavailable",
        "ledger-catching-up",
        f"tenant reservations: this replica has not yet seen every application the ledger of "
        f"pool {pool} accounted for; try again",
    )


def too_large(limit: int = bounds.MAX_ENTRY_BYTES) -> Decision:
    return errored(
        400,
        "BadRequest",
        "invalid",
        f"tenant reservations: the request's ledger entry exceeds {limit} bytes",
    )

"""Whose share of a pool's ledger an entry or a cap takes, and the carve-out caps it records.

One tenant (the tenant namespace directly below the pool, with its sub-tenants) may have at
most ``LedgerSettings.namespace_share`` of a pool's :data:`~.bounds.MAX_ENTRIES` entries listed,
and of its :data:`~.bounds.MAX_PENDING_BYTES` (:class:`Room`: long names take their share in
bytes before they take it in entries), and its sub-tenants at most that share of its
:data:`~.bounds.MAX_CAPS` caps and of their :data:`~.bounds.MAX_CAPS_BYTES`
(:func:`cap_refusal`: a cap of many long keys takes some 42 KB, and five took them all): past
it only that tenant is told to try again, and creating namespaces never multiplies its share
(:func:`holder`). A sub-Tenant allowed only because Tenant is in warn, beyond what fits, is
recorded in the pool's ``status.capped`` before the answer (:class:`Caps`, the cap found by
:mod:`webhook.core.admission.warn_caps`, as the offline paths find it): it then counts no more
than before the write, and nothing is held for it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, Final

from webhook.admission.ledger import answers, bounds
from webhook.admission.ledger.book import Book
from webhook.admission.ledger.bounds import LedgerSettings
from webhook.admission.ledger.entries import Obj, expiry, listed, listed_size, raw_caps, size
from webhook.admission.ledger.status import Status
from webhook.core.admission.carveouts import Cap
from webhook.core.admission.decisions import Decision, Policy
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.warn_caps import warn_cap, with_cap_warning
from webhook.core.base import resources as rl
from webhook.core.tenancy.tenants import below_toward, parent_namespace
from webhook.kube.client import ApiError

__all__ = [
    "Caps",
    "Room",
    "cap_refusal",
    "holder",
    "holders",
    "largest_share",
    "listed_cap_size",
    "metadata_room",
]


def holder(pool: str, namespace: str) -> str:
    """Whose share of ``pool``'s ledger an entry for ``namespace`` takes: the tenant directly
    below the pool on the way to ``namespace`` (the pool's own namespace for its own
    applications). Sub-tenants share their tenant's share, so a tenant admin cannot multiply
    it by creating namespaces.

    Remembered for the names asked last (it is a function of the two names alone, and every
    batch counts every listed entry's holder), but only for names as long as Kubernetes allows:
    a longer one, written into a ledger object by hand, is never kept."""
    if len(namespace) <= _NAME and len(pool) <= _NAME:
        return _remembered_holder(pool, namespace)
    return _holder(pool, namespace)


_NAME: Final = 253  # the longest name Kubernetes stores (a namespace's: 63)


@functools.lru_cache(maxsize=4096)
def _remembered_holder(pool: str, namespace: str) -> str:
    return _holder(pool, namespace)


def _holder(pool: str, namespace: str) -> str:
    return below_toward(pool, namespace)


def holders(pool: str, entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many of ``entries`` each tenant holds in ``pool``'s ledger."""
    counts: dict[str, int] = {}
    for entry in entries:
        who = _holder_of(pool, entry)
        counts[who] = counts.get(who, 0) + 1
    return counts


def largest_share(objects: Mapping[str, Obj]) -> float:
    """The largest share of a pool's ledger (of :data:`~.bounds.MAX_ENTRIES`) that one
    tenant's listed entries take now, over every pool's object in ``objects``."""
    largest = 0
    for pool, obj in objects.items():
        counts = holders(pool, listed(obj))
        largest = max(largest, *counts.values()) if counts else largest
    return largest / bounds.MAX_ENTRIES


class Room:
    """What a pool's listed entries take of its ledger, in entries and in bytes, in all and by
    tenant: whether one more fits (:meth:`refusal`), and taking it (:meth:`take`).

    ``known`` is :attr:`sizes` of the pool's room in the batch before: every batch counts
    every listed entry, and an entry (one uid, one expiry) takes what it took then, so only
    new entries are serialised to be measured (the first measure of an entry, unstamped, is
    never below what it takes once stamped)."""

    def __init__(
        self,
        pool: str,
        entries: Iterable[Mapping[str, Any]],
        settings: LedgerSettings,
        known: Mapping[str, tuple[object, str, int]] | None = None,
        *,
        rest: int = 0,
    ) -> None:
        self.pool = pool
        self.settings = settings
        # What the object's metadata takes (see :func:`metadata_room`): past its share, the
        # entries may hold that much less, so no write of theirs passes MAX_OBJECT_BYTES.
        self.rest = rest
        self.pending_bytes = bounds.MAX_PENDING_BYTES - max(0, rest - bounds.MAX_REST_BYTES)
        self.entries = 0
        self.bytes = 0
        self.held: dict[str, int] = {}
        self.held_bytes: dict[str, int] = {}
        self.sizes: dict[str, tuple[object, str, int]] = {}  # id -> expiry, holder, size
        held, held_bytes, sizes, known = self.held, self.held_bytes, self.sizes, known or {}
        for entry in entries:  # take(), inlined: every batch counts every listed entry
            hold_id, expires = str(entry.get("id") or ""), entry.get("expires")
            seen = known.get(hold_id)
            if seen is not None and seen[0] == expires:
                who, grown = seen[1], seen[2]
            else:
                who, grown = _holder_of(pool, entry), listed_size(entry)
            sizes[hold_id] = (expires, who, grown)
            held[who] = held.get(who, 0) + 1
            held_bytes[who] = held_bytes.get(who, 0) + grown
            self.entries += 1
            self.bytes += grown

    def refusal(self, entry: Mapping[str, Any], replaced: Iterable[str] = ()) -> Decision | None:
        """Why ``entry`` (its holder found from its object) does not fit, replacing the entries
        ``replaced`` (ids; the previews of its own object); ``None`` when it does."""
        who, grown = _holder_of(self.pool, entry), listed_size(entry)
        freed = [self.sizes[i][2] for i in set(replaced) if i in self.sizes]
        entries, total = self.entries - len(freed), self.bytes - sum(freed)
        mine = self.held.get(who, 0) - len(freed)
        mine_bytes = self.held_bytes.get(who, 0) - sum(freed)
        settings = self.settings
        if entries >= bounds.MAX_ENTRIES:
            return answers.full(self.pool)
        if total + grown > self.pending_bytes:
            return answers.full(self.pool, in_bytes=True, rest=self.rest)
        if mine >= settings.share_limit:
            return answers.share_full(self.pool, who, settings)
        if mine_bytes + grown > settings.share_bytes_limit:
            return answers.share_full(self.pool, who, settings, in_bytes=True)
        return None

    def take(self, entry: Mapping[str, Any], replaced: Iterable[str] = ()) -> None:
        """Count ``entry`` in, and the ``replaced`` ones out."""
        for hold_id in set(replaced):
            found = self.sizes.pop(hold_id, None)
            if found is not None:
                self._count(found[1], -1, -found[2])
        who, grown = _holder_of(self.pool, entry), listed_size(entry)
        self.sizes[str(entry.get("id") or "")] = (entry.get("expires"), who, grown)
        self._count(who, 1, grown)

    def _count(self, who: str, entries: int, grown: int) -> None:
        self.entries += entries
        self.bytes += grown
        self.held[who] = self.held.get(who, 0) + entries
        self.held_bytes[who] = self.held_bytes.get(who, 0) + grown


def metadata_room(obj: Mapping[str, Any]) -> int:
    """The bytes of ``obj`` (a pool's ledger object) no part's bound counts: all of it but its
    status and its managedFields (which ``Book.write`` never sends), and the status's removal
    counts by kind, as a write sends them."""
    metadata = dict(obj.get("metadata") or {})
    metadata.pop("managedFields", None)
    status = obj.get("status") or {}
    released = status.get("released") if isinstance(status, Mapping) else None
    rest = {**{k: v for k, v in obj.items() if k != "status"}, "metadata": metadata}
    return size(rest) + (size(released) if released else 0)


def _holder_of(pool: str, entry: Mapping[str, Any]) -> str:
    parts = str(entry.get("application") or "").split("/", 2)
    return holder(pool, parts[1] if len(parts) == 3 else "")


def _cap_holder(pool: str, owned: str) -> str:
    """Whose share of ``pool``'s caps a cap for the Tenant owning ``owned`` takes: that of
    the tenant it was created in (see :func:`holder`)."""
    return holder(pool, parent_namespace(owned) or owned)


def listed_cap_size(owned: str, raw: object) -> int:
    """The bytes the cap ``raw`` of the Tenant owning ``owned`` takes in the caps as the ledger
    writes them: its key, its value and the comma that follows it."""
    return size({owned: raw}) - 1  # without its braces, with the comma after it


def cap_refusal(
    pool: str, caps: Mapping[str, Any], who: str, settings: LedgerSettings
) -> Decision | None:
    """Why ``pool``'s ledger may not list ``caps`` (what it lists with one more of ``who``'s,
    the tenant whose share it takes); ``None`` when it may. The pool's caps take at most
    :data:`~.bounds.MAX_CAPS` and :data:`~.bounds.MAX_CAPS_BYTES`, one tenant's at most its
    share of each, as its entries do of :data:`~.bounds.MAX_ENTRIES` and
    :data:`~.bounds.MAX_PENDING_BYTES`: past it only that tenant is refused."""
    if len(caps) > bounds.MAX_CAPS:
        return answers.too_many_caps(pool)
    if size(caps) > bounds.MAX_CAPS_BYTES:
        return answers.too_many_caps(pool, in_bytes=True)
    mine = [owned for owned in caps if _cap_holder(pool, str(owned)) == who]
    if len(mine) > settings.cap_share_limit:
        return answers.cap_share_full(pool, who, settings)
    if sum(listed_cap_size(str(owned), caps[owned]) for owned in mine) > (
        settings.cap_share_bytes_limit
    ):
        return answers.cap_share_full(pool, who, settings, in_bytes=True)
    return None


# -- a carve-out admitted in warn: only what fits is counted ----------------------------------


class Caps:
    """Records the caps of carve-outs admitted in warn beyond what fits."""

    def __init__(self, book: Book, status: Status) -> None:
        self.book = book
        self.status = status

    async def admit_capped(
        self, request: AdmissionRequest, policy: Policy, warned: Decision
    ) -> Decision:
        """A Tenant whose quota does not fit, allowed only because Tenant is in warn: record in
        the pool above, before answering, that it counts no more than before the write (a
        cap), so nothing is held and nobody else's room is taken; the answer is still the
        warning with the full overshoot (see :mod:`webhook.core.admission.carveouts`)."""
        found = warn_cap(request, warned, self.book.current())
        if found is None:
            return warned
        refused = await self._write_cap(found.pool, found.owned, found.cap)
        if refused is not None:
            return refused
        return with_cap_warning(warned, found)

    async def _write_cap(self, pool: str, owned: str, cap: Cap) -> Decision | None:
        """Make ``pool``'s ledger list ``cap`` for ``owned``; ``None`` once written, else the
        answer to give. A cap whose Tenant is not stored with its quota within the grace
        period is dropped by the next write (see :meth:`Status.build`). One tenant's caps take
        at most its share of the caps, in count and in bytes (:func:`cap_refusal`)."""
        book, settings = self.book, self.book.settings
        who = _cap_holder(pool, owned)
        raw = {
            "digest": cap.digest,
            "declared": rl.to_strings(cap.declared),
            "counted": rl.to_strings(cap.counted),
            "expires": expiry(book.clock() + settings.grace_seconds),
        }
        if size(raw) > bounds.MAX_CAP_BYTES:
            return answers.too_large(bounds.MAX_CAP_BYTES)
        async with book.locked([pool]):
            for _ in range(settings.attempts):
                try:
                    current = book.objects.get(pool) or await book.ensure(pool)
                except ApiError:
                    return answers.unavailable()
                state = book.current()
                kept = self.status.kept(pool, current, state, without=set())
                status = self.status.build(pool, current, state, kept)
                caps = {**raw_caps(status), owned: raw}
                refused = cap_refusal(pool, caps, who, settings)
                if refused is not None:
                    return refused
                outcome = await book.attempt(pool, current, {**status, "capped": caps})
                if outcome == "written":
                    return None
                if outcome == "failed":
                    return answers.unavailable()
        return answers.contention([pool])

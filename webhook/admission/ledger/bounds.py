"""How far a pool's ledger may grow, and how long the ledger holds and waits.

A pool's ``TenantReservation`` holds at most :data:`MAX_ENTRIES` entries of at most
:data:`MAX_ENTRY_BYTES` each, and at most :data:`MAX_PENDING_BYTES` of them together; its caps
(at most :data:`MAX_CAP_BYTES` each), its summary and its escrowed slices
(:data:`MAX_SLICES_BYTES`) have bounds of their own, so the whole object stays within
:data:`MAX_OBJECT_BYTES`, well under etcd's 1.5 MiB object limit and the
watch's event bound (:data:`webhook.kube.client.MAX_WATCH_EVENT_BYTES`): at the bound a request
is told to try again, no write is ever attempted that the API server would refuse for its size,
and every object written is read back by every replica's watch.
:class:`LedgerSettings` says for how long an entry is held (its grace period), how often a
conflicting write is retried, how long a decision waits for the state to catch up, and what
share of a pool's entries and caps one tenant may take. The other modules read the bounds as
attributes of this module, so each bound is named, and can be changed, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "DELETED_POOLS",
    "MAX_CAPS",
    "MAX_CAPS_BYTES",
    "MAX_CAP_BYTES",
    "MAX_ENTRIES",
    "MAX_ENTRY_BYTES",
    "MAX_OBJECT_BYTES",
    "MAX_PENDING_BYTES",
    "MAX_REPLACES",
    "MAX_REST_BYTES",
    "MAX_SLICES_BYTES",
    "MAX_SUMMARY_BYTES",
    "MAX_WANT_BYTES",
    "REVISION_BYTES",
    "LedgerSettings",
]

# A real entry is about 300 bytes: a uid, kind/namespace/name, two small charges, an expiry, a
# replica name. A sub-tenant's carries its budget as the charge it is expected to show, and a
# budget may hold 64 keys of up to 317 characters (webhook.core.tenancy.counts): with 40-digit
# quantities, the longest names and the longest replica name, some 47,500 bytes. One entry may
# take that (a budget counting each of the 31 kinds passed the 1 KiB this bound was, and such
# a sub-tenant could never be created); the entries together are bounded by MAX_PENDING_BYTES,
# and one tenant's by its share of them, so the object's bound is unchanged.
# At 1,000 admissions/s with objects observed within 100 ms, about 100 entries are listed.
MAX_ENTRIES: Final = 1_000
MAX_ENTRY_BYTES: Final = 49_152
# Previews one entry replaces: in one batch a write replaces at most the previews of its object
# (each preview replaces the one before it, so there is one at a time, or a few in flight).
MAX_REPLACES: Final = 16
# Sub-tenants admitted in warn beyond what fits, per pool: about 200 bytes each. A cap lists the
# keys it caps twice (declared, counted), so one may take what an entry may (a cap of the 31
# kinds' counts passed the 1 KiB this bound was, and warn refused the sub-tenant for good); the
# caps together, keyed by their namespaces, take at most MAX_CAPS_BYTES (what 200 caps of 1 KiB
# took), so the object's bound is unchanged.
MAX_CAPS: Final = 200
MAX_CAP_BYTES: Final = MAX_ENTRY_BYTES
MAX_CAPS_BYTES: Final = 218_600
# The whole object as JSON, at most: two thirds of etcd's 1.5 MiB (the API server's managedFields
# beside it list each status map once: the schema marks them atomic), a ninth of the watch's event
# bound. It is the sum of what each part may take: the entries together (600 KiB: 1,000 real entries
# are about 300 KiB; 1,000 with the longest names Kubernetes allows, about 830 KiB, so there the
# bytes bind first), the caps (213.5 KiB), the summary (64 KiB), the slices (80 KiB), a refusal's
# want (24 KiB) and the rest (metadata, the removal counts by kind: 40 KiB would hold 30 times an
# object's usual): 1,045,992 bytes, and a write past the whole is never sent (Book.write).
MAX_OBJECT_BYTES: Final = 1_048_576
MAX_PENDING_BYTES: Final = 614_400
MAX_SUMMARY_BYTES: Final = 65_536
# status.slices, every replica's records together, each counted at the largest it may grow to
# before its next grant (webhook.admission.ledger.slices.largest_bytes: its folded and returned
# holding every granted key at the widest quantity within the grant). A record of a handful of
# the usual keys takes under 1 KiB so, of all 31 kinds' counts and the 4 sizes about 5 KiB:
# 80 KiB holds a dozen or more replicas' lives; one of 64 keys of the longest names takes some
# 60 KiB, so a second replica's grant there is not made and it admits by the exact path (ten
# such records would pass etcd's limit, and the pool would stop).
MAX_SLICES_BYTES: Final = 81_920
# status.wanted: the refused request's increase on the pool's budget keys, so at most 64 keys
# of the longest names at the largest quantity, some 22 KB; a want past this is not asked
# (webhook.admission.ledger.wants), and the answer is "exceeded".
MAX_WANT_BYTES: Final = 24_576
# The rest's share of MAX_OBJECT_BYTES (what no part above bounds: the metadata, the removal
# counts by kind): 43,544 bytes. Nothing keeps a stored object's metadata within it (Kubernetes
# allows 256 KiB of annotations, and labels without a total bound), so whatever it takes past
# this share is taken from what the entries may hold (webhook.admission.ledger.metadata_room).
MAX_REST_BYTES: Final = MAX_OBJECT_BYTES - (
    MAX_PENDING_BYTES + MAX_CAPS_BYTES + MAX_SUMMARY_BYTES + MAX_SLICES_BYTES + MAX_WANT_BYTES
)
# Pools whose deletion is remembered against late answers to writes made before it: a
# tenant creating and deleting sub-tenants makes a few a second at most, and an answer comes
# within a write's deadline.
DELETED_POOLS: Final = 4_096
# What a new entry grows by once a later write stamps it with its revision (the digits of a
# resourceVersion: at most 20, a 64-bit integer's).
REVISION_BYTES: Final = 20


@dataclass(frozen=True)
class LedgerSettings:
    replica: str
    # The default webhook settings' (Settings.grace_seconds): the store bound plus the skew.
    grace_seconds: float = 65.0
    # A request admitted at t is stored before t plus this, or never (kube-apiserver's
    # --request-timeout): how long a slice's spend stays counted unobserved.
    store_seconds: float = 60.0
    attempts: int = 3  # conflicting writes retried, as Kubernetes' quota admission does
    reconcile_seconds: float = 2.0
    # A pool's summary whose only change is how much is reserved (its budget, its
    # Overcommitted condition and its entries as written) is rewritten by the leader once this
    # long has passed since the pool's last write: under a steady burst answered from slices a
    # pool is written every few seconds, and a summary write each period besides cost as many.
    summary_seconds: float = 10.0
    read_timeout: float = 90.0
    watch_timeout: int = 300
    catch_up_seconds: float = 2.0  # how long a denial waits for the state to pass an expiry
    # Hold dry runs like writes: the API server may store them (cozystack-api does).
    dry_run_holds: bool = True
    # The share of a pool's ledger one tenant's listed entries may take (see
    # :func:`webhook.admission.ledger.shares.holder`).
    namespace_share: float = 0.1
    # Admit CREATEs from escrowed slices of busy pools' room held by this process, in memory
    # (docs/escrow.md); off: every admission takes the exact path (slices others hold are
    # counted either way).
    escrow: bool = False
    escrow_seconds: float = 0.25  # how often the slices are folded, refilled and renewed

    @property
    def share_limit(self) -> int:
        """How many entries one tenant may have listed in one pool's ledger."""
        return max(1, int(MAX_ENTRIES * self.namespace_share))

    @property
    def share_bytes_limit(self) -> int:
        """How many bytes one tenant's listed entries may take in one pool's ledger (never
        less than one entry of the largest size, as later writes list it)."""
        largest = MAX_ENTRY_BYTES + 64  # and what listing it adds: its revision, a comma
        return max(largest, int(MAX_PENDING_BYTES * self.namespace_share))

    @property
    def cap_share_limit(self) -> int:
        """How many caps one tenant's sub-tenants may have listed in one pool's ledger."""
        return max(1, int(MAX_CAPS * self.namespace_share))

    @property
    def cap_share_bytes_limit(self) -> int:
        """How many bytes one tenant's sub-tenants' caps may take in one pool's ledger: its
        share of them and no more, so that the shares divide the pool's caps. A floor of one
        cap at its largest (some 49 KB, 23% of them) let five tenants each within its share
        take them all; a cap past the share (a quota of dozens of long keys; real ones take a
        few hundred bytes) is refused to its own tenant only."""
        return max(1, int(MAX_CAPS_BYTES * self.namespace_share))

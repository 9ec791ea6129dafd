"""Carve-outs admitted in warn mode: what they count in the pools above them.

A Tenant's quota is a carve-out in its parent's pool: it occupies ``max(quota, usage)`` there
(:mod:`webhook.core.admission.pools`). With the Tenant kind in ``warn``, a tenant admin's sub-Tenant
that does not fit (``memory: 1000Ti`` in a 64Gi pool) is allowed with a warning; counted at its
declared quota it would then fill the parent pool, and every *enforced* write of every other
tenant there would be denied: a write admitted only because its kind is in warn would stop
everyone else.

So such a carve-out is *capped*: per key, it counts in the pools above it only what it
counted before the write (what had fitted: the write itself did not, and each write is all or
nothing), and they see ``max(counted, usage)``. Its subtree is limited by the counted figure
too (as if the write had been refused), so neither the carve-out nor its own enforced writes
can push a pool above past its budget; only writes admitted in warn inside it add their real
usage, as any warn-mode application does. The declared quota, the counted one and the
overshoot stay visible (the warning at admission, the pool's ledger status, metrics, the
subtree's denials). A cap is bound to the quota it was computed for: it applies only while the
Tenant declares exactly that quota, so a later write of another quota is decided and counted
as usual, and a cap only ever lowers what a carve-out counts and may use.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from webhook.core.admission.pools import TenantTree
from webhook.core.base import resources as rl

__all__ = ["Cap", "budget_digest", "capped", "effective_budget", "kept_budget", "overshoot"]

_ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class Cap:
    """What a carve-out admitted in warn counts while it declares the quota whose digest is
    ``digest``: ``counted`` instead of ``declared`` for the keys over (only those are kept, so
    a cap stays small whatever the quota lists)."""

    digest: str
    declared: Mapping[str, Decimal]
    counted: Mapping[str, Decimal]


def capped(declared: Mapping[str, Decimal], counted: Mapping[str, Decimal]) -> Cap:
    """The cap that makes a carve-out declaring ``declared`` count ``counted``."""
    over = sorted(k for k, v in declared.items() if counted.get(k, v) < v)
    return Cap(
        budget_digest(declared),
        {k: declared[k] for k in over},
        {k: counted[k] for k in over},
    )


def budget_digest(budget: Mapping[str, Decimal]) -> str:
    """A digest of a quota, by canonical quantities (``1024Mi`` and ``1Gi`` are one quota)."""
    text = json.dumps(rl.to_strings(budget), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def effective_budget(declared: Mapping[str, Decimal], cap: Cap | None) -> dict[str, Decimal]:
    """The quota a tenant counts as: ``declared``, or less while a cap for exactly that quota
    stands."""
    if cap is None or budget_digest(declared) != cap.digest:
        return dict(declared)
    return {key: min(value, cap.counted.get(key, value)) for key, value in declared.items()}


def kept_budget(
    tree: TenantTree,
    owned: str,
    declared: Mapping[str, Decimal],
    old: Mapping[str, Decimal] | None,
) -> dict[str, Decimal]:
    """What a carve-out admitted in warn beyond what fits counts as its quota: per key of
    ``declared``, no more than it counted before the write, as if the write had been refused
    (each write is all or nothing, in warn as in enforce).

    "Before" is the smaller of what the tree counts for it and what its stored old quota
    (``old``, from the request's old object; ``None`` for a CREATE) counts, so a replica that
    has not yet seen a lowered quota never keeps more than the cluster holds."""
    node = tree.get(owned)
    counted: dict[str, Decimal] = {}
    for key, wanted in declared.items():
        used = node.usage.get(key, _ZERO) if node is not None else _ZERO
        before = node.contribution(key) if node is not None else _ZERO
        if old is not None and key in old:
            before = min(before, max(old[key], used))
        else:  # a CREATE, or a key the old quota did not set: it counted its usage
            before = min(before, used)
        counted[key] = min(wanted, before)
    return counted


def overshoot(cap: Cap) -> dict[str, Decimal]:
    """What the declared quota exceeds the counted one by, per key."""
    return rl.positive_part(rl.subtract(cap.declared, cap.counted))

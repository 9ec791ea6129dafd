"""Which resource keys may become metric labels: those the platform itself knows, no others.

A tenant writes the keys of its budget (a sub-Tenant's ``resourceQuotas``), of the ResourceQuotas
in its namespaces, and of some charges (device names in a VM's values). Every distinct label value
is a series Prometheus keeps, so a key a tenant makes up must never become one: a label carries
only a key the platform knows, and everything else is summed under :data:`OTHER`. The platform
knows the resource keys of Kubernetes quotas (``cpu``, ``memory``, ``storage``,
``ephemeral-storage`` and the object counts), every key its contracts name, the count key of
each of its kinds, and the devices of its cluster-scoped instance types (a namespaced one may be
a tenant's own); for ResourceQuotas, the ``requests.`` and ``limits.`` forms of those. The
number of series per pool or namespace is then bounded by the platform, whatever tenants write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Final

from webhook.core.pricing.contracts import FirstOf, FromResources, MaxOf, SizeSource
from webhook.core.pricing.platform import Platform
from webhook.core.tenancy.counts import OBJECT_COUNTS, SIZE_KEYS

__all__ = ["OTHER", "fold", "known_keys", "label", "quota_keys"]

OTHER: Final = "other"
# Compute resources a ResourceQuota names (core/v1 ResourceName), the shorthand budgets use,
# and the object counts it names without ``count/`` (core/v1 types.go): one list, in counts.
_RESOURCES: Final = SIZE_KEYS
_COUNTS: Final = OBJECT_COUNTS


def known_keys(platform: Platform) -> frozenset[str]:
    """The budget and charge keys the platform knows (not what tenants wrote)."""
    keys = set(_RESOURCES | _COUNTS)
    for kind in platform.kinds.values():
        keys.add(f"count/{kind.plural}.apps.cozystack.io")
        if kind.contract is None:
            continue
        for term in kind.contract.terms:
            keys.update(key for key, _ in term.objects)
            keys.update(_size_keys(term.size))
    for instance_type in platform.catalog.instance_types.values():
        # Only cluster-scoped ones: a namespaced instance type may be a tenant's own.
        if not instance_type.namespace:
            keys.update(instance_type.devices)
    return frozenset(keys)


def quota_keys(known: frozenset[str]) -> frozenset[str]:
    """The ResourceQuota keys of ``known``: counts as they are, others also as ``requests.K``
    and ``limits.K``."""
    keys = set(known)
    for key in known:
        if key not in _COUNTS and not key.startswith("count/"):
            keys.update((f"requests.{key}", f"limits.{key}"))
    return frozenset(keys)


def label(key: str, known: frozenset[str]) -> str:
    """The label ``key`` is shown under: itself when known, else :data:`OTHER`."""
    return key if key in known and key != OTHER else OTHER


def fold(values: Mapping[str, Decimal], known: frozenset[str]) -> dict[str, Decimal]:
    """``values`` with every key outside ``known`` summed under :data:`OTHER`."""
    folded: dict[str, Decimal] = {}
    for key, value in values.items():
        shown = label(key, known)
        folded[shown] = folded.get(shown, Decimal(0)) + value
    return folded


def _size_keys(source: SizeSource | None) -> Iterable[str]:
    if isinstance(source, FromResources):
        return [key for key, _ in source.resources]
    if isinstance(source, FirstOf | MaxOf):
        return [key for member in source.sources for key in _size_keys(member)]
    return []

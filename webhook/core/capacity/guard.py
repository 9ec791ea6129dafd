"""The pod-level capacity guard: will what the reservation admitted be allowed to run?

Cozystack's tenant chart still renders the ResourceQuota ``tenant-quota`` from the tenant's
``resourceQuotas``, in pod units (``packages/apps/tenant/templates/quota.yaml`` with cozy-lib's
``flatten``; worked examples in ``shared/cozystack/derived/tenant-quota-rendering.yaml``). The
reservation decides what a tenant may declare; the ResourceQuota then decides whether the pods
start. Kept on purpose as a loose *guard* (it arms the LimitRange defaults and KubeVirt's
``AutoResourceLimitsGate`` and stops a runaway), it must be wider than the reservation by a
factor, because KubeVirt's overhead is additive per VM: no single percentage fits every mix.

This module answers, purely:

- how much room a namespace's quotas leave (Kubernetes enforces *every* quota in a namespace,
  so the tightest one counts, key by key);
- whether a new application's pods fit in that room, and the warning that says so in numbers;
- what factor on ``resourceQuotas`` would let everything admitted run, and what factor a target
  mix of VMs needs.

Room is ``hard - max(used, need of the admitted applications)``: ``status.used`` counts the pods
that exist, the admitted need counts those that will; whichever is larger is what the next pod
competes with. Only sizes appear in a warning, never another tenant's names.

Object counts are no pod-level limit: a budget's ``count/<plural>.apps.cozystack.io`` is counted
by the reservation at admission, and the chart renders it as ``limits.count/...`` and
``requests.count/...``, which no pod ever requests (the pod evaluator's extended-resource rule
would need a node to advertise ``count/...``). The guard leaves such keys out of its room and
says so (:func:`is_object_count`) instead of reporting a room nothing can fill.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, Final

from webhook.core.base import resources as rl
from webhook.core.base.errors import QuantityError
from webhook.core.base.quantities import format_quantity, parse_quantity
from webhook.core.capacity.overhead import LauncherShape, launcher_memory
from webhook.core.capacity.pod_requests import ALLOCATION_RATIOS, PodNeed, pod_need
from webhook.core.tenancy.applications import AppKey

__all__ = [
    "COUNTS_NOTE",
    "TENANT_QUOTA",
    "Quota",
    "QuotaBook",
    "Shortfall",
    "factor_for_mix",
    "guard_room",
    "guard_warning",
    "is_object_count",
    "namespace_need",
    "quota_from_object",
    "render_tenant_quota",
    "shortfall",
    "smallest_factor",
    "total_need",
]

TENANT_QUOTA: Final = "tenant-quota"
# ResourceQuota names a request two ways: "memory" is "requests.memory" (core/v1 types.go).
_ALIASES: Final = {
    "cpu": "requests.cpu",
    "memory": "requests.memory",
    "ephemeral-storage": "requests.ephemeral-storage",
}
# flatten emits these object-count keys verbatim (cozy-lib _resources.tpl).
_COUNT_KEYS: Final = frozenset(
    {
        "pods",
        "services",
        "services.loadbalancers",
        "services.nodeports",
        "services.clusterip",
        "configmaps",
        "secrets",
        "persistentvolumeclaims",
        "replicationcontrollers",
        "resourcequotas",
    }
)
_FACTOR_STEP: Final = Decimal("0.01")
_RENDERED_PREFIXES: Final = ("limits.", "requests.")
COUNTS_NOTE: Final = (
    "count/... keys are counted by the reservation at admission; the chart renders them as "
    "limits.count/... and requests.count/..., which no pod requests, so the guard checks "
    "nothing for them"
)


@dataclass(frozen=True)
class Quota:
    """One ResourceQuota: its hard limits and what the API server counts as used."""

    name: str
    hard: Mapping[str, Decimal]
    used: Mapping[str, Decimal]


@dataclass(frozen=True)
class Shortfall:
    """The key on which the tightest quota leaves less than the new pods request."""

    quota: str
    key: str
    left: Decimal
    needed: Decimal

    def warning(self, kind: str, pods: int) -> str:
        subject = "this VM's pod needs" if pods == 1 else f"this {kind}'s pods need"
        return (
            f"fits your quota, but ResourceQuota {self.quota} leaves "
            f"{format_quantity(max(self.left, Decimal(0)))} of {self.key}; {subject} "
            f"{format_quantity(self.needed)} and will not start until the platform widens "
            "the guard"
        )


class QuotaBook:
    """Every namespace's ResourceQuotas, as last observed (manifests, or a cluster watch)."""

    def __init__(self) -> None:
        self._quotas: dict[str, dict[str, Quota]] = {}

    def __len__(self) -> int:
        return sum(len(quotas) for quotas in self._quotas.values())

    def observe(self, namespace: str, quota: Quota) -> None:
        self._quotas.setdefault(namespace, {})[quota.name] = quota

    def forget(self, namespace: str, name: str) -> None:
        quotas = self._quotas.get(namespace, {})
        quotas.pop(name, None)
        if not quotas:
            self._quotas.pop(namespace, None)

    def replace(self, quotas: Iterable[tuple[str, Quota]]) -> None:
        self._quotas = {}
        for namespace, quota in quotas:
            self.observe(namespace, quota)

    def quotas(self, namespace: str) -> list[Quota]:
        return list(self._quotas.get(namespace, {}).values())

    def namespaces(self) -> list[str]:
        return sorted(self._quotas)


def quota_from_object(obj: Mapping[str, Any]) -> Quota:
    """A ResourceQuota object as a :class:`Quota`; a key whose value is no quantity is skipped.

    Tenants may create ResourceQuotas in their namespaces: a malformed one tightens nothing it
    cannot state, and never raises.
    """
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    spec, status = obj.get("spec"), obj.get("status")
    hard = spec.get("hard") if isinstance(spec, Mapping) else None
    used = status.get("used") if isinstance(status, Mapping) else None
    return Quota(str(name or ""), _quantities(hard), _quantities(used))


def shortfall(
    need: PodNeed, admitted: Mapping[str, Decimal], quotas: Iterable[Quota]
) -> Shortfall | None:
    """Where the tightest quota leaves less than ``need``; ``None`` when every quota has room.

    ``admitted`` is the pod-level need of the namespace's other admitted applications.
    """
    worst: Shortfall | None = None
    for quota in quotas:
        for key, needed in sorted(need.requests.items()):
            if needed <= 0 or key not in quota.hard:
                continue
            taken = max(quota.used.get(key, Decimal(0)), admitted.get(key, Decimal(0)))
            left = quota.hard[key] - taken
            if needed > left and (worst is None or needed - left > worst.needed - worst.left):
                worst = Shortfall(quota.name, key, left, needed)
    return worst


def guard_warning(
    key: AppKey,
    charge: Mapping[str, Decimal],
    namespace_charges: Iterable[tuple[AppKey, Mapping[str, Decimal] | None]],
    quotas: Iterable[Quota],
) -> str | None:
    """The warning for an application that fits its reservation but not its namespace's guard.

    ``namespace_charges`` are the charges of the applications stored in the same namespace
    (``None`` for one without a charge); the application itself, as stored before this write,
    is left out, so an UPDATE competes only with the others.
    """
    need = pod_need(key[0], charge)
    if not need.requests:
        return None
    others = total_need(
        pod_need(other[0], resources)
        for other, resources in namespace_charges
        if other != key and resources is not None
    )
    found = shortfall(need, others, quotas)
    return found.warning(key[0], need.pods) if found else None


def namespace_need(
    namespace_charges: Iterable[tuple[AppKey, Mapping[str, Decimal] | None]],
) -> tuple[dict[str, Decimal], list[AppKey]]:
    """What a namespace's admitted applications' pods will request, and those whose need is
    unknown (no charge, or a kind whose pods the contract cannot tell)."""
    needs = []
    unknown = []
    for key, resources in namespace_charges:
        need = pod_need(key[0], resources) if resources is not None else None
        if need is None or not need.known:
            unknown.append(key)
        else:
            needs.append(need)
    return total_need(needs), sorted(unknown)


def is_object_count(key: str) -> bool:
    """Whether a ResourceQuota key counts objects by ``count/...`` (as written, or as the chart
    renders a budget's count key): never part of what a pod requests."""
    for prefix in _RENDERED_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
            break
    return key.startswith("count/")


def guard_room(quotas: Iterable[Quota], need: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """Per key, what the tightest quota leaves once what exists and what was admitted is
    counted: ``hard - max(used, need)``. Negative where admitted applications cannot all run.
    Object counts (:func:`is_object_count`) are no pod-level room and are left out."""
    room: dict[str, Decimal] = {}
    for quota in quotas:
        for key, hard in quota.hard.items():
            if is_object_count(key):
                continue
            left = hard - max(quota.used.get(key, Decimal(0)), need.get(key, Decimal(0)))
            if key not in room or left < room[key]:
                room[key] = left
    return room


def render_tenant_quota(
    resource_quotas: Mapping[str, Decimal], factor: Decimal = Decimal(1)
) -> dict[str, Decimal]:
    """``tenant-quota``'s hard as the chart renders ``resourceQuotas`` scaled by ``factor``.

    cozy-lib's rules: cpu, memory and ephemeral-storage become ``limits.<k> = v`` and
    ``requests.<k> = v / ratio`` (memory and ephemeral-storage as whole bytes); storage becomes
    ``requests.storage``; object counts stay as they are; any other key gets both sides.
    """
    hard: dict[str, Decimal] = {}
    for key, declared in resource_quotas.items():
        value = declared * factor
        if key in _COUNT_KEYS:
            hard[key] = declared
        elif key == "storage":
            hard["requests.storage"] = value
        elif key in ALLOCATION_RATIOS:
            request = value / ALLOCATION_RATIOS[key]
            if key != "cpu":
                request = request.to_integral_value(ROUND_FLOOR)
            hard[f"limits.{key}"] = value
            hard[f"requests.{key}"] = request
        else:
            hard[f"limits.{key}"] = value
            hard[f"requests.{key}"] = value
    return hard


def smallest_factor(resource_quotas: Mapping[str, Decimal], need: Mapping[str, Decimal]) -> Decimal:
    """The smallest factor on ``resourceQuotas`` (to 0.01, at least 1) whose rendered
    ``tenant-quota`` holds ``need`` on every request key it limits."""
    rendered = render_tenant_quota(resource_quotas)
    factor = Decimal(1)
    for key, needed in need.items():
        hard = rendered.get(key)
        if hard is not None and hard > 0:
            factor = max(factor, needed / hard)
    return factor.quantize(_FACTOR_STEP, rounding=ROUND_CEILING)


def factor_for_mix(memory_budget: Decimal, vm_memory: Decimal, vcpus: int = 1) -> Decimal:
    """The factor a memory budget filled with VMs of one size needs, so every launcher starts.

    ``floor(budget / size)`` VMs, each requesting its guest memory plus KubeVirt's overhead.
    """
    if memory_budget <= 0 or vm_memory <= 0:
        return Decimal(1)
    count = int(memory_budget // vm_memory)
    guest = int(vm_memory.to_integral_value(ROUND_CEILING))
    per_vm, _ = launcher_memory(LauncherShape(guest_memory=guest, vcpus=vcpus))
    needed = Decimal(count * per_vm)
    return max(Decimal(1), needed / memory_budget).quantize(_FACTOR_STEP, rounding=ROUND_CEILING)


def total_need(needs: Iterable[PodNeed]) -> dict[str, Decimal]:
    """The pod-level requests of several applications together."""
    return rl.total(need.requests for need in needs)


def _quantities(values: object) -> dict[str, Decimal]:
    if not isinstance(values, Mapping):
        return {}
    parsed: dict[str, Decimal] = {}
    for key, value in values.items():
        if not isinstance(key, str):
            continue
        try:
            number = parse_quantity(value)
        except QuantityError:
            continue
        parsed[_ALIASES.get(key, key)] = number
    return parsed

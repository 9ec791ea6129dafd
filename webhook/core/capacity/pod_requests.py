"""What an admitted application's pods will request at the pod level, from its charge.

Reservations count the sizes a tenant declared; the namespace's ResourceQuota counts pod
requests. The two differ by rules this module states, so the gap can be shown in numbers:

- **VMInstance**: one virt-launcher pod per VM. Its memory request is the guest memory plus
  KubeVirt's overhead (:mod:`webhook.core.capacity.overhead`, the model for a VM with no pod yet);
  its CPU request is the guest vCPUs divided by KubeVirt's ``cpuAllocationRatio`` (default 10: "for
  each requested virtual CPU, how much physical CPU to request", KubeVirt's
  ``DeveloperConfiguration``); each GPU is requested as is.
- **VMDisk**: one PVC, ``requests.storage`` = its size.
- **Kinds rendered by cozy-lib** (databases, caches, queues ...): cozy-lib's ``sanitize`` renders
  ``limits = value`` and ``requests = value / ratio`` with the platform's allocation ratios
  (cpu 10, memory 1, ephemeral-storage 40; ``packages/library/cozy-lib/templates/
  _resources.tpl``), and PVCs request their storage. Pods a contract does not charge are not
  counted, so these figures are a lower bound.
- **Tenant** runs no pods. **Kubernetes** runs its workers as KubeVirt VMs whose count and
  shapes the cluster-autoscaler decides, and exempt kinds declare nothing: their need is
  *unknown*, and said so.

Quota keys follow ResourceQuota's names: ``requests.cpu``, ``requests.memory``,
``requests.ephemeral-storage``, ``requests.storage``, ``requests.<extended resource>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Final, Literal

from webhook.core.capacity.overhead import LauncherShape, launcher_memory

__all__ = [
    "ALLOCATION_RATIOS",
    "CPU_ALLOCATION_RATIO",
    "PodNeed",
    "pod_need",
]

# KubeVirt's DeveloperConfiguration.cpuAllocationRatio default.
CPU_ALLOCATION_RATIO: Final = Decimal(10)
# cozy-lib's defaults (packages/core/platform/values.yaml resources.*AllocationRatio).
ALLOCATION_RATIOS: Final[Mapping[str, Decimal]] = {
    "cpu": Decimal(10),
    "memory": Decimal(1),
    "ephemeral-storage": Decimal(40),
}
_VM_KIND: Final = "VMInstance"
_DISK_KIND: Final = "VMDisk"
_NO_PODS: Final = frozenset({"Tenant"})
_UNKNOWN_KINDS: Final = frozenset({"Kubernetes"})
# Charge keys that are object counts, never pod requests.
_OBJECT_PREFIXES: Final = ("services.", "count/", "pods", "persistentvolumeclaims")
_MILLI: Final = Decimal("0.001")

NeedSource = Literal["kubevirt-model", "pvc", "cozy-lib-ratios", "no-pods", "unknown"]


@dataclass(frozen=True)
class PodNeed:
    """Pod-level requests of one application, keyed as ResourceQuota keys them."""

    requests: Mapping[str, Decimal]
    source: NeedSource
    pods: int = 0  # launcher pods (VMs) among them: what the guard warning speaks of

    @property
    def known(self) -> bool:
        return self.source != "unknown"


UNKNOWN: Final = PodNeed({}, "unknown")
NO_PODS: Final = PodNeed({}, "no-pods")


def pod_need(kind: str, charge: Mapping[str, Decimal]) -> PodNeed:
    """The pod-level requests an application of ``kind`` with this charge will make."""
    if kind in _NO_PODS:
        return NO_PODS
    if kind in _UNKNOWN_KINDS or not charge:
        return UNKNOWN
    if kind == _VM_KIND:
        return _vm_need(charge)
    requests: dict[str, Decimal] = {}
    for key, value in charge.items():
        if key.startswith(_OBJECT_PREFIXES):
            continue
        if key == "storage":
            requests["requests.storage"] = value
            continue
        ratio = ALLOCATION_RATIOS.get(key, Decimal(1))
        requests[f"requests.{key}"] = _request(key, value / ratio)
    return PodNeed(requests, "pvc" if kind == _DISK_KIND else "cozy-lib-ratios")


def _vm_need(charge: Mapping[str, Decimal]) -> PodNeed:
    guest = int(charge.get("memory", Decimal(0)).to_integral_value(ROUND_CEILING))
    vcpus = int(charge.get("cpu", Decimal(1)).to_integral_value(ROUND_CEILING))
    gpus = {
        key: value
        for key, value in charge.items()
        if key not in ("cpu", "memory", "storage", "ephemeral-storage")
        and not key.startswith(_OBJECT_PREFIXES)
    }
    shape = LauncherShape(guest_memory=guest, vcpus=max(vcpus, 1), vfio=bool(gpus))
    memory, _ = launcher_memory(shape)
    requests = {
        "requests.cpu": _request("cpu", Decimal(max(vcpus, 1)) / CPU_ALLOCATION_RATIO),
        "requests.memory": Decimal(memory),
    }
    requests.update({f"requests.{key}": value for key, value in gpus.items()})
    return PodNeed(requests, "kubevirt-model", pods=1)


def _request(key: str, value: Decimal) -> Decimal:
    """A derived request as the chart writes it: bytes truncated to a whole number (cozy-lib's
    ``int``), cpu to 1m, rounded up as Kubernetes rounds a fractional millicore."""
    if key == "cpu":
        return value.quantize(_MILLI, rounding=ROUND_CEILING)
    return value.to_integral_value(ROUND_FLOOR)

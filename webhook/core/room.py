"""Whether a VM that fits its quota has a node to start on, by the last cluster snapshot.

The reservation decides admission; whether some node has room decides whether the VM starts.
When no node has the memory a VM's launcher will request (guest plus KubeVirt's overhead), the
tenant is told at admission, in sizes only (never another tenant's VMs or nodes), that the
platform will need to make room. The figure is the largest free memory among the nodes that can
take a VM, read out of band (never in the request path); unknown means no warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Final

from webhook.core.overhead import LauncherShape, launcher_memory
from webhook.core.quantities import format_quantity
from webhook.core.snapshot import Placement, Snapshot

__all__ = ["RoomBook", "largest_free", "room_warning"]

MiB: Final = 1024 * 1024
# KubeVirt puts this selector on every launcher pod: only such nodes can take a VM.
_LAUNCHER: Final = Placement(node_selector=(("kubevirt.io/schedulable", "true"),))


@dataclass
class RoomBook:
    """The largest free memory (bytes) among nodes that can take a VM; None: unknown."""

    largest: int | None = None


def largest_free(snapshot: Snapshot) -> int | None:
    """Allocatable minus every pod's requests, on the best node a launcher may use."""
    used: dict[str, int] = {}
    for pod in snapshot.pods:
        used[pod.node] = used.get(pod.node, 0) + pod.requests.get("memory", 0)
    for vm in snapshot.vms:
        if vm.node is not None:
            used[vm.node] = used.get(vm.node, 0) + vm.requests.get("memory", 0)
    free = [
        (node.allocatable.get("memory", 0) - used.get(node.name, 0)) // 1000
        for node in snapshot.nodes
        if _LAUNCHER.allows(node)
    ]
    return max(free) if free else None


def room_warning(kind: str, charge: Mapping[str, Decimal], largest: int | None) -> str | None:
    """The warning for a VMInstance no node has room for right now, or None."""
    memory = charge.get("memory")
    if kind != "VMInstance" or largest is None or not memory or memory <= 0:
        return None
    vcpus = charge.get("cpu") or Decimal(1)
    shape = LauncherShape(
        guest_memory=int(memory.to_integral_value(ROUND_CEILING)),
        vcpus=max(1, min(4096, int(vcpus.to_integral_value(ROUND_CEILING)))),
    )
    need, _ = launcher_memory(shape)
    if need <= largest:
        return None
    need_mi = Decimal(-(-need // MiB) * MiB)
    largest_mi = Decimal(max(0, largest) // MiB * MiB)
    return (
        f"fits your quota, but no node has {format_quantity(need_mi)} free right now "
        f"(largest: {format_quantity(largest_mi)}); the platform will need to make room"
    )

"""Whether a VM that fits its quota has a node to start on, by the last cluster snapshot.

The reservation decides admission; whether some node has room decides whether the VM starts.
When no node has the memory a VM's launcher will request (guest plus KubeVirt's overhead), the
tenant is told at admission, as a yes/no with advice, that the platform will need to make room.
The figure it rests on is the largest free memory among the nodes that can take a VM, read out
of band (never in the request path); unknown means no warning.

That figure is about other tenants' VMs, and a tenant can dry-run VMs of any size, so the
answer is given against a coarse figure only: the largest free memory rounded **up** to a power
of two (:func:`coarse_room`). Sweeping sizes then tells a tenant which power-of-two interval the
largest free memory lies in, nothing finer, and a warning is given only when no node can take
the VM (a VM within the rounding gets none). The warning names the VM's own need, never the
cluster's figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Final

from webhook.core.base.quantities import format_quantity
from webhook.core.capacity.overhead import LauncherShape, launcher_memory
from webhook.core.capacity.snapshot import Placement, Snapshot

__all__ = ["RoomBook", "coarse_room", "largest_free", "room_warning"]

MiB: Final = 1024 * 1024
# KubeVirt puts this selector on every launcher pod: only such nodes can take a VM.
_LAUNCHER: Final = Placement(node_selector=(("kubevirt.io/schedulable", "true"),))


@dataclass
class RoomBook:
    """The largest free memory (bytes) among nodes that can take a VM, as coarse as a warning
    uses it (:func:`coarse_room`); None: unknown."""

    largest: int | None = None


def coarse_room(largest: int | None) -> int | None:
    """``largest`` rounded up to a power of two bytes (at least 1 MiB); None stays unknown.

    Rounding up, not down: a warning then always holds (no node has the room), and a tenant
    learns at most the power-of-two interval of the figure.
    """
    if largest is None:
        return None
    return max(MiB, 1 << max(0, largest - 1).bit_length())


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
    room = coarse_room(largest)
    if room is None or need <= room:
        return None
    need_mi = Decimal(-(-need // MiB) * MiB)
    return (
        f"fits your quota, but no node has the {format_quantity(need_mi)} this VM needs free "
        "right now; the platform will need to make room before it can start"
    )

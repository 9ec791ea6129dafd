"""A cluster snapshot for capacity planning: nodes, what runs on them, and which VMs can move.

The planner never sees Kubernetes objects; it sees this model, read from what an operator can
produce today (``kubectl get nodes,pods,virtualmachineinstances -A -o yaml``): each node's
allocatable resources, labels, taints and cordon; each pod's effective requests; each VM's
launcher request as scheduled (guest plus KubeVirt's overhead), whether it can live-migrate, and
the constraints its launcher pod carries (node selector, required node affinity, tolerations,
required pod anti-affinity on ``kubernetes.io/hostname``).

This module is the model; the scheduler's filters it carries are
:mod:`webhook.core.capacity.scheduling`, and reading it from objects is
:mod:`webhook.core.capacity.snapshot_objects`.

Quantities are exact integers in milli-units (``1`` CPU is 1000, ``1Mi`` is 1048576000), so
comparisons never round. Every value in the input is treated as hostile: malformed objects raise
:class:`SnapshotError` naming the object and field, never an exception from deep inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING
from typing import Final

from webhook.core.base.errors import QuantityError, ReservationError
from webhook.core.base.quantities import parse_quantity
from webhook.core.capacity.scheduling import (
    HOSTNAME,
    AntiAffinity,
    NodeSelectorRequirement,
    Placement,
    Taint,
    Toleration,
)

__all__ = [
    "HOSTNAME",
    "PODS",
    "VM",
    "AntiAffinity",
    "Node",
    "NodeSelectorRequirement",
    "Placement",
    "Pod",
    "Snapshot",
    "SnapshotError",
    "Taint",
    "Toleration",
    "milli",
]

PODS: Final = "pods"


class SnapshotError(ReservationError):
    """An object in a snapshot cannot be read; the message names it and the field."""


@dataclass(frozen=True)
class Node:
    name: str
    allocatable: Mapping[str, int]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False


@dataclass(frozen=True)
class Pod:
    """A pod that is not a VM's launcher: it stays where it is and holds its requests."""

    name: str
    namespace: str
    node: str
    requests: Mapping[str, int]
    labels: Mapping[str, str] = field(default_factory=dict)
    anti_affinity: tuple[AntiAffinity, ...] = ()


@dataclass(frozen=True)
class VM:
    """A VirtualMachineInstance and its launcher: running on ``node``, or pending (None)."""

    namespace: str
    name: str
    node: str | None
    requests: Mapping[str, int]
    migratable: bool = True
    why_not_migratable: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    placement: Placement = field(default_factory=Placement)
    memory_source: str = "pod"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...]
    pods: tuple[Pod, ...] = ()
    vms: tuple[VM, ...] = ()

    def vm(self, key: str) -> VM | None:
        return next((v for v in self.vms if v.key == key), None)


def milli(value: object) -> int:
    """A quantity as an exact integer of milli-units, rounded up (the scheduler's direction)."""
    number = parse_quantity(value)
    if number < 0:
        raise QuantityError(f"{value!r} is negative")
    return int((number * 1000).to_integral_value(ROUND_CEILING))

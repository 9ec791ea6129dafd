"""What the rebalancer should act on, read from cluster objects: pure, so it is tested alone.

Two kinds of goal: a VMI whose launcher pod the scheduler refused for lack of resources (place
it), and a cordoned node that still runs VMs (drain it). Both are opt-in: a VMI carries the
annotation ``reservation.cozystack.io/make-room: "true"`` (for a drain, every VMI on the node
does), or the operator enables it for all.

A pending VM is a tenant's doing, and planning and migrating for it cost everyone: goals are
taken in turn across tenants (:func:`fair_order`), and what one tenant's pending VMs cause is
counted against that tenant (:func:`tenant_of`: a top-level tenant with its sub-tenants, so
making sub-tenants does not multiply its share).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["OPT_IN_ANNOTATION", "Goal", "fair_order", "find_goals", "for_tenant", "tenant_of"]

OPT_IN_ANNOTATION: Final = "reservation.cozystack.io/make-room"
# The scheduler's words for a pod that no node has room for (NodeResourcesFit).
_RESOURCE_SHORTAGE: Final = "Insufficient"
_FOREIGN_VM: Final = "a VM of another tenant"


@dataclass(frozen=True)
class Goal:
    kind: Literal["place", "drain"]
    key: str  # NAMESPACE/VMI for place, the node name for drain

    def __str__(self) -> str:
        return f"place {self.key}" if self.kind == "place" else f"drain {self.key}"


def find_goals(objects: Iterable[Mapping[str, object]], *, all_vms: bool) -> list[Goal]:
    """Goals in a stable order: pending VMIs (oldest first), then cordoned nodes by name."""
    nodes: dict[str, Mapping[str, object]] = {}
    vmis: list[Mapping[str, object]] = []
    unschedulable_launchers: set[tuple[str, str]] = set()
    for obj in objects:
        kind = obj.get("kind")
        if kind == "Node":
            nodes[_name(obj)] = obj
        elif kind == "VirtualMachineInstance":
            vmis.append(obj)
        elif kind == "Pod":
            labels = _map(_map(obj.get("metadata")).get("labels"))
            owner = labels.get("vm.kubevirt.io/name")
            launcher = labels.get("kubevirt.io") == "virt-launcher" and isinstance(owner, str)
            if launcher and _unschedulable_for_resources(obj):
                unschedulable_launchers.add((_namespace(obj), str(owner)))
    goals: list[Goal] = []
    pending = [
        v
        for v in vmis
        if not _node_of(v)
        and (_namespace(v), _name(v)) in unschedulable_launchers
        and (all_vms or _opted_in(v))
    ]
    pending.sort(key=lambda v: (str(_map(v.get("metadata")).get("creationTimestamp", "")), _key(v)))
    goals.extend(Goal("place", _key(v)) for v in pending)
    for name in sorted(nodes):
        if _map(nodes[name].get("spec")).get("unschedulable") is not True:
            continue
        running = [v for v in vmis if _node_of(v) == name]
        if running and (all_vms or all(_opted_in(v) for v in running)):
            goals.append(Goal("drain", name))
    return goals


def tenant_of(namespace: str) -> str:
    """The top-level tenant a namespace belongs to: ``tenant-acme-dev`` -> ``tenant-acme``.

    Cozystack names a tenant's namespace ``tenant-<path>``, joining the tenant names from the
    root's child down with ``-``; tenant names cannot contain dashes, so the split is exact.
    Any other namespace stands for itself.
    """
    parts = namespace.split("-")
    if parts[0] != "tenant" or len(parts) < 2 or not parts[1]:
        return namespace
    return f"tenant-{parts[1]}"


def for_tenant(message: str, tenant: str, vm_keys: Iterable[str]) -> str:
    """``message`` as the tenant ``tenant`` may read it (an Event in its namespace): every VM of
    ``vm_keys`` (``namespace/name``) that belongs to another tenant is named only as such.

    A plan for a tenant's pending VM moves other tenants' VMs, and the tenant chose to ask for
    it (the opt-in annotation is on its own VM): naming those VMs would tell it what others run
    and where, which the room warning at admission is careful never to say.
    """
    foreign = sorted(
        (key for key in set(vm_keys) if tenant_of(key.split("/", 1)[0]) != tenant),
        key=len,
        reverse=True,
    )
    for key in foreign:
        if key in message:
            message = re.sub(rf"(?<![\w.-]){re.escape(key)}(?![\w.-])", _FOREIGN_VM, message)
    return message


def fair_order(
    goals: Sequence[Goal], *, per_tenant: int | None = None, turn: int = 0
) -> list[Goal]:
    """Pending VMs in turn across tenants (each tenant's first, then each one's second ...),
    then the drains.

    With ``per_tenant``, at most that many of one tenant's pending VMs are taken, the
    ``turn``-th batch of them in the order of ``goals``: a caller advancing ``turn`` every round
    plans each of a tenant's many pending VMs in its turn, and one tenant's hundred pending VMs
    cost a round no more than ``per_tenant`` goals.
    """
    queues: dict[str, list[Goal]] = {}
    for goal in goals:
        if goal.kind == "place":
            queues.setdefault(tenant_of(goal.key.split("/", 1)[0]), []).append(goal)
    if per_tenant is not None:
        for tenant, queue in queues.items():
            start = (turn * max(1, per_tenant)) % len(queue)
            rotated = queue[start:] + queue[:start]
            queues[tenant] = rotated[: max(0, per_tenant)]
    ordered: list[Goal] = []
    depth = max((len(q) for q in queues.values()), default=0)
    for index in range(depth):
        ordered.extend(q[index] for q in queues.values() if index < len(q))
    return ordered + [g for g in goals if g.kind == "drain"]


def _unschedulable_for_resources(pod: Mapping[str, object]) -> bool:
    if _map(pod.get("spec")).get("nodeName"):
        return False
    conditions = _map(pod.get("status")).get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        condition = _map(condition)
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
            and _RESOURCE_SHORTAGE in str(condition.get("message", ""))
        ):
            return True
    return False


def _opted_in(vmi: Mapping[str, object]) -> bool:
    annotations = _map(_map(vmi.get("metadata")).get("annotations"))
    return annotations.get(OPT_IN_ANNOTATION) == "true"


def _node_of(vmi: Mapping[str, object]) -> str:
    status = _map(vmi.get("status"))
    if status.get("phase") in ("Succeeded", "Failed"):
        return ""
    node = status.get("nodeName")
    return node if isinstance(node, str) else ""


def _key(obj: Mapping[str, object]) -> str:
    return f"{_namespace(obj)}/{_name(obj)}"


def _name(obj: Mapping[str, object]) -> str:
    return str(_map(obj.get("metadata")).get("name", ""))


def _namespace(obj: Mapping[str, object]) -> str:
    return str(_map(obj.get("metadata")).get("namespace", ""))


def _map(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}

"""Cluster objects for the capacity tests: nodes, launcher pods and VMIs as the API returns them.

``hostile_mixed_cluster`` is the planner's worst case found so far: nearly full nodes of mixed
VMs (memory-heavy and cpu-heavy, alternately) and a pending VM that needs both memory and cpu
freed on every node, so the sets of VMs that could make room are many on every node.
"""

from __future__ import annotations

import random
from typing import Any

from webhook.core.capacity.rebalance import OPT_IN_ANNOTATION

Obj = dict[str, Any]


def node_object(name: str, memory_mi: int, cpu_m: int) -> Obj:
    labels = {"kubernetes.io/hostname": name, "kubevirt.io/schedulable": "true"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"memory": f"{memory_mi}Mi", "cpu": f"{cpu_m}m", "pods": "250"}},
    }


def vm_objects(
    namespace: str, name: str, memory_mi: int, cpu_m: int, where: str | None
) -> list[Obj]:
    """A VMI (opted in to making room) and its launcher pod, running on ``where`` or pending
    for lack of resources."""
    requests = {"memory": f"{memory_mi}Mi", "cpu": f"{cpu_m}m"}
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"virt-launcher-{name}",
            "namespace": namespace,
            "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": name},
        },
        "spec": {
            "nodeSelector": {"kubevirt.io/schedulable": "true"},
            "containers": [{"name": "compute", "resources": {"requests": requests}}],
        },
        "status": {"phase": "Running"},
    }
    vmi: Obj = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {OPT_IN_ANNOTATION: "true"},
            "creationTimestamp": "2026-11-30T00:00:00Z",
        },
        "spec": {"domain": {"resources": {"requests": {"memory": f"{memory_mi}Mi"}}}},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "LiveMigratable", "status": "True"}],
        },
    }
    if where:
        pod["spec"]["nodeName"] = where
        vmi["status"]["nodeName"] = where
    else:
        vmi["status"]["phase"] = "Scheduling"
        pod["status"] = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/9 nodes are available: 9 Insufficient cpu, memory.",
                }
            ],
        }
    return [pod, vmi]


def hostile_mixed_cluster(
    *,
    nodes: int = 8,
    per_node: int = 70,
    seed: int = 3,
    memory_short_mi: int = 4096,
    cpu_short_m: int = 7000,
    pending: str = "tenant-evil/pending",
) -> list[Obj]:
    """``nodes`` nearly full nodes of ``per_node`` mixed VMs each, a spare node with room for
    what moves but not for the pending VM, and the pending VM, short of ``memory_short_mi`` and
    ``cpu_short_m`` beyond the freest node."""
    rng = random.Random(seed)
    objects: list[Obj] = []
    free: list[tuple[int, int]] = []
    for i in range(nodes):
        name = f"worker-{i}"
        used_mi = used_m = 0
        for j in range(per_node):
            if j % 2:
                memory, cpu = rng.randint(2, 4) * 512, rng.randint(1, 2) * 250
            else:
                memory, cpu = rng.randint(1, 2) * 256, rng.randint(2, 4) * 500
            objects += vm_objects(f"tenant-t{j % 5}", f"vm-{i}-{j}", memory, cpu, name)
            used_mi, used_m = used_mi + memory, used_m + cpu
        spare_mi, spare_m = rng.randint(0, 4) * 256, rng.randint(0, 4) * 250
        objects.append(node_object(name, used_mi + spare_mi, used_m + spare_m))
        free.append((spare_mi, spare_m))
    memory = max(f[0] for f in free) + memory_short_mi
    cpu = max(f[1] for f in free) + cpu_short_m
    objects.append(node_object("spare", memory - 1024, 4 * cpu))
    namespace, name = pending.split("/", 1)
    objects += vm_objects(namespace, name, memory, cpu, None)
    return objects

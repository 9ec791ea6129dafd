"""Reading a capacity snapshot from Kubernetes objects: Nodes, Pods and VirtualMachineInstances.

The input is what an operator can produce today (``kubectl get
nodes,pods,virtualmachineinstances -A -o yaml``) or what the rebalancer lists: each node's
allocatable resources, labels, taints and cordon; each pod's effective requests (containers,
sidecars, the largest init container, overhead); each VM's launcher request as scheduled (its
launcher pod's, or for a pending VM with no pod the guest plus KubeVirt's overhead), whether it
can live-migrate, and the constraints its launcher carries. Every value is hostile: a malformed
object raises :class:`~webhook.core.capacity.snapshot.SnapshotError` naming the object and
field, and counts of objects and terms are bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from webhook.core.base.errors import QuantityError
from webhook.core.capacity.overhead import (
    MEMORY_OVERHEAD_ANNOTATION,
    launcher_memory,
    launcher_shape,
)
from webhook.core.capacity.scheduling import (
    HOSTNAME,
    AntiAffinity,
    NodeSelectorRequirement,
    Placement,
    Taint,
    Toleration,
)
from webhook.core.capacity.snapshot import PODS, VM, Node, Pod, Snapshot, SnapshotError, milli

__all__ = ["snapshot_from_objects"]

# The scheduler turns spec.unschedulable into this taint (NodeUnschedulable plugin).
UNSCHEDULABLE_TAINT: Final = "node.kubernetes.io/unschedulable"
# Bounds on hostile input: the largest clusters KubeVirt documents are far below these.
MAX_OBJECTS: Final = 200_000
MAX_TERMS: Final = 64


def snapshot_from_objects(objects: Iterable[Mapping[str, object]]) -> Snapshot:
    """Read Nodes, Pods and VirtualMachineInstances (any order; other kinds are ignored)."""
    nodes: list[Node] = []
    pods: list[Mapping[str, object]] = []
    vmis: list[Mapping[str, object]] = []
    for count, obj in enumerate(objects):
        if count >= MAX_OBJECTS:
            raise SnapshotError(f"more than {MAX_OBJECTS} objects")
        if not isinstance(obj, Mapping):
            raise SnapshotError(f"item {count}: not an object")
        kind = obj.get("kind")
        if kind == "Node":
            nodes.append(_node(obj))
        elif kind == "Pod":
            pods.append(obj)
        elif kind == "VirtualMachineInstance":
            vmis.append(obj)
    vm_names = {(_namespace(v), _name(v)) for v in vmis}
    launchers: dict[tuple[str, str], list[Mapping[str, object]]] = {}
    others: list[Pod] = []
    for pod in pods:
        status = _map(pod.get("status"))
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        labels = _labels(pod)
        owner = labels.get("vm.kubevirt.io/name") or labels.get("kubevirt.io/vm")
        ns = _namespace(pod)
        if labels.get("kubevirt.io") == "virt-launcher" and (ns, owner) in vm_names:
            launchers.setdefault((ns, str(owner)), []).append(pod)
            continue
        node = _map(pod.get("spec")).get("nodeName")
        if not isinstance(node, str) or not node:
            continue  # a pending non-VM pod holds nothing yet
        spec = _map(pod.get("spec"))
        others.append(
            Pod(
                name=_name(pod),
                namespace=ns,
                node=node,
                requests=_pod_requests(pod),
                labels=labels,
                anti_affinity=_anti_affinity(_map(spec.get("affinity")), _where(pod)),
            )
        )
    vms = [_vm(vmi, launchers.get((_namespace(vmi), _name(vmi)), [])) for vmi in vmis]
    return Snapshot(nodes=tuple(nodes), pods=tuple(others), vms=tuple(vms))


def _vm(vmi: Mapping[str, object], pods: Sequence[Mapping[str, object]]) -> VM:
    where = _where(vmi)
    spec = _map(vmi.get("spec"))
    status = _map(vmi.get("status"))
    node = status.get("nodeName")
    node = node if isinstance(node, str) and node else None
    phase = status.get("phase")
    if phase in ("Succeeded", "Failed"):
        node = None
    # The launcher that holds the VM: on the VMI's node, else the newest pending one.
    pod = next((p for p in pods if _map(p.get("spec")).get("nodeName") == node), None)
    if pod is None and node is None and pods:
        pod = pods[-1]
    try:
        shape = launcher_shape(spec)
    except QuantityError as exc:
        raise SnapshotError(f"{where}: {exc}") from exc
    if pod is not None:
        requests = _pod_requests(pod)
        memory_source = "pod"
        pod_spec = _map(pod.get("spec"))
        placement = _placement(pod_spec, where)
        labels = _labels(pod)
    else:
        annotation = _map(_map(vmi.get("metadata")).get("annotations")).get(
            MEMORY_OVERHEAD_ANNOTATION
        )
        memory, memory_source = launcher_memory(
            shape, annotation=annotation if isinstance(annotation, str) else None
        )
        requests = {"memory": memory * 1000, PODS: 1000}
        cpu = _map(_map(_map(spec.get("domain")).get("resources")).get("requests")).get("cpu")
        # KubeVirt requests 1/cpuAllocationRatio (default 10) of a CPU per vCPU.
        requests["cpu"] = _milli(cpu, where, "cpu") if cpu is not None else shape.vcpus * 100
        placement = _placement(spec, where)
        placement = Placement(
            node_selector=(*placement.node_selector, ("kubevirt.io/schedulable", "true")),
            affinity=placement.affinity,
            tolerations=placement.tolerations,
            anti_affinity=placement.anti_affinity,
        )
        labels = {**_labels(vmi), "kubevirt.io": "virt-launcher"}
    migratable, why = _migratable(vmi, spec, status)
    return VM(
        namespace=_namespace(vmi),
        name=_name(vmi),
        node=node,
        requests=requests,
        migratable=migratable,
        why_not_migratable=why,
        labels=labels,
        placement=placement,
        memory_source=memory_source,
    )


def _migratable(
    vmi: Mapping[str, object], spec: Mapping[str, object], status: Mapping[str, object]
) -> tuple[bool, str]:
    conditions = status.get("conditions")
    live = None
    if isinstance(conditions, list):
        for condition in conditions:
            if isinstance(condition, Mapping) and condition.get("type") == "LiveMigratable":
                live = condition
    if live is None:
        return False, "no LiveMigratable condition"
    if live.get("status") != "True":
        reason = live.get("reason") or live.get("message") or "LiveMigratable is False"
        return False, f"not live-migratable ({reason})"
    if spec.get("evictionStrategy") == "None":
        return False, "evictionStrategy None"
    migration = _map(status.get("migrationState"))
    if migration and not migration.get("completed") and not migration.get("failed"):
        return False, "a migration is in progress"
    return True, ""


def _node(obj: Mapping[str, object]) -> Node:
    where = _where(obj)
    status = _map(obj.get("status"))
    spec = _map(obj.get("spec"))
    allocatable = {
        str(k): _milli(v, where, f"status.allocatable.{k}")
        for k, v in _map(status.get("allocatable")).items()
    }
    taints = []
    raw = spec.get("taints")
    if isinstance(raw, list):
        for item in raw[:MAX_TERMS]:
            item = _map(item)
            taints.append(
                Taint(
                    key=str(item.get("key", "")),
                    value=str(item.get("value", "") or ""),
                    effect=str(item.get("effect", "")),
                )
            )
    unschedulable = spec.get("unschedulable") is True
    if unschedulable and not any(t.key == UNSCHEDULABLE_TAINT for t in taints):
        taints.append(Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule"))
    labels = {**_labels(obj)}
    labels.setdefault(HOSTNAME, _name(obj))
    return Node(
        name=_name(obj),
        allocatable=allocatable,
        labels=labels,
        taints=tuple(taints),
        unschedulable=unschedulable,
    )


def _pod_requests(pod: Mapping[str, object]) -> dict[str, int]:
    """Effective requests: max(sum of containers and sidecars, largest init) plus overhead."""
    where = _where(pod)
    spec = _map(pod.get("spec"))
    regular: dict[str, int] = {}
    for index, container in enumerate(_list(spec.get("containers"))):
        for k, v in _container_requests(container, where, f"spec.containers[{index}]").items():
            regular[k] = regular.get(k, 0) + v
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for index, container in enumerate(_list(spec.get("initContainers"))):
        requests = _container_requests(container, where, f"spec.initContainers[{index}]")
        if _map(container).get("restartPolicy") == "Always":
            for k, v in requests.items():
                sidecars[k] = sidecars.get(k, 0) + v
        else:
            for k, v in requests.items():
                init_peak[k] = max(init_peak.get(k, 0), v + sidecars.get(k, 0))
    total = {k: regular.get(k, 0) + sidecars.get(k, 0) for k in {*regular, *sidecars}}
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    for key, value in _map(spec.get("overhead")).items():
        total[str(key)] = total.get(str(key), 0) + _milli(value, where, f"spec.overhead.{key}")
    total[PODS] = 1000
    return total


def _container_requests(container: object, where: str, path: str) -> dict[str, int]:
    resources = _map(_map(container).get("resources"))
    requests = _map(resources.get("requests"))
    limits = _map(resources.get("limits"))
    # A limit without a request defaults the request to the limit (API defaulting).
    merged = {**limits, **requests}
    return {str(k): _milli(v, where, f"{path}.resources.requests.{k}") for k, v in merged.items()}


def _placement(spec: Mapping[str, object], where: str) -> Placement:
    selector = tuple(
        (str(k), str(v)) for k, v in list(_map(spec.get("nodeSelector")).items())[:MAX_TERMS]
    )
    affinity = _map(spec.get("affinity"))
    required = _map(
        _map(affinity.get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    terms: tuple[tuple[NodeSelectorRequirement, ...], ...] | None = None
    if required:
        terms = tuple(
            _requirements(_map(term).get("matchExpressions"), field=False)
            + _requirements(_map(term).get("matchFields"), field=True)
            for term in _list(required.get("nodeSelectorTerms"))[:MAX_TERMS]
        )
    tolerations = tuple(
        Toleration(
            key=str(_map(t).get("key", "") or ""),
            operator=str(_map(t).get("operator", "Equal") or "Equal"),
            value=str(_map(t).get("value", "") or ""),
            effect=str(_map(t).get("effect", "") or ""),
        )
        for t in _list(spec.get("tolerations"))[:MAX_TERMS]
    )
    return Placement(
        node_selector=selector,
        affinity=terms,
        tolerations=tolerations,
        anti_affinity=_anti_affinity(affinity, where),
    )


def _anti_affinity(affinity: Mapping[str, object], where: str) -> tuple[AntiAffinity, ...]:
    terms = _list(
        _map(affinity.get("podAntiAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    result = []
    for term in terms[:MAX_TERMS]:
        term = _map(term)
        if term.get("topologyKey") != HOSTNAME:
            continue  # zone-level anti-affinity is not modelled; it never blocks a same-zone move
        selector = _map(term.get("labelSelector"))
        namespaces = term.get("namespaces")
        result.append(
            AntiAffinity(
                match_labels=tuple(
                    (str(k), str(v)) for k, v in _map(selector.get("matchLabels")).items()
                ),
                expressions=_requirements(selector.get("matchExpressions"), field=False),
                namespaces=tuple(str(n) for n in namespaces)
                if isinstance(namespaces, list) and namespaces
                else None,
            )
        )
    return tuple(result)


def _requirements(raw: object, *, field: bool) -> tuple[NodeSelectorRequirement, ...]:
    return tuple(
        NodeSelectorRequirement(
            key=str(_map(item).get("key", "")),
            operator=str(_map(item).get("operator", "")),
            values=tuple(str(v) for v in _list(_map(item).get("values"))[:MAX_TERMS]),
            field=field,
        )
        for item in _list(raw)[:MAX_TERMS]
    )


def _milli(value: object, where: str, path: str) -> int:
    try:
        return milli(value)
    except QuantityError as exc:
        raise SnapshotError(f"{where}: {path}: {exc}") from exc


def _where(obj: Mapping[str, object]) -> str:
    kind = obj.get("kind", "object")
    ns = _namespace(obj)
    return f"{kind} {ns + '/' if ns else ''}{_name(obj)}"


def _name(obj: Mapping[str, object]) -> str:
    name = _map(obj.get("metadata")).get("name")
    if not isinstance(name, str) or not name:
        raise SnapshotError(f"a {obj.get('kind', 'object')} has no metadata.name")
    return name


def _namespace(obj: Mapping[str, object]) -> str:
    ns = _map(obj.get("metadata")).get("namespace")
    return ns if isinstance(ns, str) else ""


def _labels(obj: Mapping[str, object]) -> dict[str, str]:
    return {
        str(k): str(v)
        for k, v in _map(_map(obj.get("metadata")).get("labels")).items()
        if isinstance(v, str)
    }


def _map(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []

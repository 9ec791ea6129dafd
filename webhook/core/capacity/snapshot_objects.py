"""A cluster snapshot for capacity planning: nodes, what runs on them, and which VMs can move.

The planner never sees Kubernetes objects; it sees this model, read from what an operator can
produce today (``kubectl get nodes,pods,virtualmachineinstances -A -o yaml``): each node's
allocatable resources, labels, taints and cordon; each pod's effective requests; each VM's
launcher request as scheduled (guest plus KubeVirt's overhead), whether it can live-migrate, and
the constraints its launcher pod carries (node selector, required node affinity, tolerations,
required pod anti-affinity on ``kubernetes.io/hostname``).

Quantities are exact integers in milli-units (``1`` CPU is 1000, ``1Mi`` is 1048576000), so
comparisons never round. Every value in the input is treated as hostile: malformed objects raise
:class:`SnapshotError` naming the object and field, never an exception from deep inside.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING
from typing import Final

from webhook.core.base.errors import QuantityError, ReservationError
from webhook.core.base.quantities import parse_quantity
from webhook.core.capacity.overhead import (
    MEMORY_OVERHEAD_ANNOTATION,
    launcher_memory,
    launcher_shape,
)

__all__ = [
    "HOSTNAME",
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
    "snapshot_from_objects",
]

HOSTNAME: Final = "kubernetes.io/hostname"
PODS: Final = "pods"
# The scheduler turns spec.unschedulable into this taint (NodeUnschedulable plugin).
UNSCHEDULABLE_TAINT: Final = "node.kubernetes.io/unschedulable"
# Bounds on hostile input: the largest clusters KubeVirt documents are far below these.
MAX_OBJECTS: Final = 200_000
MAX_TERMS: Final = 64


class SnapshotError(ReservationError):
    """An object in a snapshot cannot be read; the message names it and the field."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class NodeSelectorRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()
    field: bool = False  # matchFields (metadata.name) rather than matchExpressions

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        present = self.key in labels if not self.field else self.key == "metadata.name"
        value = labels.get(self.key, "") if not self.field else name
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator in ("Gt", "Lt") and present and len(self.values) == 1:
            try:
                left, right = int(value), int(self.values[0])
            except ValueError:
                return False
            return left > right if self.operator == "Gt" else left < right
        return False


@dataclass(frozen=True)
class AntiAffinity:
    """A required pod anti-affinity term on ``kubernetes.io/hostname``."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[NodeSelectorRequirement, ...] = ()
    namespaces: tuple[str, ...] | None = None  # None: the pod's own namespace

    def matches(self, labels: Mapping[str, str], namespace: str, own_namespace: str) -> bool:
        if namespace not in (self.namespaces or (own_namespace,)):
            return False
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        return all(e.matches(labels, "") for e in self.expressions)


@dataclass(frozen=True)
class Placement:
    """Where a pod may be scheduled, as the scheduler's filters see it."""

    node_selector: tuple[tuple[str, str], ...] = ()
    # Required node affinity: OR over terms, AND within a term. None: no constraint.
    affinity: tuple[tuple[NodeSelectorRequirement, ...], ...] | None = None
    tolerations: tuple[Toleration, ...] = ()
    anti_affinity: tuple[AntiAffinity, ...] = ()

    def allows(self, node: Node) -> bool:
        if any(node.labels.get(k) != v for k, v in self.node_selector):
            return False
        if self.affinity is not None and not any(
            all(r.matches(node.labels, node.name) for r in term) for term in self.affinity
        ):
            return False
        return all(
            any(t.tolerates(taint) for t in self.tolerations)
            for taint in node.taints
            if taint.effect in ("NoSchedule", "NoExecute")
        )

    def why_not(self, node: Node) -> str:
        if any(node.labels.get(k) != v for k, v in self.node_selector):
            return "node selector"
        if self.affinity is not None and not any(
            all(r.matches(node.labels, node.name) for r in term) for term in self.affinity
        ):
            return "node affinity"
        for taint in node.taints:
            if taint.effect in ("NoSchedule", "NoExecute") and not any(
                t.tolerates(taint) for t in self.tolerations
            ):
                return f"taint {taint.key}"
        return ""


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

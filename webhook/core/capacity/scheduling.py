"""The scheduler's filters the capacity planner models: taints, node selection, anti-affinity.

A VM may move only to a node its launcher pod could be scheduled on, so the planner applies the
filters the scheduler would: a node's ``NoSchedule`` and ``NoExecute`` taints against the pod's
tolerations, its node selector and required node affinity (OR over terms, AND within one), and
required pod anti-affinity on ``kubernetes.io/hostname`` (zone-level terms are not modelled).
Each is a value with the rule that matches it; reading them from objects is
:mod:`webhook.core.capacity.snapshot_objects`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from webhook.core.capacity.snapshot import Node

__all__ = [
    "HOSTNAME",
    "AntiAffinity",
    "NodeSelectorRequirement",
    "Placement",
    "Taint",
    "Toleration",
]

HOSTNAME: Final = "kubernetes.io/hostname"


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

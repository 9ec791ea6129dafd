"""The sizes that names stand for: KubeVirt instance types and Cozystack resource presets.

Two different tables whose names overlap and must never be mixed: as an instance type
``u1.medium`` is 1 vCPU / 4Gi (``VirtualMachineClusterInstancetype.spec.cpu.guest`` and
``spec.memory.guest``), as a cozy-lib preset it is 2 CPU / 8Gi. Contracts say which table a
value is looked up in. This module turns the manifests and the preset table into values and
offers them behind the :class:`Catalog` port, so evaluation never touches a cluster or a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from webhook.core.base.errors import QuantityError
from webhook.core.base.quantities import format_quantity, parse_quantity

__all__ = [
    "CLUSTER_INSTANCETYPE",
    "NAMESPACED_INSTANCETYPE",
    "Catalog",
    "InstanceType",
    "Preset",
    "StaticCatalog",
    "instance_type_from_manifest",
    "presets_from_table",
]

CLUSTER_INSTANCETYPE = "VirtualMachineClusterInstancetype"
NAMESPACED_INSTANCETYPE = "VirtualMachineInstancetype"


@dataclass(frozen=True, slots=True)
class InstanceType:
    """A KubeVirt instance type's guest size, and the GPUs it attaches."""

    name: str
    cpu: Decimal
    memory: Decimal
    devices: Mapping[str, Decimal] = field(default_factory=dict)
    namespace: str = ""  # empty for the cluster-scoped kind
    # Built once: every evaluation that sizes by this type digests it.
    _fingerprint: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        devices = ",".join(f"{k}={format_quantity(v)}" for k, v in sorted(self.devices.items()))
        scope = f"{self.namespace}/" if self.namespace else ""
        text = (
            f"instancetype:{scope}{self.name}:cpu={format_quantity(self.cpu)},"
            f"memory={format_quantity(self.memory)};{devices}"
        )
        object.__setattr__(self, "_fingerprint", text)

    def resources(self) -> dict[str, Decimal]:
        """The charge of one VM of this type: guest CPU and memory plus its GPUs."""
        return {"cpu": self.cpu, "memory": self.memory, **self.devices}

    def fingerprint(self) -> str:
        """A stable text of what the size depends on, for contract digests."""
        return self._fingerprint


@dataclass(frozen=True, slots=True)
class Preset:
    """A cozy-lib resource preset: the per-replica limits of a component."""

    name: str
    resources: Mapping[str, Decimal]
    replacement: str = ""  # set for deprecated flat aliases such as ``medium``
    # Built once: every evaluation that sizes by this preset digests it.
    _fingerprint: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        body = ",".join(f"{k}={format_quantity(v)}" for k, v in sorted(self.resources.items()))
        object.__setattr__(self, "_fingerprint", f"preset:{self.name}:{body}")

    def fingerprint(self) -> str:
        """A stable text of what the size depends on, for contract digests."""
        return self._fingerprint


class Catalog(Protocol):
    """Where evaluation looks names up. Implemented by the state adapters."""

    def instance_type(self, name: str, *, namespace: str = "") -> InstanceType | None:
        """The instance type ``name``: namespaced in ``namespace`` when given, else cluster."""

    def preset(self, name: str) -> Preset | None:
        """The resource preset ``name``, legacy aliases included."""


@dataclass(frozen=True)
class StaticCatalog:
    """A catalog held in memory: the offline state, and the fake for tests."""

    instance_types: Mapping[tuple[str, str], InstanceType] = field(default_factory=dict)
    presets: Mapping[str, Preset] = field(default_factory=dict)

    @classmethod
    def of(cls, instance_types: list[InstanceType], presets: Mapping[str, Preset]) -> StaticCatalog:
        return cls({(it.namespace, it.name): it for it in instance_types}, dict(presets))

    def instance_type(self, name: str, *, namespace: str = "") -> InstanceType | None:
        return self.instance_types.get((namespace, name))

    def preset(self, name: str) -> Preset | None:
        return self.presets.get(name)


def instance_type_from_manifest(manifest: Mapping[str, Any]) -> InstanceType:
    """Read an ``instancetype.kubevirt.io`` object; raises ``ValueError`` naming the field."""
    kind = manifest.get("kind")
    metadata = manifest.get("metadata") or {}
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name: missing")
    namespace = metadata.get("namespace") or "" if kind == NAMESPACED_INSTANCETYPE else ""
    spec = manifest.get("spec") or {}
    cpu = _quantity(spec, ("cpu", "guest"))
    memory = _quantity(spec, ("memory", "guest"))
    devices: dict[str, Decimal] = {}
    gpus = spec.get("gpus") or []
    if not isinstance(gpus, list):
        raise ValueError("spec.gpus: not a list")
    for index, gpu in enumerate(gpus):
        device = gpu.get("deviceName") if isinstance(gpu, Mapping) else None
        if not isinstance(device, str) or not device:
            raise ValueError(f"spec.gpus[{index}].deviceName: missing")
        devices[device] = devices.get(device, Decimal(0)) + 1
    return InstanceType(name, cpu, memory, devices, str(namespace))


def presets_from_table(table: Mapping[str, Any]) -> dict[str, Preset]:
    """Read the preset table (``presets`` and ``legacyAliases``); raises ``ValueError``."""
    result: dict[str, Preset] = {}
    for section in ("presets", "legacyAliases"):
        entries = table.get(section) or {}
        if not isinstance(entries, Mapping):
            raise ValueError(f"{section}: not a map")
        for name, entry in entries.items():
            if not isinstance(entry, Mapping):
                raise ValueError(f"{section}.{name}: not a map")
            resources: dict[str, Decimal] = {}
            for key, value in entry.items():
                if key == "replacement":
                    continue
                try:
                    resources[str(key)] = parse_quantity(value)
                except QuantityError as exc:
                    raise ValueError(f"{section}.{name}.{key}: {exc}") from exc
            result[str(name)] = Preset(str(name), resources, str(entry.get("replacement", "")))
    if not result:
        raise ValueError("presets: the table is empty")
    return result


def _quantity(spec: Mapping[str, Any], path: tuple[str, str]) -> Decimal:
    section = spec.get(path[0])
    value = section.get(path[1]) if isinstance(section, Mapping) else None
    if value is None:
        raise ValueError(f"spec.{path[0]}.{path[1]}: missing")
    try:
        return parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(f"spec.{path[0]}.{path[1]}: {exc}") from exc

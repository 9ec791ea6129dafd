"""KubeVirt's virt-launcher memory overhead: what a VM asks a node for beyond its guest memory.

A VM's launcher pod requests the guest memory **plus** an overhead that KubeVirt computes from the
VMI spec. The overhead is additive per VM (about a quarter of a gibibyte for a small VM), which is
why pod-level quotas and node capacity see more than the sizes a tenant declared, and why a
cluster can hold "enough memory in total" yet no node can start the next VM.

The model transcribes KubeVirt's ``GetMemoryOverhead`` for the release Cozystack runs (1.8):
``pkg/hypervisor/kvm/launcherhypervisorresources.go`` (lines 36-46 for the process constants and
58-146 for ``GetMemoryOverhead``; before the hypervisor split the same function lived in
``pkg/virt-controller/services/renderresources.go`` with the constants in ``template.go``):

- page tables: ``ceil(guest / 1000) * 1000 // 512`` bytes (one bit per 512 bytes, computed on a
  kilo-scaled quantity, so it rounds exactly as KubeVirt does);
- fixed launcher processes 220Mi: virt-launcher-monitor 25Mi, virt-launcher 100Mi, virtlogd 25Mi,
  virtqemud 40Mi, qemu 30Mi;
- 8Mi per vCPU (sockets x cores x threads; without a topology the CPU limit, else the request,
  at least 1) and 8Mi for the IO thread;
- 32Mi video RAM unless ``autoattachGraphicsDevice`` is false;
- conditional terms: 128Mi on arm64 (UEFI pflash), 1Gi with a VFIO device (host device, GPU or
  SR-IOV interface), 1Mi with a downward-metrics volume, 100Mi plus 10Mi per exec probe
  (liveness, readiness), 256Mi for SEV/SEV-ES/SEV-SNP, 53Mi for a TPM, 100Mi for dedicated CPUs
  or a guaranteed-QoS VM;
- finally the cluster's ``additionalGuestMemoryOverheadRatio`` multiplies the whole overhead
  (``multiplyMemory``: the kilo-scaled overhead times ``ratio - 1``, truncated, added back).

When ``spec.domain.resources.overcommitGuestOverhead`` is true the launcher requests the guest
memory alone (``WithMemoryOverhead`` in the renderer), and the overhead is not scheduled.

Network binding plugins may add their own declared overhead (``CalculateMemoryOverhead``); that
comes from the KubeVirt CR, which a snapshot does not hold, so callers pass it in.

What a running VM really occupies is its launcher pod's request as scheduled: callers prefer that,
then the pod's ``kubevirt.io/memory-overhead-bytes`` annotation, and compute this model only for a
VM that has no pod yet (:func:`launcher_memory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_DOWN, Decimal
from typing import Final, Literal

from webhook.core.base.errors import QuantityError
from webhook.core.base.quantities import parse_quantity

__all__ = [
    "MEMORY_OVERHEAD_ANNOTATION",
    "LauncherShape",
    "OverheadSource",
    "buffer_needed",
    "launcher_memory",
    "launcher_shape",
    "memory_overhead",
]

MiB: Final = 1024 * 1024

# pkg/hypervisor/kvm/launcherhypervisorresources.go, the const block (ps RSS of each process).
VIRT_LAUNCHER_MONITOR: Final = 25 * MiB
VIRT_LAUNCHER: Final = 100 * MiB
VIRTLOGD: Final = 25 * MiB
VIRTQEMUD: Final = 40 * MiB
QEMU: Final = 30 * MiB
FIXED_PROCESSES: Final = VIRT_LAUNCHER_MONITOR + VIRT_LAUNCHER + VIRTLOGD + VIRTQEMUD + QEMU
PER_VCPU: Final = 8 * MiB
IO_THREAD: Final = 8 * MiB
VIDEO_RAM: Final = 32 * MiB
ARM64_PFLASH: Final = 128 * MiB
VFIO: Final = 1024 * MiB
DOWNWARD_METRICS: Final = 1 * MiB
PROBE_BINARY: Final = 100 * MiB
PER_EXEC_PROBE: Final = 10 * MiB
SEV: Final = 256 * MiB
TPM: Final = 53 * MiB
DEDICATED_CPU: Final = 100 * MiB
PAGE_TABLE_DIVISOR: Final = 512

# The annotation KubeVirt writes on a launcher pod with the overhead it added, in bytes.
MEMORY_OVERHEAD_ANNOTATION: Final = "kubevirt.io/memory-overhead-bytes"

# A VM spec is tenant input: bound what we believe before doing arithmetic on it.
_MAX_VCPUS: Final = 4096
_MAX_MEMORY: Final = 2**63 - 1

OverheadSource = Literal["pod", "annotation", "model"]


@dataclass(frozen=True)
class LauncherShape:
    """The parts of a VMI spec that KubeVirt's overhead depends on."""

    guest_memory: int
    vcpus: int = 1
    graphics: bool = True
    arch: str = "amd64"
    vfio: bool = False
    downward_metrics: bool = False
    exec_probes: int = 0
    sev: bool = False
    tpm: bool = False
    dedicated_or_guaranteed: bool = False
    overcommit_guest_overhead: bool = False
    additional_ratio: Decimal | None = None
    binding_plugins: int = 0


def memory_overhead(shape: LauncherShape) -> int:
    """KubeVirt's memory overhead for a launcher, in bytes (``GetMemoryOverhead``)."""
    kilo_guest = _ceil_div(shape.guest_memory, 1000)
    overhead = kilo_guest * 1000 // PAGE_TABLE_DIVISOR
    overhead += FIXED_PROCESSES
    overhead += PER_VCPU * max(1, shape.vcpus)
    overhead += IO_THREAD
    if shape.graphics:
        overhead += VIDEO_RAM
    if shape.arch == "arm64":
        overhead += ARM64_PFLASH
    if shape.vfio:
        overhead += VFIO
    if shape.downward_metrics:
        overhead += DOWNWARD_METRICS
    if shape.exec_probes:
        overhead += PROBE_BINARY + PER_EXEC_PROBE * shape.exec_probes
    if shape.sev:
        overhead += SEV
    if shape.tpm:
        overhead += TPM
    if shape.dedicated_or_guaranteed:
        overhead += DEDICATED_CPU
    if shape.additional_ratio is not None:
        # multiplyMemory: int64(float64(ScaledValue(Kilo)) * (ratio - 1)) kilobytes added.
        extra = (Decimal(_ceil_div(overhead, 1000)) * (shape.additional_ratio - 1)).to_integral(
            ROUND_DOWN
        )
        overhead += int(extra) * 1000
    return overhead + shape.binding_plugins


def launcher_memory(
    shape: LauncherShape, *, pod_request: int | None = None, annotation: str | None = None
) -> tuple[int, OverheadSource]:
    """Memory a VM's launcher occupies on a node, and where the figure came from.

    The pod's own request, as scheduled, is the truth; the annotation KubeVirt wrote on the pod
    is next (guest plus that overhead); the model is the fallback for a VM with no pod.
    An annotation that is not a plain non-negative integer is ignored, never trusted.
    """
    if pod_request is not None:
        return pod_request, "pod"
    if annotation is not None and annotation.isascii() and annotation.isdigit():
        value = int(annotation)
        if value <= _MAX_MEMORY:
            return shape.guest_memory + value, "annotation"
    if shape.overcommit_guest_overhead:
        return shape.guest_memory, "model"
    return shape.guest_memory + memory_overhead(shape), "model"


def launcher_shape(vmi_spec: Mapping[str, object], *, arch: str = "amd64") -> LauncherShape:
    """Read a VMI's (or a VM template's) spec into the inputs of :func:`memory_overhead`.

    Raises :class:`QuantityError` naming the path when a size is not a quantity.
    """
    domain = _mapping(vmi_spec.get("domain"))
    resources = _mapping(domain.get("resources"))
    requests = _mapping(resources.get("requests"))
    limits = _mapping(resources.get("limits"))
    memory_value = requests.get("memory")
    path = "spec.domain.resources.requests.memory"
    if memory_value is None:
        memory_value = _mapping(domain.get("memory")).get("guest")
        path = "spec.domain.memory.guest"
    guest = _bytes(memory_value, path) if memory_value is not None else 0

    cpu = _mapping(domain.get("cpu"))
    if cpu:
        vcpus = 1
        for field in ("sockets", "cores", "threads"):
            count = cpu.get(field)
            vcpus *= (
                count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
            )
    elif "cpu" in limits:
        vcpus = _ceil(limits["cpu"], "spec.domain.resources.limits.cpu")
    elif "cpu" in requests:
        vcpus = _ceil(requests["cpu"], "spec.domain.resources.requests.cpu")
    else:
        vcpus = 1
    vcpus = min(max(vcpus, 1), _MAX_VCPUS)

    devices = _mapping(domain.get("devices"))
    interfaces = devices.get("interfaces")
    sriov = isinstance(interfaces, list) and any(
        isinstance(i, Mapping) and "sriov" in i for i in interfaces
    )
    vfio = bool(devices.get("hostDevices")) or bool(devices.get("gpus")) or sriov
    volumes = vmi_spec.get("volumes")
    downward = isinstance(volumes, list) and any(
        isinstance(v, Mapping) and "downwardMetrics" in v for v in volumes
    )
    probes = sum(
        1 for name in ("livenessProbe", "readinessProbe") if "exec" in _mapping(vmi_spec.get(name))
    )
    launch_security = _mapping(domain.get("launchSecurity"))
    tpm = _mapping(devices.get("tpm"))
    tpm_enabled = "tpm" in devices and tpm.get("enabled", True) is not False
    dedicated = cpu.get("dedicatedCpuPlacement") is True
    guaranteed = _guaranteed(requests, limits)
    return LauncherShape(
        guest_memory=guest,
        vcpus=vcpus,
        graphics=devices.get("autoattachGraphicsDevice", True) is not False,
        arch=str(vmi_spec.get("architecture") or arch),
        vfio=vfio,
        downward_metrics=downward,
        exec_probes=probes,
        sev="sev" in launch_security or "snp" in launch_security,
        tpm=tpm_enabled,
        dedicated_or_guaranteed=dedicated or guaranteed,
        overcommit_guest_overhead=resources.get("overcommitGuestOverhead") is True,
    )


def buffer_needed(shapes: list[LauncherShape], *, per_launcher: int | None = None) -> Decimal:
    """How much a pod-level quota must exceed the declared guest memory to start these VMs.

    The ratio ``sum(launcher requests) / sum(guest memory) - 1``; with ``per_launcher`` a flat
    overhead replaces the model (the proposal's table uses a measured ~468Mi).
    """
    guest = sum(s.guest_memory for s in shapes)
    if guest == 0:
        return Decimal(0)
    overhead = sum(per_launcher if per_launcher is not None else memory_overhead(s) for s in shapes)
    return Decimal(overhead) / Decimal(guest)


def _guaranteed(requests: Mapping[str, object], limits: Mapping[str, object]) -> bool:
    # WantsToHaveQOSGuaranteed: cpu and memory limits set, and requests (if set) equal to them.
    for key in ("cpu", "memory"):
        if key not in limits:
            return False
        if key in requests and requests[key] != limits[key]:
            try:
                if parse_quantity(requests[key]) != parse_quantity(limits[key]):
                    return False
            except QuantityError:
                return False
    return True


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _bytes(value: object, path: str) -> int:
    try:
        number = parse_quantity(value)
    except QuantityError as exc:
        raise QuantityError(f"{path}: {exc}") from exc
    if number < 0 or number > _MAX_MEMORY:
        raise QuantityError(f"{path}: {value!r} is out of range")
    return int(number.to_integral_value(ROUND_CEILING))


def _ceil(value: object, path: str) -> int:
    try:
        number = parse_quantity(value)
    except QuantityError as exc:
        raise QuantityError(f"{path}: {exc}") from exc
    if number < 0:
        raise QuantityError(f"{path}: {value!r} is negative")
    return int(min(number, Decimal(_MAX_VCPUS)).to_integral_value(ROUND_CEILING))


def _ceil_div(value: int, divisor: int) -> int:
    return -(-value // divisor)

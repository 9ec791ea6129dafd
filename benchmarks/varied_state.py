"""A varied state for load benchmarks: many tenants, mixed kinds and sizes, from real data.

A benchmark of one object copied 100,000 times measures a cache, not a load: every charge but
the first is a hit and every text the parser sees recurs. So the applications here are drawn
(seeded, reproducible) from the real platform data: instance types from the KubeVirt
instancetypes under ``fixtures/cozystack``, presets from the shipped preset table, kinds in the
proportions a Cozystack cluster holds them (VMs and their disks most, then databases, caches and
Kubernetes clusters), the common storage sizes and a long tail of others, replicas, external
services, resources instead of an instance type, GPUs, node groups, labels, a third with
``kubectl``'s last-applied annotation, and most with the charge record the webhook signs at
admission (some signed for other values, so not believed). The tenant tree is three levels deep
with carve-outs (children with a quota) and unbounded children. A few objects cannot be priced
(an unknown instance type or preset), as in a real dump.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLATFORM_DIR = ROOT / "fixtures" / "cozystack"
RECORD_KEY = b"benchmark-record-key-0123456789ab"
TOP_TENANTS = 100
CHILDREN = 4  # under each top-level tenant; each child has one grandchild
SEED = 20260801
# Kinds and their weight in a cluster's applications (per 1,000).
KIND_WEIGHTS = {
    "VMInstance": 380,
    "VMDisk": 300,
    "Postgres": 90,
    "Redis": 50,
    "Kubernetes": 40,
    "MariaDB": 30,
    "RabbitMQ": 25,
    "ClickHouse": 20,
    "MongoDB": 20,
    "Kafka": 15,
    "Bucket": 15,
    "KubernetesNodes": 15,
}


def varied_objects(applications: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Tenants (as one list) and ``applications`` other applications, as stored objects."""
    from webhook.core.pricing.catalog import StaticCatalog
    from webhook.state.manifests import load_platform

    platform = load_platform([PLATFORM_DIR])
    rng = random.Random(SEED)
    catalog: StaticCatalog = platform.catalog
    types = sorted(
        name
        for (namespace, name), it in catalog.instance_types.items()
        if not namespace and not it.devices and it.cpu <= 16
    )
    gpu_types = sorted(name for (_, name), it in catalog.instance_types.items() if it.devices)
    presets = sorted(name for name, p in catalog.presets.items() if not p.replacement)
    tenants, namespaces = _tenants(rng)
    kinds, weights = zip(*KIND_WEIGHTS.items(), strict=True)
    writer = _Writer(platform, rng)
    apps = []
    for index in range(applications):
        kind = rng.choices(kinds, weights)[0]
        namespace = rng.choice(namespaces)
        spec = _SPECS[kind](rng, types=types, gpu_types=gpu_types, presets=presets)
        apps.append(writer.stored(kind, namespace, f"{kind.lower()}-{index:06d}", spec))
    return [writer.stored("Tenant", *t) for t in tenants], apps


def _tenants(rng: random.Random) -> tuple[list[tuple[str, str, dict[str, Any]]], list[str]]:
    from webhook.core.tenancy.tenants import owned_namespace

    found: list[tuple[str, str, dict[str, Any]]] = []
    namespaces = []
    for top in range(TOP_TENANTS):
        name = f"team{top:03d}"
        cpu = rng.choice((200, 400, 1000, 5000))
        found.append(
            (
                "tenant-root",
                name,
                {"resourceQuotas": {"cpu": str(cpu), "memory": f"{cpu * 4}Gi", "storage": "50Ti"}},
            )
        )
        parent = owned_namespace("tenant-root", name)
        namespaces.append(parent)
        for child in range(CHILDREN):
            child_name = ("dev", "prod", "stage", "ci")[child]
            spec: dict[str, Any] = {}
            if rng.random() < 0.4:  # a carve-out
                spec = {"resourceQuotas": {"cpu": str(cpu // 10), "memory": f"{cpu // 2}Gi"}}
            found.append((parent, child_name, spec))
            owned = owned_namespace(parent, child_name)
            namespaces.append(owned)
            found.append((owned, "sandbox", {"etcd": rng.random() < 0.2}))
            namespaces.append(owned_namespace(owned, "sandbox"))
    return found, namespaces


def _vm(rng: random.Random, *, types: list[str], gpu_types: list[str], **_: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"instanceProfile": rng.choice(("ubuntu", "alpine", "fedora", "centos"))}
    draw = rng.random()
    if draw < 0.75:
        spec["instanceType"] = rng.choice(types)
    elif draw < 0.97:
        spec["resources"] = {  # beside the schema's default instance type: the larger counts
            "cpu": rng.choice((1, 2, 4, 8, "500m")),
            "memory": rng.choice(("1Gi", "2Gi", "4Gi", "8Gi", "16Gi", "3072Mi")),
        }
        if rng.random() < 0.5:
            spec["resources"]["sockets"] = rng.choice((1, 2))
    elif draw < 0.995:
        spec["instanceType"] = rng.choice(gpu_types)
        spec["gpus"] = [{"name": "nvidia.com/AD102GL_L40S"}]
    else:
        spec["instanceType"] = "x9.unknown"  # a type this cluster does not have
    spec["runStrategy"] = rng.choice(("Always", "Always", "Halted"))
    if rng.random() < 0.1:
        spec["external"] = True
        spec["externalPorts"] = [22, 443][: rng.randint(1, 2)]
    spec["disks"] = [{"name": f"disk-{rng.randrange(10**6)}"} for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.3:
        serial = rng.randrange(10**6)
        spec["cloudInit"] = f"#cloud-config\npackages: [nginx]\nruncmd:\n  - echo {serial}\n"
    return spec


# The sizes people write, most often; one size in ten is any other (a long tail).
_COMMON_SIZES = (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 80, 100, 128, 200, 250, 256, 500)


def _size(rng: random.Random, low: int = 1, high: int = 500) -> str:
    if rng.random() < 0.1:
        return f"{rng.randint(low, high)}{rng.choice(('Gi', 'Gi', 'Gi', 'Mi', 'Ti'))}"
    common = [size for size in _COMMON_SIZES if low <= size <= high] or [low]
    return f"{rng.choice(common)}Gi"


def _disk(rng: random.Random, **_: Any) -> dict[str, Any]:
    storage_class = rng.choice(("replicated", "local"))
    spec: dict[str, Any] = {"storage": _size(rng), "storageClass": storage_class}
    if rng.random() < 0.5:
        spec["source"] = {"image": {"name": rng.choice(("ubuntu", "alpine", "talos", "fedora"))}}
    return spec


def _database(rng: random.Random, *, presets: list[str], **_: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": rng.randint(1, 5),
        "resourcesPreset": rng.choice(presets) if rng.random() < 0.995 else "z1.unknown",
        "size": _size(rng, 1, 200),
    }
    if rng.random() < 0.2:
        spec["resources"] = {"cpu": rng.choice(("1", "2", "500m")), "memory": _size(rng, 1, 16)}
    if rng.random() < 0.15:
        spec["external"] = True
    return spec


def _postgres(rng: random.Random, **named: Any) -> dict[str, Any]:
    spec = _database(rng, **named)
    spec["version"] = rng.choice(("v17", "v16", "v15"))
    if rng.random() < 0.3:
        spec["users"] = {f"user{i}": {"password": f"p{rng.randrange(10**9)}"} for i in range(3)}
        spec["databases"] = {"app": {"roles": {"admin": ["user0"]}}}
    return spec


def _kubernetes(rng: random.Random, *, types: list[str], **_: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"version": rng.choice(("v1.33", "v1.32"))}
    if rng.random() < 0.7:
        groups = {}
        for group in range(rng.randint(1, 3)):
            low = rng.randint(0, 3)
            groups[f"md{group}"] = {
                "minReplicas": low,
                "maxReplicas": low + rng.randint(1, 10),
                "instanceType": rng.choice(types),
                "ephemeralStorage": _size(rng, 10, 100),
                "roles": ["ingress-nginx"],
            }
        spec["nodeGroups"] = groups
    if rng.random() < 0.3:
        spec["controlPlane"] = {"replicas": rng.choice((1, 2, 3))}
    return spec


def _nodes(rng: random.Random, *, types: list[str], **_: Any) -> dict[str, Any]:
    low = rng.randint(0, 3)
    return {
        "minReplicas": low,
        "maxReplicas": low + rng.randint(1, 8),
        "instanceType": rng.choice(types),
        "diskSize": _size(rng, 10, 100),
    }


def _clickhouse(rng: random.Random, **named: Any) -> dict[str, Any]:
    spec = _database(rng, **named)
    spec["shards"] = rng.randint(1, 3)
    spec["logStorageSize"] = _size(rng, 1, 10)
    return spec


def _kafka(rng: random.Random, *, presets: list[str], **_: Any) -> dict[str, Any]:
    return {
        "kafka": {
            "replicas": rng.randint(1, 5),
            "size": _size(rng),
            "resourcesPreset": rng.choice(presets),
        },
        "zookeeper": {
            "replicas": 3,
            "size": _size(rng, 1, 20),
            "resourcesPreset": rng.choice(presets),
        },
        "external": rng.random() < 0.1,
    }


def _bucket(rng: random.Random, **_: Any) -> dict[str, Any]:
    return {"users": {f"u{i}": {} for i in range(rng.randint(0, 3))}}


_SPECS: dict[str, Any] = {
    "VMInstance": _vm,
    "VMDisk": _disk,
    "Postgres": _postgres,
    "Redis": _database,
    "Kubernetes": _kubernetes,
    "MariaDB": _database,
    "RabbitMQ": _database,
    "ClickHouse": _clickhouse,
    "MongoDB": _database,
    "Kafka": _kafka,
    "Bucket": _bucket,
    "KubernetesNodes": _nodes,
}


class _Writer:
    """Stored objects, with the metadata a cluster adds and the record the webhook signs."""

    def __init__(self, platform: Any, rng: random.Random) -> None:
        from webhook.core.tenancy.records import RecordKeys

        self.platform = platform
        self.rng = rng
        self.keys = RecordKeys(RECORD_KEY)
        self.version = 1000

    def stored(self, kind: str, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        from webhook.core.base.errors import UNEVALUABLE
        from webhook.core.tenancy.applications import CHARGE_ANNOTATION
        from webhook.core.tenancy.records import signed_annotation, values_digest

        self.version += self.rng.randint(1, 50)
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": f"{self.version:08x}-0000-4000-8000-{self.rng.randrange(16**12):012x}",
            "resourceVersion": str(self.version),
            "generation": self.rng.randint(1, 9),
            "creationTimestamp": f"2026-0{self.rng.randint(1, 9)}-13T04:00:00Z",
            "labels": {
                "app.kubernetes.io/managed-by": "cozystack",
                "team": f"team-{self.rng.randrange(50)}",
            },
        }
        annotations: dict[str, str] = {}
        if self.rng.random() < 0.3:
            annotations["kubectl.kubernetes.io/last-applied-configuration"] = json.dumps(
                {"apiVersion": "apps.cozystack.io/v1alpha1", "kind": kind, "spec": spec}
            )
        if kind != "Tenant" and self.rng.random() < 0.8:
            signed_spec = spec if self.rng.random() < 0.95 else {**spec, "stale": True}
            try:
                charge = self.platform.charge(kind, signed_spec, namespace=namespace)
                found = self.platform.kinds[kind]
                annotations[CHARGE_ANNOTATION] = signed_annotation(
                    self.keys,
                    (kind, namespace, name),
                    values_digest(found.defaulted(signed_spec)),
                    charge.resources,
                    charge.digest,
                )
            except UNEVALUABLE:
                pass
        if annotations:
            metadata["annotations"] = annotations
        return {
            "apiVersion": "apps.cozystack.io/v1alpha1",
            "kind": kind,
            "metadata": metadata,
            "spec": spec,
        }

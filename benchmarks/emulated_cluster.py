"""An emulated cluster holding N applications, for benchmarks.sync (run in its own process).

Prints its kubeconfig path when it is ready, then serves until stdin closes. A line ``relist``
on stdin cuts every watch and compacts the history past their resume points, so every
reflector must list again (``410 Gone``); it answers ``ok``.

With ``--realistic`` each application looks like one read back from a cluster (about 2.5 KB of
JSON): its own disk names and SSH key, the charge annotation the mutating webhook records,
kubectl's last-applied annotation, Cozystack's labels, two managedFields entries and a status
with conditions. Without it, applications are bare (about 200 bytes).

Run: python -m benchmarks.emulated_cluster APPLICATIONS DIR [--realistic]
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tests.cluster import app, cluster, tenant
from webhook.core.pricing.platform import Platform
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.core.tenancy.records import RecordKeys, signed_annotation, values_digest
from webhook.state.manifests import load_platform

ROOT = Path(__file__).resolve().parent.parent
TENANTS = 1_000
TYPES = ("u1.micro", "u1.small", "u1.medium", "u1.large", "cx1.medium", "m1.large")
STAMP = "2026-11-30T12:00:00Z"
# Records signed as the webhook signs them (the server under test holds another key, so it
# verifies each and evaluates it as it stands: the cost of a record it cannot believe).
BENCHMARK_KEYS = RecordKeys(b"benchmark-record-key-0123456789ab")


def realistic(platform: Platform, index: int, namespace: str, name: str) -> dict[str, Any]:
    """A VMInstance as the API server returns it after a while in a real cluster."""
    spec = {
        "instanceType": TYPES[index % len(TYPES)],
        "instanceProfile": "ubuntu",
        "runStrategy": "Always",
        "external": index % 3 == 0,
        "externalMethod": "PortList",
        "externalPorts": [22],
        "disks": [{"name": f"{name}-system"}, {"name": f"{name}-data", "bus": "virtio"}],
        "sshKeys": [f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{index:040d} user{index}@laptop"],
    }
    charge = platform.charge("VMInstance", spec, namespace=namespace)
    obj = app("VMInstance", namespace, name, spec)
    labels = {
        "apps.cozystack.io/application.group": "apps.cozystack.io",
        "apps.cozystack.io/application.kind": "VMInstance",
        "apps.cozystack.io/application.name": name,
        "app.kubernetes.io/managed-by": "cozystack",
        "team": f"team-{index % 50}",
    }
    applied = json.dumps({**obj, "metadata": {"name": name, "namespace": namespace}})
    obj["metadata"].update(
        labels=labels,
        annotations={
            CHARGE_ANNOTATION: signed_annotation(
                BENCHMARK_KEYS,
                ("VMInstance", namespace, name),
                values_digest(platform.kinds["VMInstance"].defaulted(spec)),
                charge.resources,
                charge.digest,
            ),
            "kubectl.kubernetes.io/last-applied-configuration": applied,
        },
        managedFields=[
            {
                "manager": "kubectl-client-side-apply",
                "operation": "Update",
                "apiVersion": "apps.cozystack.io/v1alpha1",
                "time": STAMP,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {
                        "f:annotations": {
                            ".": {},
                            "f:kubectl.kubernetes.io/last-applied-configuration": {},
                        },
                        "f:labels": {".": {}, **{f"f:{k}": {} for k in labels}},
                    },
                    "f:spec": {".": {}, **{f"f:{k}": {} for k in spec}},
                },
            },
            {
                "manager": "cozystack-controller",
                "operation": "Update",
                "apiVersion": "apps.cozystack.io/v1alpha1",
                "time": STAMP,
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {".": {}, "f:conditions": {}, "f:version": {}}},
                "subresource": "status",
            },
        ],
    )
    obj["status"] = {
        "version": "0.17.1",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "lastTransitionTime": STAMP,
                "reason": "ReconciliationSucceeded",
                "message": f"Helm install succeeded for release {namespace}/vm-instance-{name}.v1 "
                "with chart vm-instance@0.17.1",
            },
            {
                "type": "Released",
                "status": "True",
                "lastTransitionTime": STAMP,
                "reason": "InstallSucceeded",
                "message": "Helm install succeeded",
            },
        ],
    }
    return obj


async def main() -> None:
    count, directory = int(sys.argv[1]), Path(sys.argv[2])
    platform = load_platform([ROOT / "fixtures" / "cozystack"])
    rich = "--realistic" in sys.argv[3:]
    async with cluster(directory, bookmark_interval=5.0) as (server, kubeconfig):
        for index in range(TENANTS):
            server.create(tenant("tenant-root", f"t{index}", {"memory": "100000Gi"}))
        for index in range(count):
            namespace, name = f"tenant-t{index % TENANTS}", f"vm{index:06d}"
            if rich:
                server.create(realistic(platform, index, namespace, name))
            else:
                spec = {"instanceType": TYPES[index % len(TYPES)]}
                server.create(app("VMInstance", namespace, name, spec))
        print(kubeconfig, flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip() == "relist":
                # Cut every watch, move the history on and compact it: each watch's resume
                # point is now gone, so every reflector must list again.
                server.drop_watches()
                server.create(
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": f"bump-{server.resource_version}", "namespace": "x"},
                    }
                )
                server.compact()
                print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main())

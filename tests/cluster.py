"""An emulated Cozystack cluster for tests: the API server with every resource the webhook reads
or writes, loaded with the real platform data from fixtures/cozystack."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.apiserver.server import EmulatedAPIServer
from tests.builders import FIXTURES
from webhook.kube.client import KubeClient
from webhook.state.manifests import read_manifests


def platform_manifests() -> list[dict[str, Any]]:
    wanted = {"ApplicationDefinition", "VirtualMachineClusterInstancetype"}
    return [
        dict(m.body)
        for m in read_manifests([FIXTURES / "cozystack"])
        if m.body.get("kind") in wanted
    ]


def register(server: EmulatedAPIServer, *, unserved: Collection[str] = ()) -> None:
    """Register every resource the webhook uses; application plurals in ``unserved`` are left
    out (their lists get 404, as when cozystack-api does not serve a kind yet)."""
    server.resource(
        "cozystack.io",
        "v1alpha1",
        "applicationdefinitions",
        "ApplicationDefinition",
        namespaced=False,
    )
    server.resource(
        "instancetype.kubevirt.io",
        "v1beta1",
        "virtualmachineclusterinstancetypes",
        "VirtualMachineClusterInstancetype",
        namespaced=False,
    )
    server.resource(
        "instancetype.kubevirt.io",
        "v1beta1",
        "virtualmachineinstancetypes",
        "VirtualMachineInstancetype",
    )
    server.resource("", "v1", "configmaps", "ConfigMap")
    server.resource("", "v1", "resourcequotas", "ResourceQuota", status=True)
    server.resource("coordination.k8s.io", "v1", "leases", "Lease")
    server.resource("", "v1", "secrets", "Secret")
    for plural, kind in (
        ("mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
        ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration"),
    ):
        server.resource("admissionregistration.k8s.io", "v1", plural, kind, namespaced=False)
    server.resource(
        "reservation.cozystack.io",
        "v1alpha1",
        "tenantreservations",
        "TenantReservation",
        status=True,
    )
    server.resource("openreports.io", "v1alpha1", "reports", "Report")
    for manifest in platform_manifests():
        if manifest["kind"] == "ApplicationDefinition":
            application = manifest["spec"]["application"]
            if application["plural"] in unserved:
                continue
            server.resource(
                "apps.cozystack.io", "v1alpha1", application["plural"], application["kind"]
            )


def app(kind: str, namespace: str, name: str, spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def tenant(namespace: str, name: str, quotas: dict[str, str] | None = None) -> dict[str, Any]:
    return app("Tenant", namespace, name, {"resourceQuotas": quotas} if quotas else {})


@asynccontextmanager
async def cluster(
    tmp_path: Path,
    *,
    bookmark_interval: float = 0.2,
    load: bool = True,
    unserved: Collection[str] = (),
) -> AsyncIterator[tuple[EmulatedAPIServer, Path]]:
    """A started emulated cluster and a kubeconfig for it."""
    server = EmulatedAPIServer(bookmark_interval=bookmark_interval)
    register(server, unserved=unserved)
    if load:
        for manifest in platform_manifests():
            server.create(manifest)
    async with server:
        yield server, server.kubeconfig(tmp_path / "kubeconfig")


@asynccontextmanager
async def kube_client(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        yield client
    finally:
        await client.close()

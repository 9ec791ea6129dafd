"""Consistent reads behind the real cozystack-api: the HelmReleases kube-apiserver lists are
keyed as cozystack-api serves them, so a kind whose releases do not carry their application's
name in the name label (the root tenant's) is confirmed like any other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster import kube_client
from tests.cozystack_api.conftest import CozystackAPI, vm
from tests.state.test_live import live_of
from tests.test_live import Caller, caller, certs, replica, wait_ready
from tests.waiting import eventually
from webhook.core.admission.policy_reports import build_reports
from webhook.kube.client import METADATA_ONLY
from webhook.kube.pages import consistent_read
from webhook.state.consistent_reads import (
    HELM_RELEASES,
    RELEASE_GROUP,
    RELEASE_KIND_LABEL,
    release_version_of,
)

__all__ = ["caller", "certs"]

pytestmark = pytest.mark.cozystack_api

# packages/system/cozystack-basics/templates/tenant-root.yaml: served as Tenant `root`.
ROOT_RELEASE = {
    "apiVersion": "helm.toolkit.fluxcd.io/v2",
    "kind": "HelmRelease",
    "metadata": {
        "name": "tenant-root",
        "namespace": "tenant-root",
        "labels": {
            "sharding.fluxcd.io/key": "tenants",
            "apps.cozystack.io/application.kind": "Tenant",
            "apps.cozystack.io/application.group": "apps.cozystack.io",
            "apps.cozystack.io/application.name": "tenant-root",
        },
    },
    "spec": {
        "chartRef": {
            "kind": "ExternalArtifact",
            "name": "cozystack-tenant-application-default-tenant",
            "namespace": "cozy-system",
        },
        "interval": "1m0s",
        "values": {},
    },
}


async def test_the_root_tenant_labelled_other_than_its_name_is_confirmed(
    cozystack_api: CozystackAPI, certs: Path, caller: Caller
) -> None:
    env = cozystack_api
    env.apply(ROOT_RELEASE)
    served = env.get("tenants.apps.cozystack.io", "-n", "tenant-root", "root")
    written = int(served["metadata"]["resourceVersion"])
    env.tenant("reads", {"memory": "4Gi"})
    kubeconfig = env.service_account_kubeconfig()  # the shipped RBAC: HelmReleases listed
    async with replica(kubeconfig, certs, watch_resync_seconds=1.0) as webhook:
        await wait_ready(caller, webhook.port, timeout=60)
        live = live_of(webhook)
        await eventually(lambda: live._confirmed.get("Tenant", 0) >= written, 20)
        assert live._releases_readable, "read from kube-apiserver, at its current revision"
        assert live.repairs == {}, "nothing lost, nothing fetched"


async def test_a_helmrelease_read_lists_metadata_only_with_the_same_keys(
    cozystack_api: CozystackAPI,
) -> None:
    # A resync reads every kind's HelmReleases every few minutes: their values (a Kubernetes
    # cluster's, a tenant's) would be most of the bytes, and the read needs only names and
    # versions. kube-apiserver answers the metadata alone, keyed and versioned as the whole.
    env = cozystack_api
    env.tenant("meta", {"memory": "4Gi"})
    params = {"labelSelector": f"{RELEASE_KIND_LABEL}=Tenant,{RELEASE_GROUP}"}
    async with kube_client(env.service_account_kubeconfig()) as client:
        _, slim = await consistent_read(
            client, HELM_RELEASES, lambda obj: obj, params=params, accept=METADATA_ONLY
        )
        _, whole = await consistent_read(client, HELM_RELEASES, lambda obj: obj, params=params)
    assert slim, "the Tenants' releases are listed"
    assert {item["kind"] for item in slim} == {"PartialObjectMetadata"}
    assert not any("spec" in item for item in slim)
    assert [release_version_of(i, "tenant-") for i in slim] == [
        release_version_of(i, "tenant-") for i in whole
    ]
    assert len(json.dumps(slim)) < len(json.dumps(whole))


async def test_a_change_the_state_missed_is_fetched_through_cozystack_api(
    cozystack_api: CozystackAPI, certs: Path, caller: Caller
) -> None:
    # A lost event cannot be made on demand behind the real server; what the repair does then
    # can: the replica's view of one VM is set back to a version before the stored one, as a
    # lost MODIFIED leaves it. The next read of the HelmReleases finds it behind, the GET
    # through cozystack-api (the shipped RBAC's `get`) fetches it, and the state holds it
    # at the stored version again.
    env = cozystack_api
    namespace = env.tenant("fix", {"memory": "8Gi"})
    env.apply(vm("lost", namespace))
    stored = int(
        env.get("vminstances.apps.cozystack.io", "-n", namespace, "lost")["metadata"][
            "resourceVersion"
        ]
    )
    key = (namespace, "lost")
    async with replica(
        env.service_account_kubeconfig(), certs, watch_resync_seconds=1.0
    ) as webhook:
        await wait_ready(caller, webhook.port, timeout=60)
        live = live_of(webhook)
        held = live._held.setdefault("VMInstance", {})
        await eventually(lambda: held.get(key, (None, None, 0))[2] == stored, 60)
        spec, note, _ = held[key]
        held[key] = (spec, note, 1)  # what a lost change leaves: older than what is stored
        await eventually(lambda: live.repairs.get("VMInstance", 0) >= 1, 30)
        assert held[key][2] == stored


async def test_a_helmrelease_labelled_with_another_requests_name_is_named_for_removal(
    cozystack_api: CozystackAPI, certs: Path, caller: Caller
) -> None:
    """Concurrent creates of one kind can store ``vm-instance-m4`` labelled ``m0`` (a race in
    cozystack-api's Create; it cannot be made on demand, so its result is stored by hand, as
    it was seen). cozystack-api serves it as m4 and its DELETE answers 404; the webhook charges
    it, and the replica's reads of the HelmReleases name it in the policy report with the
    command that removes it. Once removed, nothing is named."""
    env = cozystack_api
    namespace = env.tenant("lbl", {"memory": "8Gi"})
    env.apply([vm("m0", namespace), vm("m4", namespace)])
    label = "apps.cozystack.io/application.name=m0"
    env.kubectl("-n", namespace, "label", "--overwrite", "helmrelease", "vm-instance-m4", label)
    deleted = env.kubectl("-n", namespace, "delete", "vminstance", "m4", check=False)
    assert "NotFound" in deleted.stderr, "cozystack-api cannot delete it"
    assert env.get("vminstances.apps.cozystack.io", "-n", namespace, "m4")  # still served
    m4 = ("VMInstance", namespace, "m4")
    async with replica(
        env.service_account_kubeconfig(), certs, watch_resync_seconds=1.0
    ) as webhook:
        await wait_ready(caller, webhook.port, timeout=60)
        live = live_of(webhook)
        await eventually(lambda: m4 in live.state.mislabelled(), 30)
        assert live.state.record(m4) is not None, "stored, so charged"
        (finding,) = [
            r
            for r in build_reports(live.state)[namespace]["results"]
            if r["resources"][0]["name"] == "m4"
        ]
        assert finding["result"] == "fail"
        assert finding["rule"] == "mislabelled-release"
        command = finding["message"].rpartition("remove it with: ")[2]
        assert command == f"kubectl -n {namespace} delete helmrelease vm-instance-m4"
        env.kubectl(*command.split()[1:])  # as the report says
        await eventually(lambda: live.state.record(m4) is None, 30)
        await eventually(lambda: m4 not in live.state.mislabelled(), 30)

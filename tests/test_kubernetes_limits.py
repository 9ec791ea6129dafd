"""Applications at Kubernetes' own limits, written through the real kube-apiserver to both webhooks.

The API server of ``../shared/kube`` (marker ``kube``; skipped, saying why, when it is absent)
stands the apps kinds in with CRDs built from the real ApplicationDefinitions, and calls the
shipped webhook configurations, pointed by URL at one replica: what is tried here is what a
tenant meets, the API server's own checks and messages included. An object the webhook leaves
alone (in the webhook's own namespace, which both configurations skip) shows what Kubernetes
stores without it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import write_path
from tests.builders import ROOT, review
from tests.cluster import kube_client, tenant
from tests.realkube import kubectl, real_apiserver
from tests.test_large_objects import stand_ins
from tests.test_live import Caller, certs, replica, wait_ready
from tests.waiting import eventually_async
from webhook.admission.ledger.entries import TENANT_RESERVATIONS
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.kube.client import ApiError, KubeClient, ResourceRef

__all__ = ["certs"]

pytestmark = pytest.mark.kube

VMINSTANCES = ResourceRef("apps.cozystack.io", "v1alpha1", "vminstances")
KUBERNETESES = ResourceRef("apps.cozystack.io", "v1alpha1", "kuberneteses")
TENANTS = ResourceRef("apps.cozystack.io", "v1alpha1", "tenants")
NAMESPACES = ResourceRef("", "v1", "namespaces", namespaced=False)
TENANT_NAMESPACE = "tenant-acme"
SMALL_NAMESPACE = "tenant-small"
SKIPPED_NAMESPACE = "cozy-reservation"  # neither configuration calls the webhook here
ANNOTATIONS_LIMIT = 262_144  # all of an object's annotations, keys and values, in bytes


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One real API server for the module: the stand-in CRDs, the platform, one tenant."""
    with real_apiserver(tmp_path_factory.mktemp("kube")) as config:
        kubectl(config, "create", "-f", "-", stdin=yaml.safe_dump_all(stand_ins()))
        kubectl(config, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        namespaces = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            for name in (SKIPPED_NAMESPACE, "tenant-root", TENANT_NAMESPACE, SMALL_NAMESPACE)
        ]
        budget = {"cpu": "1000", "memory": "1000Gi", "storage": "100Ti"}
        documents = [
            *namespaces,
            *write_path.platform_documents(),
            tenant("tenant-root", "acme", budget),
            tenant("tenant-root", "small", {"cpu": "2", "memory": "2Gi"}),  # two u1.micro VMs
        ]
        kubectl(config, "create", "-f", "-", stdin=yaml.safe_dump_all(documents))
        yield config


@pytest.fixture
async def client(
    kubeconfig: Path, certs: Path, caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[KubeClient]:
    """A cluster-admin client of the API server, while one replica serves both shipped
    configurations (with the test's certificates, as cert-manager would issue them),
    registered until the test ends: once a dry-run write comes back recorded."""
    monkeypatch.setenv("WEBHOOK_CERTS", "cert-manager")
    async with replica(kubeconfig, certs, watch_read_timeout=5.0) as webhook:
        await wait_ready(caller, webhook.port, timeout=60.0)
        deploy = list(yaml.safe_load_all((ROOT / "deploy/base/webhooks.yaml").read_text()))
        ca = (certs / "ca.crt").read_bytes()
        configurations = write_path.webhook_configurations(deploy, ca, webhook.port, webhook.port)
        for configuration in configurations:  # the serving certificate names localhost
            for hook in configuration["webhooks"]:
                url = hook["clientConfig"]["url"]
                hook["clientConfig"]["url"] = url.replace("127.0.0.1", "localhost")
        await _kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(configurations))
        try:
            async with kube_client(kubeconfig) as client:
                probe = vm("probe", {})

                async def recorded() -> bool:
                    path = VMINSTANCES.path(TENANT_NAMESPACE)
                    try:
                        got = await client.request(
                            "POST", path, params={"dryRun": "All"}, body=probe
                        )
                    except ApiError:
                        return False
                    return CHARGE_ANNOTATION in annotations_of(got)

                await eventually_async(recorded, 30)
                yield client
        finally:
            await _kubectl(
                kubeconfig,
                "delete",
                "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                "--all",
            )


async def _kubectl(kubeconfig: Path, *arguments: str, stdin: str = "") -> None:
    """kubectl without blocking the loop the replica serves on; it must succeed."""
    code, err = await _kubectl_run(kubeconfig, *arguments, stdin=stdin)
    assert code == 0, err[-600:]  # its last lines: the reason


async def _kubectl_run(kubeconfig: Path, *arguments: str, stdin: str = "") -> tuple[int, str]:
    """kubectl without blocking the loop the replica serves on: its exit code and stderr."""
    process = await asyncio.create_subprocess_exec(
        "kubectl",
        "--kubeconfig",
        str(kubeconfig),
        *arguments,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate(stdin.encode())
    return int(process.returncode or 0), err.decode()


@pytest.fixture
async def caller(certs: Path) -> AsyncIterator[Caller]:
    client = Caller(certs)
    yield client
    await client.close()


def vm(
    name: str,
    notes: dict[str, str],
    namespace: str = TENANT_NAMESPACE,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if notes:
        metadata["annotations"] = notes
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMInstance",
        "metadata": metadata,
        "spec": {"instanceType": "u1.micro", **spec},
    }


def annotations_of(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})


def annotation_bytes(notes: dict[str, str]) -> int:
    """What Kubernetes counts against its limit: every key and value, in UTF-8 bytes."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in notes.items())


def notes_of(total: int) -> dict[str, str]:
    """Annotations of 250 bytes each (the last one shorter) that take exactly ``total``."""
    notes: dict[str, str] = {}
    index = 0
    while total > 0:
        key = f"example.com/note-{index:05d}"
        value = "x" * max(0, min(250, total) - len(key))
        notes[key] = value
        total -= len(key) + len(value)
        index += 1
    return notes


# -- the charge record beside annotations at their limit ----------------------------------------


async def test_a_vm_whose_annotations_leave_no_room_for_the_charge_record_is_told_so_by_the_webhook(
    client: KubeClient,
) -> None:
    notes = notes_of(ANNOTATIONS_LIMIT - 10)  # ten bytes short of what Kubernetes allows
    assert annotation_bytes(notes) == ANNOTATIONS_LIMIT - 10
    # Kubernetes stores it where the webhook is not called ...
    stored = await client.create(VMINSTANCES, vm("full", notes, SKIPPED_NAMESPACE))
    assert annotation_bytes(annotations_of(stored)) == ANNOTATIONS_LIMIT - 10
    # ... and a tenant writing it is told what does not fit, by the webhook: not the API
    # server's "metadata.annotations: Too long", for annotations the tenant kept in bounds.
    with pytest.raises(ApiError) as refused:
        await client.create(VMINSTANCES, vm("full", notes))
    message = refused.value.message
    assert refused.value.status == 422, message
    assert "tenant reservations:" in message, message
    assert "charge record" in message, message
    assert f"take {ANNOTATIONS_LIMIT - 10} bytes" in message, message
    assert f"at most {ANNOTATIONS_LIMIT}" in message, message
    # With room for the record, the same tenant's VM is stored, recorded.
    roomy = notes_of(ANNOTATIONS_LIMIT - 2_000)
    written = await client.create(VMINSTANCES, vm("roomy", roomy))
    kept = annotations_of(written)
    assert CHARGE_ANNOTATION in kept
    assert annotation_bytes(kept) <= ANNOTATIONS_LIMIT


async def test_an_update_that_grows_annotations_past_room_for_the_record_is_told_so_by_the_webhook(
    client: KubeClient,
) -> None:
    stored = await client.create(VMINSTANCES, vm("grown", notes_of(1_000)))
    assert CHARGE_ANNOTATION in annotations_of(stored)
    # The tenant's annotations grow to five bytes short of the limit in place of the record;
    # the new charge needs a record of its own, and there is no room for one.
    grown = notes_of(ANNOTATIONS_LIMIT - 5)
    assert annotation_bytes(grown) == ANNOTATIONS_LIMIT - 5
    stored["metadata"]["annotations"] = grown
    stored["spec"]["instanceType"] = "u1.small"
    with pytest.raises(ApiError) as refused:
        await client.replace(VMINSTANCES, stored)
    message = refused.value.message
    assert refused.value.status == 422, message
    assert "charge record" in message, message


# -- values at the project's own bound, and strings full of commas -------------------------------


async def test_a_second_kubectl_apply_of_a_kubernetes_with_values_at_the_bound_is_admitted(
    kubeconfig: Path, client: KubeClient
) -> None:
    # Helm values for an addon, 19,980 entries (the values bound is 20,000), applied with
    # kubectl: the object carries itself as last-applied-configuration, and the API server
    # lists every map key in managedFields. The second apply's review (object and oldObject)
    # was refused with 413, "more than 120000 JSON values (about 162232)".
    override = {f"rule{i:04d}": {f"k{j:02d}": f"v{j}" for j in range(17)} for i in range(1_110)}
    addon = {"enabled": True, "valuesOverride": override}
    cluster = {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "Kubernetes",
        "metadata": {"name": "helm-heavy", "namespace": TENANT_NAMESPACE},
        "spec": {"addons": {"monitoringAgents": addon}},
    }
    await _kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(cluster))
    override["rule0000"]["k00"] = "changed"
    await _kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(cluster))
    stored = await client.get(KUBERNETESES, TENANT_NAMESPACE, "helm-heavy")
    addons = stored["spec"]["addons"]["monitoringAgents"]
    assert addons["valuesOverride"]["rule0000"]["k00"] == "changed"
    assert CHARGE_ANNOTATION in annotations_of(stored)


async def test_an_update_of_a_vm_whose_cloud_init_writes_a_json_file_is_admitted(
    client: KubeClient,
) -> None:
    # A cloud-init writing a JSON file of 75,000 numbers (225 KB): the UPDATE's review holds
    # 150,000 commas, every one inside a string. It was refused with 413, "more than 120000
    # JSON values (about 150000)".
    content = json.dumps([index % 10 for index in range(75_000)])
    cloud_init = f"#cloud-config\nwrite_files:\n- path: /etc/app.json\n  content: '{content}'\n"
    stored = await client.create(VMINSTANCES, vm("configured", {}, cloudInit=cloud_init))
    stored["spec"]["instanceType"] = "u1.small"
    updated = await client.replace(VMINSTANCES, stored)
    assert updated["spec"]["instanceType"] == "u1.small"
    assert updated["spec"]["cloudInit"] == cloud_init


# -- an object etcd cannot store --------------------------------------------------------------


async def test_a_vm_too_large_for_etcd_is_refused_by_the_webhook_and_holds_nothing(
    kubeconfig: Path, client: KubeClient
) -> None:
    # kube-apiserver takes request bodies up to 3 MiB; etcd stores at most 1.5 MiB. A create
    # past that was admitted, and admitted again when the API server retried it without
    # managedFields, both held: the tenant saw "etcdserver: request is too large" (500), and its
    # 2Gi pool, with nothing stored, refused its next u1.micro VM for the grace period.
    big = vm("too-large", {}, SMALL_NAMESPACE, cloudInit="x" * 1_600_000)
    code, err = await _kubectl_run(kubeconfig, "create", "-f", "-", stdin=json.dumps(big))
    assert code != 0
    assert "tenant reservations:" in err, err[-600:]
    assert "1572864" in err, err[-600:]
    for name in ("first", "second"):  # the pool's whole budget, at once
        stored = await client.create(VMINSTANCES, vm(name, {}, SMALL_NAMESPACE))
        assert CHARGE_ANNOTATION in annotations_of(stored)


# -- sub-tenant budgets at the project's own bound --------------------------------------------


def plurals() -> list[str]:
    return sorted(
        str(document["spec"]["application"]["plural"])
        for document in write_path.platform_documents()
        if document["kind"] == "ApplicationDefinition"
    )


async def created_under(
    client: KubeClient, parent: str, budget: dict[str, str], name: str, sub: dict[str, str]
) -> dict[str, Any]:
    """Tenant ``parent`` (under the root, its namespace made as the tenant chart makes it) with
    ``budget``, then sub-tenant ``name`` in it with ``sub``, once the webhook knows the parent."""
    namespace = f"tenant-{parent}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    await client.create(NAMESPACES, body)
    await client.create(TENANTS, tenant("tenant-root", parent, budget))
    stored: dict[str, Any] = {}

    async def created() -> bool:
        try:
            stored.update(await client.create(TENANTS, tenant(namespace, name, sub)))
        except ApiError as exc:
            if exc.status != 503:  # its parent not known yet: nothing else is waited out
                raise
            return False
        return True

    await eventually_async(created, 30)
    return stored


async def test_a_sub_tenant_limiting_how_many_of_every_kind_it_holds_is_admitted(
    client: KubeClient,
) -> None:
    # A count of each of the 31 kinds and six resources: 37 keys, of the 64 a budget may hold,
    # in a pool that bounds them all. Its ledger entry there (the keys the pool bounds, as the
    # charge it is expected to carry) passed 1 KiB, and the Tenant was refused for good: "the
    # request's ledger entry exceeds 1024 bytes".
    budget = {f"count/{plural}.apps.cozystack.io": "10" for plural in plurals()}
    budget.update(
        {
            "cpu": "16",
            "memory": "64Gi",
            "storage": "1Ti",
            "ephemeral-storage": "100Gi",
            "services.loadbalancers": "2",
            "nvidia.com/gpu": "4",
        }
    )
    parent = dict.fromkeys(budget, "1000") | {"memory": "1000Gi", "storage": "100Ti"}
    parent["ephemeral-storage"] = "1000Gi"
    stored = await created_under(client, "counter", parent, "counted", budget)
    assert stored["spec"]["resourceQuotas"] == budget


async def test_a_sub_tenant_with_sixty_four_budget_keys_of_the_longest_names_is_admitted(
    client: KubeClient,
) -> None:
    # The bound on a budget's keys (64), 61 of them the longest the tenant chart can render into
    # a ResourceQuota (a 244-character DNS prefix, 253 once rendered as "requests.<key>", "/",
    # a 63-character name), in a pool that bounds them all.
    prefix = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 52])
    assert len(prefix) == 244
    budget = {f"{prefix}/{index:02d}{'g' * 61}": "1000" for index in range(61)}
    budget.update({"cpu": "16", "memory": "64Gi", "storage": "1Ti"})
    parent = dict.fromkeys(budget, "100000") | {"memory": "1000Gi", "storage": "100Ti"}
    stored = await created_under(client, "widener", parent, "widest", budget)
    assert stored["spec"]["resourceQuotas"] == budget


async def test_in_warn_mode_a_sub_tenant_over_its_parents_count_of_every_kind_is_allowed_capped(
    kubeconfig: Path, certs: Path, caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # warn (the shipped default) blocks nothing: a sub-tenant over its parent's budget is
    # allowed and capped at what it counted before, the cap listed in the parent's ledger. A
    # cap of the 31 counts passed the 1 KiB a cap was held to, and the Tenant was refused with
    # 400 "the request's ledger entry exceeds 1024 bytes".
    monkeypatch.setenv("WEBHOOK_CERTS", "cert-manager")
    counts = {f"count/{plural}.apps.cozystack.io": "1" for plural in plurals()}
    parent = {**counts, "cpu": "100", "memory": "100Gi", "storage": "10Ti"}
    async with (
        replica(kubeconfig, certs, watch_read_timeout=5.0, mode="warn") as webhook,
        kube_client(kubeconfig) as client,
    ):
        await wait_ready(caller, webhook.port, timeout=60.0)
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-capper"}}
        await client.create(NAMESPACES, namespace)  # the tenant chart makes it, with its ledger's
        await client.create(TENANTS, tenant("tenant-root", "capper", parent))
        over = review(
            "Tenant",
            "tenant-capper",
            "over",
            {"resourceQuotas": dict.fromkeys(counts, "100")},
            uid="over-every-count",
        )

        async def capped() -> bool:
            answer = await caller.validate(webhook.port, over)
            assert answer["allowed"], answer  # never a refusal, in warn
            capping = "not reserved: pool tenant-capper counts this quota as"
            return any(w.startswith(capping) for w in answer.get("warnings", []))

        await eventually_async(capped, 30)
        ledger = await client.get(TENANT_RESERVATIONS, "tenant-capper", "tenant-capper")
        assert "tenant-capper-over" in ledger["status"]["capped"]

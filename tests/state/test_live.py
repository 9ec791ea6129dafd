"""The live state stays up against the emulated API server: one unlistable kind, one bad
definition, one garbage preset table, one malformed instance type or a stream of label changes
never stops admission for everything else, and readiness says why it is not ready."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

from tests.apiserver.server import EmulatedAPIServer
from tests.builders import review
from tests.cluster import app, cluster, tenant
from tests.test_live import MICRO, SILENT_READ_TIMEOUT, Caller, replica, wait_ready
from tests.waiting import eventually
from webhook.admission.report import build_report, render_report
from webhook.server import WebhookServer
from webhook.state.live import LiveState

DEFINITIONS = ("cozystack.io", "applicationdefinitions")
NAMESPACED_TYPES = ("instancetype.kubevirt.io", "virtualmachineinstancetypes")
CLUSTER_TYPES = ("instancetype.kubevirt.io", "virtualmachineclusterinstancetypes")


async def readyz(caller: Caller, port: int) -> tuple[int, str]:
    async with caller.session.get(f"https://localhost:{port}/readyz") as response:
        return response.status, await response.text()


async def metrics(caller: Caller, webhook: WebhookServer) -> str:
    """What the metrics port (plain HTTP, its own port) serves."""
    url = f"http://127.0.0.1:{webhook.metrics_port}/metrics"
    async with caller.session.get(url) as response:
        return await response.text()


def live_of(webhook: WebhookServer) -> LiveState:
    assert webhook.services is not None
    return webhook.services.live


def app_lists(server: EmulatedAPIServer, plural: str = "") -> int:
    """List requests (not watches) the server saw for applications (of one plural)."""
    return sum(
        1
        for r in server.requests
        if r.method == "GET"
        and r.path.startswith("/apis/apps.cozystack.io/")
        and r.path.endswith(f"/{plural}" if plural else "")
        and r.query.get("watch") not in ("true", "1")
    )


def widget_definition(server: EmulatedAPIServer) -> dict[str, Any]:
    """A definition whose plural the API does not serve (copied from a real one)."""
    bucket = server.get(*DEFINITIONS, None, "bucket")
    assert bucket is not None
    spec = copy.deepcopy(bucket["spec"])
    spec["application"]["kind"] = "Widget"
    spec["application"]["plural"] = "widgets"
    return {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "ApplicationDefinition",
        "metadata": {"name": "widget"},
        "spec": spec,
    }


def instance_type(name: str, namespace: str, memory: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "instancetype.kubevirt.io/v1beta1",
        "kind": "VirtualMachineInstancetype",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"cpu": {"guest": 1}, "memory": {"guest": memory}},
    }


def cluster_type(name: str, memory: str) -> dict[str, Any]:
    found = instance_type(name, "", memory)
    found["kind"] = "VirtualMachineClusterInstancetype"
    del found["metadata"]["namespace"]
    return found


def presets(text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "reservation-resource-presets", "namespace": "cozy-reservation"},
        "data": {"presets.yaml": text},
    }


GOOD_TABLE = "presets:\n  small: {cpu: '1', memory: 64Gi}\n"


# -- item 1: a kind that cannot be listed ---------------------------------------------------


async def test_an_unserved_kind_denies_only_its_own_writes_and_says_why(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "4Gi"}))
        server.create(widget_definition(server))  # plural "widgets": every list gets 404
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            allowed = await caller.validate(
                webhook.port, review("VMInstance", "tenant-acme", "vm", MICRO)
            )
            assert allowed["allowed"], allowed
            widget = await caller.validate(
                webhook.port, review("Widget", "tenant-acme", "w", {}, uid="w1")
            )
            assert not widget["allowed"]
            assert widget["status"]["code"] == 503
            assert "Widget applications cannot be listed" in widget["status"]["message"]
            assert "/apis/apps.cozystack.io/v1alpha1/widgets" in widget["status"]["message"]
            status, body = await readyz(caller, webhook.port)
            assert status == 200
            assert "kind Widget: cannot be listed" in body
            assert "404" in body
            exposed = await metrics(caller, webhook)
            assert 'reservation_kind_unavailable{kind="Widget"} 1.0' in exposed
            assert 'kind="Widget",mode="enforce",reason="kind-not-synced"' in exposed


async def test_an_unserved_kind_is_listed_again_with_backoff(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(widget_definition(server))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            await asyncio.sleep(3.0)
            # Without backoff a 3 s window would hold hundreds of lists; doubling from 0.2 s
            # (with jitter) holds a handful.
            assert 2 <= app_lists(server, "widgets") <= 7
            assert live_of(webhook).synced


async def test_unlistable_tenants_stop_admission_and_readiness_names_them(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with (
        cluster(tmp_path, unserved={"tenants"}) as (_, kubeconfig),
        replica(kubeconfig, certs) as webhook,
    ):
        await asyncio.sleep(1.5)
        status, body = await readyz(caller, webhook.port)
        assert status == 503
        assert "applications tenants (Tenant): cannot be listed" in body
        assert "/apis/apps.cozystack.io/v1alpha1/tenants" in body
        answer = await caller.validate(
            webhook.port, review("VMInstance", "tenant-acme", "v", MICRO)
        )
        assert not answer["allowed"]
        assert answer["status"]["code"] == 503


async def test_in_warn_and_off_readiness_does_not_wait_for_applications(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path, unserved={"tenants"}) as (_, kubeconfig):
        for mode in ("warn", "off"):
            async with replica(kubeconfig, certs, mode=mode) as webhook:
                await wait_ready(caller, webhook.port)  # at once: nothing to wait for
                await eventually(
                    lambda: "tenants (Tenant): cannot" in "".join(live_of(webhook).explain()[0]),
                    timeout=10,
                )
                status, body = await readyz(caller, webhook.port)
                assert status == 200
                assert "not synced: applications tenants (Tenant): cannot be listed" in body
                answer = await caller.validate(
                    webhook.port, review("VMInstance", "tenant-acme", "v", MICRO)
                )
                assert answer["allowed"], answer


# -- item 2: a definition without kind or plural -------------------------------------------


async def test_a_definition_without_plural_is_skipped_and_every_other_kind_works(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "4Gi"}))
        broken = widget_definition(server)
        del broken["spec"]["application"]["plural"]
        server.create(broken)
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            assert live.state.platform.kind("VMInstance") is not None
            assert len(live.state.platform.kinds) > 20
            assert (
                await caller.validate(
                    webhook.port, review("VMInstance", "tenant-acme", "vm", MICRO)
                )
            )["allowed"]
            status, body = await readyz(caller, webhook.port)
            assert status == 200
            assert "spec.application.plural: missing; left out" in body
            report = render_report(build_report(live.state))
            assert "Platform problems" in report
            assert "plural: missing" in report
            assert 'reservation_platform_problems{store="definitions"} 1.0' in await metrics(
                caller, webhook
            )


async def test_a_definition_that_loses_its_plural_keeps_its_last_good_kind(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig), replica(kubeconfig, certs) as webhook:
        await wait_ready(caller, webhook.port)
        live = live_of(webhook)
        generation = live.platform_generation
        server.patch(*DEFINITIONS, None, "bucket", {"spec": {"application": {"plural": None}}})
        await eventually(lambda: bool(live.problems))
        assert "plural: missing; its last good version is kept" in live.problems[0]
        assert live.state.platform.kind("Bucket") is not None
        assert "buckets" in live._apps
        assert live.platform_generation == generation  # nothing to re-price
        assert live.synced


# -- item 3: platform events ---------------------------------------------------------------


async def test_label_changes_on_instance_types_cause_no_relist(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "4Gi"}))
        server.create(instance_type("mine", "tenant-acme", "1Gi"))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            lists, generation = app_lists(server), live.platform_generation
            for round_ in range(10):
                server.patch(
                    *NAMESPACED_TYPES,
                    "tenant-acme",
                    "mine",
                    {"metadata": {"labels": {"round": str(round_)}}},
                )
                server.patch(
                    *CLUSTER_TYPES, None, "u1.micro", {"metadata": {"labels": {"r": str(round_)}}}
                )
                await asyncio.sleep(0.1)
                assert live.synced
            await asyncio.sleep(0.5)
            assert app_lists(server) == lists
            assert live.platform_generation == generation
            assert live.reprices == 0


def vms_of_one_type(server: EmulatedAPIServer, count: int) -> None:
    """Tenant acme and ``count`` VMs of the cluster instance type ``mine`` (1Gi each)."""
    server.create(tenant("tenant-root", "acme", {"memory": "100Gi"}))
    server.create(cluster_type("mine", "1Gi"))
    for index in range(count):
        spec = {"instanceType": "mine", "instanceProfile": "ubuntu"}
        server.create(app("VMInstance", "tenant-acme", f"vm{index}", spec))


def acme_memory(live: LiveState) -> Any:
    node = live.state.tree.get("tenant-acme")
    return node.usage.get("memory") if node else None


async def test_an_instance_type_resize_reprices_held_applications_without_a_relist(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        vms_of_one_type(server, 50)
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            assert dict(live.state.unknown()) == {}
            assert acme_memory(live) == 50 * 1024**3
            lists = app_lists(server)
            unsynced = 0
            server.patch(*CLUSTER_TYPES, None, "mine", {"spec": {"memory": {"guest": "2Gi"}}})

            def repriced() -> bool:
                nonlocal unsynced
                unsynced += not live.synced
                return bool(acme_memory(live) == 100 * 1024**3)

            await eventually(repriced, 10, interval=0.01)
            assert unsynced == 0  # the old state served until the new one was complete
            assert app_lists(server) == lists
            assert live.reprices == 1


async def test_deleting_the_instance_type_of_running_vms_does_not_free_their_room(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    # KubeVirt keeps a VM at the instance type it started with (a revision of it): the VMs
    # still hold their memory after the type is gone, so the re-priced state keeps counting
    # what they were last priced at instead of nothing.
    async with cluster(tmp_path) as (server, kubeconfig):
        vms_of_one_type(server, 5)
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            assert acme_memory(live) == 5 * 1024**3
            server.delete(*CLUSTER_TYPES, None, "mine")
            await eventually(lambda: len(live.state.unknown()) == 5, 10, interval=0.01)
            assert live.reprices == 1
            assert acme_memory(live) == 5 * 1024**3


async def test_a_new_definition_starts_one_watch_and_relists_nothing_else(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig), replica(kubeconfig, certs) as webhook:
        await wait_ready(caller, webhook.port)
        live = live_of(webhook)
        lists = app_lists(server)
        server.create(widget_definition(server))
        await eventually(lambda: "widgets" in live._apps)
        await asyncio.sleep(0.5)
        others = app_lists(server) - app_lists(server, "widgets")
        assert others == lists
        assert live.synced


# -- item 4: what is kept from each object ------------------------------------------------


async def test_only_spec_and_charge_annotation_are_held_from_an_application(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        heavy = app("VMInstance", "tenant-acme", "vm", MICRO)
        heavy["metadata"]["labels"] = {"team": "x" * 500}
        heavy["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:x": {}}}]
        heavy["status"] = {"conditions": [{"type": "Ready", "message": "y" * 500}]}
        server.create(heavy)
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            held = live_of(webhook)._held["VMInstance"][("tenant-acme", "vm")]
            # ... and its resourceVersion, which orders observations for the ledger.
            assert held[:2] == ('{"instanceType":"u1.micro"}', None)
            assert held[2] > 0


# -- item 7: garbage preset tables and malformed instance types ----------------------------


async def test_a_garbage_preset_table_keeps_the_last_good_one_and_is_reported(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(presets(GOOD_TABLE))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            small = live.state.platform.catalog.preset("small")
            assert small is not None
            assert small.resources["memory"] == 64 * 1024**3
            server.patch(
                "",
                "configmaps",
                "cozy-reservation",
                "reservation-resource-presets",
                {"data": {"presets.yaml": "{{ not: yaml"}},
            )
            await eventually(lambda: bool(live.problems))
            assert "its last good version is kept" in live.problems[0]
            kept = live.state.platform.catalog.preset("small")
            assert kept is not None
            assert kept.resources["memory"] == 64 * 1024**3
            status, body = await readyz(caller, webhook.port)
            assert status == 200
            assert "presets.yaml: not YAML" in body
            assert 'reservation_platform_problems{store="presets"} 1.0' in await metrics(
                caller, webhook
            )
            assert "presets.yaml: not YAML" in render_report(build_report(live.state))


async def test_a_garbage_preset_table_at_start_fails_closed_not_to_the_built_in_table(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(presets("presets: [1, 2]\n"))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            assert live.state.platform.catalog.preset("u1.medium") is None
            assert "charges that need a preset fail closed" in live.problems[0]


async def test_a_malformed_instance_type_keeps_its_last_good_size(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(instance_type("mine", "tenant-acme", "3Gi"))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            server.patch(
                *NAMESPACED_TYPES, "tenant-acme", "mine", {"spec": {"memory": {"guest": "lots"}}}
            )
            await eventually(lambda: bool(live.problems))
            found = live.state.platform.catalog.instance_type("mine", namespace="tenant-acme")
            assert found is not None
            assert found.memory == 3 * 1024**3
            assert "spec.memory.guest" in live.problems[0]
            status, body = await readyz(caller, webhook.port)
            assert status == 200
            assert "spec.memory.guest" in body
            assert 'reservation_platform_problems{store="namespaced-types"} 1.0' in (
                await metrics(caller, webhook)
            )


async def test_readiness_body_names_what_is_not_synced(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with (
        cluster(tmp_path) as (server, kubeconfig),
        replica(kubeconfig, certs, watch_read_timeout=SILENT_READ_TIMEOUT) as webhook,
    ):
        await wait_ready(caller, webhook.port)
        server.pause()
        try:
            # Every watch goes silent within its read timeout (1 s here), each on its own clock.
            await eventually(
                lambda: "applicationdefinitions:" in "".join(live_of(webhook).explain()[0]),
                timeout=5,
            )
            status, body = await readyz(caller, webhook.port)
        finally:
            server.resume()
        assert status == 503
        assert body.startswith("state not synced")
        assert "- applicationdefinitions: watch not live (watch /apis/cozystack.io/" in body

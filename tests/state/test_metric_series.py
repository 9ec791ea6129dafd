"""/metrics keeps its series bounded whatever tenants write into budgets and ResourceQuotas:
resource labels carry only keys the platform knows, everything else is summed under ``other``.
Read from a live replica (TLS listener, metrics port) against the emulated API server."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.cluster import cluster, tenant
from tests.state.test_live import live_of, metrics
from tests.test_live import Caller, replica, wait_ready
from tests.waiting import eventually
from webhook.core.pricing.catalog import InstanceType, StaticCatalog
from webhook.core.pricing.metric_keys import OTHER, fold, known_keys, quota_keys
from webhook.core.pricing.platform import Platform
from webhook.server import WebhookServer

MADE_UP = 2000


def series(text: str) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    found: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).add(tuple(sorted(sample.labels.items())))
    return found


def resource_labels(found: dict[str, set[tuple[tuple[str, str], ...]]], name: str) -> set[str]:
    return {dict(labels)["resource"] for labels in found.get(name, set())}


async def observed(
    caller: Caller, webhook: WebhookServer, pool: str, room: str
) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """The series of /metrics once they show ``pool``'s budget and ``room``'s guard room."""
    for _ in range(200):
        found = series(await metrics(caller, webhook))
        pools = {dict(x)["pool"] for x in found.get("reservation_pool_budget", set())}
        rooms = {dict(x)["namespace"] for x in found.get("reservation_guard_room", set())}
        if pool in pools and room in rooms:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"/metrics never showed pool {pool} and the room of {room}")


def quota(namespace: str, hard: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "mine", "namespace": namespace},
        "spec": {"hard": hard},
        "status": {"hard": hard, "used": {}},
    }


async def test_made_up_budget_and_quota_keys_add_no_series(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "64Gi", "cpu": "32"}))
        server.create(tenant("tenant-acme", "calm", {"memory": "1Gi", "cpu": "1"}))
        server.create(quota("tenant-acme", {"requests.memory": "64Gi"}))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            await eventually(lambda: "tenant-acme" in str(live.state.tree.pools()))
            # The baseline once /metrics shows every object above (both pools, acme's quota),
            # not the first pool alone: a series that came later would be counted as added.
            before = await observed(caller, webhook, "tenant-acme-calm", "tenant-acme")
            # A sub-Tenant with 2,000 made-up budget keys, stored as the API server stores what
            # was admitted (in warn, in off, or before the webhook ran), and a tenant's own
            # ResourceQuota with 2,000 extended-resource keys.
            made_up = {f"example.com/made-up-{i}": "1" for i in range(MADE_UP)}
            server.create(tenant("tenant-acme", "evil", {"memory": "1Gi", **made_up}))
            extended = {f"requests.example.com/device-{i}": "1" for i in range(MADE_UP)}
            server.create(quota("tenant-acme-evil", extended))
            server.create(quota("tenant-acme-calm", {"requests.memory": "1Gi"}))

            found = await observed(caller, webhook, "tenant-acme-evil", "tenant-acme-evil")
            added = sum(len(s) for s in found.values()) - sum(len(s) for s in before.values())
            # Two new pools and two new namespaces with a quota, a handful of series each; before
            # keys were folded the Tenant added about 10,005 and the quota 2,000 room series.
            assert added < 60, added
            budget_keys = resource_labels(found, "reservation_pool_budget")
            assert budget_keys <= {"memory", "cpu", OTHER}
            assert OTHER in budget_keys
            assert resource_labels(found, "reservation_guard_room") <= {
                "requests.memory",
                OTHER,
            }
            evil_budget = {
                dict(x)["resource"]
                for x in found["reservation_pool_budget"]
                if dict(x)["pool"] == "tenant-acme-evil"
            }
            assert evil_budget == {"memory", OTHER}
            text = await metrics(caller, webhook)
            assert (
                'reservation_pool_budget{pool="tenant-acme-evil",resource="other"} 2000.0' in text
            )


def test_known_keys_come_from_the_platform_not_from_tenants() -> None:
    from tests.builders import platform

    known = known_keys(platform())
    assert {"cpu", "memory", "storage", "services.loadbalancers"} <= known
    assert "count/vminstances.apps.cozystack.io" in known
    assert "example.com/made-up" not in known
    assert {"requests.memory", "limits.cpu", "pods"} <= quota_keys(known)
    folded = fold({"memory": Decimal(1), "a/b": Decimal(2), "other": Decimal(3)}, known)
    assert folded == {"memory": Decimal(1), OTHER: Decimal(5)}
    assert known_keys(Platform()) >= {"cpu", "memory"}


def test_devices_of_a_tenants_own_instance_type_are_not_platform_keys() -> None:
    from dataclasses import replace

    from tests.builders import platform

    base = platform()
    own = {
        (namespace, name): InstanceType(name, Decimal(1), Decimal(1), {device: Decimal(1)}, ns)
        for namespace, name, device, ns in (
            ("tenant-acme", "mine", "example.com/made-up-gpu", "tenant-acme"),
            ("", "shared", "nvidia.com/GA102", ""),
        )
    }
    catalog = StaticCatalog({**base.catalog.instance_types, **own}, base.catalog.presets)
    known = known_keys(replace(base, catalog=catalog))
    assert "nvidia.com/GA102" in known
    assert "example.com/made-up-gpu" not in known

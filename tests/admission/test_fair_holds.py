"""One tenant never stops another through the ledger: attacks on holds, barriers and warn-mode
carve-outs, each through the TLS server against the emulated API server. Every loop is bounded
in count and time; servers bind 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.apiserver.server import EmulatedAPIServer
from tests.builders import review
from tests.cluster import app, cluster, tenant
from tests.test_live import Caller, certs, replica, wait_ready
from tests.waiting import eventually
from webhook.server import WebhookServer

__all__ = ["certs"]

POOL = "tenant-acme"


@pytest.fixture
async def caller(certs: Path) -> AsyncIterator[Caller]:
    client = Caller(certs)
    yield client
    await client.close()


def pending(server: Any, pool: str = POOL) -> list[dict[str, Any]]:
    tres = server.get("reservation.cozystack.io", "tenantreservations", pool, pool)
    return list(((tres or {}).get("status") or {}).get("pending") or [])


async def metrics(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


@asynccontextmanager
async def serving(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
    budget: dict[str, str],
    members: list[tuple[str, str]] | None = None,
    objects: list[dict[str, Any]] | None = None,
    *,
    bookmark_interval: float = 0.2,
    **settings: Any,
) -> AsyncIterator[tuple[EmulatedAPIServer, WebhookServer]]:
    """Tenant acme with ``budget`` and its ``members`` (parent namespace, name), ``objects``
    stored, and one replica serving once every kind's watch is open."""
    async with cluster(tmp_path, bookmark_interval=bookmark_interval) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", budget))
        for parent, name in members or []:
            server.create(tenant(parent, name))
        for obj in objects or []:
            server.create(obj)
        async with replica(kubeconfig, certs, **settings) as webhook:
            await wait_ready(caller, webhook.port)
            await asyncio.sleep(0.3)
            yield server, webhook


# ---------------------------------------------------------------------------------------------
# Holds only for writes that can be stored


async def test_creates_of_an_existing_name_hold_nothing_and_never_deny_another_tenant(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    disk = app("VMDisk", "tenant-acme-a", "data", {"storage": "1Gi"})
    members = [(POOL, "a"), (POOL, "b")]  # two tenants sharing acme's pool
    async with serving(
        tmp_path,
        certs,
        caller,
        {"storage": "1000Gi"},
        members,
        [disk],
    ) as (server, webhook):
        duplicates = [
            review("VMDisk", "tenant-acme-a", "data", {"storage": "999Gi"}, uid=f"dup{i}")
            for i in range(30)
        ]
        answers = await asyncio.gather(*(caller.validate(webhook.port, b) for b in duplicates))
        for answer in answers:
            assert not answer["allowed"], answer
            assert answer["status"]["code"] == 409
            assert "VMDisk data already exists in tenant-acme-a" in answer["status"]["message"]
        assert pending(server) == [], "nothing is held for a write the API server refuses"
        other = await caller.validate(
            webhook.port, review("VMDisk", "tenant-acme-b", "disk", {"storage": "10Gi"})
        )
        assert other["allowed"], other


async def test_a_create_stored_as_another_kinds_helmrelease_holds_nothing(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    # cozystack-api stores both as HelmRelease kubernetes-nodes-x: the second CREATE is refused
    # by its storage after admission, whatever its size.
    nodes = app("KubernetesNodes", POOL, "x", {})
    async with serving(tmp_path, certs, caller, {"memory": "1000Gi"}, [], [nodes]) as (
        server,
        webhook,
    ):
        answer = await caller.validate(webhook.port, review("Kubernetes", POOL, "nodes-x", {}))
        assert not answer["allowed"], answer
        assert answer["status"]["code"] == 409
        message = answer["status"]["message"]
        assert "stored as HelmRelease kubernetes-nodes-x" in message
        assert "KubernetesNodes x already is" in message
        assert pending(server) == []
        fine = await caller.validate(webhook.port, review("Kubernetes", POOL, "k8s", {}, uid="k"))
        assert fine["allowed"], fine


async def test_an_existing_name_in_warn_mode_is_let_through_unheld(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    disk = app("VMDisk", POOL, "data", {"storage": "1Gi"})
    warn: dict[str, Any] = {"mode_for": {"VMDisk": "warn"}}
    async with serving(tmp_path, certs, caller, {"storage": "1000Gi"}, [], [disk], **warn) as (
        server,
        webhook,
    ):
        answer = await caller.validate(
            webhook.port, review("VMDisk", POOL, "data", {"storage": "999Gi"})
        )
        assert answer["allowed"]
        assert any("would be denied" in w and "exists" in w for w in answer["warnings"])
        assert pending(server) == []


# ---------------------------------------------------------------------------------------------
# A bounded share of a pool's ledger per tenant


async def test_one_tenants_burst_of_unstored_creates_refuses_only_that_tenant(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    members = [(POOL, "a"), ("tenant-acme-a", "sub"), (POOL, "b")]  # sub shares a's share
    async with serving(tmp_path, certs, caller, {"storage": "100Ti"}, members) as (_, webhook):
        burst = [
            review(
                "VMDisk",
                "tenant-acme-a" if i % 2 else "tenant-acme-a-sub",
                f"ghost{i}",
                {"storage": "1Gi"},
                uid=f"g{i}",
            )
            for i in range(120)
        ]
        answers = []
        for start in range(0, len(burst), 20):  # 20 in flight at a time
            chunk = burst[start : start + 20]
            answers += await asyncio.gather(*(caller.validate(webhook.port, b) for b in chunk))
        allowed = [a for a in answers if a["allowed"]]
        refused = [a for a in answers if not a["allowed"]]
        assert len(allowed) == 100, "one tenant holds at most its share"
        for answer in refused:
            assert answer["status"]["code"] == 429
            message = answer["status"]["message"]
            assert "tenant-acme-a already has 100" in message
            assert "its share (10% of 1000)" in message
            assert "try again" in message
        other = await caller.validate(
            webhook.port, review("VMDisk", "tenant-acme-b", "disk", {"storage": "10Gi"})
        )
        assert other["allowed"], other
        text = await metrics(webhook.metrics_port)
        assert 'reservation_ledger_entries_limit{scope="tenant"} 100.0' in text
        assert 'reservation_ledger_entries_limit{scope="pool"} 1000.0' in text
        assert "reservation_ledger_tenant_share 0.1" in text
        assert "reservation_ledger_largest_tenant_share 0.1" in text
        assert 'reason="ledger-share"' in text


async def test_a_smaller_share_is_configurable_and_bounds_each_tenant(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    small: dict[str, Any] = {"ledger_namespace_share": 0.005}
    async with serving(tmp_path, certs, caller, {"storage": "100Ti"}, **small) as (
        server,
        webhook,
    ):
        answers = [
            await caller.validate(
                webhook.port, review("VMDisk", POOL, f"g{i}", {"storage": "1Gi"}, uid=f"g{i}")
            )
            for i in range(7)
        ]
        assert [a["allowed"] for a in answers] == [True] * 5 + [False] * 2
        assert "its share (0.5% of 1000)" in answers[-1]["status"]["message"]
        assert len(pending(server)) == 5


# ---------------------------------------------------------------------------------------------
# No barrier waits on a quiet source

# No bookmarks, and a read timeout long enough that a silent watch stays live meanwhile.
QUIET: dict[str, Any] = {"watch_read_timeout": 60.0, "bookmark_interval": 3600.0}


def ledger_object(pool: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "reservation.cozystack.io/v1alpha1",
        "kind": "TenantReservation",
        "metadata": {"name": pool, "namespace": pool},
        "spec": {"pool": pool},
        "status": status,
    }


def set_ledger_status(server: Any, status: dict[str, Any]) -> None:
    """Write the pool's ledger as another replica would have."""
    tres = server.get("reservation.cozystack.io", "tenantreservations", POOL, POOL)
    assert tres is not None
    server.update_status({**tres, "status": status})


def expiry(seconds: float) -> str:
    moment = datetime.fromtimestamp(time.time() + seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def test_entries_of_a_quiet_kind_missed_by_a_replica_do_not_stall_the_pool(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    ledger = ledger_object(POOL, {})
    async with serving(tmp_path, certs, caller, {"memory": "4Gi"}, [], [ledger], **QUIET) as (
        server,
        webhook,
    ):
        # Another replica admitted a Bucket and removed its entry between two versions this
        # replica read: it sees only the count of removals grow. Nobody writes Buckets, and
        # no bookmark comes: the Bucket watch never passes that version by itself. Buckets are
        # HelmReleases to kube-apiserver, which lists them at its current revision.
        server.resource("helm.toolkit.fluxcd.io", "v2", "helmreleases", "HelmRelease")
        set_ledger_status(server, {"released": {"Bucket": 1}})
        await asyncio.sleep(0.2)
        started = time.monotonic()
        answer = await caller.validate(
            webhook.port, review("VMInstance", POOL, "vm", {"instanceType": "u1.micro"})
        )
        assert answer["allowed"], answer
        assert time.monotonic() - started < 1.5, "a consistent read, not a wait"
        releases = [r for r in server.requests if r.path.endswith("/helmreleases")]
        assert releases, "read where the revision is current"
        selector = releases[0].query["labelSelector"]
        assert selector.startswith("apps.cozystack.io/application.kind=Bucket,")


async def test_an_expired_hold_of_a_quiet_kind_stops_denying_other_tenants_at_once(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    ledger = ledger_object(POOL, {})
    async with serving(tmp_path, certs, caller, {"memory": "2Gi"}, [], [ledger], **QUIET) as (
        server,
        webhook,
    ):
        ghost = {  # another replica admitted a Bucket that is never stored
            "id": "ghost",
            "application": f"Bucket/{POOL}/never-stored",
            "charge": {"memory": "2Gi"},
            "expected": {"memory": "2Gi"},
            "expires": expiry(1.0),
            "replica": "another",
        }
        set_ledger_status(server, {"pending": [ghost]})
        await asyncio.sleep(0.2)
        body = review("VMInstance", POOL, "vm", {"instanceType": "u1.micro"}, uid="first")
        held = await caller.validate(webhook.port, body)
        assert not held["allowed"], "the hold counts while it may still be stored"
        await asyncio.sleep(1.2)  # its grace ends; its Bucket never appeared
        started = time.monotonic()
        answer = await caller.validate(
            webhook.port,
            review("VMInstance", POOL, "vm", {"instanceType": "u1.micro"}, uid="second"),
        )
        assert answer["allowed"], answer
        assert time.monotonic() - started < 1.5
        assert webhook.services is not None
        assert webhook.services.live.consistent_reads >= 1


async def test_a_stream_of_missed_entries_of_a_quiet_kind_costs_spaced_reads(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    ledger = ledger_object(POOL, {})
    async with serving(tmp_path, certs, caller, {"memory": "64Gi"}, [], [ledger], **QUIET) as (
        server,
        webhook,
    ):
        reads, elapsed, answers = await stream_missed_buckets(server, webhook, caller, 6)
        assert all(answer["allowed"] for answer in answers), answers
        assert 1 <= reads <= 1 + elapsed / 0.5, f"{reads} reads in {elapsed:.1f}s"


async def test_a_stream_of_missed_entries_of_a_kind_with_many_objects_reads_it_rarely(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    # Every consistent read lists every Bucket in the cluster: a tenant that keeps reads wanted
    # must not make the API server list a large kind twice a second.
    ledger = ledger_object(POOL, {})
    buckets = [app("Bucket", POOL, f"b{i}", {}) for i in range(40)]
    async with serving(
        tmp_path, certs, caller, {"memory": "64Gi"}, [], [ledger, *buckets], **QUIET
    ) as (server, webhook):
        assert webhook.services is not None
        live = webhook.services.live
        live.settings = replace(live.settings, confirm_objects=20.0)  # 40 Buckets: one per 2 s
        reads, elapsed, _ = await stream_missed_buckets(server, webhook, caller, 8)
        assert 1 <= reads <= 1 + elapsed / 2.0, f"{reads} reads in {elapsed:.1f}s"


async def stream_missed_buckets(
    server: Any, webhook: WebhookServer, caller: Caller, writes: int
) -> tuple[int, float, list[dict[str, Any]]]:
    """``writes`` VMInstance CREATEs, each after the ledger's version jumps past one more
    Bucket entry: the Bucket reads they caused, the seconds they took and their answers."""
    before = len(bucket_lists(server))
    started = time.monotonic()
    answers = []
    for i in range(writes):
        set_ledger_status(server, {"released": {"Bucket": i + 1}})
        await asyncio.sleep(0.05)
        body = review("VMInstance", POOL, f"vm{i}", {"instanceType": "u1.micro"}, uid=f"v{i}")
        answers.append(await caller.validate(webhook.port, body))
    return len(bucket_lists(server)) - before, time.monotonic() - started, answers


def bucket_lists(server: Any) -> list[Any]:
    return [
        r
        for r in server.requests
        if r.method == "GET" and r.path.endswith("/buckets") and "watch" not in r.query
    ]


# ---------------------------------------------------------------------------------------------
# A carve-out admitted in warn never takes other tenants' room

MICRO = {"instanceType": "u1.micro"}  # 1 vCPU, 1Gi


async def test_a_sub_tenant_admitted_in_warn_never_fills_the_pool_for_enforced_tenants(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
) -> None:
    members = [(POOL, "other")]  # another customer in acme's pool
    vm = app("VMInstance", "tenant-acme-other", "old", MICRO)
    rollout: dict[str, Any] = {
        "mode_for": {"Tenant": "warn"}
    }  # the README's order: Tenant enforced last
    async with serving(tmp_path, certs, caller, {"memory": "64Gi"}, members, [vm], **rollout) as (
        server,
        webhook,
    ):
        body = review("Tenant", POOL, "big", {"resourceQuotas": {"memory": "1000Ti"}})
        answer = await caller.validate(webhook.port, body)
        assert answer["allowed"], "warn mode blocks nothing"
        server.create(tenant(POOL, "big", {"memory": "1000Ti"}))  # the API server stores it
        state = webhook.admission.state

        def observed() -> bool:
            node = state.tree.get("tenant-acme-big")
            return node is not None and node.declared

        await eventually(observed)
        pool = state.tree.get(POOL)
        assert pool is not None
        assert pool.usage.get("memory") == 1024**3, "acme's pool counts only the real VM"
        for i in range(3):  # every other customer's enforced writes still fit
            other = await caller.validate(
                webhook.port,
                review("VMInstance", "tenant-acme-other", f"vm{i}", MICRO, uid=f"o{i}"),
            )
            assert other["allowed"], other
        warnings = " | ".join(answer["warnings"])
        assert "would be denied: exceeded tenant quota: pool tenant-acme" in warnings
        assert "requested: memory=1000Ti" in warnings, "the full overshoot is shown"
        assert "not reserved: pool tenant-acme counts this quota as memory=0" in warnings
        inside = await caller.validate(
            webhook.port, review("VMInstance", "tenant-acme-big", "vm", MICRO, uid="in")
        )
        assert not inside["allowed"], "its own enforced writes get no room it never had"
        assert "admitted in warn mode beyond what fits" in inside["status"]["message"]
        tres = server.get("reservation.cozystack.io", "tenantreservations", POOL, POOL)
        assert tres is not None
        cap = tres["status"]["capped"]["tenant-acme-big"]
        assert cap["declared"] == {"memory": "1000Ti"}, "the overshoot stays visible"
        assert cap["counted"] == {"memory": "0"}
        assert "reservation_capped_carve_outs 1.0" in await metrics(webhook.metrics_port)


async def test_one_tenants_sub_tenants_over_budget_in_warn_never_use_up_the_pools_caps(
    tmp_path: Path,
    certs: Path,
    caller: Caller,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Tenant a fills the pool's caps with sub-tenants it keeps stored over budget (a cap stays
    # while its Tenant declares its quota); tenant b's own over-budget Tenant, let through in
    # warn, must still be warned, not refused for caps a took.
    monkeypatch.setattr("webhook.admission.ledger.bounds.MAX_CAPS", 10)  # a's share: 1 of 10
    members = [(POOL, "a"), (POOL, "b")]
    rollout: dict[str, Any] = {"mode_for": {"Tenant": "warn"}}
    async with serving(tmp_path, certs, caller, {"memory": "64Gi"}, members, **rollout) as (
        server,
        webhook,
    ):
        huge = {"resourceQuotas": {"memory": "1000Ti"}}
        flood = [
            await caller.validate(
                webhook.port, review("Tenant", "tenant-acme-a", f"x{i}", huge, uid=f"a{i}")
            )
            for i in range(12)
        ]
        assert flood[0]["allowed"], flood[0]
        refused = [answer for answer in flood if not answer["allowed"]]
        assert refused, "a tenant's caps are bounded by its share"
        assert all("tenant-acme-a" in r["status"]["message"] for r in refused), refused
        other = await caller.validate(
            webhook.port, review("Tenant", "tenant-acme-b", "y", huge, uid="b0")
        )
        assert other["allowed"], other
        tres = server.get("reservation.cozystack.io", "tenantreservations", POOL, POOL)
        assert tres is not None
        assert "tenant-acme-b-y" in tres["status"]["capped"]

"""Counts are keys, on live cluster state: the TLS server over the emulated API server, one
replica and two. Every loop is bounded in count and time; servers bind 127.0.0.1 only."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.builders import free_port, review
from tests.cluster import app, cluster, tenant
from tests.test_live import (
    MICRO,
    Caller,
    caller,
    certs,
    replica,
    spawn,
    store,
    wait_ready,
)
from tests.waiting import eventually

__all__ = ["caller", "certs"]  # the fixtures, used by name

VMS = "count/vminstances.apps.cozystack.io"
TENANTS = "count/tenants.apps.cozystack.io"


async def test_the_eleventh_vm_is_denied_with_the_count_and_a_delete_lets_the_next_in(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {VMS: "10"}))
        for i in range(10):
            server.create(app("VMInstance", "tenant-acme", f"vm{i}", MICRO))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            eleventh = review("VMInstance", "tenant-acme", "vm10", MICRO, uid="u10")
            denied = await caller.validate(webhook.port, eleventh)
            assert not denied["allowed"]
            assert denied["status"]["code"] == 403
            assert denied["status"]["message"] == (
                f"exceeded tenant quota: pool tenant-acme, requested: {VMS}=1, "
                f"used: {VMS}=10, limited: {VMS}=10"
            )
            server.delete("apps.cozystack.io", "vminstances", "tenant-acme", "vm0")
            state = webhook.admission.state
            await eventually(lambda: state.record(("VMInstance", "tenant-acme", "vm0")) is None)
            again = review("VMInstance", "tenant-acme", "vm10", MICRO, uid="u11")
            allowed = await caller.validate(webhook.port, again)
            assert allowed["allowed"], allowed
            assert f"pool tenant-acme at {VMS} 10/10 (100%)" in allowed["warnings"][0]


async def test_a_sub_tenants_vms_count_in_the_parents_pool(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {VMS: "3"}))
        server.create(tenant("tenant-acme", "dev"))
        server.create(app("VMInstance", "tenant-acme", "web", MICRO))
        for i in range(2):
            server.create(app("VMInstance", "tenant-acme-dev", f"ci{i}", MICRO))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            for namespace in ("tenant-acme", "tenant-acme-dev"):
                body = review("VMInstance", namespace, "more", MICRO, uid=f"u-{namespace}")
                denied = await caller.validate(webhook.port, body)
                assert not denied["allowed"], namespace
                assert f"used: {VMS}=3, limited: {VMS}=3" in denied["status"]["message"]
            assert "(via tenant-acme-dev)" in denied["status"]["message"]


async def test_a_count_of_two_sub_tenants_refuses_the_third_child(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {TENANTS: "2"}))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            for name in ("one", "two"):
                body = review("Tenant", "tenant-acme", name, {}, uid=f"u-{name}")
                answer = await caller.validate(webhook.port, body)
                assert answer["allowed"], answer
                store(server, body)
            state = webhook.admission.state
            await eventually(lambda: len(state.pending) == 0)
            third = review("Tenant", "tenant-acme", "three", {}, uid="u-three")
            denied = await caller.validate(webhook.port, third)
            assert not denied["allowed"]
            message = denied["status"]["message"]
            assert f"requested: {TENANTS}=1, used: {TENANTS}=2, limited: {TENANTS}=2" in message


async def test_an_unknown_plural_is_a_422_that_suggests_the_known_one(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme"))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            quotas = {"count/vminstance.apps.cozystack.io": "10"}
            body = review("Tenant", "tenant-acme", "dev", {"resourceQuotas": quotas})
            answer = await caller.validate(webhook.port, body)
    assert not answer["allowed"]
    assert answer["status"]["code"] == 422
    message = answer["status"]["message"]
    assert "resourceQuotas[count/vminstance.apps.cozystack.io]" in message
    assert f"did you mean {VMS}?" in message
    assert "known plurals: bootboxes, buckets" in message
    causes = answer["status"]["details"]["causes"]
    assert causes[0]["field"] == "spec.resourceQuotas[count/vminstance.apps.cozystack.io]"


async def test_two_hundred_concurrent_creates_at_a_counts_edge_admit_exactly_the_remainder(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {VMS: "20"}))
        for i in range(6):
            server.create(app("VMInstance", "tenant-acme", f"old{i}", MICRO))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            bodies = [
                review("VMInstance", "tenant-acme", f"vm{i}", MICRO, uid=f"u{i}")
                for i in range(200)
            ]
            answers = await asyncio.gather(*(caller.validate(webhook.port, b) for b in bodies))
            assert sum(a["allowed"] for a in answers) == 14


async def test_two_replicas_bursting_at_a_counts_edge_admit_exactly_the_remainder(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    remainder = 9
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {VMS: str(remainder + 4), "memory": "1Ti"}))
        for i in range(4):
            server.create(app("VMInstance", "tenant-acme", f"old{i}", MICRO))
        ports = [free_port(), free_port()]
        logs = [(tmp_path / f"replica-{i}.log").open("wb") for i in range(2)]
        processes = [
            spawn(kubeconfig, certs, f"replica-{i}", p, logs[i]) for i, p in enumerate(ports)
        ]
        try:
            for port in ports:
                await wait_ready(caller, port, timeout=30)
            bodies = [
                review("VMInstance", "tenant-acme", f"vm{i}", MICRO, uid=f"u{i}")
                for i in range(200)
            ]
            answers = await asyncio.gather(
                *(caller.validate(ports[i % 2], b) for i, b in enumerate(bodies))
            )
            assert sum(a["allowed"] for a in answers) == remainder
            assert {a["status"]["reason"] for a in answers if not a["allowed"]} <= {
                "Forbidden",
                "Conflict",
            }
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                await asyncio.to_thread(process.wait, 30)
            for log in logs:
                log.close()

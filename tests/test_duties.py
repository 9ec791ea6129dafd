"""A replica's periodic duties survive one that raises: logged, counted, and run again."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from kubernetes import client as k8s_client

from tests.waiting import eventually
from webhook.kube.client import KubeClient
from webhook.server import LiveServices
from webhook.settings import Settings


async def test_a_pool_status_writer_that_raises_does_not_stop_the_other_duties(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WEBHOOK_CERTS", "cert-manager")  # no rotation: nothing else to reach
    configuration = k8s_client.Configuration()
    configuration.host = "https://127.0.0.1:9"
    services = LiveServices(KubeClient(configuration), Settings(namespace="cozy-reservation"))
    services.ledger.settings = dataclasses.replace(services.ledger.settings, reconcile_seconds=0.01)
    monkeypatch.setattr(type(services.elector), "is_leader", property(lambda self: True))
    monkeypatch.setattr(type(services.live), "synced", property(lambda self: True))
    rounds = 0
    counted: list[str] = []
    services.on_failure = counted.append

    async def poisoned_pool_status() -> None:  # issue 9: a 4,400-digit figure in one pool
        nonlocal rounds
        rounds += 1
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    monkeypatch.setattr(services.ledger, "reconcile", poisoned_pool_status)
    stop = asyncio.Event()
    task = asyncio.create_task(services._duties(stop))
    await eventually(lambda: rounds >= 3, 10, interval=0.01)
    stop.set()
    await task
    await services.client.close()
    assert rounds >= 3  # it ran again on every round
    assert services.failures["pool-status"] >= 3
    assert counted[:3] == ["pool-status"] * 3


async def test_a_tenant_slowing_the_policy_reports_never_delays_the_pool_statuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tenants may edit their reports so that every round rewrites them: however long the
    reports take, the leader's pool statuses and the expiry of pending charges go on."""
    monkeypatch.setenv("WEBHOOK_CERTS", "cert-manager")
    configuration = k8s_client.Configuration()
    configuration.host = "https://127.0.0.1:9"
    services = LiveServices(KubeClient(configuration), Settings(namespace="cozy-reservation"))
    services.ledger.settings = dataclasses.replace(services.ledger.settings, reconcile_seconds=0.01)
    monkeypatch.setattr(type(services.elector), "is_leader", property(lambda self: True))
    monkeypatch.setattr(type(services.live), "synced", property(lambda self: True))
    statuses = 0
    reports_started = asyncio.Event()

    async def pool_status() -> int:
        nonlocal statuses
        statuses += 1
        return 0

    async def slow_reports(writer: object) -> None:
        reports_started.set()
        await asyncio.sleep(30)  # a round of many slow writes

    monkeypatch.setattr(services.ledger, "reconcile", pool_status)
    monkeypatch.setattr(services, "_policy_reports", slow_reports)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(services._duties(stop)),
        asyncio.create_task(services._reports(stop)),
    ]
    await asyncio.wait_for(reports_started.wait(), 10)
    before = statuses
    await eventually(lambda: statuses >= before + 5, 10, interval=0.01)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await services.client.close()

"""A replica's periodic duties survive one that raises: logged, counted, and run again."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes import client as k8s_client

from tests.test_live import certs
from tests.waiting import eventually
from webhook.kube.client import KubeClient
from webhook.server import LiveServices, WebhookServer
from webhook.settings import Settings

__all__ = ["certs"]


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


async def test_a_loop_that_raises_leaves_the_others_running_until_all_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica's loops share one client: one that raises stops none of the others, and the
    run ends only once every loop has, so that the client closes after all of them."""
    monkeypatch.setenv("WEBHOOK_CERTS", "cert-manager")
    configuration = k8s_client.Configuration()
    configuration.host = "https://127.0.0.1:9"
    services = LiveServices(KubeClient(configuration), Settings(namespace="cozy-reservation"))
    ended: list[str] = []

    async def keys(stop: asyncio.Event) -> object:
        return object()

    def waits(name: str) -> object:
        async def run(stop: asyncio.Event) -> None:
            await stop.wait()
            ended.append(name)

        return run

    async def raises(stop: asyncio.Event) -> None:
        raise ValueError("a bug in one loop")

    monkeypatch.setattr(services.record_keys, "bootstrap", keys)
    monkeypatch.setattr(services.live, "use_keys", lambda keys: None)
    monkeypatch.setattr(services.live, "run", raises)
    monkeypatch.setattr(services.ledger.reflector, "run", waits("ledger"))
    monkeypatch.setattr(services.quotas, "run", waits("quotas"))
    monkeypatch.setattr(services.elector, "run", waits("elector"))
    monkeypatch.setattr(services, "_duties", waits("duties"))
    monkeypatch.setattr(services, "_reports", waits("reports"))
    if services.room is not None:
        monkeypatch.setattr(services.room, "run", waits("room"))
    stop = asyncio.Event()
    task = asyncio.create_task(services.run(stop))
    await asyncio.sleep(0.05)
    assert not task.done(), "the other loops still run"
    stop.set()
    with pytest.raises(ValueError, match="a bug in one loop"):
        await task
    assert {"ledger", "quotas", "elector", "duties", "reports"} <= set(ended)
    assert not services.client._closed, "closed by the server once its requests drained"
    await services.close()
    assert services.client._closed


async def test_an_admission_answered_during_the_drain_can_still_write(
    monkeypatch: pytest.MonkeyPatch, certs: Path
) -> None:
    """A replica told to stop drains the requests it is answering; one waiting on its pool's
    write then must still reach the API server and decide from a state that follows the
    cluster: the loops stop and the client closes after the drain."""
    monkeypatch.setenv("WEBHOOK_CERTS", "cert-manager")
    configuration = k8s_client.Configuration()
    configuration.host = "https://127.0.0.1:9"
    settings = Settings(
        cert_dir=str(certs), namespace="cozy-reservation", listen_port=0, metrics_port=0
    )
    services = LiveServices(KubeClient(configuration), settings)
    server = WebhookServer(None, settings, services=services)
    await server.start()
    closed_while_draining: list[bool] = []
    following: list[bool] = []
    cleanup = web.AppRunner.cleanup

    async def draining(runner: web.AppRunner) -> None:
        if runner is server._runner:
            await asyncio.sleep(0.2)  # the loops have seen the stop meanwhile
            closed_while_draining.append(services.client._closed)
            following.append(not services_task.done())
        await cleanup(runner)

    monkeypatch.setattr(web.AppRunner, "cleanup", draining)
    (services_task,) = [t for t in server._tasks if "LiveServices.run" in repr(t.get_coro())]
    server.stop()
    await server.wait()
    assert closed_while_draining == [False]
    assert following == [True], "the loops still run while requests drain"
    assert services.client._closed, "closed once drained"

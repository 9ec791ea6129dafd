"""The webhook on live cluster state: an emulated API server, one or two replicas, races,
leaks and faults. Every loop is bounded in count and time; servers bind 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import aiohttp
import pytest

from tests.apiserver.server import EmulatedAPIServer
from tests.builders import ROOT, free_port, review
from tests.cluster import app, cluster, tenant
from tests.waiting import eventually, eventually_async
from webhook.kube.client import KubeClient
from webhook.server import LiveServices, WebhookServer
from webhook.settings import Settings
from webhook.tls.certificates import generate

MICRO = {"instanceType": "u1.micro"}  # 1 vCPU, 1Gi
# How long a live test's replica reads a silent watch before taking it for dead. The emulated
# API server bookmarks every 0.2 s, but it, the webhook and the test's clients share one event
# loop, and on a loaded machine (the suite's other workers, real API servers starting) one turn
# of that loop, or the process waiting for a core, can outlast a second: with a 1 s timeout the
# state then rightly turns unsynced and answers 503 to a test that is about something else.
READ_TIMEOUT = 15.0
# The short timeout, for the tests whose subject is a silent watch (found within seconds).
SILENT_READ_TIMEOUT = 1.0
LIVE = {
    "watch_read_timeout": READ_TIMEOUT,
    "namespace": "cozy-reservation",
    "listen_port": 0,
    "metrics_port": 0,
}


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    out = tmp_path / "certs"
    generate(out, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    return out


@asynccontextmanager
async def replica(
    kubeconfig: Path, certs: Path, name: str = "replica-a", **overrides: Any
) -> AsyncIterator[WebhookServer]:
    settings = Settings(cert_dir=str(certs), replica=name, **{**LIVE, **overrides})
    services = LiveServices(KubeClient.from_kubeconfig(str(kubeconfig)), settings)
    server = WebhookServer(None, settings, services=services)
    await server.start()
    try:
        yield server
    finally:
        server.stop()
        await server.wait()


class Caller:
    """Posts AdmissionReviews to one or more webhook endpoints over TLS."""

    def __init__(self, certs: Path, *, check_hostname: bool = True) -> None:
        self.context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        self.context.check_hostname = check_hostname  # the CA is verified either way
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.context))

    async def validate(self, port: int, body: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(f"https://localhost:{port}/validate", json=body) as r:
            answer: dict[str, Any] = (await r.json())["response"]
            return answer

    async def ready(self, port: int) -> bool:
        try:
            async with self.session.get(f"https://localhost:{port}/readyz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    async def close(self) -> None:
        await self.session.close()


@pytest.fixture
async def caller(certs: Path) -> AsyncIterator[Caller]:
    client = Caller(certs)
    yield client
    await client.close()


async def wait_ready(caller: Caller, port: int, timeout: float = 15.0) -> None:
    await eventually_async(lambda: caller.ready(port), timeout)


def store(server: EmulatedAPIServer, body: dict[str, Any]) -> None:
    """Do what the API server does after admission: store the object."""
    request = body["request"]
    server.create(
        app(
            request["kind"]["kind"],
            request["namespace"],
            request["name"],
            request["object"]["spec"],
        )
    )


async def test_serves_against_live_state(tmp_path: Path, certs: Path, caller: Caller) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "2Gi"}))
        server.create(app("VMInstance", "tenant-acme", "existing", MICRO))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            allowed = await caller.validate(
                webhook.port, review("VMInstance", "tenant-acme", "second", MICRO)
            )
            assert allowed["allowed"], allowed
            denied = await caller.validate(
                webhook.port, review("VMInstance", "tenant-acme", "third", MICRO, uid="u3")
            )
            assert not denied["allowed"]
            assert "used: memory=2Gi, limited: memory=2Gi" in denied["status"]["message"]


async def test_not_ready_and_denying_while_the_api_server_is_unreachable(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (_, kubeconfig):
        pass  # stopped: nothing listens at the kubeconfig's address any more
    async with replica(kubeconfig, certs) as webhook:
        await asyncio.sleep(0.5)
        assert not await caller.ready(webhook.port)
        answer = await caller.validate(
            webhook.port, review("VMInstance", "tenant-acme", "v", MICRO)
        )
        assert not answer["allowed"]
        assert answer["status"]["code"] == 503
        assert "not synced" in answer["status"]["message"]


async def test_stale_after_the_api_server_goes_silent(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with (
        cluster(tmp_path) as (server, kubeconfig),
        replica(kubeconfig, certs, watch_read_timeout=SILENT_READ_TIMEOUT) as webhook,
    ):
        await wait_ready(caller, webhook.port)
        server.pause()
        try:
            await eventually(lambda: not webhook.admission.state.synced, timeout=5)
            answer = await caller.validate(
                webhook.port, review("VMInstance", "tenant-x", "v", MICRO)
            )
            assert not answer["allowed"]
        finally:
            server.resume()
        await wait_ready(caller, webhook.port)


async def test_dropped_watches_and_410_keep_the_state_exact(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "4Gi"}))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            server.drop_watches()
            server.create(app("VMInstance", "tenant-acme", "a", MICRO))
            server.drop_watches()
            server.create(app("VMInstance", "tenant-acme", "b", MICRO))
            server.compact()
            server.drop_watches()
            server.create(app("VMInstance", "tenant-acme", "c", MICRO))

            def reserved() -> Any:
                node = webhook.admission.state.tree.get("tenant-acme")
                return node.usage.get("memory") if node else None

            await eventually(lambda: reserved() == 3 * 1024**3)
            await wait_ready(caller, webhook.port)


async def test_two_hundred_concurrent_creates_admit_exactly_what_fits(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    room = 17
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": f"{room}Gi"}))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            bodies = [
                review("VMInstance", "tenant-acme", f"vm{i}", MICRO, uid=f"u{i}")
                for i in range(200)
            ]
            answers = await asyncio.gather(*(caller.validate(webhook.port, b) for b in bodies))
            assert sum(a["allowed"] for a in answers) == room
            tres = server.get(
                "reservation.cozystack.io", "tenantreservations", "tenant-acme", "tenant-acme"
            )
            assert tres is not None
            assert len(tres["status"]["pending"]) == room


async def test_an_admitted_object_that_never_appears_is_released(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "1Gi"}))
        async with replica(kubeconfig, certs, pending_grace_seconds=1.0) as webhook:
            await wait_ready(caller, webhook.port)
            first = await caller.validate(
                webhook.port, review("VMInstance", "tenant-acme", "ghost", MICRO)
            )
            assert first["allowed"]
            blocked = await caller.validate(
                webhook.port, review("VMInstance", "tenant-acme", "next", MICRO, uid="u2")
            )
            assert not blocked["allowed"]
            await asyncio.sleep(1.2)  # the grace period passes; the ghost never appeared
            again = await caller.validate(
                webhook.port, review("VMInstance", "tenant-acme", "next", MICRO, uid="u3")
            )
            assert again["allowed"], again


async def test_a_stored_object_settles_and_a_deleted_one_releases(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "1Gi"}))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            body = review("VMInstance", "tenant-acme", "real", MICRO)
            assert (await caller.validate(webhook.port, body))["allowed"]
            store(server, body)
            state = webhook.admission.state
            await eventually(
                lambda: (
                    len(state.pending) == 0
                    and state.record(("VMInstance", "tenant-acme", "real")) is not None
                )
            )
            assert not (
                await caller.validate(
                    webhook.port, review("VMInstance", "tenant-acme", "more", MICRO, uid="u2")
                )
            )["allowed"]
            server.delete("apps.cozystack.io", "vminstances", "tenant-acme", "real")
            await eventually(lambda: state.record(("VMInstance", "tenant-acme", "real")) is None)
            assert (
                await caller.validate(
                    webhook.port, review("VMInstance", "tenant-acme", "more", MICRO, uid="u3")
                )
            )["allowed"]


async def test_a_conflict_storm_ends_in_a_clear_denial_never_an_overshoot(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "4Gi"}))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            server.fail_next(50, 409, method="PUT")
            answer = await caller.validate(
                webhook.port, review("VMInstance", "tenant-acme", "vm", MICRO)
            )
            assert not answer["allowed"]
            assert "try again" in answer["status"]["message"]
            assert len(webhook.admission.state.pending) == 0


def spawn(
    kubeconfig: Path,
    certs: Path,
    name: str,
    port: int,
    log: IO[bytes],
    *,
    read_timeout: float = READ_TIMEOUT,
) -> subprocess.Popen[bytes]:
    environment = {
        **os.environ,
        "POD_NAME": name,
        "POD_NAMESPACE": "cozy-reservation",
        "WEBHOOK_WATCH_READ_TIMEOUT": str(read_timeout),
        "WEBHOOK_LOG_LEVEL": "WARNING",
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook",
            "serve",
            "--kubeconfig",
            str(kubeconfig),
            "--cert-dir",
            str(certs),
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


async def test_two_replicas_admit_exactly_what_fits_and_the_ledger_settles(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    room = 23
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": f"{room}Gi"}))
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
            for _ in range(5):  # "try again" (a replica behind under load) is retried, as kubectl
                again = [
                    i
                    for i, a in enumerate(answers)
                    if not a["allowed"] and a["status"]["reason"] == "ServiceUnavailable"
                ]
                if not again:
                    break
                await asyncio.sleep(1)
                retried = await asyncio.gather(
                    *(caller.validate(ports[i % 2], bodies[i]) for i in again)
                )
                for i, answer in zip(again, retried, strict=True):
                    answers[i] = answer
            allowed = [b for b, a in zip(bodies, answers, strict=True) if a["allowed"]]
            assert len(allowed) == room
            assert {a["status"]["reason"] for a in answers if not a["allowed"]} <= {
                "Forbidden",
                "Conflict",
            }
            for body in allowed:
                store(server, body)

            def settled() -> bool:
                tres = server.get(
                    "reservation.cozystack.io", "tenantreservations", "tenant-acme", "tenant-acme"
                )
                status = (tres or {}).get("status") or {}
                return (
                    not status.get("pending")
                    and status.get("reserved", {}).get("memory") == f"{room}Gi"
                )

            try:
                await eventually(settled, timeout=20)
            except TimeoutError:
                tres = server.get(
                    "reservation.cozystack.io", "tenantreservations", "tenant-acme", "tenant-acme"
                )
                pytest.fail(f"the ledger did not settle: {json.dumps((tres or {}).get('status'))}")
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                await asyncio.to_thread(process.wait, 30)
            for log in logs:
                log.close()


def rbac_call(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str]:
    """The (apiGroup, resource, verb) an API request needs, as the authorizer sees it."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if rest and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0]
    named = len(rest) > 1
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if method == "GET":
        verb = "watch" if query.get("watch") in ("true", "1") else "get" if named else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return (
        ("apps.cozystack.io", "*", verb)
        if group == "apps.cozystack.io"
        else (group, resource, verb)
    )


async def test_every_api_call_the_webhook_makes_is_granted_by_its_rbac(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    from tests.deploy.test_manifests import EXPECTED_API_CALLS

    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "2Gi"}))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            body = review("VMInstance", "tenant-acme", "vm", MICRO)
            assert (await caller.validate(webhook.port, body))["allowed"]
            services = webhook.services
            assert services is not None
            await eventually(lambda: services.elector.is_leader)
            await eventually(
                lambda: (
                    server.get(
                        "reservation.cozystack.io",
                        "tenantreservations",
                        "tenant-acme",
                        "tenant-acme",
                    )
                    is not None
                )
            )
            await asyncio.sleep(2.5)  # a reconcile round as leader
        calls = {rbac_call(r.method, r.path, dict(r.query)) for r in server.requests}
    assert ("reservation.cozystack.io", "tenantreservations/status", "update") in calls
    assert ("coordination.k8s.io", "leases", "update") in calls
    assert ("openreports.io", "reports", "create") in calls
    assert calls <= set(EXPECTED_API_CALLS), calls - set(EXPECTED_API_CALLS)


async def test_application_watches_follow_the_definitions(tmp_path: Path, certs: Path) -> None:
    async with cluster(tmp_path) as (server, kubeconfig), replica(kubeconfig, certs) as webhook:
        services = webhook.services
        assert services is not None
        live = services.live
        await eventually(lambda: live.synced)
        assert "buckets" in live._apps
        definition = server.get("cozystack.io", "applicationdefinitions", None, "bucket")
        assert definition is not None
        server.delete("cozystack.io", "applicationdefinitions", None, "bucket")
        await eventually(lambda: "buckets" not in live._apps and live.synced)
        assert live.state.platform.kind("Bucket") is None
        server.create(
            {key: definition[key] for key in ("apiVersion", "kind", "spec")}
            | {"metadata": {"name": "bucket"}}
        )
        await eventually(
            lambda: live.synced and live.state.platform.kind("Bucket") is not None  # swapped in
        )
        assert "buckets" in live._apps


async def test_a_fresh_install_starts_without_certificates_and_makes_its_own(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "certs-empty"
    async with cluster(tmp_path) as (server, kubeconfig):
        port = free_port()
        with (tmp_path / "replica.log").open("wb") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "webhook",
                    "serve",
                    "--kubeconfig",
                    str(kubeconfig),
                    "--cert-dir",
                    str(empty),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--metrics-listen",
                    "127.0.0.1:0",
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={
                    **os.environ,
                    "POD_NAME": "fresh",
                    "WEBHOOK_WATCH_READ_TIMEOUT": str(READ_TIMEOUT),
                },
            )
            try:
                await eventually(lambda: (empty / "ca.crt").exists(), timeout=20)
                caller = Caller(empty, check_hostname=False)  # issued for the Service's names
                try:
                    await wait_ready(caller, port, timeout=30)
                finally:
                    await caller.close()
                secret = server.get("", "secrets", "cozy-reservation", "reservation-webhook-tls")
                assert secret is not None
                assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
            finally:
                process.terminate()
                assert await asyncio.to_thread(process.wait, 30) == 0


async def test_the_pod_level_guard_warns_from_the_live_resourcequota_and_its_status(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "16Gi", "cpu": "16"}))
        for index in range(10):
            server.create(app("VMInstance", "tenant-acme", f"vm{index}", MICRO))
        hard = {"requests.memory": "16Gi", "limits.memory": "16Gi", "requests.cpu": "1600m"}
        quota = server.create(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "tenant-quota", "namespace": "tenant-acme"},
                "spec": {"hard": hard},
            }
        )
        # The quota controller's count of the pods that exist.
        server.update_status(
            {**quota, "status": {"hard": hard, "used": {"requests.memory": "15Gi"}}}
        )
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            services = webhook.services
            assert services is not None
            await eventually(lambda: bool(services.quotas.book.quotas("tenant-acme")))
            body = review("VMInstance", "tenant-acme", "eleventh", MICRO, dry_run=True)
            answer = await caller.validate(webhook.port, body)
    # Ten admitted VMs need 12940Mi; the running pods already use 15Gi, the larger: 1Gi left.
    assert answer["allowed"], answer
    assert any(
        "ResourceQuota tenant-quota leaves 1Gi of requests.memory; this VM's pod needs 1294Mi"
        in warning
        for warning in answer.get("warnings", [])
    ), answer


POISON = "9" * 60 + ".5"  # more digits than any quantity holds
HUGE = "1e" + "0" * 4301  # an exponent past Python's int-to-text limit


def poisoned_spec() -> dict[str, Any]:
    """Values a tenant can store that once killed a reflector: every common sizing field."""
    size = {"cpu": POISON, "memory": HUGE}
    return {
        "storage": POISON,
        "size": HUGE,
        "replicas": POISON,
        "resources": size,
        "resourcesPreset": "u1.medium",
        "instanceType": "u1.micro",
        "nodeGroups": {"md0": {"minReplicas": HUGE, "maxReplicas": POISON, "resources": size}},
        "resourceQuotas": {"memory": POISON, "cpu": HUGE},
    }


async def test_a_poisoned_object_of_every_kind_leaves_the_webhook_ready_for_every_other_pool(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "1Gi"}))
        server.create(tenant("tenant-root", "poison", {"memory": "1Gi"}))
        kinds = [
            m["spec"]["application"]["kind"]
            for m in server.objects("cozystack.io", "applicationdefinitions")
        ]
        assert len(kinds) > 20
        for kind in kinds:
            body = app(kind, "tenant-poison", f"bad-{kind.lower()}", poisoned_spec())
            body["metadata"]["annotations"] = {"reservation.cozystack.io/charge": HUGE}
            server.create(body)
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            fits = review("VMInstance", "tenant-acme", "first", MICRO)
            assert (await caller.validate(webhook.port, fits))["allowed"]
            store(server, fits)
            over = review("VMInstance", "tenant-acme", "second", MICRO, uid="u2")
            denied = await caller.validate(webhook.port, over)
            assert not denied["allowed"]
            assert "exceeded tenant quota" in denied["status"]["message"]
            assert await caller.ready(webhook.port)


def poisoned(kind: str, name: str, spec: Any, annotation: str | None = None) -> dict[str, Any]:
    obj = app(kind, "tenant-evil", name, spec)
    if annotation is not None:
        obj["metadata"]["annotations"] = {"reservation.cozystack.io/charge": annotation}
    return obj


def deep_spec(depth: int) -> Any:
    value: Any = {"instanceType": "u1.micro"}
    for _ in range(depth):
        value = {"x": value}
    return value


POISONED = [
    poisoned("VMDisk", "sixty-digits", {"storage": "9" * 60 + ".5"}),
    poisoned("VMDisk", "exponent", {"storage": "1e" + "0" * 4301}),
    poisoned("VMInstance", "deep", deep_spec(200)),
    poisoned("Postgres", "huge-count", {"replicas": "9" * 4000}),
    poisoned(
        "Kubernetes",
        "annotated",
        {"nodeGroups": {"md0": {"maxReplicas": 1, "instanceType": "u9.none"}}},
        '{"charge":{"memory":"1e' + "0" * 4301 + '"},"digest":"x"}',
    ),
]


async def test_a_poisoned_object_of_each_kind_leaves_the_webhook_ready_and_deciding(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "2Gi"}))
        server.create(tenant("tenant-root", "evil", {"memory": "2Gi"}))
        for obj in POISONED[:3]:  # some stored before the replica lists ...
            server.create(obj)
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            for obj in POISONED[3:]:  # ... and some arriving through the watch
                server.create(obj)
            await eventually(lambda: len(webhook.admission.state.unknown()) == len(POISONED))
            assert await caller.ready(webhook.port)
            other = await caller.validate(
                webhook.port, review("VMInstance", "tenant-acme", "vm", MICRO)
            )
            assert other["allowed"], other
            blocked = await caller.validate(
                webhook.port, review("VMInstance", "tenant-evil", "vm", MICRO)
            )
            assert not blocked["allowed"]
            assert "is unknown" in blocked["status"]["message"]

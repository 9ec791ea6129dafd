"""The HTTP edges: every hostile input answered, every decision echoing the uid."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from tests.builders import review, state
from webhook.admission.admit import Admission
from webhook.core.admission.decisions import Decision, Policy
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.http.app import create_app, create_metrics_app, metrics_key, readiness_key
from webhook.logs import JsonFormatter
from webhook.settings import Settings

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]
VM = {"instanceType": "u1.micro"}


def acme_admission(**kwargs: Any) -> Admission:
    return Admission(state({"tenant-acme": {"memory": "2Gi"}}), Policy(), **kwargs)


@pytest.fixture
async def client(aiohttp_client: MakeClient) -> Client:
    return await aiohttp_client(create_app(acme_admission(), Settings()))


async def post(client: Client, path: str, body: Any) -> tuple[int, Any]:
    response = await client.post(path, json=body)
    text = await response.text()
    try:
        return response.status, json.loads(text)
    except ValueError:
        return response.status, text


@pytest.mark.parametrize(
    ("data", "headers", "status", "reason"),
    [
        pytest.param(b"", {"Content-Type": "application/json"}, 400, "empty body", id="empty-body"),
        pytest.param(b"{}", {"Content-Type": "text/plain"}, 400, "content type", id="wrong-type"),
        pytest.param(
            b"{nope", {"Content-Type": "application/json"}, 400, "not JSON", id="bad-json"
        ),
        pytest.param(
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
            {"Content-Type": "application/json"},
            400,
            "not an AdmissionReview",
            id="old-version",
        ),
        pytest.param(
            b"[1, 2]",
            {"Content-Type": "application/json"},
            400,
            "not a JSON object",
            id="json-array",
        ),
        pytest.param(
            json.dumps(
                {
                    **review("VMInstance", "tenant-acme", "v", VM),
                    "request": {
                        **review("VMInstance", "tenant-acme", "v", VM)["request"],
                        "operation": "PATCH",
                    },
                }
            ).encode(),
            {"Content-Type": "application/json"},
            400,
            "unknown operation",
            id="unknown-operation",
        ),
    ],
)
async def test_malformed_reviews_get_400_with_a_reason(
    client: Client, data: bytes, headers: dict[str, str], status: int, reason: str
) -> None:
    for path in ("/validate", "/mutate"):
        response = await client.post(path, data=data, headers=headers)
        assert response.status == status
        assert reason in await response.text()


async def test_a_body_over_7_mib_gets_413_and_is_not_read(client: Client) -> None:
    huge = io.BytesIO(b" " * (7 * 1024 * 1024 + 1))
    response = await client.post(
        "/validate", data=huge, headers={"Content-Type": "application/json"}
    )
    assert response.status == 413


async def test_a_chunked_body_over_7_mib_gets_413(client: Client) -> None:
    async def chunks() -> Any:
        for _ in range(8):
            yield b" " * (1024 * 1024)

    response = await client.post(
        "/validate", data=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status == 413


async def test_an_update_of_a_vm_whose_cloud_init_holds_a_json_file_is_decided(
    client: Client,
) -> None:
    # A JSON file of 75,000 numbers in each version's cloudInit: 150,000 commas in the review,
    # all inside strings. It was refused with 413, "more than 120000 JSON values".
    content = json.dumps([index % 10 for index in range(75_000)])
    spec = {**VM, "cloudInit": f"#cloud-config\nwrite_files:\n- content: '{content}'\n"}
    body = review("VMInstance", "tenant-acme", "vm", spec, operation="UPDATE", old_spec=spec)
    status, answer = await post(client, "/validate", body)
    assert status == 200
    assert answer["response"]["allowed"], answer["response"]


async def test_validate_answers_with_the_decision_and_the_uid(client: Client) -> None:
    status, body = await post(
        client, "/validate", review("VMInstance", "tenant-acme", "vm", VM, uid="abc")
    )
    assert status == 200
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["response"]["uid"] == "abc"
    assert body["response"]["allowed"] is True
    assert body["response"]["auditAnnotations"]["decision"] == "allowed"


async def test_admitted_requests_accumulate_and_dry_runs_do_not(client: Client) -> None:
    dry = review("VMInstance", "tenant-acme", "a", VM, dry_run=True)
    for _ in range(3):
        _, body = await post(client, "/validate", dry)
        assert body["response"]["allowed"]
    for name, allowed in (("a", True), ("b", True), ("c", False)):
        _, body = await post(client, "/validate", review("VMInstance", "tenant-acme", name, VM))
        assert body["response"]["allowed"] is allowed


async def test_mutate_records_the_charge_and_is_idempotent(client: Client) -> None:
    _, body = await post(client, "/mutate", review("VMInstance", "tenant-acme", "vm", VM))
    response = body["response"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    (operation,) = json.loads(base64.b64decode(response["patch"]))
    assert operation["path"] == "/metadata/annotations"
    value = operation["value"][CHARGE_ANNOTATION]
    assert json.loads(value)["charge"] == {"cpu": "1", "memory": "1Gi"}
    again = review("VMInstance", "tenant-acme", "vm", VM, annotations={CHARGE_ANNOTATION: value})
    _, body = await post(client, "/mutate", again)
    assert "patch" not in body["response"]
    _, body = await post(client, "/validate", again)
    assert body["response"]["allowed"] is True


async def test_validate_refuses_a_charge_annotation_it_did_not_write(client: Client) -> None:
    forged = json.dumps({"charge": {"memory": "1"}, "digest": "sha256:0"})
    body = review("VMInstance", "tenant-acme", "vm", VM, annotations={CHARGE_ANNOTATION: forged})
    _, answer = await post(client, "/validate", body)
    assert answer["response"]["allowed"] is False
    assert "written by the reservation webhook only" in answer["response"]["status"]["message"]


class Exploding(Admission):
    async def validate(self, request: AdmissionRequest) -> Decision:
        raise RuntimeError("boom: a secret value must not leak")


class Slow(Admission):
    async def validate(self, request: AdmissionRequest) -> Decision:
        await asyncio.sleep(5)
        return await super().validate(request)


async def test_a_crash_is_a_denial_with_the_uid_and_a_request_id(
    aiohttp_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = await aiohttp_client(create_app(Exploding(state({}), Policy()), Settings()))
    _, body = await post(client, "/validate", review("VMInstance", "tenant-acme", "v", VM))
    response = body["response"]
    assert response["uid"] == "uid-1"
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "request id" in response["status"]["message"]
    assert "boom" not in json.dumps(body)
    assert "boom" in caplog.text  # the stack trace goes to the log only


async def test_a_decision_not_ready_before_the_deadline_is_a_denial(
    aiohttp_client: MakeClient,
) -> None:
    settings = Settings(timeout_seconds=1)  # deadline: 0.5 s
    client = await aiohttp_client(create_app(Slow(state({}), Policy()), settings))
    async with asyncio.timeout(3):
        _, body = await post(client, "/validate", review("VMInstance", "tenant-acme", "v", VM))
    assert body["response"]["allowed"] is False
    assert "no decision within 0.5s" in body["response"]["status"]["message"]


async def test_health_and_readiness(aiohttp_client: MakeClient) -> None:
    admission = acme_admission()
    app = create_app(admission, Settings())
    client = await aiohttp_client(app)
    assert (await client.get("/livez")).status == 200
    response = await client.get("/readyz")
    assert response.status == 503
    assert "TLS listener not serving" in await response.text()
    app[readiness_key].serving = True
    assert (await client.get("/readyz")).status == 200
    admission.state.synced = False
    response = await client.get("/readyz")
    assert response.status == 503
    assert "state not synced" in await response.text()


async def scrape(aiohttp_client: MakeClient, client: Client) -> str:
    """What the metrics port serves for the application behind ``client``."""
    scraper = await aiohttp_client(create_metrics_app(client.app[metrics_key]))
    response = await scraper.get("/metrics")
    assert response.status == 200
    return await response.text()


async def test_metrics_are_not_served_on_the_admission_port(client: Client) -> None:
    assert (await client.get("/metrics")).status == 404


async def test_metrics_expose_latency_decisions_pools_and_readiness(
    client: Client, aiohttp_client: MakeClient
) -> None:
    await post(client, "/validate", review("VMInstance", "tenant-acme", "vm", VM))
    lines = (await scrape(aiohttp_client, client)).splitlines()
    expected = [
        'reservation_admission_duration_seconds_count{decision="allowed",endpoint="validate"} 1.0',
        "reservation_decisions_total"
        '{decision="allowed",kind="VMInstance",mode="enforce",reason="fits"} 1.0',
        'reservation_pool_budget{pool="tenant-acme",resource="memory"} 2.147483648e+09',
        'reservation_pool_reserved{pool="tenant-acme",resource="memory"} 1.073741824e+09',
        "reservation_state_ready 1.0",
    ]
    for line in expected:
        assert line in lines


async def test_400_megabyte_kind_labels_cannot_grow_metrics(
    client: Client, aiohttp_client: MakeClient
) -> None:
    # The attack: distinct 1 MB kinds, each a new label value kept forever by the registry.
    before = len(await scrape(aiohttp_client, client))
    for index in range(8):
        kind = f"{index}" + "K" * (1024 * 1024)
        raw = json.dumps(review(kind, "tenant-acme", "x", {})).encode()
        response = await client.post(
            "/validate", data=io.BytesIO(raw), headers={"Content-Type": "application/json"}
        )
        assert response.status == 200
        assert (await response.json())["response"]["allowed"] is False
    text = await scrape(aiohttp_client, client)
    assert len(text) < before + 4096
    assert 'kind="other"' in text
    assert (
        'reservation_decisions_total{decision="denied",kind="other",mode="enforce",'
        'reason="unknown-kind"} 8.0'
    ) in text.splitlines()


async def test_one_json_log_line_per_request_without_values(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.requests")
    secret = {"instanceType": "u1.micro", "cloudInit": "password: hunter2"}
    await post(client, "/validate", review("VMInstance", "tenant-acme", "vm", secret, uid="u7"))
    (record,) = [r for r in caplog.records if r.name == "webhook.requests"]
    line = json.loads(JsonFormatter().format(record))
    assert {k: line[k] for k in ("uid", "kind", "namespace", "name", "user", "operation")} == {
        "uid": "u7",
        "kind": "VMInstance",
        "namespace": "tenant-acme",
        "name": "vm",
        "user": "alice",
        "operation": "CREATE",
    }
    assert line["decision"] == "allowed"
    assert line["pool"] == "tenant-acme"
    assert "hunter2" not in json.dumps(line)


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
async def test_100k_level_nested_json_is_a_400_not_a_500(client: Client, path: str) -> None:
    body = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    response = await client.post(path, data=body, headers={"Content-Type": "application/json"})
    assert response.status == 400
    assert "nested too deeply" in await response.text()


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
async def test_a_spec_nested_past_the_values_bound_is_a_denial_not_a_500(
    client: Client, path: str
) -> None:
    spec: Any = {"instanceType": "u1.micro"}
    for _ in range(500):
        spec = {"x": spec}
    status, answer = await post(client, path, review("VMInstance", "tenant-acme", "deep", spec))
    assert status == 200
    if path == "/validate":
        assert answer["response"]["allowed"] is False
        assert "nest deeper than 64 levels" in answer["response"]["status"]["message"]
    else:
        assert "patch" not in answer["response"]


async def test_a_probe_is_answered_while_huge_requests_are_refused_before_evaluation(
    client: Client,
) -> None:
    # 16 reviews of 250k node groups each (the attack in issue 9): each is refused on its size,
    # before defaulting or matching, so a small probe sent among them is decided as usual.
    groups: dict[str, Any] = {f"g{i}": {} for i in range(250_000)}
    heavy = json.dumps(review("Kubernetes", "tenant-acme", "k", {"nodeGroups": groups})).encode()
    probe = review("VMInstance", "tenant-acme", "probe", VM, uid="probe")

    async def send_heavy() -> Any:
        response = await client.post(
            "/validate", data=io.BytesIO(heavy), headers={"Content-Type": "application/json"}
        )
        assert response.status == 200
        return await response.json()

    *refused, (status, answered) = await asyncio.gather(
        *(send_heavy() for _ in range(16)), post(client, "/validate", probe)
    )
    assert status == 200
    assert answered["response"]["allowed"], answered
    for body in refused:  # refused on its size, or (its tenant's turn too long in coming) 429
        status_of = body["response"]["status"]
        assert not body["response"]["allowed"]
        assert "more than" in status_of["message"] or status_of["code"] == 429, status_of


async def test_a_body_trickled_past_the_deadline_gets_408(aiohttp_client: MakeClient) -> None:
    client = await aiohttp_client(create_app(acme_admission(), Settings(timeout_seconds=1)))
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{"
    )
    await writer.drain()
    async with asyncio.timeout(10):
        status = await reader.readline()
    writer.close()
    assert status.startswith(b"HTTP/1.1 408")

"""The overcommit factor end to end: through ``webhook review`` and the TLS server.

The figures, by hand: a u1.micro VM declares 1Gi = 1073741824 bytes. At memory=1.2 it reserves
ceil(1073741824 / 1.2) = ceil(894784853.33) = 894784854 bytes. Tenant solo's budget is 16Gi =
17179869184 bytes: 19 such VMs reserve 17000912226 and fit; a 20th would make 17895697080 and
is denied. Without the factor only 16 fit.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import ADMIN, FIXTURES, review, state
from webhook.admission.report import (
    build_report,
    explain_charge,
    explain_factor,
    render_explanation,
    render_report,
)
from webhook.commands.cli import main
from webhook.core.admission.decisions import Policy, decide
from webhook.core.admission.reviews import AdmissionRequest, parse_review
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import Application
from webhook.core.tenancy.overcommit import OVERCOMMIT_ANNOTATION
from webhook.server import WebhookServer
from webhook.settings import Settings
from webhook.state.manifests import load_state
from webhook.tls.certificates import generate

MICRO = {"instanceType": "u1.micro"}
BUDGET = {"resourceQuotas": {"memory": "16Gi"}}
PER_VM = 894784854


def solo_state(tmp_path: Path) -> Path:
    tenants = tmp_path / "state"
    tenants.mkdir()
    (tenants / "tenant.yaml").write_text(
        "apiVersion: apps.cozystack.io/v1alpha1\nkind: Tenant\n"
        "metadata: {name: solo, namespace: tenant-root}\n"
        "spec: {resourceQuotas: {memory: 16Gi}}\n"
    )
    return tenants


def factor(value: str | None) -> dict[str, str] | None:
    return {OVERCOMMIT_ANNOTATION: value} if value is not None else None


def set_tenant_factor(new: str, old: str | None, uid: str, **who: Any) -> dict[str, Any]:
    return review(
        "Tenant",
        "tenant-root",
        "solo",
        BUDGET,
        operation="UPDATE",
        old_spec=BUDGET,
        annotations=factor(new),
        old_annotations=factor(old),
        uid=uid,
        **who,
    )


def scenario() -> list[dict[str, Any]]:
    """The reviews, in order; what each must answer is in ``check``."""
    return [
        set_tenant_factor("memory=1.2", None, "tenant-user-sets", user="alice"),
        set_tenant_factor("memory=1.3", None, "jump-to-1.3", **ADMIN),
        set_tenant_factor("memory=1.1", None, "step-to-1.1", **ADMIN),
        set_tenant_factor("memory=1.2", "memory=1.1", "step-to-1.2", **ADMIN),
        *(review("VMInstance", "tenant-solo", f"vm{i}", MICRO, uid=f"vm{i}") for i in range(20)),
        review(
            "VMInstance",
            "tenant-solo",
            "copied",
            MICRO,
            annotations=factor("memory=1.5"),
            uid="copied-manifest",
        ),
    ]


def check(answers: list[dict[str, Any]]) -> None:
    by_uid = {answer["uid"]: answer for answer in answers}
    denied = by_uid["tenant-user-sets"]
    assert denied["allowed"] is False
    assert denied["status"]["code"] == 403
    assert (
        "reserved to the platform (cozystack-cluster-admin, system:masters)"
        in (denied["status"]["message"])
    )
    jump = by_uid["jump-to-1.3"]
    assert jump["allowed"] is False
    assert "the largest allowed next value is 1.1" in jump["status"]["message"]
    assert by_uid["step-to-1.1"]["allowed"] is True
    assert by_uid["step-to-1.2"]["allowed"] is True
    vms = [by_uid[f"vm{i}"] for i in range(20)]
    assert [vm["allowed"] for vm in vms] == [True] * 19 + [False]
    first = vms[0]["auditAnnotations"]
    assert first["charge"] == f'{{"cpu":"1","memory":"{PER_VM}"}}'
    assert first["committed"] == '{"cpu":"1","memory":"1Gi"}'
    assert first["overcommit"] == "memory=1.2 (tenant-solo)"
    assert vms[-1]["status"]["message"] == (
        f"exceeded tenant quota: pool tenant-solo, requested: memory={PER_VM}, "
        f"used: memory={19 * PER_VM}, limited: memory=16Gi"
    )
    copied = by_uid["copied-manifest"]
    assert copied["allowed"] is False
    assert "remove the annotation" in copied["status"]["message"]


def test_through_the_review_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = []
    for index, body in enumerate(scenario()):
        path = tmp_path / f"{index:02}.json"
        path.write_text(json.dumps(body))
        files.append(str(path))
    state = ["--state", str(FIXTURES / "cozystack"), "--state", str(solo_state(tmp_path))]
    assert main(["review", *state, *files]) == 0
    out = capsys.readouterr().out
    check([json.loads(line)["response"] for line in out.splitlines()])


async def test_through_the_tls_server(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    settings = Settings(
        state=(str(FIXTURES / "cozystack"), str(solo_state(tmp_path))),
        cert_dir=str(certs),
        listen_port=0,
        metrics_port=0,
    )
    server = WebhookServer(load_state(settings.state), settings)
    await server.start()
    answers = []
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    try:
        async with aiohttp.ClientSession() as session:
            for body in scenario():
                url = f"https://localhost:{server.port}/validate"
                async with session.post(url, json=body, ssl=context) as response:
                    assert response.status == 200
                    answers.append((await response.json())["response"])
            url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            async with session.get(url) as response:
                metrics = (await response.text()).splitlines()
    finally:
        server.stop()
        await server.wait()
    check(answers)
    committed = 19 * 1024**3
    assert gauge(metrics, "reservation_pool_reserved") == 19 * PER_VM
    assert gauge(metrics, "reservation_pool_committed") == committed
    assert gauge(metrics, "reservation_pool_discount") == committed - 19 * PER_VM


def gauge(lines: list[str], name: str) -> float:
    prefix = f'{name}{{pool="tenant-solo",resource="memory"}} '
    (value,) = [float(line[len(prefix) :]) for line in lines if line.startswith(prefix)]
    return value


def review_request(body: dict[str, Any]) -> AdmissionRequest:
    return parse_review(body)


def rolled_out() -> tuple[ReservationState, Application]:
    """tenant-acme (16Gi) at memory=1.2, walked there by an admin, holding one 1Gi VM."""
    current = state({"tenant-acme": {"memory": "16Gi"}})
    old: str | None = None
    for value in ("memory=1.1", "memory=1.2"):
        decision = decide(review_request(set_acme_factor(value, old)), current, Policy())
        assert decision.admitted is not None
        current.observe(decision.admitted)
        old = value
    decision = decide(
        review_request(review("VMInstance", "tenant-acme", "vm", MICRO)), current, Policy()
    )
    assert decision.admitted is not None
    current.observe(decision.admitted)
    return current, decision.admitted


def set_acme_factor(new: str, old: str | None) -> dict[str, Any]:
    spec = {"resourceQuotas": {"memory": "16Gi"}}
    return review(
        "Tenant",
        "tenant-root",
        "acme",
        spec,
        operation="UPDATE",
        old_spec=spec,
        annotations=factor(new),
        old_annotations=factor(old),
        **ADMIN,
    )


def test_explain_shows_the_factor_and_the_tenant_it_came_from() -> None:
    current, vm = rolled_out()
    charge = current.platform.charge("VMInstance", MICRO)
    explained = explain_charge(charge, overcommit=explain_factor(current, vm, charge))
    assert explained["overcommit"] == {
        "factor": "memory=1.2",
        "source": "tenant tenant-acme",
        "as": "believed",
        "committed": {"cpu": "1", "memory": "1Gi"},
        "reserved": {"cpu": "1", "memory": str(PER_VM)},
    }
    text = render_explanation(explained, recorded=None)
    assert (
        f"overcommit memory=1.2 from tenant tenant-acme (believed): reserves cpu=1,memory={PER_VM}"
        " of the cpu=1,memory=1Gi it commits"
    ) in text
    # A reader without the key (kubectl reservation explain) shows what the record says.
    elsewhere = ReservationState(current.platform)
    recorded = explain_factor(elsewhere, vm, charge)
    assert (recorded["factor"], recorded["source"], recorded["as"]) == (
        "memory=1.2",
        "tenant tenant-acme",
        "recorded",
    )


def test_the_report_shows_committed_reserved_discount_and_the_share_sold_beyond() -> None:
    current, _ = rolled_out()
    for index in range(18):
        decision = decide(
            review_request(review("VMInstance", "tenant-acme", f"more{index}", MICRO)),
            current,
            Policy(),
        )
        assert decision.allowed, decision.message
        assert decision.admitted is not None
        current.observe(decision.admitted)
    (pool,) = build_report(current)["pools"]
    assert pool["reserved"] == {"memory": str(19 * PER_VM)}
    assert pool["committed"] == {"memory": "19Gi"}
    assert pool["discount"] == {"memory": str(19 * 1024**3 - 19 * PER_VM)}
    assert pool["soldBeyondBudget"] == {"memory": "18.8%"}  # (19 - 16) / 16
    assert "sold beyond budget memory=18.8%" in render_report(build_report(current))

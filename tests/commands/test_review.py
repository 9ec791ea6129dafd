"""``webhook review`` decides a sequence of writes as the cluster would: the same answers, one
by one, as a live replica gives for the same writes against the same stored objects."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import FIXTURES, review
from tests.cluster import app, cluster, tenant
from tests.test_live import Caller, certs, replica, store, wait_ready
from tests.waiting import eventually
from webhook.commands.cli import main

__all__ = ["certs"]

POOL = "tenant-acme"
MICRO = {"instanceType": "u1.micro"}  # 1 vCPU, 1Gi
STORED = [
    tenant("tenant-root", "acme", {"memory": "64Gi"}),
    tenant(POOL, "other"),  # another customer in acme's pool
    app("VMInstance", "tenant-acme-other", "old", MICRO),
]
# A sub-Tenant far beyond what fits, let through because Tenant is in warn; then other
# customers' enforced writes in the pool, and a write inside the sub-Tenant.
SEQUENCE = [
    review("Tenant", POOL, "big", {"resourceQuotas": {"memory": "1000Ti"}}, uid="big"),
    *(review("VMInstance", "tenant-acme-other", f"vm{i}", MICRO, uid=f"o{i}") for i in range(3)),
    review("VMInstance", "tenant-acme-big", "vm", MICRO, uid="inside"),
]


@pytest.fixture
async def caller(certs: Path) -> Any:
    client = Caller(certs)
    yield client
    await client.close()


def what_a_tenant_reads(answer: dict[str, Any]) -> tuple[bool, str, tuple[str, ...]]:
    """Allowed or not, the denial's message, and the warnings."""
    return (
        answer["allowed"],
        answer.get("status", {}).get("message", ""),
        tuple(answer.get("warnings") or ()),
    )


async def live_answers(tmp_path: Path, certs: Path, caller: Caller) -> list[dict[str, Any]]:
    """The sequence against one replica, each allowed write stored (and seen) before the next."""
    answers = []
    async with cluster(tmp_path) as (server, kubeconfig):
        for obj in STORED:
            server.create(obj)
        async with replica(kubeconfig, certs, mode_for={"Tenant": "warn"}) as webhook:
            await wait_ready(caller, webhook.port)
            await asyncio.sleep(0.3)
            state = webhook.admission.state
            for body in SEQUENCE:
                answer = await caller.validate(webhook.port, body)
                answers.append(answer)
                if not answer["allowed"]:
                    continue
                store(server, body)
                request = body["request"]
                key = (request["kind"]["kind"], request["namespace"], request["name"])

                def stored(key: tuple[str, str, str] = key) -> bool:
                    return state.record(key) is not None

                await eventually(stored)
    return answers


def offline_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The same sequence through ``webhook review``, on the same stored objects."""
    stored = tmp_path / "stored"
    stored.mkdir()
    (stored / "apps.yaml").write_text(yaml.safe_dump_all(STORED))
    files = []
    for index, body in enumerate(SEQUENCE):
        path = tmp_path / f"{index}.json"
        path.write_text(json.dumps(body))
        files.append(str(path))
    state = ["--state", str(FIXTURES / "cozystack"), "--state", str(stored)]
    status = main(["review", *state, "--mode-for", "Tenant=warn", *files])
    out, _ = capsys.readouterr()
    assert status == 0
    return [json.loads(line)["response"] for line in out.splitlines()]


async def test_a_review_sequence_counts_a_sub_tenant_capped_in_warn_as_the_cluster_does(
    tmp_path: Path, certs: Path, caller: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    """Live, the sub-Tenant admitted in warn beyond what fits is capped (it counts what it had
    before: nothing), so the other customers' VMs fit and a VM inside it does not. Offline, the
    sequence counted its full 1000Ti against the pool: every later answer differed."""
    live = await live_answers(tmp_path, certs, caller)
    offline = offline_answers(tmp_path, capsys)
    assert [a["allowed"] for a in live] == [True, True, True, True, False]
    assert [what_a_tenant_reads(a) for a in offline] == [what_a_tenant_reads(a) for a in live]
    assert "admitted in warn mode beyond what fits" in offline[-1]["status"]["message"]

"""The decision is the same whichever source the state comes from: a directory of manifests or
the live cluster (an emulated API server). Each scenario is decided against both."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import FIXTURES, KEYS, request, signed
from tests.cluster import app, cluster, kube_client, tenant
from tests.waiting import eventually
from webhook.core.admission.decisions import Decision, Policy, decide
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.state.live import LiveSettings, LiveState
from webhook.state.manifests import load_state

MICRO = {"instanceType": "u1.micro"}  # 1 vCPU, 1Gi


def recorded(obj: dict[str, Any], charge: str) -> dict[str, Any]:
    obj["metadata"]["annotations"] = {CHARGE_ANNOTATION: charge}
    return obj


SCENARIOS = [
    pytest.param(
        [
            tenant("tenant-root", "acme", {"memory": "16Gi"}),
            *(app("VMInstance", "tenant-acme", f"vm{i}", MICRO) for i in range(16)),
        ],
        request("VMInstance", "tenant-acme", "vm16", MICRO),
        (
            False,
            "exceeded tenant quota: pool tenant-acme, requested: memory=1Gi, "
            "used: memory=16Gi, limited: memory=16Gi",
        ),
        id="the-seventeenth-1gi-vm-does-not-fit-16gi",
    ),
    pytest.param(
        [
            tenant("tenant-root", "acme", {"memory": "4Gi"}),
            app("VMInstance", "tenant-acme", "web", MICRO),
            app("VMInstance", "tenant-acme", "other", MICRO),
        ],
        request(
            "VMInstance",
            "tenant-acme",
            "web",
            {"instanceType": "u1.small"},
            operation="UPDATE",
            old_spec=MICRO,
        ),
        (True, ""),
        id="an-update-is-charged-its-delta",
    ),
    pytest.param(
        [tenant("tenant-root", "foo", {"cpu": "10"}), tenant("tenant-foo", "bar")],
        request("Tenant", "tenant-foo-bar", "baz", {"resourceQuotas": {"cpu": "11"}}),
        (
            False,
            "exceeded tenant quota: pool tenant-foo (via tenant-foo-bar), requested: cpu=11, "
            "used: cpu=0, limited: cpu=10",
        ),
        id="a-carve-out-through-an-unbounded-tenant",
    ),
    pytest.param(
        [tenant("tenant-root", "acme", {"memory": "16Gi"})],
        request("VMInstance", "tenant-acme", "vm", {"instanceType": "u9.huge"}),
        (False, 'VMInstance: instanceType: unknown instance type "u9.huge"'),
        id="an-unevaluable-object-is-denied-with-its-path",
    ),
    pytest.param(
        [
            tenant("tenant-root", "acme", {"memory": "16Gi"}),
            app("VMInstance", "tenant-acme", "legacy", {"instanceType": "u9.huge"}),
        ],
        request("VMInstance", "tenant-acme", "vm", MICRO),
        (
            False,
            "tenant quota: pool tenant-acme cannot grant more while the reservation of "
            "VMInstance tenant-acme/legacy is unknown: it cannot be evaluated (VMInstance: "
            'instanceType: unknown instance type "u9.huge") and has no recorded charge; fix its '
            "spec so it evaluates, or delete it",
        ),
        id="an-unknown-reservation-blocks-its-pool",
    ),
    pytest.param(
        [
            tenant("tenant-root", "acme", {"memory": "16Gi"}),
            recorded(
                app("VMInstance", "tenant-acme", "old", MICRO),
                signed("VMInstance", "tenant-acme", "old", MICRO, {"memory": "8Gi"}, "sha256:old"),
            ),
        ],
        request("VMInstance", "tenant-acme", "big", {"instanceType": "u1.2xlarge"}),
        (
            False,
            "exceeded tenant quota: pool tenant-acme, requested: memory=32Gi, "
            "used: memory=8Gi, limited: memory=16Gi",
        ),
        id="a-recorded-charge-stands-over-re-evaluation",
    ),
]


def from_manifests(objects: list[dict[str, Any]], directory: Path) -> ReservationState:
    directory.mkdir()
    (directory / "objects.yaml").write_text(yaml.safe_dump_all(objects))
    return load_state([FIXTURES / "cozystack", directory], keys=KEYS)


async def from_cluster(
    objects: list[dict[str, Any]], tmp_path: Path, check: Callable[[ReservationState], None]
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        for obj in objects:
            server.create(obj)
        async with kube_client(kubeconfig) as client:
            live = LiveState(client, LiveSettings(read_timeout=5.0), keys=KEYS)
            stop = asyncio.Event()
            task = asyncio.create_task(live.run(stop))
            try:
                await eventually(lambda: live.synced, 15)
                check(live.state)
            finally:
                stop.set()
                await task


def outcome(decision: Decision) -> tuple[bool, str]:
    return decision.allowed, decision.message


@pytest.mark.parametrize(("objects", "review", "expected"), SCENARIOS)
async def test_both_state_sources_decide_alike(
    objects: list[dict[str, Any]],
    review: AdmissionRequest,
    expected: tuple[bool, str],
    tmp_path: Path,
) -> None:
    answers: list[tuple[bool, str]] = []
    offline = from_manifests(objects, tmp_path / "manifests")
    answers.append(outcome(decide(review, offline, Policy())))

    def record(state: ReservationState) -> None:
        answers.append(outcome(decide(review, state, Policy())))

    await from_cluster(objects, tmp_path, record)
    assert answers == [expected, expected]

"""Counts are keys, end to end on the command line: ``review`` decides, ``report`` shows the
counts per pool, ``guard`` leaves them to the reservation, ``audit replay`` suggests them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.builders import FIXTURES, review, state
from tests.commands.test_cli import responses, run, write
from tests.http.test_metrics import samples
from webhook.core.base.quantities import parse_quantity
from webhook.core.capacity.guard import Quota, QuotaBook, render_tenant_quota
from webhook.core.tenancy.applications import Application
from webhook.http.metrics import Metrics

VMS = "count/vminstances.apps.cozystack.io"
TENANTS = "count/tenants.apps.cozystack.io"
MICRO = {"instanceType": "u1.micro"}
PLATFORM = ["--state", str(FIXTURES / "cozystack")]


def tenants(tmp_path: Path, text: str) -> list[str]:
    """A state directory holding these Tenants (YAML), after the platform."""
    directory = tmp_path / "tenants"
    directory.mkdir(exist_ok=True)
    (directory / "tenants.yaml").write_text(text)
    return [*PLATFORM, "--state", str(directory)]


ACME = """
apiVersion: apps.cozystack.io/v1alpha1
kind: Tenant
metadata: {name: acme, namespace: tenant-root}
spec:
  resourceQuotas:
    count/vminstances.apps.cozystack.io: 10
    count/kuberneteses.apps.cozystack.io: 2
    count/tenants.apps.cozystack.io: 5
---
apiVersion: apps.cozystack.io/v1alpha1
kind: Tenant
metadata: {name: dev, namespace: tenant-acme}
spec: {}
"""


def reviews(tmp_path: Path, bodies: list[dict[str, Any]]) -> list[str]:
    return [write(tmp_path, f"{i:03}.json", body) for i, body in enumerate(bodies)]


def vm(namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
    return review("VMInstance", namespace, name, MICRO, uid=f"u-{namespace}-{name}", **kwargs)


def test_at_most_ten_vms_the_eleventh_is_denied_with_the_count_and_a_delete_lets_the_next_in(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = tenants(tmp_path, ACME)
    bodies = [vm("tenant-acme", f"vm{i}") for i in range(6)]
    bodies += [vm("tenant-acme-dev", f"vm{i}") for i in range(4)]  # the sub-tenant's count too
    bodies += [
        vm("tenant-acme", "eleventh"),
        review("VMInstance", "tenant-acme", "vm0", None, operation="DELETE", old_spec=MICRO),
        vm("tenant-acme", "next"),
        vm("tenant-acme-dev", "twelfth"),
    ]
    status, out, _ = run(capsys, "review", *state, "--mode", "enforce", *reviews(tmp_path, bodies))
    answers = responses(out)
    assert status == 0
    assert [a["allowed"] for a in answers] == [True] * 10 + [False, True, True, False]
    assert answers[10]["status"]["message"] == (
        f"exceeded tenant quota: pool tenant-acme, requested: {VMS}=1, used: {VMS}=10, "
        f"limited: {VMS}=10"
    )
    assert answers[13]["status"]["message"].startswith(
        "exceeded tenant quota: pool tenant-acme (via tenant-acme-dev)"
    )
    assert f"pool tenant-acme at {VMS} 10/10 (100%)" in answers[12]["warnings"][0]
    audit = answers[12]["auditAnnotations"]
    assert json.loads(audit["reserved-after"])[VMS] == "10"
    assert json.loads(audit["budget"])[VMS] == "10"
    assert VMS not in json.loads(audit["charge"]), "the charge (and its record) stays sizes"


def test_a_dry_run_at_the_edge_shows_the_count_and_reserves_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = tenants(tmp_path, ACME.replace("count/vminstances.apps.cozystack.io: 10", f"{VMS}: 1"))
    bodies = [vm("tenant-acme", "a", dry_run=True), vm("tenant-acme", "b"), vm("tenant-acme", "c")]
    _, out, _ = run(capsys, "review", *state, "--mode", "enforce", *reviews(tmp_path, bodies))
    dry, real, over = responses(out)
    assert dry["allowed"]
    assert "dry run: nothing was reserved" in dry["warnings"]
    assert f"at {VMS} 1/1 (100%)" in dry["warnings"][0]
    assert real["allowed"]
    assert not over["allowed"]


def test_in_warn_mode_the_count_warns_and_admits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = tenants(tmp_path, ACME.replace("count/vminstances.apps.cozystack.io: 10", f"{VMS}: 0"))
    _, out, _ = run(
        capsys,
        "review",
        *state,
        "--mode",
        "warn",
        write(tmp_path, "a.json", vm("tenant-acme", "a")),
    )
    (answer,) = responses(out)
    assert answer["allowed"]
    assert answer["warnings"][0].startswith(
        f"would be denied: exceeded tenant quota: pool tenant-acme, requested: {VMS}=1"
    )
    assert answer["auditAnnotations"]["decision"] == "warned"


def test_a_count_of_five_sub_tenants_refuses_the_sixth_at_every_level(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = tenants(tmp_path, ACME)  # dev is the first of acme's five
    bodies = [
        review("Tenant", "tenant-acme", name, {}, uid=f"t-{name}")
        for name in ("one", "two", "three")
    ]
    bodies.append(review("Tenant", "tenant-acme-dev", "deep", {}, uid="t-deep"))  # grandchild
    bodies.append(review("Tenant", "tenant-acme", "six", {}, uid="t-six"))
    bodies.append(review("Tenant", "tenant-acme-dev", "deeper", {}, uid="t-deeper"))
    _, out, _ = run(capsys, "review", *state, "--mode", "enforce", *reviews(tmp_path, bodies))
    answers = responses(out)
    assert [a["allowed"] for a in answers] == [True, True, True, True, False, False]
    assert (
        f"requested: {TENANTS}=1, used: {TENANTS}=5, limited: {TENANTS}=5"
        in (answers[4]["status"]["message"])
    )
    assert "(via tenant-acme-dev)" in answers[5]["status"]["message"]


def test_a_sub_tenant_carving_out_a_count_takes_it_from_the_parent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = tenants(tmp_path, ACME)
    bodies = [
        review("Tenant", "tenant-acme", "big", {"resourceQuotas": {VMS: "11"}}, uid="t-big"),
        review("Tenant", "tenant-acme", "ok", {"resourceQuotas": {VMS: "4"}}, uid="t-ok"),
        *[vm("tenant-acme", f"vm{i}") for i in range(6)],
        vm("tenant-acme", "seventh"),
        *[vm("tenant-acme-ok", f"vm{i}") for i in range(5)],
    ]
    _, out, _ = run(capsys, "review", *state, "--mode", "enforce", *reviews(tmp_path, bodies))
    answers = responses(out)
    assert not answers[0]["allowed"], "11 VMs carved out of a 10-VM pool"
    assert [a["allowed"] for a in answers[1:]] == [True] * 7 + [False] + [True] * 4 + [False]
    assert (
        f"pool tenant-acme-ok, requested: {VMS}=1, used: {VMS}=4, limited: {VMS}=4"
        in (answers[-1]["status"]["message"])
    )


def test_an_application_that_cannot_be_evaluated_still_counts_and_blocks_no_count(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    broken = """
---
apiVersion: apps.cozystack.io/v1alpha1
kind: VMInstance
metadata: {name: broken, namespace: tenant-acme}
spec: {instanceType: u9.nonexistent}
"""
    state = tenants(
        tmp_path, ACME.replace("count/vminstances.apps.cozystack.io: 10", f"{VMS}: 2") + broken
    )
    bodies = [vm("tenant-acme", "a"), vm("tenant-acme", "b")]
    _, out, _ = run(capsys, "review", *state, "--mode", "enforce", *reviews(tmp_path, bodies))
    allowed, denied = responses(out)
    assert allowed["allowed"], "its size is unknown, its existence is not: 1 + 1 of 2"
    assert f"used: {VMS}=2, limited: {VMS}=2" in denied["status"]["message"]


def test_the_report_shows_the_counts_per_pool_limited_or_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    state = [
        *PLATFORM,
        "--state",
        str(FIXTURES / "tenants"),
        "--state",
        str(FIXTURES / "applications"),
    ]
    status, out, _ = run(capsys, "report", *state, "-o", "json")
    assert status == 0
    pools = {pool["pool"]: pool for pool in json.loads(out)["pools"]}
    assert pools["tenant-acme"]["counts"] == {
        "count/postgreses.apps.cozystack.io": "1",
        TENANTS: "2",
        VMS: "1",
    }
    _, table, _ = run(capsys, "report", *state)
    assert "  tenant-acme: postgreses=1,tenants=2,vminstances=1" in table


def test_the_guard_says_counts_are_no_pod_level_limit_instead_of_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    quota = """
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: tenant-quota, namespace: tenant-acme}
spec:
  hard:
    limits.count/vminstances.apps.cozystack.io: "10"
    requests.count/vminstances.apps.cozystack.io: "10"
    requests.memory: 64Gi
status:
  used:
    requests.count/vminstances.apps.cozystack.io: "10"
"""
    state = tenants(tmp_path, ACME + quota)
    _, out, _ = run(capsys, "review", *state, write(tmp_path, "a.json", vm("tenant-acme", "a")))
    (answer,) = responses(out)
    assert answer["allowed"]
    assert not [w for w in answer["warnings"] if "ResourceQuota" in w], "no guard warning"
    status, out, _ = run(capsys, "guard", *state, "-o", "json")
    assert status == 0
    report = json.loads(out)
    (row,) = [r for r in report["namespaces"] if r["namespace"] == "tenant-acme"]
    assert row["hard"] == {"requests.memory": "64Gi"}
    assert row["short"] == {}
    assert row["counts"] == [f"limits.{VMS}", f"requests.{VMS}"]
    assert "counted by the reservation" in report["note"]
    _, table, _ = run(capsys, "guard", *state)
    assert "Note: count/... keys are counted by the reservation at admission" in table


def test_the_replay_suggests_a_count_budget_per_pool_and_enforcing_it_denies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = str(FIXTURES / "audit" / "sample-day.log")
    start = str(FIXTURES / "audit" / "sample-day.start-state" / "all-apps.raw.yaml")
    args = ["audit", "replay", log, *PLATFORM, "--state", start, "-o", "json"]
    status, out, _ = run(capsys, *args, "--suggest-budgets")
    assert status in (0, 1)
    pools = {pool["pool"]: pool for pool in json.loads(out)["pools"]}
    suggested = pools["tenant-acme"]["suggestedBudget"]
    assert pools["tenant-acme"]["peak"][VMS] == "9"
    # One VM the log shows refused would have been stored under budgets that deny nothing.
    assert suggested[VMS] == "10"
    assert suggested[TENANTS] == "2"
    _, out, _ = run(
        capsys,
        *args,
        "--mode",
        "enforce",
        "--budget",
        f"tenant-acme={VMS}:8,cpu:100,memory:1Ti,storage:10Ti",
    )
    counted = [d for d in json.loads(out)["denied"] if f"requested: {VMS}=1" in d["message"]]
    assert {d["name"] for d in counted} == {"batch-2", "cache-2", "api-1", "search-4"}
    assert all(f"limited: {VMS}=8" in d["message"] for d in counted)


def test_the_pool_metrics_carry_a_count_and_the_guard_room_leaves_it_out() -> None:
    vms = [Application("VMInstance", "tenant-acme", f"vm{i}", MICRO) for i in range(3)]
    current = state({"tenant-acme": {VMS: "10"}}, *vms)
    quotas = QuotaBook()
    rendered = render_tenant_quota({VMS: parse_quantity("10"), "memory": parse_quantity("16Gi")})
    quotas.observe("tenant-acme", Quota("tenant-quota", rendered, {}))
    metrics = Metrics(lambda: current)
    metrics.watch_guard(lambda: current, quotas)
    assert samples(metrics, "reservation_pool_budget") == {("tenant-acme", VMS): 10}
    assert samples(metrics, "reservation_pool_reserved") == {("tenant-acme", VMS): 3}
    room = samples(metrics, "reservation_guard_room")
    assert ("tenant-acme", "requests.memory") in room
    assert not [key for _, key in room if "count/" in key]

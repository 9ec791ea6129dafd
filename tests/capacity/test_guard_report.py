"""The pod-level guard end to end: warnings through ``webhook review``, sizing with ``guard``."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import FIXTURES, review
from webhook.commands.cli import main
from webhook.core.base.quantities import format_quantity
from webhook.core.capacity.guard import render_tenant_quota

BUDGET = {"cpu": Decimal(16), "memory": Decimal(16 * 1024**3)}
SOLO = {
    "apiVersion": "apps.cozystack.io/v1alpha1",
    "kind": "Tenant",
    "metadata": {"name": "solo", "namespace": "tenant-root"},
    "spec": {"resourceQuotas": {"cpu": 16, "memory": "16Gi"}},
}


def tenant_quota(name: str, factor: str = "1", **hard: str) -> dict[str, Any]:
    """A ResourceQuota in tenant-solo: the chart's rendering of the budget (times a factor)."""
    rendered = render_tenant_quota(BUDGET, Decimal(factor))
    values = {key: format_quantity(value) for key, value in rendered.items()} | hard
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": "tenant-solo"},
        "spec": {"hard": values},
        "status": {"hard": values, "used": {}},
    }


def vm(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMInstance",
        "metadata": {"name": name, "namespace": "tenant-solo"},
        "spec": {"instanceType": "u1.micro"},  # 1 vCPU, 1Gi
    }


def state(directory: Path, *objects: dict[str, Any]) -> list[str]:
    """State flags: the fixtures, plus tenant solo (16 cpu, 16Gi) and ``objects``."""
    directory.mkdir(exist_ok=True)
    solo = directory / "solo.yaml"
    solo.write_text(yaml.safe_dump_all([SOLO, *objects]))
    fixtures = [FIXTURES / "cozystack", FIXTURES / "tenants", solo]
    return [arg for path in fixtures for arg in ("--state", str(path))]


def sixteen_vms(tmp_path: Path) -> str:
    reviews = tmp_path / "reviews.json"
    bodies = [
        review("VMInstance", "tenant-solo", f"vm{i}", {"instanceType": "u1.micro"}, uid=f"u{i}")
        for i in range(1, 17)
    ]
    reviews.write_text("\n".join(json.dumps(body) for body in bodies))
    return str(reviews)


def decide(capsys: pytest.CaptureFixture[str], args: list[str]) -> list[dict[str, Any]]:
    assert main(["review", *args]) == 0
    return [json.loads(line)["response"] for line in capsys.readouterr().out.splitlines()]


def test_sixteen_1Gi_vms_in_a_16Gi_tenant_warn_from_the_thirteenth_under_todays_guard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = decide(
        capsys, [*state(tmp_path, tenant_quota("tenant-quota")), sixteen_vms(tmp_path)]
    )
    assert all(answer["allowed"] for answer in answers)  # the reservation decides
    warned = [i + 1 for i, answer in enumerate(answers) if _guard_warning(answer)]
    assert warned == [13, 14, 15, 16]
    assert "leaves 856Mi of requests.memory; this VM's pod needs 1294Mi" in _guard_warning(
        answers[12]
    )


def test_with_the_guard_widened_by_the_suggested_factor_no_vm_is_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = state(tmp_path, tenant_quota("tenant-quota"), *[vm(f"x{i}") for i in range(16)])
    assert main(["guard", *args, "-o", "json"]) == 0
    (row,) = [
        r
        for r in json.loads(capsys.readouterr().out)["namespaces"]
        if r["namespace"] == "tenant-solo"
    ]
    factor = row["smallestFactor"]
    assert factor == "1.27"
    widened = state(tmp_path, tenant_quota("tenant-quota", factor))
    answers = decide(capsys, [*widened, sixteen_vms(tmp_path)])
    assert [a for a in answers if _guard_warning(a)] == []


def test_a_tenants_own_quota_tighter_than_tenant_quota_is_the_one_that_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tight = tenant_quota("team-cap", **{"requests.memory": "8Gi"})
    args = state(tmp_path, tenant_quota("tenant-quota", "2"), tight)
    answers = decide(capsys, [*args, sixteen_vms(tmp_path)])
    warned = [i + 1 for i, answer in enumerate(answers) if _guard_warning(answer)]
    assert warned[0] == 7  # 6 x 1294Mi = 7764Mi of 8Gi
    assert "ResourceQuota team-cap" in _guard_warning(answers[6])


def test_guard_fail_on_short_exits_1_when_admitted_vms_cannot_all_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = [vm(f"x{i}") for i in range(16)]
    short = state(tmp_path / "a", tenant_quota("tenant-quota"), *full)
    assert main(["guard", *short, "--fail-on", "short"]) == 1
    table = capsys.readouterr().out
    assert table.splitlines()[1].startswith("tenant-solo")  # the short namespace comes first
    assert main(["guard", *short]) == 0
    capsys.readouterr()
    roomy = state(tmp_path / "b", tenant_quota("tenant-quota", "1.27"), *full)
    assert main(["guard", *roomy, "--fail-on", "short"]) == 0


def _guard_warning(answer: dict[str, Any]) -> str:
    found = [w for w in answer.get("warnings", []) if w.startswith("fits your quota, but")]
    return found[0] if found else ""

"""The pod-level guard: room left by a namespace's quotas, the warning, the factor to set."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.base.quantities import parse_quantity
from webhook.core.capacity.guard import (
    Quota,
    QuotaBook,
    factor_for_mix,
    guard_warning,
    quota_from_object,
    render_tenant_quota,
    smallest_factor,
)

Mi = Decimal(1024**2)
Gi = Decimal(1024**3)
ONE_GI_VM = {"cpu": Decimal(1), "memory": Gi}
LAUNCHER_1GI = Gi + 270 * Mi  # guest + KubeVirt's overhead for a 1-vCPU VM
RENDERING = Path(__file__).resolve().parents[3] / "fixtures/guard/tenant-quota-rendering.yaml"


def vms(count: int) -> list[tuple[tuple[str, str, str], dict[str, Decimal] | None]]:
    return [(("VMInstance", "tenant-a", f"vm{i}"), dict(ONE_GI_VM)) for i in range(count)]


def quota(name: str = "tenant-quota", used: dict[str, Decimal] | None = None, **hard: Any) -> Quota:
    return Quota(
        name, {k.replace("_", "."): parse_quantity(v) for k, v in hard.items()}, used or {}
    )


RENDERED_16GI = Quota(
    "tenant-quota", render_tenant_quota({"cpu": Decimal(16), "memory": 16 * Gi}), {}
)


@pytest.mark.parametrize(
    "example",
    yaml.safe_load(RENDERING.read_text())["examples"],
)
def test_tenant_quota_renders_as_the_chart_does(example: dict[str, Any]) -> None:
    declared = {k: parse_quantity(v) for k, v in example["resourceQuotas"].items()}
    expected = {k: parse_quantity(v) for k, v in example["tenantQuotaHard"].items()}
    assert render_tenant_quota(declared) == expected


def test_the_thirteenth_1Gi_vm_in_a_16Gi_guard_will_not_start() -> None:
    # 12 x (1Gi + 270Mi) = 15528Mi fits 16384Mi, leaving 856Mi; 13 x = 16822Mi does not.
    key = ("VMInstance", "tenant-a", "new")
    assert guard_warning(key, ONE_GI_VM, vms(11), [RENDERED_16GI]) is None
    warning = guard_warning(key, ONE_GI_VM, vms(12), [RENDERED_16GI])
    assert warning == (
        "fits your quota, but ResourceQuota tenant-quota leaves 856Mi of requests.memory; "
        "this VM's pod needs 1294Mi and will not start until the platform widens the guard"
    )
    assert len(warning) <= 256


def test_an_update_competes_only_with_the_other_applications() -> None:
    key = ("VMInstance", "tenant-a", "vm0")  # already stored, among the twelve
    assert guard_warning(key, ONE_GI_VM, vms(12), [RENDERED_16GI]) is None


def test_pods_already_running_count_when_they_exceed_what_was_admitted() -> None:
    running = Quota("tenant-quota", RENDERED_16GI.hard, {"requests.memory": 16 * Gi - 100 * Mi})
    warning = guard_warning(("VMInstance", "tenant-a", "new"), ONE_GI_VM, [], [running])
    assert warning is not None
    assert "leaves 100Mi of requests.memory" in warning


def test_the_tightest_quota_in_the_namespace_is_the_one_that_counts() -> None:
    own = quota("team-cap", requests_memory="8Gi")
    warning = guard_warning(
        ("VMInstance", "tenant-a", "new"), ONE_GI_VM, vms(6), [RENDERED_16GI, own]
    )
    # 6 x 1294Mi = 7764Mi of 8192Mi: 428Mi left for a 1294Mi launcher.
    assert warning is not None
    assert "ResourceQuota team-cap leaves 428Mi of requests.memory" in warning


def test_a_bare_memory_key_is_the_requests_memory_key() -> None:
    parsed = quota_from_object({"metadata": {"name": "q"}, "spec": {"hard": {"memory": "1Gi"}}})
    assert parsed.hard == {"requests.memory": Gi}


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param({"spec": {"hard": {"requests.memory": "lots"}}}, id="not-a-quantity"),
        pytest.param({"spec": {"hard": {"requests.memory": "1e99999"}}}, id="absurd-exponent"),
        pytest.param({"spec": {"hard": ["requests.memory"]}}, id="hard-is-a-list"),
        pytest.param({"spec": "x", "status": {"used": 7}}, id="spec-is-a-string"),
        pytest.param({"metadata": None}, id="no-metadata"),
    ],
)
def test_a_tenants_garbage_resourcequota_states_nothing_and_never_raises(
    garbage: dict[str, Any],
) -> None:
    parsed = quota_from_object(garbage)
    assert parsed.hard == {}
    assert guard_warning(("VMInstance", "t", "v"), ONE_GI_VM, [], [parsed]) is None


def test_the_factor_that_lets_sixteen_1Gi_vms_run_is_what_the_guard_report_suggests() -> None:
    budget = {"cpu": Decimal(16), "memory": 16 * Gi}
    need = {"requests.memory": 16 * LAUNCHER_1GI, "requests.cpu": Decimal("1.6")}
    factor = smallest_factor(budget, need)
    assert factor == Decimal("1.27")  # 16 x 1294Mi / 16384Mi = 1.2637 -> 1.27
    assert factor == factor_for_mix(16 * Gi, Gi)
    widened = Quota("tenant-quota", render_tenant_quota(budget, factor), {})
    assert guard_warning(("VMInstance", "tenant-a", "new"), ONE_GI_VM, vms(15), [widened]) is None


def test_no_single_factor_fits_every_mix() -> None:
    # Few large VMs need little room, many small ones need a lot: the shape of the overhead.
    # Launcher = guest + 268Mi (processes, one vCPU, IO thread, video) + guest/512 page tables.
    # 1 x (16Gi + 300Mi + 1 byte) / 16Gi = 1.018 -> 1.02
    assert factor_for_mix(16 * Gi, 16 * Gi) == Decimal("1.02")
    # 2 x (8Gi + 284Mi) / 16Gi = 1.035 -> 1.04
    assert factor_for_mix(16 * Gi, 8 * Gi) == Decimal("1.04")
    # 16 x (1Gi + 270Mi) / 16Gi = 1.264 -> 1.27
    assert factor_for_mix(16 * Gi, Gi) == Decimal("1.27")
    # 64 x (256Mi + 268Mi + 524289 bytes) / 16Gi = 2.049 -> 2.05
    assert factor_for_mix(16 * Gi, 256 * Mi) == Decimal("2.05")


def test_the_quota_book_keeps_each_namespaces_quotas_by_name() -> None:
    book = QuotaBook()
    book.observe("a", quota("q1", requests_memory="1Gi"))
    book.observe("a", quota("q1", requests_memory="2Gi"))
    book.observe("b", quota("q2", requests_memory="1Gi"))
    assert [q.hard["requests.memory"] for q in book.quotas("a")] == [2 * Gi]
    book.forget("a", "q1")
    assert book.quotas("a") == []
    assert book.namespaces() == ["b"]

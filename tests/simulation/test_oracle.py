"""The judge: pools recomputed from stored objects, and what counts as an overshoot."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tests.simulation.oracle import overshoots, pools

GI = Decimal(1024**3)


def stored(*objects: tuple[str, str, str, dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
    return {(p, ns, name): {"spec": spec} for p, ns, name, spec in objects}


def test_a_bounded_sub_tenant_counts_its_budget_in_the_parent_pool_not_its_usage() -> None:
    objects = stored(
        ("tenants", "tenant-root", "a", {"resourceQuotas": {"memory": "16Gi"}}),
        ("tenants", "tenant-a", "b", {"resourceQuotas": {"memory": "4Gi"}}),
        ("things", "tenant-a", "x", {"memory": "8Gi"}),
        ("things", "tenant-a-b", "y", {"memory": "1Gi"}),
    )
    figures = pools(objects)
    assert figures[("tenant-a", "memory")] == (12 * GI, 16 * GI)
    assert figures[("tenant-a-b", "memory")] == (1 * GI, 4 * GI)


def test_a_sub_tenant_over_its_budget_occupies_its_usage_in_the_parent_pool() -> None:
    objects = stored(
        ("tenants", "tenant-root", "a", {"resourceQuotas": {"memory": "16Gi"}}),
        ("tenants", "tenant-a", "b", {"resourceQuotas": {"memory": "2Gi"}}),
        ("things", "tenant-a-b", "y", {"memory": "6Gi"}),
    )
    figures = pools(objects)
    assert figures[("tenant-a", "memory")] == (6 * GI, 16 * GI)
    assert figures[("tenant-a-b", "memory")] == (6 * GI, 2 * GI)


def test_an_unbounded_key_of_a_sub_tenant_flows_up_to_the_parent_pool() -> None:
    objects = stored(
        ("tenants", "tenant-root", "a", {"resourceQuotas": {"memory": "16Gi", "cpu": "4"}}),
        ("tenants", "tenant-a", "b", {"resourceQuotas": {"cpu": "2"}}),
        ("things", "tenant-a-b", "y", {"memory": "3Gi", "cpu": "1"}),
    )
    figures = pools(objects)
    assert figures[("tenant-a", "memory")] == (3 * GI, 16 * GI)
    assert figures[("tenant-a", "cpu")] == (Decimal(2), Decimal(4))
    assert figures[("tenant-a-b", "cpu")] == (Decimal(1), Decimal(2))


def test_growing_past_the_budget_is_an_overshoot() -> None:
    before = pools(
        stored(
            ("tenants", "tenant-root", "a", {"resourceQuotas": {"memory": "16Gi"}}),
            ("things", "tenant-a", "x", {"memory": "12Gi"}),
        )
    )
    after = pools(
        stored(
            ("tenants", "tenant-root", "a", {"resourceQuotas": {"memory": "16Gi"}}),
            ("things", "tenant-a", "x", {"memory": "12Gi"}),
            ("things", "tenant-a", "y", {"memory": "12Gi"}),
        )
    )
    assert overshoots(before, after) == {
        ("tenant-a", "memory"): f"tenant-a memory: {24 * GI} used of {16 * GI} (was {12 * GI})"
    }


def test_a_budget_lowered_below_usage_is_no_overshoot_but_anything_added_there_is() -> None:
    full = ("things", "tenant-a", "x", {"memory": "12Gi"})
    before = pools(
        stored(("tenants", "tenant-root", "a", {"resourceQuotas": {"memory": "16Gi"}}), full)
    )
    lowered = pools(
        stored(("tenants", "tenant-root", "a", {"resourceQuotas": {"memory": "8Gi"}}), full)
    )
    assert overshoots(before, lowered) == {}
    grown = pools(
        stored(
            ("tenants", "tenant-root", "a", {"resourceQuotas": {"memory": "8Gi"}}),
            full,
            ("things", "tenant-a", "y", {"memory": "1Gi"}),
        )
    )
    assert list(overshoots(lowered, grown)) == [("tenant-a", "memory")]

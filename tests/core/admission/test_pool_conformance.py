"""Cozystack's own hierarchical-quota test scenarios, run against our pools and decision.

The data is ``fixtures/conformance/pool-cases.yaml``, transcribed from Cozystack's Go tests.
Cozystack's controller works in rendered keys (``limits.cpu``); we work in the shorthand keys
tenants write (``cpu``), so usage given in rendered keys is charged here under the shorthand
key it renders from. Where Cozystack's admission gate checks only the immediate parent and
same-namespace siblings, we check the nearest bounded ancestor per key; the last tests show
where that deliberately denies what the Go gate lets through.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
import yaml

from tests.builders import FIXTURES, review, state, thing
from webhook.core.admission.decisions import Policy, decide
from webhook.core.admission.reviews import parse_review
from webhook.core.admission.state import ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.quantities import parse_quantity
from webhook.core.tenancy.tenants import (
    ROOT_NAMESPACE,
    ancestors,
    owner_release,
    parent_namespace,
    parse_budget,
)

CASES: dict[str, Any] = yaml.safe_load(
    (FIXTURES / "conformance" / "pool-cases.yaml").read_text(encoding="utf-8")
)

# Sections that describe Cozystack machinery this project replaces rather than ports.
NOT_PORTED = {
    "scaleResourceList": "the --tenant-quota-buffer-percent clamp: reservations need no buffer",
    "reconcile": "writing tenant-quota-allocated ResourceQuotas: pod usage leaves the contract",
}


def quantities(values: dict[str, str] | None) -> dict[str, Decimal]:
    return {k: parse_quantity(v) for k, v in (values or {}).items()}


def shorthand(rendered: str) -> str:
    """``limits.cpu`` -> ``cpu``; ``requests.storage`` -> ``storage``; counts unchanged."""
    return rendered.split(".", 1)[1] if rendered.startswith(("limits.", "requests.")) else rendered


def usage_apps(used: dict[str, dict[str, str]] | None) -> list[Any]:
    apps = []
    for namespace, resources in (used or {}).items():
        charge = {shorthand(k): v for k, v in resources.items()}
        apps.append(thing(namespace, f"usage-{namespace}", **charge))
    return apps


def test_every_section_is_either_ported_or_deliberately_not() -> None:
    ported = {
        "parentNamespace",
        "parentTenantHelmReleaseRef",
        "renderedLimitKey",
        "computePools",
        "enforcedHard",
        "overcommitted",
        "admission",
    }
    assert set(CASES) == ported | set(NOT_PORTED)


@pytest.mark.parametrize(("namespace", "parent"), list(CASES["parentNamespace"].items()))
def test_parent_namespace(namespace: str, parent: str) -> None:
    assert parent_namespace(namespace) == parent


@pytest.mark.parametrize(("namespace", "ref"), list(CASES["parentTenantHelmReleaseRef"].items()))
def test_owner_release(namespace: str, ref: dict[str, str] | None) -> None:
    expected = (ref["name"], ref["namespace"]) if ref else None
    assert owner_release(namespace) == expected


@pytest.mark.parametrize(("key", "rendered"), list(CASES["renderedLimitKey"].items()))
def test_budgets_and_charges_share_the_shorthand_key(key: str, rendered: str) -> None:
    # Cozystack's gate reads status.used under the rendered key; we compare the shorthand key
    # on both sides, and refuse a rendered key in a budget, naming the shorthand to use.
    assert shorthand(rendered) == key
    assert parse_budget({"resourceQuotas": {key: "1"}}) == {key: Decimal(1)}
    if rendered != key:
        with pytest.raises(Exception, match=f'use the shorthand key "{key}"'):
            parse_budget({"resourceQuotas": {rendered: "1"}})


@pytest.mark.parametrize(
    "case", CASES["computePools"], ids=[c["name"].replace(" ", "-") for c in CASES["computePools"]]
)
def test_compute_pools(case: dict[str, Any]) -> None:
    current = state(case["tenants"])
    pools = {pool.namespace: pool for pool in current.tree.pools()}
    for namespace, expected in case["expect"].items():
        if expected == "absent":
            assert namespace not in pools
            continue
        pool = pools[namespace]
        if "budget" in expected:
            assert pool.budget == quantities(expected["budget"])
        if "carvedOut" in expected:
            carved = rl.total(current.tree.get(ns).budget for ns in pool.carve_outs)  # type: ignore[union-attr]
            assert rl.mask(carved, pool.budget) == quantities(expected["carvedOut"])
        if "available" in expected:
            assert pool.available == quantities(expected["available"])
        if "members" in expected:
            assert list(pool.members) == sorted(expected["members"])
        for key, value in expected.items():
            if key.startswith("enforcedHard_for_"):
                target = key.removeprefix("enforcedHard_for_").removesuffix("_with_no_usage")
                assert current.tree.ceiling(target) == quantities(value)


@pytest.mark.parametrize("case", CASES["enforcedHard"])
def test_enforced_hard_is_the_ceiling_of_a_member(case: dict[str, Any]) -> None:
    current = state(case["pool"], *usage_apps(case["used"]))
    for namespace, expected in case["expect"].items():
        assert current.tree.ceiling(namespace) == quantities(expected)


@pytest.mark.parametrize("case", CASES["overcommitted"])
def test_overcommitted(case: dict[str, Any]) -> None:
    current = state(case["tenants"])
    pools = {pool.namespace: pool for pool in current.tree.pools()}
    for namespace, expected in case["expect"].items():
        assert pools[namespace].overcommitted == quantities(expected)


def admission_state(case: dict[str, Any]) -> tuple[ReservationState, str]:
    """The tree a Go admission case describes; returns the namespace the child is created in."""
    home = case.get("parentNamespaceOfChild", "tenant-foo")
    # A tenant namespace exists only under its ancestors' Tenants (unbounded unless the case
    # says otherwise): tenant-foo-bar is tenant-foo's.
    tenants: dict[str, dict[str, str] | None] = {
        namespace: None for namespace in ancestors(home)[1:] if namespace != ROOT_NAMESPACE
    }
    if case["parent"] != "missing":
        tenants[home] = case["parent"]
    for name, budget in {**case.get("siblings", {}), **case.get("existingSelf", {})}.items():
        tenants[f"{home}-{name}"] = budget
    used = {**case.get("usedByParentPool", {}), **case.get("usedInOwnNamespace", {})}
    return state(tenants, *usage_apps(used)), home


@pytest.mark.parametrize(
    "case", CASES["admission"], ids=[c["name"].replace(" ", "-") for c in CASES["admission"]]
)
def test_tenant_admission(case: dict[str, Any]) -> None:
    current, home = admission_state(case)
    child = dict(case["child"] or {})
    name = child.pop("name", "child")
    updating = name in case.get("existingSelf", {})
    spec = {"resourceQuotas": child} if child else {}
    old = {"resourceQuotas": case["existingSelf"][name]} if updating else None
    operation = "UPDATE" if updating else "CREATE"
    body = review("Tenant", home, name, spec, operation=operation, old_spec=old)
    decision = decide(parse_review(body), current, Policy())
    assert decision.allowed is not case["denied"], decision.message


def test_a_bounded_grandchild_under_an_unbounded_parent_is_checked() -> None:
    # The Go gate allows early when the immediate parent declares nothing; computePools still
    # charges the grandchild's budget to tenant-foo, so we check it there.
    current = state({"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": None})
    body = review("Tenant", "tenant-foo-bar", "baz", {"resourceQuotas": {"cpu": "11"}})
    decision = decide(parse_review(body), current, Policy())
    assert not decision.allowed
    assert "pool tenant-foo (via tenant-foo-bar)" in decision.message


def test_carve_outs_behind_unbounded_siblings_count() -> None:
    # The Go gate sums only same-namespace siblings; tenant-foo-bar-x carves 6 of foo's 10
    # through the unbounded tenant-foo-bar, so 5 more do not fit.
    current = state(
        {"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": None, "tenant-foo-bar-x": {"cpu": "6"}}
    )
    body = review("Tenant", "tenant-foo", "qux", {"resourceQuotas": {"cpu": "5"}})
    decision = decide(parse_review(body), current, Policy())
    assert not decision.allowed
    assert "used: cpu=6" in decision.message


def test_a_memory_only_child_does_not_take_its_cpu_out_of_the_parent_pool() -> None:
    # computePools would make tenant-foo-bar its own pool for every key; we keep its cpu usage
    # in tenant-foo's cpu pool, since tenant-foo-bar limits only memory.
    current = state(
        {"tenant-foo": {"cpu": "4"}, "tenant-foo-bar": {"memory": "1Gi"}},
        thing("tenant-foo-bar", cpu="3"),
    )
    body = review("Thing", "tenant-foo", "more", {"cpu": "2"})
    decision = decide(parse_review(body), current, Policy())
    assert not decision.allowed
    assert "used: cpu=3, limited: cpu=4" in decision.message


def test_a_carve_out_lowered_below_its_usage_occupies_its_usage() -> None:
    # computePools sums the children's budgets (CarvedOut): lowering tenant-foo-bar to 1 would
    # free 5 of tenant-foo's 10 while bar still uses 6. We count max(budget, usage), so the
    # parent keeps 6 reserved for bar and the next 5 do not fit.
    current = state(
        {"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": {"cpu": "1"}},
        thing("tenant-foo-bar", cpu="6"),
    )
    (foo, bar) = current.tree.pools()
    assert foo.reserved == {"cpu": Decimal(6)}
    assert bar.overcommitted == {"cpu": Decimal(5)}
    body = review("Thing", "tenant-foo", "more", {"cpu": "5"})
    decision = decide(parse_review(body), current, Policy())
    assert not decision.allowed
    assert "used: cpu=6, limited: cpu=10" in decision.message

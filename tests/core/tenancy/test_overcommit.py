"""The overcommit factor: who may set it, its bounds and steps, the arithmetic, the re-pricing."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest

from tests.builders import ADMIN, request, state, tenant, thing
from webhook.admission.admit import apply_admitted
from webhook.core.admission.decisions import Decision, Policy, decide
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import Application
from webhook.core.tenancy.overcommit import (
    OVERCOMMIT_ANNOTATION,
    OvercommitError,
    OvercommitRules,
    apply_factors,
    parse_factors,
)

GI = 1024**3
ENFORCE = Policy()
D = Decimal


# -- parsing, arithmetic, bounds --------------------------------------------------------------


def test_a_factor_annotation_is_exact_decimals_by_key() -> None:
    assert parse_factors("cpu=2,memory=1.2") == {"cpu": D(2), "memory": D("1.2")}
    assert parse_factors(" memory = 1.25 ") == {"memory": D("1.25")}
    assert parse_factors("") == {}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("memory", "not key=decimal"),
        ("memory=1e3", "not a decimal"),
        ("memory=-1", "not a decimal"),
        ("memory=NaN", "not a decimal"),
        ("memory=1.2,memory=1.1", "given twice"),
        ("x" * 600, "longer than"),
    ],
)
def test_a_malformed_factor_annotation_says_why(text: str, why: str) -> None:
    with pytest.raises(OvercommitError, match=why):
        parse_factors(text)


def test_the_charge_is_the_ceiling_of_declared_over_factor() -> None:
    declared = {"memory": D(16 * GI), "cpu": D(2)}
    reserved = apply_factors(declared, {"memory": D("1.2"), "cpu": D(3)})
    assert reserved["memory"] == math.ceil(16 * GI / 1.2) == 14316557654
    assert reserved["cpu"] == D("0.667")  # 2/3 = 0.6666... rounded up to 1m


def test_rounding_is_up_on_every_key_a_1_byte_and_a_1m_case() -> None:
    assert apply_factors({"memory": D(1)}, {"memory": D("1.5")}) == {"memory": D(1)}
    assert apply_factors({"cpu": D("0.001")}, {"cpu": D(4)}) == {"cpu": D("0.001")}
    assert apply_factors({"storage": D(3)}, {"storage": D(2)}) == {"storage": D(2)}
    assert apply_factors({"services.loadbalancers": D(1)}, {"services.loadbalancers": D(2)}) == {
        "services.loadbalancers": D(1)
    }


def test_keys_without_a_factor_are_unchanged() -> None:
    assert apply_factors({"cpu": D(2), "memory": D(GI)}, {"memory": D(1)}) == {
        "cpu": D(2),
        "memory": D(GI),
    }


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ({}, {"memory": D("1.3")}, "largest allowed next value is 1.1"),
        ({"memory": D("1.4")}, {"memory": D("1.0")}, "smallest allowed next value is 1.3"),
        ({}, {"memory": D("0.9")}, "below 1.0"),
        ({"memory": D("1.5")}, {"memory": D("1.6")}, "above the maximum 1.5"),
        ({"cpu": D("4")}, {"cpu": D("4.1")}, "above the maximum 4"),
        ({}, {"storage": D("1.1")}, "above the maximum 1 for storage"),
    ],
)
def test_bounds_and_steps_are_refused_with_the_bound(
    old: dict[str, Decimal], new: dict[str, Decimal], why: str
) -> None:
    assert why in OvercommitRules().check(old, new)


def test_one_step_up_and_one_step_down_are_allowed() -> None:
    rules = OvercommitRules()
    assert rules.check({}, {"memory": D("1.1")}) == ""
    assert rules.check({"memory": D("1.4")}, {"memory": D("1.3")}) == ""
    assert rules.check({"memory": D("1.1")}, {}) == ""  # a revert from 1.1 is one step


def test_the_platform_is_system_masters_and_cozystacks_admin_group() -> None:
    rules = OvercommitRules()
    assert rules.may_set("kubernetes-admin", ["system:masters"])
    assert rules.may_set("ops", ["cozystack-cluster-admin"])
    assert not rules.may_set("alice", ["system:authenticated", "tenant-acme-admin"])
    sa = OvercommitRules(admins=frozenset({"system:serviceaccount:cozy-system:rollout"}))
    assert sa.may_set("system:serviceaccount:cozy-system:rollout", [])


# -- who may set it ---------------------------------------------------------------------------


def acme(*apps: Application) -> ReservationState:
    return state({"tenant-acme": {"memory": "16Gi"}}, *apps)


def factor_write(
    kind: str,
    name: str,
    spec: Any,
    new: str | None,
    old: str | None = None,
    *,
    namespace: str = "tenant-acme",
    operation: str = "UPDATE",
    who: dict[str, Any] | None = None,
) -> Any:
    return request(
        kind,
        namespace,
        name,
        spec,
        operation=operation,
        old_spec=spec if operation == "UPDATE" else None,
        annotations={OVERCOMMIT_ANNOTATION: new} if new is not None else None,
        old_annotations={OVERCOMMIT_ANNOTATION: old} if old is not None else None,
        **(who or {}),
    )


@pytest.mark.parametrize(
    ("new", "old", "operation", "fix"),
    [
        pytest.param("memory=1.1", None, "CREATE", "remove the annotation", id="set-on-create"),
        pytest.param("memory=1.1", None, "UPDATE", "remove the annotation", id="set"),
        pytest.param("memory=1.1", "memory=1.2", "UPDATE", "keep the annotation", id="change"),
        pytest.param(None, "memory=1.1", "UPDATE", "keep the annotation", id="remove"),
    ],
)
@pytest.mark.parametrize("kind", ["Thing", "Tenant"])
def test_a_tenant_user_setting_changing_or_removing_a_factor_is_denied_naming_who_may(
    kind: str, new: str | None, old: str | None, operation: str, fix: str
) -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}, "tenant-acme-dev": None})
    name = "t" if kind == "Thing" else "dev"
    namespace, spec = "tenant-acme", dict[str, str]()
    if new is None:  # removing: the platform set the factor first, so the record vouches for it
        first = "UPDATE" if kind == "Tenant" else "CREATE"
        granted = factor_write(kind, name, spec, old, None, operation=first, who=ADMIN)
        apply_admitted(current, granted, decide(granted, current, ENFORCE))
    decision = decide(
        factor_write(kind, name, spec, new, old, namespace=namespace, operation=operation),
        current,
        ENFORCE,
    )
    assert not decision.allowed
    assert decision.code == 403
    assert decision.reason == "overcommit-forbidden"
    assert "reserved to the platform (cozystack-cluster-admin, system:masters)" in decision.message
    assert "alice may not" in decision.message
    assert fix in decision.message


def test_an_unchanged_factor_carried_by_a_tenant_update_is_allowed() -> None:
    current = acme(thing("tenant-acme", "t", memory="1Gi"))
    decision = decide(
        factor_write("Thing", "t", {"memory": "1Gi"}, "memory=1.1", "memory=1.1"), current, ENFORCE
    )
    assert decision.allowed


def test_an_admin_jump_from_1_0_to_1_3_is_denied_and_1_1_allowed() -> None:
    current = acme(thing("tenant-acme", "t", memory="1Gi"))
    jump = decide(
        factor_write("Thing", "t", {"memory": "1Gi"}, "memory=1.3", who=ADMIN), current, ENFORCE
    )
    assert not jump.allowed
    assert jump.code == 422
    assert "1 -> 1.3 refused; the largest allowed next value is 1.1" in jump.message
    step = decide(
        factor_write("Thing", "t", {"memory": "1Gi"}, "memory=1.1", who=ADMIN), current, ENFORCE
    )
    assert step.allowed, step.message
    assert step.charge == {"memory": D(math.ceil(GI / 1.1))}
    assert step.audit["overcommit"] == "memory=1.1 (application)"
    assert step.audit["committed"] == '{"memory":"1Gi"}'


@pytest.mark.parametrize(
    ("text", "bound"),
    [("memory=0.9", "below 1.0"), ("cpu=4.1", "above the maximum 4")],
)
def test_an_admin_factor_out_of_bounds_is_denied_with_the_bound(text: str, bound: str) -> None:
    rules = OvercommitRules(step=D(10))  # so only the bound can refuse
    current = acme()
    decision = decide(
        factor_write("Thing", "t", {}, text, operation="CREATE", who=ADMIN),
        current,
        Policy(overcommit=rules),
    )
    assert not decision.allowed
    assert bound in decision.message


@pytest.mark.parametrize(("kind", "name"), [("Thing", "t"), ("Tenant", "fresh")])
def test_creating_an_object_with_a_factor_inside_the_bounds_needs_no_steps(
    kind: str, name: str
) -> None:
    """A new object has no old factor to step from: the bounds hold, the steps do not."""
    current = acme()
    created = decide(
        factor_write(kind, name, {}, "memory=1.5", operation="CREATE", who=ADMIN), current, ENFORCE
    )
    assert created.allowed, created.message
    above = decide(
        factor_write(kind, name, {}, "memory=1.6", operation="CREATE", who=ADMIN), current, ENFORCE
    )
    assert not above.allowed
    assert "above the maximum 1.5" in above.message


def walk(current: ReservationState, kind: str, name: str, spec: Any, *values: str) -> Decision:
    """An admin walks a factor up step by step on one object; returns the last decision."""
    old: str | None = None
    decision = Decision(allowed=False, outcome="")
    for value in values:
        decision = decide(
            factor_write(kind, name, spec, value, old, namespace="tenant-root", who=ADMIN),
            current,
            ENFORCE,
        )
        assert decision.allowed, decision.message
        assert decision.admitted is not None
        current.observe(decision.admitted)
        old = value
    return decision


def test_a_tenant_factor_re_prices_its_subtree_and_a_16gi_budget_holds_19_1gi_things() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}})
    for index in range(16):
        current.observe(thing("tenant-acme", f"t{index}", memory="1Gi"))
    assert not decide(
        request("Thing", "tenant-acme", "t16", {"memory": "1Gi"}), current, ENFORCE
    ).allowed
    walk(
        current,
        "Tenant",
        "acme",
        {"resourceQuotas": {"memory": "16Gi"}},
        "memory=1.1",
        "memory=1.2",
    )
    # Each 1Gi thing now reserves ceil(1073741824 / 1.2) = 894784854 bytes; 16 of them
    # reserve 14316557664, and 16Gi (17179869184) holds 19 (17000912226), not 20 (17895697080).
    pool = current.tree.get("tenant-acme")
    assert pool is not None
    assert pool.usage["memory"] == 16 * 894784854
    for index in range(16, 19):
        decision = decide(
            request("Thing", "tenant-acme", f"t{index}", {"memory": "1Gi"}), current, ENFORCE
        )
        assert decision.allowed, decision.message
        assert decision.factor == "memory=1.2 (tenant-acme)"
        assert decision.admitted is not None
        current.observe(decision.admitted)
    assert pool.usage["memory"] == 19 * 894784854 == 17000912226
    last = decide(request("Thing", "tenant-acme", "t19", {"memory": "1Gi"}), current, ENFORCE)
    assert not last.allowed
    assert "requested: memory=894784854" in last.message
    assert current.discounts()["tenant-acme"]["memory"] == 19 * (GI - 894784854)


def test_lowering_a_tenant_factor_may_overcommit_the_pool_and_is_allowed_with_a_warning() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}})
    walk(current, "Tenant", "acme", {"resourceQuotas": {"memory": "16Gi"}}, "memory=1.1")
    for index in range(17):  # 17 x ceil(1Gi / 1.1) = 17 x 976128931 fits 16Gi
        decision = decide(
            request("Thing", "tenant-acme", f"t{index}", {"memory": "1Gi"}), current, ENFORCE
        )
        assert decision.allowed, decision.message
        assert decision.admitted is not None
        current.observe(decision.admitted)
    revert = decide(
        factor_write(
            "Tenant",
            "acme",
            {"resourceQuotas": {"memory": "16Gi"}},
            None,
            "memory=1.1",
            namespace="tenant-root",
            who=ADMIN,
        ),
        current,
        ENFORCE,
    )
    assert revert.allowed, revert.message
    assert any("re-priced at the new factor" in w for w in revert.warnings), revert.warnings
    assert revert.admitted is not None
    current.observe(revert.admitted)
    pool = current.tree.get("tenant-acme")
    assert pool is not None
    assert pool.usage["memory"] == 17 * GI  # over the 16Gi budget: reported, nothing evicted
    assert not decide(
        request("Thing", "tenant-acme", "more", {"memory": "1"}), current, ENFORCE
    ).allowed


def test_a_factor_planted_without_the_webhook_is_not_believed() -> None:
    planted = Application("Thing", "tenant-acme", "t", {"memory": "8Gi"}, None, "memory=1.5")
    tenant_planted = Application(
        "Tenant", "tenant-root", "acme", {"resourceQuotas": {"memory": "16Gi"}}, None, "memory=1.5"
    )
    current = state({}, tenant_planted, planted)
    pool = current.tree.get("tenant-acme")
    assert pool is not None
    assert pool.usage["memory"] == 8 * GI
    assert current.factors_for("tenant-acme", None) == ({}, "")


def test_an_application_factor_wins_over_its_tenants() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}})
    walk(
        current,
        "Tenant",
        "acme",
        {"resourceQuotas": {"memory": "16Gi"}},
        "memory=1.1",
        "memory=1.2",
    )
    decision = decide(
        factor_write("Thing", "t", {"memory": "12Gi"}, "memory=1.3", operation="CREATE", who=ADMIN),
        current,
        ENFORCE,
    )
    # One step from the effective 1.2 it would otherwise inherit.
    assert decision.allowed, decision.message
    assert decision.factor == "memory=1.3 (application)"
    assert decision.charge == {"memory": D(math.ceil(12 * GI / D("1.3")))}


def test_nothing_changes_for_a_tenant_below_a_tenant_without_a_factor() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}, "tenant-acme-dev": None})
    tenant("tenant-acme-dev")
    decision = decide(request("Thing", "tenant-acme-dev", "t", {"memory": "1Gi"}), current, ENFORCE)
    assert decision.factor == ""
    assert decision.charge == {"memory": D(GI)}

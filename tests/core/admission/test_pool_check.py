"""Stage 4 alone: the hierarchical budget walk, unknown usage, counts and carve-outs."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.builders import request, state, tenant, thing
from webhook.core.admission.answers import BAD_BUDGET_KEY, Decision, Facts
from webhook.core.admission.factors import Factored, factor
from webhook.core.admission.modes import Mode
from webhook.core.admission.pool_check import (
    ModeFor,
    budget_key_refusal,
    check,
    check_pools,
    tenant_change,
)
from webhook.core.admission.price import Priced, price
from webhook.core.admission.resolve import Subject, resolve
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import Application
from webhook.core.tenancy.overcommit import OvercommitRules

GI = Decimal(1024**3)


def enforce(kind: str) -> Mode:
    return "enforce"


def warn(kind: str) -> Mode:
    return "warn"


def facts(namespace: str = "tenant-acme") -> Facts:
    return Facts(
        kind="Thing",
        charge={},
        delta={},
        digest="",
        admitted=Application("Thing", namespace, "x", {}),
    )


def staged(body: AdmissionRequest, current: ReservationState) -> Decision:
    """Stages 1 to 3 as the pipeline runs them, then this stage."""
    resolved = resolve(body, current)
    assert isinstance(resolved, Subject), resolved
    priced = price(resolved)
    assert isinstance(priced, Priced), priced
    factored = factor(resolved, priced, OvercommitRules())
    assert isinstance(factored, Factored), factored
    return check_pools(resolved, priced, factored, enforce)


# -- check: the walk up the tree ---------------------------------------------------------------


def test_an_increase_past_the_pool_budget_is_denied_naming_requested_used_limited() -> None:
    current = state({"tenant-acme": {"memory": "4Gi"}}, thing("tenant-acme", memory="3Gi"))
    denied = check("tenant-acme", {"memory": 2 * GI}, current, facts(), enforce)
    assert (denied.allowed, denied.reason) == (False, "exceeded")
    assert denied.message == (
        "exceeded tenant quota: pool tenant-acme, requested: memory=2Gi, "
        "used: memory=3Gi, limited: memory=4Gi"
    )
    assert denied.reserved_after == {"memory": 5 * GI}


def test_a_decrease_passes_even_in_an_overcommitted_pool() -> None:
    current = state({"tenant-acme": {"memory": "4Gi"}}, thing("tenant-acme", memory="9Gi"))
    allowed = check("tenant-acme", {"memory": -GI}, current, facts(), enforce)
    assert allowed.allowed
    assert allowed.charged_pools == {}


def test_each_key_is_checked_against_its_nearest_bounded_tenant() -> None:
    current = state({"tenant-a": {"memory": "8Gi", "cpu": "4"}, "tenant-a-b": {"cpu": "1"}})
    allowed = check("tenant-a-b", {"memory": GI, "cpu": Decimal(1)}, current, facts(), enforce)
    assert allowed.allowed, allowed.message
    assert allowed.charged_pools == {"tenant-a": {"memory": GI}, "tenant-a-b": {"cpu": Decimal(1)}}
    assert allowed.pool == "tenant-a-b"


def test_a_sub_tenants_label_patch_is_held_in_the_parent_pool_that_bounds_its_memory() -> None:
    # tenant-a-b bounds only cpu: a decision in tenant-a, the pool its memory counts in, rereads
    # tenant-a's ledger, so the label patch (which may write the old size back) is written there.
    current = state(
        {"tenant-a": {"memory": "8Gi"}, "tenant-a-b": {"cpu": "1"}},
        thing("tenant-a-b", memory="4Gi"),
    )
    body = request(
        "Thing",
        "tenant-a-b",
        "x",
        {"memory": "4Gi"},
        operation="UPDATE",
        old_spec={"memory": "4Gi"},
    )
    decision = staged(body, current)
    assert decision.allowed, decision.message
    assert decision.charged_pools == {"tenant-a": {}}


def test_a_namespace_with_no_quota_above_it_is_unlimited() -> None:
    allowed = check(
        "tenant-free", {"memory": 100 * GI}, state({"tenant-free": None}), facts(), enforce
    )
    assert allowed.allowed
    assert (allowed.pool, allowed.budget) == ("", {})


@pytest.mark.parametrize(
    ("change", "mode_for", "blocked"),
    [
        pytest.param({"memory": GI}, enforce, True, id="an-unknown-size-blocks-a-size-increase"),
        pytest.param({"memory": GI}, warn, False, id="not-when-its-kind-is-in-warn"),
        pytest.param(
            {"count/things.apps.cozystack.io": Decimal(1)}, enforce, False, id="nor-a-count"
        ),
    ],
)
def test_an_application_of_unknown_size_blocks_only_the_keys_it_could_hold(
    change: dict[str, Decimal], mode_for: ModeFor, blocked: bool
) -> None:
    budget = {"memory": "16Gi", "count/things.apps.cozystack.io": "10"}
    current = state({"tenant-acme": budget}, thing("tenant-acme", "broken", memory="lots"))
    decision = check("tenant-acme", change, current, facts(), mode_for)
    assert (decision.reason == "unknown-usage") is blocked
    if blocked:
        assert "Thing tenant-acme/broken is unknown" in decision.message


# -- counts and carve-outs ---------------------------------------------------------------------


def test_a_create_counts_one_of_its_kind() -> None:
    current = state(
        {"tenant-acme": {"count/things.apps.cozystack.io": "1"}}, thing("tenant-acme", "a")
    )
    denied = staged(request("Thing", "tenant-acme", "b", {}), current)
    assert denied.reason == "exceeded"
    assert "count/things.apps.cozystack.io" in denied.message


def test_an_update_counts_nothing() -> None:
    current = state(
        {"tenant-acme": {"count/things.apps.cozystack.io": "1"}}, thing("tenant-acme", "a")
    )
    body = request("Thing", "tenant-acme", "a", {"cpu": "1"}, operation="UPDATE", old_spec={})
    assert staged(body, current).allowed


def test_a_new_child_quota_is_carved_out_of_its_parents_pool() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}})
    child = tenant("tenant-acme-dev", {"memory": "4Gi"})
    change = tenant_change(
        request("Tenant", "tenant-acme", "dev", child.spec), current, child, facts()
    )
    assert not isinstance(change, Decision)
    contribution, warnings, counted = change
    assert contribution == {"memory": 4 * GI}
    assert counted == {"memory": 4 * GI}
    assert warnings == []


def test_a_carve_out_past_the_parents_budget_is_denied() -> None:
    current = state({"tenant-acme": {"memory": "4Gi"}})
    denied = staged(
        request("Tenant", "tenant-acme", "dev", {"resourceQuotas": {"memory": "8Gi"}}), current
    )
    assert denied.reason == "exceeded"


def test_a_tenant_name_the_chart_cannot_use_is_invalid() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}})
    bad = Application("Tenant", "tenant-acme", "Dev-1", {})
    refused = tenant_change(request("Tenant", "tenant-acme", "Dev-1", {}), current, bad, facts())
    assert isinstance(refused, Decision)
    assert refused.causes[0][0] == "metadata.name"


@pytest.mark.parametrize(
    ("quotas", "refused"),
    [
        pytest.param({"memory": "4Gi"}, False, id="a-resource-key-is-fine"),
        pytest.param({"not a key!": "1"}, True, id="a-key-a-resourcequota-refuses"),
        pytest.param({"count/nothings.apps.cozystack.io": "1"}, True, id="a-count-of-nothing"),
        pytest.param({"memory": "lots"}, False, id="a-bad-value-is-the-budgets-refusal"),
    ],
)
def test_budget_keys_are_screened_as_written(quotas: dict[str, str], refused: bool) -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}})
    body = request("Tenant", "tenant-acme", "dev", {"resourceQuotas": quotas})
    decision = budget_key_refusal(body, current)
    assert (decision is not None and decision.reason == BAD_BUDGET_KEY) is refused

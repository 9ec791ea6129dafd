"""Budget keys are validated where they enter: a Tenant's resourceQuotas at admission.

The rules are Kubernetes' for a ResourceQuota's ``hard`` (the chart renders the budget into
one), plus a maximum per budget and counts only of plurals the platform defines. Every hostile
key is a 422 naming it, in warn mode too; keys a stored Tenant already had are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import platform, request, state
from webhook.core.admission.decisions import Policy, decide
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.counts import (
    MAX_BUDGET_KEYS,
    MAX_KEY_CHARS,
    count_key,
    counted_plural,
    key_problem,
)

ENFORCE = Policy()
WARN = Policy(mode="warn")
PLURALS = platform().plurals()


def sub_tenant(quotas: Mapping[str, object], **kwargs: Any) -> AdmissionRequest:
    return request("Tenant", "tenant-acme", "dev", {"resourceQuotas": quotas}, **kwargs)


def acme() -> ReservationState:
    return state({"tenant-acme": {"memory": "16Gi"}})


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("cpu", id="cpu"),
        pytest.param("memory", id="memory"),
        pytest.param("ephemeral-storage", id="ephemeral-storage"),
        pytest.param("storage", id="storage"),
        pytest.param("services.loadbalancers", id="an-object-count-the-chart-emits-verbatim"),
        pytest.param("nvidia.com/GA102GL_A10", id="a-gpu-model"),
        pytest.param("count/vminstances.apps.cozystack.io", id="a-count-of-vms"),
        pytest.param("count/tenants.apps.cozystack.io", id="a-count-of-sub-tenants"),
        pytest.param("count/kuberneteses.apps.cozystack.io", id="an-irregular-plural"),
    ],
)
def test_the_keys_a_platform_uses_are_accepted(key: str) -> None:
    assert key_problem(key, Decimal(2), PLURALS) == ""
    decision = decide(sub_tenant({key: "2"}), acme(), ENFORCE)
    assert decision.allowed, decision.message


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        pytest.param("$\\x$", "1", "the name must be letters", id="mathtext-dollars"),
        pytest.param("mémoire", "1", "the name must be letters", id="unicode"),
        pytest.param("💾/disk", "1", "must be a DNS subdomain", id="unicode-prefix"),
        pytest.param("a" * 64, "1", "at most 63 characters", id="a-name-past-63"),
        pytest.param("x" * 5000, "1", f"at most {MAX_KEY_CHARS} characters", id="very-long"),
        pytest.param(
            "a" * 250 + ".io/gpu", "1", "whose prefix would pass", id="rendered-prefix-past-253"
        ),
        pytest.param("a/b/c", "1", "at most one '/'", id="two-slashes"),
        pytest.param("/gpu", "1", "DNS subdomain", id="empty-prefix"),
        pytest.param("Example.com/gpu", "1", "DNS subdomain", id="upper-case-prefix"),
        pytest.param("gpu", "1", "not a resource a ResourceQuota can limit", id="a-plain-unknown"),
        pytest.param(
            "services.clusterip", "1", "not a resource", id="flatten-emits-it-kubernetes-refuses"
        ),
        pytest.param("hugepages-2Mi", "1", "not a resource", id="hugepages-renders-limits"),
        pytest.param("memroy", "1", "(did you mean memory?)", id="a-typo-of-a-plain-key"),
        pytest.param("pods", "1500m", "must be a whole number", id="a-fractional-object-count"),
        pytest.param(
            "count/vminstances.apps.cozystack.io", "0.5", "whole number", id="a-fractional-count"
        ),
        pytest.param(
            "count/deployments.apps", "1", "only applications of apps.cozystack.io", id="apps-group"
        ),
        pytest.param(
            "count/.apps.cozystack.io", "1", "the name must be", id="a-count-of-no-plural"
        ),
        pytest.param(
            "count/vms.apps.cozystack.io",
            "1",
            'no application kind has the plural "vms"',
            id="an-unknown-plural",
        ),
    ],
)
def test_a_key_kubernetes_or_the_counts_would_refuse_is_a_422_naming_it(
    key: str, value: str, said: str
) -> None:
    decision = decide(sub_tenant({key: value}), acme(), ENFORCE)
    assert not decision.allowed
    assert (decision.code, decision.reason) == (422, "invalid-budget-key")
    assert said in decision.message
    field, _ = decision.causes[0]
    assert field.startswith("spec.resourceQuotas[")
    assert field.isascii(), "a hostile key is quoted back printable"
    assert len(field) < 100, "and bounded"


def test_an_unknown_plural_names_the_known_ones_and_the_closest() -> None:
    decision = decide(sub_tenant({"count/vminstance.apps.cozystack.io": "10"}), acme(), ENFORCE)
    assert not decision.allowed
    assert "did you mean count/vminstances.apps.cozystack.io?" in decision.message
    assert "known plurals: " + ", ".join(sorted(PLURALS)) in decision.message


def test_a_sub_tenant_with_two_thousand_made_up_keys_is_refused() -> None:
    quotas = {f"example.com/key{i}": "1" for i in range(2000)}
    decision = decide(sub_tenant(quotas), acme(), ENFORCE)
    assert not decision.allowed
    assert (decision.code, decision.reason) == (422, "invalid-budget-key")
    assert decision.message == (
        f"Tenant: resourceQuotas: 2000 keys exceed the limit of {MAX_BUDGET_KEYS} per budget"
    )


def test_a_budget_of_exactly_the_maximum_number_of_keys_is_accepted() -> None:
    quotas = {f"example.com/key{i}": "1" for i in range(MAX_BUDGET_KEYS)}
    assert decide(sub_tenant(quotas), acme(), ENFORCE).allowed


def test_a_hostile_key_is_refused_in_warn_mode_too() -> None:
    decision = decide(sub_tenant({"$\\x$": "1"}), acme(), WARN)
    assert not decision.allowed
    assert decision.mode == "enforce"
    assert decision.audit["decision"] == "denied"


def test_keys_the_stored_tenant_already_had_do_not_make_its_next_write_fail() -> None:
    old = {"gpu": "1", "memory": "1Gi"}
    update = sub_tenant(
        {"gpu": "1", "memory": "2Gi"}, operation="UPDATE", old_spec={"resourceQuotas": old}
    )
    assert decide(update, acme(), ENFORCE).allowed
    adding = sub_tenant(
        {"gpu": "1", "tpu": "1"}, operation="UPDATE", old_spec={"resourceQuotas": old}
    )
    refused = decide(adding, acme(), ENFORCE)
    assert not refused.allowed
    assert "resourceQuotas[tpu]" in refused.message


def test_an_update_cannot_grow_past_the_maximum_by_keeping_old_keys() -> None:
    old = {f"example.com/key{i}": "1" for i in range(MAX_BUDGET_KEYS)}
    grown = {**old, "example.com/one-more": "1"}
    update = sub_tenant(grown, operation="UPDATE", old_spec={"resourceQuotas": old})
    decision = decide(update, acme(), ENFORCE)
    assert not decision.allowed
    assert f"{MAX_BUDGET_KEYS + 1} keys exceed the limit" in decision.message


@given(st.text(max_size=400))
def test_any_text_as_a_key_gets_an_answer_never_an_exception(key: str) -> None:
    problem = key_problem(key, Decimal(1), PLURALS)
    if not problem:
        assert key.isascii()
        assert len(key) <= MAX_KEY_CHARS
        assert key.count("/") <= 1


@given(st.sampled_from(sorted(PLURALS)))
def test_a_count_key_names_its_plural_back(plural: str) -> None:
    assert counted_plural(count_key(plural)) == plural
    assert key_problem(count_key(plural), Decimal(3), PLURALS) == ""


@pytest.mark.parametrize(
    "spoiler",
    [
        pytest.param({"zzz": "not-a-quantity"}, id="a-value-that-does-not-parse"),
        pytest.param({"memory": "-1"}, id="a-negative-value"),
        pytest.param({"limits.cpu": "1"}, id="a-prefixed-key"),
    ],
)
def test_warn_mode_never_stores_hostile_keys_behind_another_refusal_to_keep_them_later(
    spoiler: Mapping[str, str],
) -> None:
    # In warn mode a refusal is admitted with a warning: a budget refused for another reason
    # before its keys were looked at would be stored with 2000 made-up keys, and the Tenant's
    # next write (the spoiler fixed) would keep them as keys "the stored Tenant already had".
    planted = {f"example.com/key{i}": "1" for i in range(2000)}
    decision = decide(sub_tenant({**planted, **spoiler}), acme(), WARN)
    assert not decision.allowed
    assert (decision.mode, decision.reason) == ("enforce", "invalid-budget-key")
    assert f"exceed the limit of {MAX_BUDGET_KEYS}" in decision.message
    one = decide(sub_tenant({"$\\x$": "1", **spoiler}), acme(), WARN)
    assert (one.allowed, one.reason) == (False, "invalid-budget-key")


def test_in_warn_mode_a_bad_value_under_good_keys_is_still_only_warned_about() -> None:
    alone = decide(sub_tenant({"memory": "-1", "cpu": "2"}), acme(), WARN)
    assert alone.allowed
    assert alone.mode == "warn"
    assert "must not be negative" in alone.warnings[0]


@given(
    st.sampled_from(["$\\x$", "gpu", "count/vms.apps.cozystack.io", "a/b/c", "limits.cpu"]),
    st.dictionaries(
        st.sampled_from(["cpu", "memory", "storage", "pods", "nvidia.com/gpu"]),
        st.sampled_from(["1", "2Gi", "-1", "lots", "0.5", ""]),
        max_size=4,
    ),
)
def test_in_warn_mode_a_budget_with_a_hostile_key_is_never_admitted_whatever_else_it_holds(
    bad: str, rest: Mapping[str, str]
) -> None:
    decision = decide(sub_tenant({**rest, bad: "1"}), acme(), WARN)
    assert not decision.allowed
    assert decision.mode == "enforce"

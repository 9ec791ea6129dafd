"""Policy reports as values: one OpenReports ``Report`` per tenant namespace, one result per
application, the worst first, bounded whatever a tenant creates or writes."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import state, tenant, thing
from tests.crd_schema import check, crd_schema
from webhook.core.admission.policy_reports import (
    MAX_MESSAGE,
    MAX_RESULTS,
    TRUNCATED_ANNOTATION,
    build_reports,
    report_content,
)
from webhook.core.capacity.guard import Quota, QuotaBook
from webhook.core.tenancy.applications import Application


def valid(report: dict[str, Any]) -> dict[str, Any]:
    """The report, checked against the published CRD's schema (no unknown fields either)."""
    check(report, crd_schema("openreports.io_reports.yaml", "v1alpha1"))
    return report


def results(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {r["resources"][0]["name"]: (r["result"], r["rule"]) for r in report["results"]}


def test_an_application_that_fits_passes_and_a_lowered_budget_turns_it_into_a_fail() -> None:
    current = state({"tenant-acme": {"memory": "8Gi"}}, thing("tenant-acme", "db", memory="4Gi"))
    report = valid(build_reports(current)["tenant-acme"])
    assert results(report) == {"db": ("pass", "fits")}
    assert report["summary"] == {"pass": 1, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    current.observe(tenant("tenant-acme", {"memory": "2Gi"}))
    report = valid(build_reports(current)["tenant-acme"])
    assert results(report) == {"db": ("fail", "over-budget")}
    (result,) = report["results"]
    assert result["properties"] == {
        "budget": "2Gi",
        "charge": "memory=4Gi",
        "pool": "tenant-acme",
        "reserved": "4Gi",
        "resource": "memory",
    }
    assert "over by 2Gi" in result["message"]
    assert result["severity"] == "high"


def test_an_application_that_cannot_be_evaluated_is_an_error_with_the_reason() -> None:
    broken = Application("VMInstance", "tenant-acme", "vm", {"instanceType": "no.such"})
    report = valid(build_reports(state({"tenant-acme": {"memory": "8Gi"}}, broken))["tenant-acme"])
    assert results(report) == {"vm": ("error", "unknown-reservation")}
    assert "no.such" in report["results"][0]["message"]


def test_near_the_limit_warns_with_the_share() -> None:
    current = state({"tenant-acme": {"memory": "10Gi"}}, thing("tenant-acme", "a", memory="9Gi"))
    report = valid(build_reports(current)["tenant-acme"])
    assert results(report) == {"a": ("warn", "near-limit")}
    assert "(90%)" in report["results"][0]["message"]


def test_a_resourcequota_short_of_the_admitted_pods_warns() -> None:
    vm = Application("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.medium"})
    current = state({"tenant-acme": {"memory": "64Gi", "cpu": "64"}}, vm)
    quotas = QuotaBook()
    quotas.observe("tenant-acme", Quota("tenant-quota", {"requests.memory": Decimal(2**30)}, {}))
    report = valid(build_reports(current, quotas=quotas)["tenant-acme"])
    assert results(report) == {"vm": ("warn", "pod-level-guard")}
    assert report["results"][0]["properties"]["quotaResource"] == "requests.memory"


def test_every_declared_tenant_gets_a_report_even_an_empty_one() -> None:
    reports = build_reports(state({"tenant-acme": {"memory": "1Gi"}, "tenant-acme-dev": None}))
    assert sorted(reports) == ["tenant-acme", "tenant-acme-dev", "tenant-root"]
    assert valid(reports["tenant-acme-dev"])["results"] == []


def test_a_namespace_scope_keeps_that_tenant_and_those_below_it() -> None:
    tenants = {"tenant-acme": {"memory": "1Gi"}, "tenant-acme-dev": None, "tenant-beta": None}
    assert sorted(build_reports(state(tenants), namespace="tenant-acme")) == [
        "tenant-acme",
        "tenant-acme-dev",
    ]


def test_a_tenant_creating_thousands_of_applications_cannot_grow_its_report_past_the_cap() -> None:
    apps = [thing("tenant-acme", f"a{i:04d}", memory="1Mi") for i in range(MAX_RESULTS + 100)]
    broken = Application("VMInstance", "tenant-acme", "zz-broken", {"instanceType": "no.such"})
    report = valid(
        build_reports(state({"tenant-acme": {"memory": "8Gi"}}, *apps, broken))["tenant-acme"]
    )
    assert len(report["results"]) == MAX_RESULTS
    assert report["summary"]["pass"] == MAX_RESULTS + 100
    assert report["summary"]["error"] == 1
    assert report["results"][0]["result"] == "error"  # the worst is never the one left out
    assert report["configuration"] == {"limits": {"maxResults": MAX_RESULTS}}
    assert report["metadata"]["annotations"][TRUNCATED_ANNOTATION].startswith(
        f"101 of {MAX_RESULTS + 101} results left out"
    )


def test_a_huge_value_quoted_in_a_reason_is_cut_in_the_report() -> None:
    broken = Application("VMInstance", "tenant-acme", "vm", {"instanceType": "x" * 100_000})
    report = valid(build_reports(state({"tenant-acme": None}, broken))["tenant-acme"])
    (result,) = report["results"]
    assert len(result["message"]) <= MAX_MESSAGE
    assert all(len(value) <= MAX_MESSAGE for value in result["properties"].values())


def test_the_same_state_gives_the_same_content() -> None:
    def build() -> dict[str, Any]:
        current = state({"tenant-acme": {"memory": "8Gi"}}, thing("tenant-acme", memory="1Gi"))
        return build_reports(current)["tenant-acme"]

    first, second = build(), build()
    stored = {**second, "metadata": {**second["metadata"], "resourceVersion": "7", "uid": "u"}}
    assert report_content(first) == report_content(stored)
    lowered = state({"tenant-acme": {"memory": "1Mi"}}, thing("tenant-acme", memory="1Gi"))
    assert report_content(build_reports(lowered)["tenant-acme"]) != report_content(first)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=12), min_size=0, max_size=30),
    st.integers(min_value=1, max_value=64),
)
def test_the_summary_counts_every_application_and_results_are_worst_first(
    sizes: list[int], budget: int
) -> None:
    apps = [thing("tenant-acme", f"a{i}", memory=f"{size}Gi") for i, size in enumerate(sizes)]
    report = valid(
        build_reports(state({"tenant-acme": {"memory": f"{budget}Gi"}}, *apps))["tenant-acme"]
    )
    assert sum(report["summary"].values()) == len(apps)
    order = {"error": 0, "fail": 1, "warn": 2, "pass": 3}
    ranks = [order[r["result"]] for r in report["results"]]
    assert ranks == sorted(ranks)
    over = sum(sizes) > budget
    # Over budget, every application reserving memory fails; none fails otherwise.
    fails = {r["resources"][0]["name"] for r in report["results"] if r["result"] == "fail"}
    assert fails == ({f"a{i}" for i, s in enumerate(sizes) if s} if over else set())


def test_the_schema_check_refuses_a_field_the_crd_does_not_know() -> None:
    report = build_reports(state({"tenant-acme": None}))["tenant-acme"]
    with pytest.raises(AssertionError, match="truncated"):
        valid({**report, "truncated": True})
    with pytest.raises(AssertionError, match=r"results\.0\.result"):
        valid({**report, "results": [{"policy": "p", "result": "maybe"}]})


def test_a_carve_out_report_never_shows_the_parent_pool_it_cannot_be_denied_by() -> None:
    # A carve-out's writes are checked against its own budget only (it occupies max(quota,
    # usage) of the parent): the parent's figures, the sum of its siblings' applications, are
    # none of its business, and a parent lowered below what it holds denies none of its writes.
    current = state(
        {"tenant-acme": {"memory": "16Gi"}, "tenant-acme-dev": {"memory": "4Gi"}},
        thing("tenant-acme", "sibling", memory="11Gi"),
        thing("tenant-acme-dev", "vm", memory="1Gi"),
    )
    current.observe(tenant("tenant-acme", {"memory": "12Gi"}))  # lowered: 11 + 4 of 12
    report = valid(build_reports(current)["tenant-acme-dev"])
    assert results(report) == {"vm": ("pass", "fits")}
    (result,) = report["results"]
    assert result["properties"]["pool"] == "tenant-acme-dev"
    assert "tenant-acme " not in result["message"]
    assert "15Gi" not in str(result)
    current.observe(tenant("tenant-acme", {"memory": "16Gi"}))  # 15 of 16: near the limit
    (result,) = valid(build_reports(current)["tenant-acme-dev"])["results"]
    assert (result["result"], "15Gi" in str(result)) == ("pass", False)
    # The parent's own members still see its figures.
    parent = valid(build_reports(current)["tenant-acme"])
    assert results(parent)["sibling"] == ("warn", "near-limit")


def test_hostile_unicode_in_reasons_never_pushes_a_report_past_what_the_api_server_takes() -> None:
    # Applications admitted in warn mode keep values that no longer evaluate, and the reason
    # quotes them: 500 reasons of 1024 emoji are 6 MiB as the client sends JSON (12 bytes each),
    # so the report would never be written and the stale one (a pass) would stay.
    hostile = "\U0001f600" * 5000
    apps = [
        Application("VMInstance", "tenant-acme", f"vm{i:04d}", {"instanceType": hostile})
        for i in range(MAX_RESULTS + 50)
    ]
    current = state({"tenant-acme": {"memory": "8Gi"}}, *apps)
    current.observe(thing("tenant-acme", "db", memory="9Gi"))  # over budget: a fail
    report = valid(build_reports(current)["tenant-acme"])
    assert len(json.dumps(report)) <= 1024 * 1024  # etcd stores 1.5 MiB; room for metadata
    assert report["summary"]["error"] == MAX_RESULTS + 50
    assert report["summary"]["fail"] == 1
    left_out = MAX_RESULTS + 51 - len(report["results"])
    assert left_out > 50
    assert report["metadata"]["annotations"][TRUNCATED_ANNOTATION].startswith(
        f"{left_out} of {MAX_RESULTS + 51} results left out"
    )


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.text(min_size=0, max_size=2 * MAX_MESSAGE), min_size=1, max_size=3),
    st.integers(min_value=1, max_value=MAX_RESULTS + 20),
)
def test_any_text_in_any_number_of_findings_keeps_a_report_within_its_bytes(
    texts: list[str], count: int
) -> None:
    from webhook.core.admission.policy_reports import MAX_REPORT_BYTES, _Finding, assemble_report

    findings = [
        (
            ("VMInstance", "tenant-acme", f"vm{i:04d}"),
            _Finding("error", "unknown-reservation", texts[i % len(texts)], {"charge": texts[0]}),
        )
        for i in range(count)
    ]
    report = assemble_report("tenant-acme", findings)
    assert len(json.dumps(report)) <= MAX_REPORT_BYTES
    assert report["summary"]["error"] == count
    left_out = count - len(report["results"])
    annotations = report["metadata"].get("annotations", {})
    assert (TRUNCATED_ANNOTATION in annotations) == (left_out > 0)

"""The admission decision, as a specification."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal

import pytest

from tests.builders import request, signed, signed_marks, signed_record, state, tenant, thing
from webhook.core.admission.decisions import Decision, Policy, decide, mutate
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import (
    CHARGE_ANNOTATION,
    Application,
)

ENFORCE = Policy()
MICRO = {"instanceType": "u1.micro"}  # KubeVirt u1.micro: 1 vCPU, 1Gi


def acme(*apps: Application) -> ReservationState:
    return state({"tenant-acme": {"memory": "16Gi"}}, *apps)


def vm(name: str, spec: Mapping[str, object] | None = None) -> Application:
    return Application("VMInstance", "tenant-acme", name, spec or MICRO)


def create_vm(current: ReservationState, name: str, **kwargs: object) -> Decision:
    return decide(request("VMInstance", "tenant-acme", name, MICRO, **kwargs), current, ENFORCE)


def test_sixteen_1gi_vms_fill_a_16gi_quota_and_the_seventeenth_is_denied() -> None:
    current = acme()
    for index in range(16):
        decision = create_vm(current, f"vm{index}")
        assert decision.allowed, decision.message
        assert decision.admitted is not None
        current.observe(decision.admitted)
    denied = create_vm(current, "vm16")
    assert not denied.allowed
    assert denied.code == 403
    assert denied.status_reason == "Forbidden"
    assert denied.message == (
        "exceeded tenant quota: pool tenant-acme, requested: memory=1Gi, "
        "used: memory=16Gi, limited: memory=16Gi"
    )


def test_a_denial_names_the_pool_and_the_namespace_it_came_through() -> None:
    current = state(
        {"tenant-foo": {"memory": "16Gi"}, "tenant-foo-bar": None},
        thing("tenant-foo", memory="12Gi"),
    )
    decision = decide(request("Thing", "tenant-foo-bar", "x", {"memory": "8Gi"}), current, ENFORCE)
    assert decision.message == (
        "exceeded tenant quota: pool tenant-foo (via tenant-foo-bar), requested: memory=8Gi, "
        "used: memory=12Gi, limited: memory=16Gi"
    )


def test_an_update_is_charged_only_its_delta() -> None:
    current = acme(thing("tenant-acme", "other", memory="12Gi"), vm("web", MICRO))
    bigger = {"instanceType": "u1.medium"}  # 1 vCPU, 4Gi: +3Gi
    decision = decide(
        request("VMInstance", "tenant-acme", "web", bigger, operation="UPDATE", old_spec=MICRO),
        current,
        ENFORCE,
    )
    assert decision.allowed, decision.message
    assert decision.delta == {"memory": Decimal(3 * 1024**3)}
    assert decision.reserved_after["memory"] == Decimal(16 * 1024**3)


def test_a_decrease_is_allowed_even_in_an_overcommitted_pool() -> None:
    current = acme(thing("tenant-acme", "big", memory="20Gi"))
    decision = decide(
        request(
            "Thing",
            "tenant-acme",
            "big",
            {"memory": "18Gi"},
            operation="UPDATE",
            old_spec={"memory": "20Gi"},
        ),
        current,
        ENFORCE,
    )
    assert decision.allowed


def test_a_no_op_update_of_a_sparse_object_against_its_defaulted_old_self_charges_nothing() -> None:
    current = acme(Application("Postgres", "tenant-acme", "db", {}))
    platform = current.platform
    defaulted = platform.kinds["Postgres"].defaulted({})
    decision = decide(
        request("Postgres", "tenant-acme", "db", {}, operation="UPDATE", old_spec=defaulted),
        current,
        ENFORCE,
    )
    assert decision.allowed
    assert decision.delta == {}


def test_the_old_charge_recorded_on_the_old_object_wins_over_re_evaluation() -> None:
    recorded = signed("VMInstance", "tenant-acme", "web", MICRO, {"memory": "2Gi"}, "sha256:old")
    current = acme(thing("tenant-acme", "filler", memory="14Gi"))
    decision = decide(
        request(
            "VMInstance",
            "tenant-acme",
            "web",
            {"instanceType": "u1.small"},
            operation="UPDATE",
            old_spec=MICRO,
            old_annotations={CHARGE_ANNOTATION: recorded},
        ),
        current,
        ENFORCE,
    )
    # u1.small is 2Gi; recorded old charge 2Gi: no increase, though MICRO evaluates to 1Gi.
    assert decision.allowed
    assert decision.delta == {"cpu": Decimal(1)}


def test_a_namespace_in_no_pool_is_unlimited_but_still_evaluated() -> None:
    current = state({"tenant-free": None})
    allowed = decide(request("Thing", "tenant-free", "x", {"memory": "1Ti"}), current, ENFORCE)
    assert allowed.allowed
    assert allowed.warnings[0] == "reserves memory=1Ti; no tenant quota applies"
    broken = decide(
        request("VMInstance", "tenant-free", "vm", {"instanceType": "u9.huge"}), current, ENFORCE
    )
    assert not broken.allowed


def test_values_that_cannot_be_evaluated_are_invalid_with_the_field() -> None:
    decision = decide(
        request(
            "VMInstance",
            "tenant-acme",
            "vm",
            {"instanceType": "", "resources": {"cpu": 1, "sockets": 1, "memory": "12Gx"}},
        ),
        acme(),
        ENFORCE,
    )
    assert not decision.allowed
    assert decision.code == 422
    assert decision.status_reason == "Invalid"
    assert decision.causes == (
        ("spec.resources.memory", 'VMInstance: resources.memory: "12Gx" is not a quantity'),
    )


def test_an_unknown_kind_fails_closed() -> None:
    decision = decide(request("Mystery", "tenant-acme", "x", {}), acme(), ENFORCE)
    assert not decision.allowed
    assert decision.reason == "unknown-kind"


def test_a_state_that_is_not_synced_denies_with_try_again() -> None:
    current = acme()
    current.synced = False
    decision = create_vm(current, "vm")
    assert not decision.allowed
    assert decision.code == 503
    assert "try again" in decision.message


def test_delete_is_allowed_without_evaluation() -> None:
    decision = decide(
        request("VMInstance", "tenant-acme", "vm", None, operation="DELETE", old_spec=MICRO),
        acme(),
        ENFORCE,
    )
    assert decision.allowed
    assert decision.outcome == "skipped"


def test_dry_run_decides_fully_and_says_nothing_was_reserved() -> None:
    decision = create_vm(acme(), "vm", dry_run=True)
    assert decision.allowed
    assert decision.warnings[-1] == "dry run: nothing was reserved"
    assert decision.audit["charge"] == '{"cpu":"1","memory":"1Gi"}'


def test_an_unknown_application_blocks_growth_of_its_pool_and_is_named() -> None:
    broken = Application("VMInstance", "tenant-acme", "legacy", {"instanceType": "u9.huge"})
    current = acme(broken)
    decision = create_vm(current, "vm")
    assert not decision.allowed
    assert decision.reason == "unknown-usage"
    assert "VMInstance tenant-acme/legacy is unknown" in decision.message
    assert 'unknown instance type "u9.huge"' in decision.message  # why
    assert "fix its spec so it evaluates, or delete it" in decision.message  # what to do


def test_an_unevaluable_application_admitted_in_warn_mode_does_not_block_enforced_kinds() -> None:
    # Kubernetes runs in warn: an unevaluable cluster is admitted with a warning. The VMs of the
    # same pool, enforced, still get their decisions instead of being blocked by it.
    policy = Policy(per_kind={"Kubernetes": "warn"})
    broken = {"nodeGroups": {"md0": {"maxReplicas": 1, "instanceType": "u9.huge"}}}
    current = acme()
    cluster = decide(request("Kubernetes", "tenant-acme", "k", broken), current, policy)
    assert cluster.allowed
    assert cluster.outcome == "warned"
    current.observe(Application("Kubernetes", "tenant-acme", "k", broken))
    assert current.unknown()
    vm_decision = decide(request("VMInstance", "tenant-acme", "vm", MICRO), current, policy)
    assert vm_decision.allowed, vm_decision.message
    # an enforced kind's unknown application still blocks
    current.observe(Application("VMInstance", "tenant-acme", "legacy", {"instanceType": "u9.x"}))
    blocked = decide(request("VMInstance", "tenant-acme", "vm2", MICRO), current, policy)
    assert not blocked.allowed
    assert blocked.reason == "unknown-usage"


def test_an_unevaluable_application_with_a_recorded_charge_keeps_it() -> None:
    legacy = Application(
        "VMInstance",
        "tenant-acme",
        "legacy",
        {"instanceType": "u9.huge"},
        recorded=signed_record(
            "VMInstance",
            "tenant-acme",
            "legacy",
            {"instanceType": "u9.huge"},
            {"memory": "15Gi"},
            "sha256:recorded",
        ),
    )
    current = acme(legacy)
    record = current.record(legacy.key)
    assert record is not None
    assert record.problem == 'VMInstance: instanceType: unknown instance type "u9.huge"'
    first = create_vm(current, "vm1")  # 15Gi + 1Gi = 16Gi fits
    assert first.allowed
    assert first.admitted is not None
    current.observe(first.admitted)
    assert not create_vm(current, "vm2").allowed


class TestTenants:
    def test_a_budget_is_a_carve_out_in_the_parent_pool(self) -> None:
        current = state({"tenant-foo": {"cpu": "10"}}, thing("tenant-foo", cpu="4"))
        fits = decide(
            request("Tenant", "tenant-foo", "bar", {"resourceQuotas": {"cpu": "6"}}),
            current,
            ENFORCE,
        )
        over = decide(
            request("Tenant", "tenant-foo", "bar", {"resourceQuotas": {"cpu": "7"}}),
            current,
            ENFORCE,
        )
        assert fits.allowed
        assert not over.allowed

    def test_adding_a_budget_moves_the_subtree_usage_out_and_the_budget_in(self) -> None:
        current = state(
            {"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": None},
            thing("tenant-foo", cpu="3"),
            thing("tenant-foo-bar", cpu="5"),
        )
        # bar's contribution goes from its usage (5) to its budget (7): +2 fits in 10 - 8.
        grow = decide(
            request(
                "Tenant",
                "tenant-foo",
                "bar",
                {"resourceQuotas": {"cpu": "7"}},
                operation="UPDATE",
                old_spec={},
            ),
            current,
            ENFORCE,
        )
        assert grow.allowed, grow.message
        assert grow.reserved_after == {"cpu": Decimal(10)}
        too_much = decide(
            request(
                "Tenant",
                "tenant-foo",
                "bar",
                {"resourceQuotas": {"cpu": "8"}},
                operation="UPDATE",
                old_spec={},
            ),
            current,
            ENFORCE,
        )
        assert not too_much.allowed

    def test_a_budget_below_current_usage_is_allowed_with_a_warning(self) -> None:
        current = state(
            {"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": None}, thing("tenant-foo-bar", cpu="5")
        )
        decision = decide(
            request(
                "Tenant",
                "tenant-foo",
                "bar",
                {"resourceQuotas": {"cpu": "2"}},
                operation="UPDATE",
                old_spec={},
            ),
            current,
            ENFORCE,
        )
        assert decision.allowed
        assert any("overcommitted" in w for w in decision.warnings)

    def test_removing_a_budget_moves_the_usage_back_into_the_parent(self) -> None:
        current = state(
            {"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": {"cpu": "6"}},
            thing("tenant-foo", cpu="3"),
            thing("tenant-foo-bar", cpu="4"),
        )
        decision = decide(
            request(
                "Tenant",
                "tenant-foo",
                "bar",
                {},
                operation="UPDATE",
                old_spec={"resourceQuotas": {"cpu": "6"}},
            ),
            current,
            ENFORCE,
        )
        # bar occupied its budget (6); without one it occupies its usage (4): 3 + 4 = 7
        assert decision.allowed, decision.message
        assert decision.reserved_after == {"cpu": Decimal(7)}

    def test_removing_a_budget_below_usage_frees_nothing(self) -> None:
        current = state(
            {"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": {"cpu": "2"}},
            thing("tenant-foo", cpu="6"),
            thing("tenant-foo-bar", cpu="4"),  # overcommitted child: 4 > 2
        )
        assert current.tree.get("tenant-foo").usage["cpu"] == 10  # type: ignore[union-attr]
        decision = decide(
            request(
                "Tenant",
                "tenant-foo",
                "bar",
                {},
                operation="UPDATE",
                old_spec={"resourceQuotas": {"cpu": "2"}},
            ),
            current,
            ENFORCE,
        )
        assert decision.allowed, decision.message
        assert decision.reserved_after == {"cpu": Decimal(10)}

    def test_prefixed_quota_keys_are_refused_naming_the_shorthand(self) -> None:
        decision = decide(
            request("Tenant", "tenant-root", "foo", {"resourceQuotas": {"requests.cpu": "4"}}),
            state({}),
            ENFORCE,
        )
        assert decision.code == 422
        assert decision.causes[0][0] == "spec.resourceQuotas[requests.cpu]"
        assert 'use the shorthand key "cpu"' in decision.message

    def test_a_tenant_name_with_a_dash_is_invalid(self) -> None:
        decision = decide(request("Tenant", "tenant-root", "a-b", {}), state({}), ENFORCE)
        assert decision.causes[0][0] == "metadata.name"


class TestModes:
    def test_warn_allows_and_carries_the_would_be_denial(self) -> None:
        current = acme(thing("tenant-acme", "fill", memory="16Gi"))
        decision = decide(
            request("VMInstance", "tenant-acme", "vm", MICRO), current, Policy("warn")
        )
        assert decision.allowed
        assert decision.outcome == "warned"
        assert decision.warnings[0].startswith("would be denied: exceeded tenant quota")
        assert decision.audit["would-deny"].startswith("exceeded tenant quota")

    def test_a_kind_can_be_enforced_while_the_rest_only_warn(self) -> None:
        current = acme(thing("tenant-acme", "fill", memory="16Gi"))
        policy = Policy("warn", {"VMInstance": "enforce"})
        assert not decide(request("VMInstance", "tenant-acme", "v", MICRO), current, policy).allowed
        assert decide(
            request("Thing", "tenant-acme", "t", {"memory": "1"}), current, policy
        ).allowed

    def test_off_skips_without_evaluating(self) -> None:
        decision = decide(
            request("VMInstance", "tenant-acme", "v", {"instanceType": "u9.huge"}),
            acme(),
            Policy("off"),
        )
        assert decision.allowed
        assert decision.outcome == "skipped"


QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@pytest.mark.parametrize("mode", ["enforce", "warn"])
def test_warnings_and_audit_annotations_respect_the_api_server_limits(mode: str) -> None:
    long_name = "x" * 200
    current = state({"tenant-acme": {"memory": "1Gi"}}, tenant("tenant-acme-dev"))
    spec = {
        "instanceType": "",
        "resources": {"cpu": 64, "sockets": 2, "memory": "64Gi"},
        "gpus": [{"name": f"nvidia.com/{long_name}{i}"} for i in range(3)],
    }
    decision = decide(
        request("VMInstance", "tenant-acme-dev", "vm", spec),
        current,
        Policy(mode),  # type: ignore[arg-type]
    )
    for warning in decision.warnings:
        assert len(warning) <= 256
    for key in decision.audit:
        assert len(key) <= 63
        assert QUALIFIED_NAME.match(key), key


def test_an_allowed_request_says_what_it_reserves_and_where_the_pool_stands() -> None:
    decision = create_vm(acme(thing("tenant-acme", "other", memory="7Gi")), "vm")
    assert decision.warnings == (
        "reserves cpu=1, memory=1Gi; pool tenant-acme at memory 8Gi/16Gi (50%)",
    )


def test_applications_in_a_sub_tenant_created_just_now_are_not_charged_to_an_ancestor() -> None:
    """Behind cozystack-api the watches lag: a tenant admin creates sub-Tenant ``dev`` with a
    small budget and at once fills ``tenant-acme-dev`` before any replica has seen ``dev``.
    Charged to acme's pool, or to none, the writes would pass ``dev``'s own budget."""
    current = state({"tenant-acme": {"cpu": "64"}})
    grab = {"cpu": "32"}
    decision = decide(request("Thing", "tenant-acme-dev", "grab", grab), current, Policy())
    assert not decision.allowed
    assert decision.code == 503
    assert decision.reason == "tenant-not-synced"
    assert "tenant-acme-dev" in decision.message
    assert "try again" in decision.message
    nested = {"resourceQuotas": {"cpu": "64"}}
    below = decide(request("Tenant", "tenant-acme-dev", "deep", nested), current, Policy())
    assert below.reason == "tenant-not-synced"  # nor a Tenant below it
    fresh = decide(request("Thing", "tenant-new", "grab", grab), current, Policy())
    assert fresh.reason == "tenant-not-synced"  # nor under the root
    current.observe(tenant("tenant-acme-dev", {"cpu": "1"}))
    decision = decide(request("Thing", "tenant-acme-dev", "grab", grab), current, Policy())
    assert not decision.allowed
    assert "exceeded tenant quota" in decision.message
    assert decide(request("Thing", "tenant-root", "ok", grab), current, Policy()).allowed
    assert decide(request("Thing", "tenant-acme", "ok", grab), current, Policy()).allowed


def test_a_label_on_a_held_application_whose_preset_left_the_catalog_passes_in_warn() -> None:
    # A Postgres priced and recorded (its volume held at 50Gi) while its preset existed; the
    # preset has since left the catalog. A label-only write carries the signed record, marks and
    # all, unchanged: nothing the reservation reads is lost, and enforce lets it through as it
    # stands. Warn must not be stricter than enforce and refuse it.
    spec = {"replicas": 1, "size": "10Gi", "resourcesPreset": "z9.gone"}
    charge = {"cpu": "1", "memory": "1Gi", "storage": "50Gi"}
    record = signed_marks("Postgres", "tenant-acme", "pg", spec, charge, {"postgres": "50Gi"})
    current = state({"tenant-acme": {"memory": "16Gi", "storage": "100Gi"}})
    label = request(
        "Postgres",
        "tenant-acme",
        "pg",
        spec,
        operation="UPDATE",
        old_spec=spec,
        annotations={CHARGE_ANNOTATION: record, "example.com/owner": "ops"},
        old_annotations={CHARGE_ANNOTATION: record},
    )
    for mode in ("enforce", "warn"):
        policy = Policy(mode=mode)
        mutated = mutate(label, current, policy)
        assert mutated.allowed, (mode, mutated.message)
        assert not mutated.patch  # the record, marks and all, is carried as it stands
        assert decide(label, current, policy).allowed

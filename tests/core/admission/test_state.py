"""The reservation state: charges observed, recorded charges kept, drift reported."""

import json
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from tests.builders import platform, signed, signed_record, state, tenant, thing
from webhook.core.admission.state import ReservationState, recount
from webhook.core.tenancy.applications import (
    Application,
    application_from_helmrelease,
    parse_recorded_charge,
)
from webhook.core.tenancy.records import record_annotation


def test_observing_and_forgetting_an_application_moves_pool_usage() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}})
    vm = Application("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.medium"})
    current.observe(vm)
    assert current.tree.get("tenant-acme").usage["memory"] == Decimal(4 * 1024**3)  # type: ignore[union-attr]
    current.forget(vm.key)
    assert current.tree.get("tenant-acme").usage["memory"] == 0  # type: ignore[union-attr]


def test_forgetting_a_tenant_releases_its_carve_out() -> None:
    current = state({"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": {"cpu": "4"}})
    current.forget(tenant("tenant-foo-bar").key)
    (pool,) = current.tree.pools()
    assert pool.reserved == {"cpu": 0}


def test_a_recorded_charge_stays_authoritative_and_drift_is_visible() -> None:
    recorded = signed_record("VMInstance", "tenant-acme", "vm", {}, {"cpu": "9"}, "sha256:old")
    app = Application("VMInstance", "tenant-acme", "vm", {}, recorded=recorded)
    current = state({"tenant-acme": {"cpu": "20"}}, app)
    record = current.record(app.key)
    assert record is not None
    assert record.resources == {"cpu": Decimal(9)}
    assert record.drifted
    assert record.current_digest == platform().charge("VMInstance", {}).digest
    assert record.current == {"cpu": Decimal(1), "memory": Decimal(4 * 1024**3)}


def test_the_charge_annotation_round_trips_and_garbage_is_ignored() -> None:
    text = signed("Thing", "tenant-acme", "t", {}, {"memory": "2Gi", "cpu": "500m"}, "sha256:x")
    body = json.loads(text)
    assert list(body) == ["charge", "digest", "values", "kid", "mac"]
    assert body["charge"] == {"cpu": "500m", "memory": "2Gi"}
    record = parse_recorded_charge(text)
    assert record is not None
    assert record.resources == {"cpu": Decimal("0.5"), "memory": Decimal(2 * 1024**3)}
    assert record_annotation(record) == text
    for garbage in ["", "{", '{"charge": 1}', '{"charge": {"cpu": "x"}, "digest": "d"}', None]:
        assert parse_recorded_charge(garbage) is None


def test_helmreleases_are_read_as_the_applications_they_store() -> None:
    release = {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {
            "name": "vm-instance-web1",
            "namespace": "tenant-acme",
            "labels": {
                "apps.cozystack.io/application.kind": "VMInstance",
                "apps.cozystack.io/application.group": "apps.cozystack.io",
                "apps.cozystack.io/application.name": "web1",
            },
        },
        "spec": {"values": {"instanceType": "u1.large"}},
    }
    app = application_from_helmrelease(release)
    assert app == Application(
        "VMInstance",
        "tenant-acme",
        "web1",
        {"instanceType": "u1.large"},
        release="vm-instance-web1",
    )


def test_a_recount_agrees_with_the_incremental_figures_and_finds_a_difference() -> None:
    current = state(
        {"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": None, "tenant-foo-bar-baz": {"cpu": "4"}},
        thing("tenant-foo-bar", cpu="3"),
        thing("tenant-foo-bar-baz", "b", cpu="1"),
    )
    assert recount(current) == {}
    node = current.tree.get("tenant-foo")
    assert node is not None
    node.usage["cpu"] += 1  # an incremental update gone wrong
    assert recount(current) == {("tenant-foo", "cpu"): (Decimal(8), Decimal(7))}


def test_a_factor_on_the_root_tenant_reprices_every_tenant_beneath_it() -> None:
    # The root's children own tenant-<name>, not tenant-root-<name>: beneath it all the same.
    current = state(
        {"tenant-root": {"memory": "100Gi"}, "tenant-acme": None},
        thing("tenant-acme", "vm", memory="4Gi"),
    )
    assert current.repricing("tenant-root", {"memory": Decimal(2)}) == {
        "memory": -2 * Decimal(1024**3)
    }


GIB = 1024**3


def _vm(instance_type: str, name: str = "vm") -> Application:
    return Application("VMInstance", "tenant-acme", name, {"instanceType": instance_type})


def _memory(current: ReservationState) -> Decimal:
    node = current.tree.get("tenant-acme")
    assert node is not None
    return node.usage.get("memory", Decimal(0))


def test_an_update_the_state_cannot_price_keeps_counting_what_it_was_priced_at() -> None:
    # An update stored unpriced (values past their bound, admitted in warn) has not shrunk
    # what the application holds: counted at nothing, its room went to the pool's other kinds.
    current = state({"tenant-acme": {"memory": "16Gi"}}, _vm("u1.medium"))
    current.observe(_vm("u1.nope"))
    assert _memory(current) == 4 * GIB
    assert _vm("u1.nope").key in current.unknown()  # still unknown: refusals stay as they were
    assert recount(current) == {}
    current.replace_kind("VMInstance", [_vm("u1.nope")])  # a relist keeps it too
    assert _memory(current) == 4 * GIB
    current.observe(_vm("u1.micro"))  # priced again: its own charge, nothing kept
    assert _memory(current) == 1 * GIB
    assert current.kept() == {}
    current.observe(_vm("u1.nope"))
    current.forget(_vm("u1.nope").key)
    assert _memory(current) == 0
    assert current.kept() == {}
    assert recount(current) == {}


def test_a_state_rebuilt_for_a_platform_that_cannot_price_an_application_keeps_its_charge() -> None:
    # The rebuilt state prices every application afresh: one it cannot price (its instance
    # type deleted) counts what the state it replaces last priced it at, kept or not.
    old = state({"tenant-acme": {"memory": "16Gi"}}, _vm("u1.medium"), _vm("u1.small", "b"))
    old.observe(_vm("u1.nope", "b"))  # already unpriced before the rebuild: kept at 2Gi
    fresh = state({"tenant-acme": {"memory": "16Gi"}}, _vm("u1.nope"), _vm("u1.nope", "b"))
    assert _memory(fresh) == 0
    fresh.carry_kept(old)
    assert _memory(fresh) == 6 * GIB
    assert set(fresh.kept()) == {_vm("u1.nope").key, _vm("u1.nope", "b").key}
    assert recount(fresh) == {}
    fresh.forget(_vm("u1.nope").key)
    assert _memory(fresh) == 2 * GIB
    assert recount(fresh) == {}


def test_an_application_never_priced_counts_only_its_existence() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}}, _vm("u1.nope"))
    assert _memory(current) == 0
    assert current.kept() == {}


_SIZES = {"u1.micro": 1, "u1.small": 2, "u1.medium": 4, "u1.nope": None}


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([*_SIZES, "delete"])),
        max_size=30,
    )
)
def test_what_each_application_counts_is_its_last_price_since_it_was_created(
    steps: list[tuple[str, str]],
) -> None:
    current = state({"tenant-acme": {"memory": "1Ti"}})
    expected: dict[str, int] = {}  # name -> GiB last priced since it was (re)created
    for name, change in steps:
        if change == "delete":
            current.forget(_vm("u1.micro", name).key)
            expected.pop(name, None)
            continue
        current.observe(_vm(change, name))
        size = _SIZES[change]
        expected[name] = size if size is not None else expected.get(name, 0)
        assert _memory(current) == sum(expected.values()) * GIB
        assert recount(current) == {}


def test_a_floor_over_an_application_counted_at_its_kept_charge_is_not_counted_twice() -> None:
    # An update admitted while the VM was priced (a label: its floor expects 4Gi), then one
    # stored unpriced: the pool counts max(kept, floor), not both (8Gi refused the pool's others).
    from webhook.core.admission.pending import Hold

    current = state({"tenant-acme": {"memory": "16Gi"}})
    current.observe(
        Application("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.medium"}, version=5)
    )
    label = Hold(
        id="label",
        key=_vm("u1.medium").key,
        namespace="tenant-acme",
        increase={},
        charge={"memory": Decimal(4 * GIB)},
        after=6,
        until="2099-01-01T00:00:00.000000Z",
        update=True,
    )
    current.pending.track("tenant-acme", [label], version=7)
    assert _memory(current) == 4 * GIB
    current.observe(
        Application("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.nope"}, version=8)
    )
    assert _memory(current) == 4 * GIB
    assert recount(current) == {}

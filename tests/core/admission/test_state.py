"""The reservation state: charges observed, recorded charges kept, drift reported."""

import json
from decimal import Decimal

from tests.builders import platform, signed, signed_record, state, tenant, thing
from webhook.core.admission.state import recount
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

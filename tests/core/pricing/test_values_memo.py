"""The values memo: applications with the very same values are prepared and priced once.

What :meth:`Platform.prepare` answers from its memo must be what preparing the values afresh
answers (the values digest records are bound to, the charge or its error), whatever was
prepared before; values that only read alike (NaN and null, a date and its text, in another
namespace where instance types are namespaced) never share an entry; and a tenant writing
endless distinct values cannot grow it past its bound.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import KEYS, platform
from tests.core.pricing.test_charge_projection import (
    KINDS,
    VALUES,
    _counting_lb_when,
    outcome,
    read_keys,
)
from webhook.core.admission.state import ReservationState
from webhook.core.base.errors import UNEVALUABLE
from webhook.core.pricing import platform as platform_module
from webhook.core.pricing.platform import (
    PREPARED_CACHE_BYTES,
    PREPARED_CACHE_SIZE,
    Platform,
    PlatformBuilder,
)
from webhook.core.tenancy.applications import Application
from webhook.core.tenancy.records import values_digest

ODD = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(datetime.date(2001, 12, 14)),
    st.tuples(st.integers(0, 2)),
    st.integers(2**64, 2**66),
)


@st.composite
def specs(draw: st.DrawFn) -> tuple[str, dict[str, Any], str]:
    kind = draw(st.sampled_from(KINDS))
    keys = [*read_keys(kind), "disks", "cloudInit", "other"]
    spec = draw(st.dictionaries(st.sampled_from(keys), VALUES | ODD, max_size=5))
    namespace = draw(st.sampled_from(["tenant-a", "tenant-b"]))
    return kind, spec, namespace


def prepared(platform: Platform, kind: str, spec: object, namespace: str) -> object:
    try:
        found = platform.prepare(kind, spec, namespace=namespace)
    except UNEVALUABLE as exc:
        return ("error", type(exc).__name__, str(exc))
    charge = (
        outcome(lambda: found.charge)
        if found.failure is None
        else ("error", type(found.failure).__name__, str(found.failure))
    )
    return found.digest, charge


def afresh(platform: Platform, kind: str, spec: object, namespace: str) -> object:
    found = platform.kinds[kind]
    try:
        defaulted = found.defaulted(spec)
    except UNEVALUABLE as exc:
        return ("error", type(exc).__name__, str(exc))
    charge = outcome(
        lambda: found.charge_defaulted(defaulted, platform.catalog, namespace=namespace)
    )
    return values_digest(defaulted), charge


SHARED = Platform(platform().kinds, platform().catalog)  # its memo is warm across examples


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_what_the_memo_answers_is_what_preparing_afresh_answers(
    case: tuple[str, dict[str, Any], str],
) -> None:
    kind, spec, namespace = case
    first = prepared(SHARED, kind, spec, namespace)
    again = prepared(SHARED, kind, spec, namespace)
    assert first == again == afresh(SHARED, kind, spec, namespace)


def _resources(found: Any) -> dict[str, Any]:
    assert found.charge is not None
    return dict(found.charge.resources)


def test_a_nan_written_where_null_is_priced_does_not_share_its_memo_entry() -> None:
    # Fast JSON writers write NaN as null: a key made of that text would serve NaN the charge
    # of null (or the reverse).
    probe = _counting_lb_when("$.x", None)
    assert _resources(probe.prepare("Probe", {"x": None})) == {"services.loadbalancers": 1}
    assert _resources(probe.prepare("Probe", {"x": math.nan})) == {}
    assert _resources(probe.prepare("Probe", {"x": math.inf})) == {}


def test_a_yaml_date_does_not_share_a_memo_entry_with_its_text() -> None:
    dated = _counting_lb_when("$.since", "2001-12-14")
    assert _resources(dated.prepare("Probe", {"since": "2001-12-14"})) == {
        "services.loadbalancers": 1
    }
    assert _resources(dated.prepare("Probe", {"since": datetime.date(2001, 12, 14)})) == {}


def test_values_priced_in_one_namespace_are_not_served_where_its_instance_types_are_not() -> None:
    definition = {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "ApplicationDefinition",
        "metadata": {"name": "probe"},
        "spec": {
            "application": {"kind": "Probe", "plural": "probes", "openAPISchema": "{}"},
            "reservation": {
                "terms": [{"name": "vm", "size": {"instanceType": "$.type", "namespaced": True}}]
            },
        },
    }
    instance_type = {
        "apiVersion": "instancetype.kubevirt.io/v1beta1",
        "kind": "VirtualMachineInstancetype",
        "metadata": {"name": "own", "namespace": "tenant-a"},
        "spec": {"cpu": {"guest": 2}, "memory": {"guest": "4Gi"}},
    }
    builder = PlatformBuilder({}, {})
    builder.add(definition, source="test")
    builder.add(instance_type, source="test")
    probe = builder.build()
    assert probe.prepare("Probe", {"type": "own"}, namespace="tenant-a").charge is not None
    elsewhere = probe.prepare("Probe", {"type": "own"}, namespace="tenant-b")
    assert elsewhere.charge is None
    assert elsewhere.failure is not None


def test_applications_with_the_same_values_are_prepared_once() -> None:
    fresh = Platform(platform().kinds, platform().catalog)
    spec = {"storage": "10Gi", "storageClass": "replicated"}
    first = fresh.prepare("VMDisk", spec, namespace="tenant-a")
    assert fresh.prepare("VMDisk", dict(spec), namespace="tenant-b") is first
    assert len(fresh._prepared) == 1


def test_a_tenant_writing_endless_distinct_values_cannot_grow_the_values_memo_past_its_bound() -> (
    None
):
    state = ReservationState(Platform(platform().kinds, platform().catalog), keys=KEYS)
    memo = state.platform._prepared
    for index in range(PREPARED_CACHE_SIZE + 300):  # through the watch path: observe
        spec = {"instanceType": "u1.micro", "disks": [{"name": f"d{index}"}]}
        state.observe(Application("VMInstance", "tenant-acme", f"vm{index}", spec))
    assert len(memo) <= PREPARED_CACHE_SIZE
    assert memo.currsize <= PREPARED_CACHE_BYTES
    assert all(len(key[2]) == 32 for key in memo)  # a digest of the values, never the values
    assert len(state) == PREPARED_CACHE_SIZE + 300


def test_a_charge_too_large_for_the_values_memo_is_priced_not_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An entry the memo cannot hold (its estimate past the memo's bytes) is refused by the
    # cache with ValueError; that must not turn a charge that evaluated into a failure (the
    # state would price the application as unknown or by its record, reporting a problem).
    monkeypatch.setattr(platform_module, "PREPARED_CACHE_BYTES", 1024)
    monkeypatch.setattr(platform_module, "PREPARED_CACHE_SIZE", 1)
    small = Platform(platform().kinds, platform().catalog)
    found = small.prepare("VMDisk", {"storage": "10Gi"}, namespace="tenant-a")
    assert found.failure is None
    assert found.charge is not None
    assert found.charge.resources == platform().charge("VMDisk", {"storage": "10Gi"}).resources
    assert len(small._prepared) == 0

"""Charges are cached by what the contract reads: never a wrong charge, one evaluation per shape.

The cached charge of any values must equal the charge evaluated afresh on the whole values
(same resources, digest, terms, or the same error), whatever else the values hold and whatever
was priced before them; contracts whose paths could reach past their root key read everything.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import platform
from webhook.core.base.errors import UNEVALUABLE
from webhook.core.pricing.contracts import compile_contract
from webhook.core.pricing.evaluation import contract_reads
from webhook.core.pricing.platform import Platform, PlatformBuilder

KINDS = sorted(kind for kind, found in platform().kinds.items() if found.contract is not None)
NAMES = ["u1.micro", "u1.small", "cx1.medium", "m1.large", "nano", "small", "large", "x", ""]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 40),
    st.sampled_from(["1", "2", "500m", "1Gi", "10Gi", "0", "-1", "abc", *NAMES]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["cpu", "memory", "name", "replicas", "size", "enabled", "md0"]),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)


def read_keys(kind: str) -> list[str]:
    reads = platform().kinds[kind].reads
    return sorted(reads.keys) if reads is not None else []


@st.composite
def specs(draw: st.DrawFn) -> tuple[str, dict[str, Any], str]:
    kind = draw(st.sampled_from(KINDS))
    keys = [*read_keys(kind), "disks", "cloudInit", "labels", "other"]
    spec = draw(st.dictionaries(st.sampled_from(keys), VALUES, max_size=5))
    namespace = draw(st.sampled_from(["tenant-a", "tenant-b", "tenant-a-c"]))
    return kind, spec, namespace


def outcome(call: Any) -> object:
    try:
        charge = call()
    except UNEVALUABLE as exc:
        return ("error", type(exc).__name__, str(exc))
    return (dict(charge.resources), charge.digest, charge.terms, charge.exempt_reason)


SHARED = Platform(platform().kinds, platform().catalog)  # its cache is warm across examples


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_a_cached_charge_is_the_charge_of_the_whole_values(
    case: tuple[str, dict[str, Any], str],
) -> None:
    kind, spec, namespace = case
    found = SHARED.kinds[kind]
    cached = outcome(lambda: SHARED.charge(kind, spec, namespace=namespace))
    fresh = outcome(
        lambda: found.charge_defaulted(found.defaulted(spec), SHARED.catalog, namespace=namespace)
    )
    assert cached == fresh


def test_every_shipped_contract_reads_a_known_set_of_keys() -> None:
    unbounded = [kind for kind in KINDS if platform().kinds[kind].reads is None]
    assert unbounded == []


def test_vms_differing_only_in_what_no_term_reads_are_evaluated_once() -> None:
    fresh = Platform(platform().kinds, platform().catalog)
    for index in range(50):
        spec = {
            "instanceType": "u1.small",
            "disks": [{"name": f"vm{index}-system"}],
            "cloudInit": f"#{index}",
        }
        fresh.charge("VMInstance", spec, namespace=f"tenant-t{index}")
    assert len(fresh._charges) == 1


def test_a_spec_differing_in_a_read_key_is_not_served_the_cached_cheaper_charge() -> None:
    fresh = Platform(platform().kinds, platform().catalog)
    small = fresh.charge("VMInstance", {"instanceType": "u1.micro"}, namespace="tenant-a")
    large = fresh.charge(
        "VMInstance", {"instanceType": "u1.micro", "gpus": [{"name": "nvidia.com/GA102"}]}
    )
    external = fresh.charge("VMInstance", {"instanceType": "u1.micro", "external": True})
    assert dict(large.resources) != dict(small.resources)
    assert dict(external.resources) != dict(small.resources)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("$..cpu", id="recursive-descent-from-the-root"),
        pytest.param("$.*.cpu", id="wildcard-at-the-root"),
        pytest.param("$.a.`parent`.cpu", id="parent-operator-climbs-to-the-root"),
        pytest.param("$.a.`this`.cpu", id="this-operator"),
        pytest.param("$['a','b']", id="bracketed-keys"),
    ],
)
def test_a_contract_path_that_may_reach_past_its_root_key_makes_the_contract_read_everything(
    path: str,
) -> None:
    term = {"name": "t", "count": path, "objects": {"services.loadbalancers": 1}}
    contract = compile_contract("Thing", {"terms": [term]}, source="test")
    assert contract_reads(contract) is None
    term["count"] = "$.a.cpu"
    plain = contract_reads(compile_contract("Thing", {"terms": [term]}, source="test"))
    assert plain is not None
    assert plain.keys == {"a"}


def test_a_contract_with_namespaced_instance_types_keys_its_cache_on_the_namespace() -> None:
    contract = compile_contract(
        "Thing",
        {"terms": [{"name": "vm", "size": {"instanceType": "$.type", "namespaced": True}}]},
        source="test",
    )
    reads = contract_reads(contract)
    assert reads is not None
    assert reads.namespaced
    plain = platform().kinds["VMInstance"].reads
    assert plain is not None
    assert not plain.namespaced


def _counting_lb_when(path: str, equals: object) -> Platform:
    """A platform of one kind, ``Probe``, charging one load balancer when ``path`` equals
    ``equals``."""
    definition = {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "ApplicationDefinition",
        "metadata": {"name": "probe"},
        "spec": {
            "application": {"kind": "Probe", "plural": "probes", "openAPISchema": "{}"},
            "reservation": {
                "terms": [
                    {
                        "name": "lb",
                        "when": {"path": path, "equals": equals},
                        "objects": {"services.loadbalancers": 1},
                    }
                ]
            },
        },
    }
    builder = PlatformBuilder({}, {})
    builder.add(definition, source="test")
    return builder.build()


def test_a_yaml_date_does_not_share_a_cached_charge_with_its_text() -> None:
    dated = _counting_lb_when("$.since", "2001-12-14")
    text = dated.charge("Probe", {"since": "2001-12-14"})
    assert dict(text.resources) == {"services.loadbalancers": 1}
    date = dated.charge("Probe", {"since": datetime.date(2001, 12, 14)})  # what YAML makes of it
    assert dict(date.resources) == {}


@pytest.mark.parametrize("key", [True, None, 1])
def test_a_yaml_key_that_is_not_text_does_not_share_a_cached_charge_with_its_text(
    key: object,
) -> None:
    # JSON writes the keys true, null and 1 as the texts "true", "null" and "1": a digest of
    # that text would price {true: on} (what YAML makes of it) as {"true": on}.
    text = json.dumps(key)
    flagged = _counting_lb_when("$.flags", {text: "on"})
    typed = flagged.charge("Probe", {"flags": {key: "on"}})
    assert dict(typed.resources) == {}, "not the text key: the condition does not hold"
    plain = flagged.charge("Probe", {"flags": {text: "on"}})
    assert dict(plain.resources) == {"services.loadbalancers": 1}

"""Evaluation: contract + values + catalog -> charge, failing closed with the path."""

from decimal import Decimal
from typing import Any

import pytest
from jsonpath_ng.jsonpath import JSONPath

from webhook.core.base.errors import EvaluationError
from webhook.core.base.quantities import parse_quantity
from webhook.core.pricing.catalog import InstanceType, Preset, StaticCatalog
from webhook.core.pricing.contracts import compile_contract
from webhook.core.pricing.evaluation import EvaluationLimits, evaluate, interpret

GI = 1024**3

CATALOG = StaticCatalog.of(
    [
        InstanceType("u1.medium", Decimal(1), Decimal(4 * GI)),
        InstanceType("gn1.xlarge", Decimal(4), Decimal(16 * GI), {"nvidia.com/A400": Decimal(1)}),
        InstanceType("private", Decimal(2), Decimal(2 * GI), namespace="tenant-a"),
    ],
    {
        "u1.medium": Preset("u1.medium", {"cpu": Decimal(2), "memory": Decimal(8 * GI)}),
        "t1.nano": Preset(
            "t1.nano",
            {
                "cpu": Decimal("0.25"),
                "memory": parse_quantity("128Mi"),
                "ephemeral-storage": Decimal(2 * GI),
            },
        ),
    },
)


def charge(terms: list[dict[str, Any]], values: Any, **kwargs: Any) -> dict[str, str]:
    contract = compile_contract("Thing", {"terms": terms}, source="test")
    return evaluate(contract, values, CATALOG, **kwargs).as_strings()


def test_instance_types_and_presets_are_different_tables() -> None:
    by_type = [{"name": "vm", "size": {"instanceType": "$.name"}}]
    by_preset = [{"name": "db", "size": {"preset": "$.name"}}]
    assert charge(by_type, {"name": "u1.medium"}) == {"cpu": "1", "memory": "4Gi"}
    assert charge(by_preset, {"name": "u1.medium"}) == {"cpu": "2", "memory": "8Gi"}


def test_count_multiplies_every_key_of_the_unit() -> None:
    terms = [
        {"name": "db", "count": "$.replicas", "size": {"preset": "t1.nano"}, "storage": "$.size"}
    ]
    assert charge(terms, {"replicas": 3, "size": "10Gi"}) == {
        "cpu": "750m",
        "ephemeral-storage": "6Gi",
        "memory": "384Mi",
        "storage": "30Gi",
    }


def test_explicit_resources_override_a_preset_key_by_key() -> None:
    terms = [{"name": "db", "size": {"preset": "$.preset", "overrides": "$.resources"}}]
    assert charge(terms, {"preset": "t1.nano", "resources": {"cpu": 3}}) == {
        "cpu": "3",
        "ephemeral-storage": "2Gi",
        "memory": "128Mi",
    }


def test_first_present_source_wins() -> None:
    size = {
        "first": [
            {"resources": {"cpu": "$.cpu", "memory": "$.memory"}, "require": ["$.cpu", "$.memory"]},
            {"instanceType": "$.type"},
        ]
    }
    terms = [{"name": "vm", "size": size}]
    assert charge(terms, {"type": "u1.medium", "cpu": 2}) == {"cpu": "1", "memory": "4Gi"}
    assert charge(terms, {"type": "u1.medium", "cpu": 2, "memory": "1Gi"}) == {
        "cpu": "2",
        "memory": "1Gi",
    }


def test_max_never_charges_less_than_its_first_member() -> None:
    size = {"max": [{"instanceType": "$.type"}, {"resources": {"memory": "$.memory"}}]}
    terms = [{"name": "vm", "size": size}]
    assert charge(terms, {"type": "u1.medium", "memory": "1Gi"}) == {"cpu": "1", "memory": "4Gi"}
    assert charge(terms, {"type": "u1.medium", "memory": "9Gi"}) == {"cpu": "1", "memory": "9Gi"}


def test_instance_type_gpus_are_charged_as_devices() -> None:
    terms = [{"name": "vm", "size": {"instanceType": "gn1.xlarge"}}]
    assert charge(terms, {})["nvidia.com/A400"] == "1"


def test_namespaced_instance_types_resolve_in_the_application_namespace() -> None:
    terms = [{"name": "vm", "size": {"instanceType": "$.type", "namespaced": True}}]
    assert charge(terms, {"type": "private"}, namespace="tenant-a") == {"cpu": "2", "memory": "2Gi"}
    with pytest.raises(
        EvaluationError, match='unknown instance type "private" in namespace tenant-b'
    ):
        charge(terms, {"type": "private"}, namespace="tenant-b")


def test_for_each_iterates_map_values_with_the_item_as_context() -> None:
    terms = [
        {
            "name": "workers",
            "forEach": "$.groups.*",
            "count": "@.max",
            "size": {"instanceType": "@.type"},
            "devices": "@.gpus[*].name",
        }
    ]
    values = {
        "groups": {
            "a": {"max": 2, "type": "u1.medium", "gpus": []},
            "b": {"max": 1, "type": "u1.medium", "gpus": [{"name": "x/gpu"}, {"name": "x/gpu"}]},
        }
    }
    assert charge(terms, values) == {"cpu": "3", "memory": "12Gi", "x/gpu": "2"}


def test_if_none_supplies_implicit_items() -> None:
    terms = [
        {
            "name": "workers",
            "forEach": "$.groups.*",
            "ifNone": {"md0": {"max": 10, "type": "u1.medium"}},
            "count": "@.max",
            "size": {"instanceType": "@.type"},
        }
    ]
    contract = compile_contract("Thing", {"terms": terms}, source="test")
    result = evaluate(contract, {"groups": {}}, CATALOG)
    assert result.as_strings() == {"cpu": "10", "memory": "40Gi"}
    assert [t.path for t in result.terms] == ["groups.md0"]


def test_when_and_unless_gate_a_term() -> None:
    terms: list[dict[str, Any]] = [
        {"name": "lb", "when": "$.external", "objects": {"services.loadbalancers": 1}},
        {"name": "disk", "unless": "$.ephemeral", "storage": "1Gi"},
    ]
    assert charge(terms, {"external": True, "ephemeral": True}) == {"services.loadbalancers": "1"}
    assert charge(terms, {"external": False}) == {"storage": "1Gi"}
    assert charge(terms, {}) == {"storage": "1Gi"}


def test_zero_count_charges_nothing() -> None:
    terms = [{"name": "db", "count": "$.replicas", "storage": "10Gi"}]
    assert charge(terms, {"replicas": 0}) == {}


@pytest.mark.parametrize(
    ("terms", "values", "message"),
    [
        pytest.param(
            [{"name": "vm", "size": {"instanceType": "$.nodeGroups.gpu.instanceType"}}],
            {"nodeGroups": {"gpu": {"instanceType": "u9.huge"}}},
            'Thing: nodeGroups.gpu.instanceType: unknown instance type "u9.huge"',
            id="unknown-instance-type",
        ),
        pytest.param(
            [{"name": "db", "size": {"preset": "$.resourcesPreset"}}],
            {"resourcesPreset": "t9.giant"},
            'Thing: resourcesPreset: unknown resource preset "t9.giant"',
            id="unknown-preset",
        ),
        pytest.param(
            [{"name": "vm", "size": {"resources": {"memory": "$.resources.memory"}}}],
            {"resources": {"memory": "12Gx"}},
            'Thing: resources.memory: "12Gx" is not a quantity',
            id="bad-quantity",
        ),
        pytest.param(
            [{"name": "db", "count": "$.replicas", "storage": "1Gi"}],
            {},
            "Thing: replicas: required value is missing",
            id="missing-count",
        ),
        pytest.param(
            [{"name": "db", "count": "$.replicas", "storage": "1Gi"}],
            {"replicas": "1.5"},
            'Thing: replicas: "1.5" is not a whole number (a count is digits only)',
            id="fractional-count",
        ),
        pytest.param(
            [{"name": "db", "storage": "$.size"}],
            {"size": "-1Gi"},
            "Thing: size: -1Gi must not be negative",
            id="negative-size",
        ),
        pytest.param(
            [{"name": "vm", "size": {"instanceType": "$.type"}}],
            {"type": ""},
            "Thing: vm: no size: set type",
            id="no-size-source",
        ),
        pytest.param(
            [{"name": "vm", "size": {"instanceType": "$.type"}}],
            {"type": 7},
            "Thing: type: 7 is not a name",
            id="name-of-the-wrong-type",
        ),
        pytest.param(
            [{"name": "vm", "devices": "$.gpus[*].name"}],
            {"gpus": [{"name": ""}]},
            "Thing: gpus[0].name: a device name must be a non-empty string",
            id="empty-device-name",
        ),
    ],
)
def test_failures_name_the_kind_path_and_reason(
    terms: list[dict[str, Any]], values: Any, message: str
) -> None:
    with pytest.raises(EvaluationError) as caught:
        charge(terms, values)
    assert str(caught.value) == message


def test_values_that_are_not_an_object_fail_closed() -> None:
    with pytest.raises(EvaluationError, match="spec: must be an object"):
        charge([{"name": "a", "storage": "1Gi"}], ["not", "a", "map"])


def test_a_path_matching_too_many_items_is_cut_off() -> None:
    terms = [{"name": "w", "forEach": "$.items[*]", "storage": "1Gi"}]
    with pytest.raises(EvaluationError, match="exceed the limit of 10"):
        charge(terms, {"items": [{}] * 11}, limits=EvaluationLimits(max_items=10))
    with pytest.raises(EvaluationError, match="matched more than 50 values"):
        charge(
            [{"name": "d", "devices": "$..name"}],
            {"a": [{"name": "g"}] * 60},
            limits=EvaluationLimits(max_matches=50),
        )


def test_the_digest_covers_the_catalog_entries_used() -> None:
    contract = compile_contract(
        "Thing", {"terms": [{"name": "vm", "size": {"instanceType": "$.t"}}]}, source="t"
    )
    bigger = StaticCatalog.of([InstanceType("u1.medium", Decimal(2), Decimal(4 * GI))], {})
    first = evaluate(contract, {"t": "u1.medium"}, CATALOG)
    again = evaluate(contract, {"t": "u1.medium"}, CATALOG)
    resized = evaluate(contract, {"t": "u1.medium"}, bigger)
    assert first.digest == again.digest
    assert first.digest != resized.digest
    assert first.contract_digest == resized.contract_digest


def test_an_exempt_kind_charges_nothing_and_says_why() -> None:
    contract = compile_contract("Bucket", {"exempt": {"reason": "object storage"}}, source="t")
    result = evaluate(contract, {}, CATALOG)
    assert result.resources == {}
    assert result.exempt_reason == "object storage"


@pytest.mark.parametrize(
    ("plain", "bracketed"),
    [
        pytest.param("$.spec.size", "$['spec']['size']", id="nested-field"),
        pytest.param("$.missing.size", "$['missing']['size']", id="missing-field"),
        pytest.param("$.spec.list.size", "$['spec']['list']['size']", id="field-of-a-list"),
    ],
)
def test_plain_paths_resolve_like_jsonpath(plain: str, bracketed: str) -> None:
    values = {"spec": {"size": "3Gi", "list": [{"size": "1Gi"}]}}
    results = []
    for path in (plain, bracketed):
        terms = [{"name": "disk", "storage": {"path": path, "default": "1"}}]
        results.append(charge(terms, values))
    assert results[0] == results[1]


def test_conditions_compare_values_and_combine() -> None:
    terms: list[dict[str, Any]] = [
        {
            "name": "mongos",
            "when": ["$.external", "$.sharding"],
            "objects": {"services.loadbalancers": 1},
        },
        {"name": "zones", "when": {"path": "$.topology", "equals": "MultiZone"}, "storage": "1Gi"},
        {
            "name": "default",
            "unless": {"path": "$.topology", "in": ["MultiZone", "Client"]},
            "storage": "10Gi",
        },
    ]
    assert charge(terms, {"external": True, "sharding": False, "topology": "Simple"}) == {
        "storage": "10Gi"
    }
    assert charge(terms, {"external": True, "sharding": True, "topology": "MultiZone"}) == {
        "services.loadbalancers": "1",
        "storage": "1Gi",
    }
    assert charge(terms, {"topology": "Client"}) == {}


def test_a_for_each_over_too_many_items_is_refused_before_matching(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    matched: list[str] = []
    original = JSONPath.find

    def spy(self: JSONPath, data: Any) -> Any:
        matched.append(str(self))
        return original(self, data)

    monkeypatch.setattr(JSONPath, "find", spy)
    terms = [{"name": "w", "forEach": "$.nodeGroups.*", "storage": "1Gi"}]
    groups: dict[str, Any] = {f"g{i}": {} for i in range(11)}
    with pytest.raises(EvaluationError, match="11 items exceed the limit of 10"):
        charge(terms, {"nodeGroups": groups}, limits=EvaluationLimits(max_items=10))
    assert matched == []  # refused on the container's size, no match materialised


def test_max_of_counts_takes_the_largest_and_is_missing_when_a_member_is() -> None:
    terms = [{"name": "w", "count": {"max": ["$.low", "$.high"]}, "storage": "1Gi"}]
    assert charge(terms, {"low": 10, "high": 0}) == {"storage": "10Gi"}
    assert charge(terms, {"low": 1, "high": 3}) == {"storage": "3Gi"}
    with pytest.raises(EvaluationError, match="low: required value is missing"):
        charge(terms, {"high": 3})


def test_a_required_value_of_zero_counts_as_unset_like_a_chart_if() -> None:
    size = {
        "first": [
            {"resources": {"cpu": "$.cpu"}, "require": ["$.cpu"]},
            {"resources": {"cpu": "2"}},
        ]
    }
    assert charge([{"name": "v", "size": size}], {"cpu": 0}) == {"cpu": "2"}
    assert charge([{"name": "v", "size": size}], {"cpu": 4}) == {"cpu": "4"}


def test_a_charge_past_what_a_kubernetes_quantity_holds_fails_closed() -> None:
    terms = [{"name": "w", "count": "$.n", "storage": "$.size"}]
    with pytest.raises(EvaluationError, match="exceeds what a Kubernetes quantity holds"):
        charge(terms, {"n": 100_000, "size": "1Ei"})  # counts stop at 100,000; 2^60 x that


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
def test_a_product_of_counts_past_what_a_quantity_holds_fails_closed(compiled: bool) -> None:
    """Each factor is at most 100,000, but four of them make 10^20 units (of 1m: a charge well
    in range): a volume mark is keyed by the count, and read back only up to 2^63-1, so a larger
    count is refused, not charged."""
    contract = compile_contract(
        "Thing",
        {"terms": [{"name": "w", "count": {"product": ["$.a"] * 4}, "storage": "1m"}]},
        source="test",
    )
    price = evaluate if compiled else interpret
    with pytest.raises(EvaluationError, match=r"w\.count exceeds what a Kubernetes quantity"):
        price(contract, {"a": 100_000}, CATALOG)
    assert price(contract, {"a": 10_000}, CATALOG).terms[0].count == 10**16

"""Contracts are validated and compiled when loaded; mistakes name the source and the path."""

from typing import Any

import pytest

from webhook.core.base.errors import ContractError
from webhook.core.pricing.contracts import (
    FirstOf,
    FromInstanceType,
    FromPreset,
    Literal,
    PathRef,
    Product,
    compile_contract,
    compile_document,
)


def compile_terms(*terms: dict[str, Any]) -> Any:
    return compile_contract("Thing", {"terms": list(terms)}, source="thing.yaml")


def test_compiles_counts_sizes_and_paths() -> None:
    contract = compile_terms(
        {
            "name": "db",
            "count": {"product": ["$.shards", "$.replicas"]},
            "size": {"first": [{"instanceType": "$.instanceType"}, {"preset": "t1.nano"}]},
            "storage": "10Gi",
        }
    )
    (term,) = contract.terms
    assert isinstance(term.count, Product)
    assert [f.path.text for f in term.count.factors if isinstance(f, PathRef)] == [
        "$.shards",
        "$.replicas",
    ]
    assert isinstance(term.size, FirstOf)
    first, second = term.size.sources
    assert isinstance(first, FromInstanceType)
    assert isinstance(second, FromPreset)
    assert second.name == Literal("t1.nano")
    assert contract.digest.startswith("sha256:")


def test_an_exemption_needs_a_reason() -> None:
    contract = compile_contract("Bucket", {"exempt": {"reason": "object storage"}}, source="b")
    assert contract.exempt
    assert contract.exempt_reason == "object storage"
    with pytest.raises(ContractError, match="exempt"):
        compile_contract("Bucket", {"exempt": {}}, source="b")


def test_equal_contracts_have_equal_digests_and_a_change_changes_it() -> None:
    one = compile_terms({"name": "a", "storage": "$.size"})
    two = compile_terms({"name": "a", "storage": "$.size"})
    three = compile_terms({"name": "a", "storage": "$.other"})
    assert one.digest == two.digest
    assert one.digest != three.digest


@pytest.mark.parametrize(
    ("spec", "path", "reason"),
    [
        pytest.param({}, "", "needs exactly one of: terms, exempt", id="neither-terms-nor-exempt"),
        pytest.param(
            {"terms": [{"name": "a", "storage": "10Gi", "colour": "red"}]},
            "terms[0]",
            "'colour' was unexpected",
            id="unknown-field",
        ),
        pytest.param(
            {"terms": [{"name": "a", "storage": "$.size", "count": -1}]},
            "terms[0].count",
            "",
            id="negative-constant-count",
        ),
        pytest.param(
            {"terms": [{"name": "a", "storage": "12Gx"}]},
            "terms[0].storage",
            '"12Gx" is not a quantity',
            id="bad-literal-quantity",
        ),
        pytest.param(
            {"terms": [{"name": "a", "storage": "$.x[?"}]},
            "terms[0].storage",
            "is not valid JSONPath",
            id="bad-jsonpath",
        ),
        pytest.param(
            {"terms": [{"name": "a", "storage": "@.size"}]},
            "terms[0].storage",
            "outside forEach",
            id="item-path-outside-for-each",
        ),
        pytest.param(
            {
                "terms": [
                    {"name": "a", "storage": "1Gi", "when": {"path": "$.x", "equals": 1, "in": [2]}}
                ]
            },
            "terms[0].when",
            "",
            id="a-comparison-with-both-equals-and-in",
        ),
        pytest.param(
            {"terms": [{"name": "a", "storage": "1Gi", "when": ["$.x", "@.y"]}]},
            "terms[0].when[1]",
            "outside forEach",
            id="an-item-path-in-a-condition-outside-for-each",
        ),
        pytest.param(
            {"terms": [{"name": "a", "storage": "1Gi", "ifNone": {"x": {}}}]},
            "terms[0].ifNone",
            "ifNone needs forEach",
            id="if-none-without-for-each",
        ),
        pytest.param(
            {"terms": [{"name": "a", "storage": "1Gi"}, {"name": "a", "storage": "2Gi"}]},
            "terms",
            "duplicate term names: a",
            id="duplicate-term-names",
        ),
        pytest.param(
            {"terms": [{"name": "a", "count": 1.5, "storage": "1Gi"}]},
            "terms[0].count",
            "",
            id="fractional-count",
        ),
        pytest.param(
            {"terms": [{"name": "a"}]},
            "terms[0]",
            "needs at least one of: size, storage, devices, objects",
            id="term-that-charges-nothing",
        ),
    ],
)
def test_mistakes_are_rejected_naming_the_path(spec: Any, path: str, reason: str) -> None:
    with pytest.raises(ContractError) as caught:
        compile_contract("Thing", spec, source="contracts/thing.yaml")
    error = caught.value
    assert error.source == "contracts/thing.yaml"
    assert error.path == path
    assert reason in error.reason
    assert str(error).startswith("contracts/thing.yaml: ")


def document(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "reservation.cozystack.io/v1alpha1",
        "kind": "ReservationContract",
        "metadata": {"name": "thing"},
        "spec": {"kind": "Thing", **spec},
    }


def test_a_document_carries_its_kind() -> None:
    contract = compile_document(document(terms=[{"name": "a", "storage": "1Gi"}]), source="f")
    assert contract.kind == "Thing"


def test_a_document_error_names_the_spec_path() -> None:
    with pytest.raises(ContractError) as caught:
        compile_document(document(terms=[{"name": "a", "storage": "x!"}]), source="f.yaml")
    assert caught.value.path == "spec.terms[0].storage"
    assert "f.yaml (thing)" in str(caught.value)


def test_a_document_of_another_kind_is_rejected() -> None:
    bad = document(terms=[{"name": "a", "storage": "1Gi"}])
    bad["kind"] = "ConfigMap"
    with pytest.raises(ContractError, match="kind"):
        compile_document(bad, source="f.yaml")

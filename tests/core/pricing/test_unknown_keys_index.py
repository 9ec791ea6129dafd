"""The unknown-key walk over the schema index finds what the walk over the raw schema found.

Every real kind's ``openAPISchema`` (the ApplicationDefinitions in fixtures/cozystack), hostile
values (deep, wide, keys spelt like schema keywords, keys that are not strings) and any budget:
the same keys, in the same order, with the same hints, stopping at the same node. The raw walk
is :mod:`tests.core.pricing.raw_schema_walk`, the code the index replaced.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.pricing.raw_schema_walk import raw_unknown_keys
from webhook.core.admission.decisions import Policy, decide
from webhook.core.pricing import unknown_keys as module
from webhook.core.pricing.unknown_keys import (
    MAX_FINDINGS,
    MAX_NODES,
    KeyIndex,
    index_schema,
    unknown_key_warnings,
    unknown_keys,
)
from webhook.state.manifests import load_platform

ROOT = Path(__file__).resolve().parents[3]
PLATFORM = load_platform([ROOT / "fixtures" / "cozystack"])
KINDS = sorted(k for k in PLATFORM.kinds if PLATFORM.kinds[k].schema)
KEYWORDS = [
    "properties",
    "items",
    "additionalProperties",
    "x-kubernetes-preserve-unknown-fields",
    "$ref",
    "type",
    "default",
    "allOf",
    "anyOf",
    "oneOf",
    "enum",
    "required",
]


def _names(schema: object) -> Iterator[str]:
    """Every property name a schema declares, at any depth."""
    if isinstance(schema, Mapping):
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            yield from map(str, properties)
        for child in schema.values():
            yield from _names(child)
    elif isinstance(schema, list):
        for child in schema:
            yield from _names(child)


NAMES = sorted({n for k in KINDS for n in _names(PLATFORM.kinds[k].schema)})
KEYS = (
    st.sampled_from(NAMES)
    | st.sampled_from(KEYWORDS)
    | st.sampled_from(NAMES).map(lambda n: n[:-1] or "x")  # a typo: the hint's work
    | st.sampled_from(NAMES).map(str.upper)  # a case-insensitive match
    | st.text(max_size=6)
    | st.integers(254, 400).map(lambda n: "y" * n)  # too long to remember
    | st.integers(-2, 2)  # not a string: YAML reads 1: as an int
    | st.none()
    | st.booleans()
    | st.tuples(st.integers(0, 1))
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-2, 2)
    | st.floats(allow_nan=False)
    | st.text(max_size=3)
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(KEYS, children, max_size=8)
        | st.dictionaries(KEYS, children, min_size=20, max_size=40)  # a huge map
    ),
    max_leaves=80,
)
DEEP = st.integers(1, 60).flatmap(
    lambda depth: st.lists(st.sampled_from(NAMES + KEYWORDS), min_size=depth, max_size=depth)
)


def nested(path: list[str], leaf: object) -> object:
    """``leaf`` under ``path``, one map per key: deep nesting along real names."""
    for key in reversed(path):
        leaf = {key: leaf}
    return leaf


def both(values: object, kind: str, max_nodes: int, max_findings: int) -> tuple[Any, Any]:
    schema = PLATFORM.kinds[kind].schema
    raw = raw_unknown_keys(values, schema, max_nodes=max_nodes, max_findings=max_findings)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "MAX_NODES", max_nodes)
        patch.setattr(module, "MAX_FINDINGS", max_findings)
        indexed = unknown_keys(values, PLATFORM.kinds[kind].key_index)  # reused across examples
        fresh = unknown_keys(values, index_schema(schema))
    assert fresh == indexed
    return raw, indexed


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(KINDS),
    st.dictionaries(KEYS, VALUES, max_size=10),
    st.sampled_from([1, 2, 3, 5, 8, 13, 40, 200, MAX_NODES]),
    st.sampled_from([1, 2, MAX_FINDINGS]),
)
def test_the_indexed_walk_finds_what_the_raw_schema_walk_finds(
    kind: str, values: dict[Any, Any], max_nodes: int, max_findings: int
) -> None:
    raw, indexed = both(values, kind, max_nodes, max_findings)
    assert indexed == raw


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(KINDS), DEEP, VALUES, st.sampled_from([5, 30, MAX_NODES]))
def test_deep_values_along_real_names_find_the_same_keys(
    kind: str, path: list[str], leaf: object, max_nodes: int
) -> None:
    raw, indexed = both(nested(path, leaf), kind, max_nodes, MAX_FINDINGS)
    assert indexed == raw


def test_the_properties_cover_every_kind_and_find_something() -> None:
    """The generated values reach real findings and hints in every fixture kind."""
    assert len(KINDS) >= 30
    for kind in KINDS:
        values = {name[:-1] or "x": 1 for name in PLATFORM.kinds[kind].key_index.known or ["x"]}
        raw, indexed = both(values, kind, MAX_NODES, MAX_FINDINGS)
        assert indexed == raw
    raw, _ = both({"storag": "1Gi"}, "VMDisk", MAX_NODES, MAX_FINDINGS)
    assert raw
    assert "did you mean storage" in raw[0].hint


# -- attacks: values shaped to make the index and the raw walk disagree ----------------------

KEYWORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string"},  # a property named like a keyword
        "properties": {"properties": {"size": {}}},
        "items": {"items": {"properties": {"name": {}}}},
        "additionalProperties": {"additionalProperties": {"properties": {"n": {}}}},
        "x-kubernetes-preserve-unknown-fields": {"properties": {"only": {}}},
        "$ref": {"properties": {"ref": {}}},
    },
}


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"properties": {"properties": {"size": 1}, "siz": 1}}, id="properties-key"),
        pytest.param({"items": [{"items": 1}, {"nam": 1}]}, id="items-key"),
        pytest.param({"additionalProperties": {"a": {"m": 1}, "b": 2}}, id="additional-key"),
        pytest.param({"x-kubernetes-preserve-unknown-fields": True, "typ": 1}, id="preserve-true"),
        pytest.param(
            {
                "x-kubernetes-preserve-unknown-fields": {
                    "x-kubernetes-preserve-unknown-fields": True
                }
            },
            id="preserve-nested",
        ),
        pytest.param({"$ref": {"$ref": "#/", "ref": 1}, "type": {"type": 1}}, id="ref-and-type"),
        pytest.param({"type": {"properties": {"x": 1}}, "tpye": 1}, id="type-with-a-shape"),
    ],
)
def test_a_schema_keyword_as_a_values_key_is_judged_as_the_raw_walk_judges_it(
    values: dict[str, Any],
) -> None:
    """A key spelt like a keyword is only ever a key: it never reaches the index's reading of
    the schema, so it cannot switch a node to "anything goes" or borrow another node's keys."""
    raw = raw_unknown_keys(values, KEYWORD_SCHEMA, max_nodes=MAX_NODES, max_findings=MAX_FINDINGS)
    assert unknown_keys(values, index_schema(KEYWORD_SCHEMA)) == raw
    assert raw, "each case still reports a key the schema does not know"


def test_a_properties_map_key_named_type_is_a_property_not_a_keyword() -> None:
    schema: dict[str, Any] = {"properties": {"type": {"properties": {"kind": {}}}, "items": {}}}
    values = {"type": {"kind": 1, "knd": 2}, "items": [1]}
    found = unknown_keys(values, index_schema(schema))
    assert found == raw_unknown_keys(values, schema, max_nodes=MAX_NODES, max_findings=MAX_FINDINGS)
    assert [f.path for f in found] == ["type.knd"]


@pytest.mark.parametrize(
    ("schema", "values"),
    [
        pytest.param({"properties": {"a": {}}}, [{"b": 1}, {"c": 2}], id="list-against-a-map"),
        pytest.param(
            {"items": {"properties": {"a": {}}}}, {"b": {"c": 1}}, id="map-against-a-list"
        ),
        pytest.param(
            {"properties": {"a": {}}, "items": {"properties": {"x": {}}}},
            [{"y": 1}, {"a": 1}],
            id="list-against-both",
        ),
        pytest.param(
            {"properties": {"a": {}}, "items": {"properties": {"x": {}}}},
            {"x": [{"y": 1}], "b": 1},
            id="map-against-both",
        ),
        pytest.param({"properties": {"a": {"items": {}}}}, {"a": {"b": 1}}, id="map-under-items"),
        pytest.param({"items": [{"properties": {}}]}, [{"a": 1}], id="tuple-items-not-a-schema"),
        pytest.param({"properties": ["a"]}, {"b": 1}, id="properties-a-list"),
        pytest.param({"additionalProperties": False, "properties": {}}, {"b": 1}, id="extra-false"),
        pytest.param({"additionalProperties": "yes"}, {"b": 1}, id="extra-a-string"),
        pytest.param(
            {"x-kubernetes-preserve-unknown-fields": "true", "properties": {"a": {}}},
            {"b": 1},
            id="preserve-a-string",
        ),
        pytest.param(
            {"x-kubernetes-preserve-unknown-fields": 1, "properties": {"a": {}}},
            {"b": 1},
            id="preserve-one",
        ),
    ],
)
def test_lists_against_maps_are_judged_as_the_raw_walk_judges_them(
    schema: dict[str, Any], values: object
) -> None:
    raw = raw_unknown_keys(values, schema, max_nodes=MAX_NODES, max_findings=MAX_FINDINGS)
    assert unknown_keys(values, index_schema(schema)) == raw


@pytest.mark.parametrize("typo", ["FOO", "fooo", "Fo"])
def test_known_keys_that_fold_alike_hint_in_schema_order(typo: str) -> None:
    """Keys differing only in case (``Foo``, ``foo``): the first in the schema is the hint, as
    the raw walk gave it; an index that reordered the known keys would name the other."""
    for order in (["Foo", "foo", "bar"], ["foo", "Foo", "bar"]):
        schema: dict[str, Any] = {"properties": {key: {} for key in order}}
        raw = raw_unknown_keys({typo: 1}, schema, max_nodes=MAX_NODES, max_findings=MAX_FINDINGS)
        assert unknown_keys({typo: 1}, index_schema(schema)) == raw
        assert raw[0].hint == f" (did you mean {order[0]}?)"


def _read_nodes(node: KeyIndex) -> int:
    """How many nodes of an index have been read (each holds what its schema declares)."""
    if not node.read:
        return 0
    children = [*(node.declared or {}).values(), node.others, node.items]
    return 1 + sum(_read_nodes(child) for child in children if child is not None)


def _schema_nodes(schema: object) -> int:
    if not isinstance(schema, Mapping):
        return 1
    total = 1
    properties = schema.get("properties")
    for child in properties.values() if isinstance(properties, Mapping) else ():
        total += _schema_nodes(child)
    for key in ("additionalProperties", "items"):
        if isinstance(schema.get(key), Mapping):
            total += _schema_nodes(schema[key])
    return total


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.sampled_from(KINDS), st.lists(st.dictionaries(KEYS, VALUES, max_size=10), max_size=5))
def test_hostile_values_never_grow_the_index_past_the_schema(
    kind: str, writes: list[dict[Any, Any]]
) -> None:
    """The index is the schema's: however many writes, whatever keys, it holds no more nodes
    than the schema has (a tenant's keys are looked up, never added)."""
    schema = PLATFORM.kinds[kind].schema
    index = index_schema(schema)
    for values in writes:
        unknown_keys(values, index)
    assert _read_nodes(index) <= _schema_nodes(schema)


def test_a_flood_of_distinct_unknown_keys_keeps_the_hint_cache_bounded() -> None:
    """A tenant sending new misspelt keys on every write: each write costs at most
    MAX_FINDINGS hints, the cache stays at its bound, and keys past a name's length are never
    kept; another tenant's typo is answered the same afterwards."""
    module._remembered_hint.cache_clear()
    index = PLATFORM.kinds["VMDisk"].key_index
    for write in range(600):
        values = {f"k{write}-{i}": 1 for i in range(50)} | {"y" * 300 + str(write): 1}
        assert len(unknown_keys(values, index)) == MAX_FINDINGS
    info = module._remembered_hint.cache_info()
    assert info.currsize <= 1024
    assert info.maxsize == 1024
    assert all(len(word) <= 253 for word, _ in _cached_words())
    warnings = unknown_key_warnings("VMDisk", {"storag": "5Gi"}, index)
    assert warnings == [
        "VMDisk: storag is not in the VMDisk schema (did you mean storage?); it is ignored"
    ]


def _cached_words() -> list[tuple[str, tuple[str, ...]]]:
    """The (key, known keys) pairs the hint cache holds, by asking it for nothing new."""
    cache = module._remembered_hint
    found = []
    for word in [f"k{w}-{i}" for w in range(590, 600) for i in range(5)]:
        before = cache.cache_info().hits
        cache(word, PLATFORM.kinds["VMDisk"].key_index.known)
        if cache.cache_info().hits > before:
            found.append((word, PLATFORM.kinds["VMDisk"].key_index.known))
    return found


def test_admission_reads_the_kinds_index_not_the_raw_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stage 2 walks the index made with the kind: the raw schema is not read per request."""
    from tests.builders import request, state

    current = state({"tenant-acme": {"storage": "100Gi"}})
    kind = current.platform.kind("VMDisk")
    assert kind is not None
    seen: list[object] = []
    real = module.unknown_keys

    def spy(values: object, schema: Any) -> Any:
        seen.append(schema)
        return real(values, schema)

    monkeypatch.setattr(module, "unknown_keys", spy)
    decision = decide(request("VMDisk", "tenant-acme", "d", {"storag": "5Gi"}), current, Policy())
    assert any("did you mean storage" in w for w in decision.warnings)
    assert seen == [kind.key_index]

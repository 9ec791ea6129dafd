"""Values are measured before any work is done on them, at a cost the bound itself caps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import platform
from webhook.core.base.errors import EvaluationError
from webhook.core.pricing.bounds import ValuesLimits, check_values, non_string_key


def nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_real_values_pass() -> None:
    check_values({"nodeGroups": {f"g{i}": {"minReplicas": 0, "gpus": []} for i in range(1000)}})


def test_values_nested_100k_levels_are_refused_without_recursion() -> None:
    with pytest.raises(EvaluationError, match="nest deeper than 64 levels"):
        check_values(nested(100_000))


def test_a_spec_with_250k_node_groups_is_refused_before_defaulting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kind = platform().kinds["Kubernetes"]
    assert kind.defaulter is not None
    defaulted: list[object] = []
    monkeypatch.setattr(type(kind.defaulter), "apply", lambda self, v: defaulted.append(v))
    spec: dict[str, Any] = {"nodeGroups": {f"g{i}": {} for i in range(250_000)}}
    with pytest.raises(EvaluationError, match="more than 20000 entries"):
        platform().charge("Kubernetes", spec, namespace="tenant-x")
    assert defaulted == []


def test_a_tenant_sending_19000_empty_node_groups_is_refused_before_defaults_multiply_them() -> (
    None
):
    # 19,000 empty node groups pass the 20,000-entry bound; defaulted, each becomes six
    # entries (114,000 in all, 2.4 MB of JSON), which cost some 90 ms on the shared loop to
    # make, digest and walk, ten times the heaviest values the bound lets through otherwise.
    kind = platform().kinds["Kubernetes"]
    spec: dict[str, Any] = {"nodeGroups": {f"g{i}": {} for i in range(19_000)}}
    check_values(spec)  # within the bound as sent
    with pytest.raises(EvaluationError, match="defaults would add more than 10000 entries"):
        kind.defaulted(spec)


def test_the_largest_real_values_are_defaulted_within_the_bound() -> None:
    # A thousand node groups (the most one forEach reads), every default filled in.
    kind = platform().kinds["Kubernetes"]
    defaulted = kind.defaulted({"nodeGroups": {f"g{i}": {} for i in range(1000)}})
    assert defaulted["nodeGroups"]["g999"]["diskSize"] == "20Gi"


def test_the_check_stops_at_the_bound_whatever_the_size() -> None:
    visited = 0

    class Counting(dict[str, Any]):
        def values(self) -> Any:
            nonlocal visited
            visited += 1
            return super().values()

    wide = Counting({f"k{i}": Counting() for i in range(10)})
    with pytest.raises(EvaluationError):
        check_values([wide] * 1000, ValuesLimits(max_nodes=100))
    assert visited <= 100


def walk_every_node(values: object, limits: ValuesLimits) -> str:
    """The plain walk that queues every node, scalars included: the specification."""
    nodes = 0
    stack: list[tuple[object, int]] = [(values, 1)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if isinstance(value, Mapping):
            children: list[object] = list(value.values())
        elif isinstance(value, list | tuple):
            children = list(value)
        else:
            continue
        if nodes + len(stack) + len(children) > limits.max_nodes:
            return (
                f"the values hold more than {limits.max_nodes} entries; refused before evaluation"
            )
        if children and depth >= limits.max_depth:
            return f"the values nest deeper than {limits.max_depth} levels; refused"
        stack.extend((child, depth + 1) for child in children)
    return ""


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=2), children, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.integers(1, 40), st.integers(1, 6))
def test_the_bounds_refuse_exactly_where_a_walk_over_every_node_does(
    values: object, max_nodes: int, max_depth: int
) -> None:
    limits = ValuesLimits(max_nodes=max_nodes, max_depth=max_depth)
    try:
        check_values(values, limits)
        refused = ""
    except EvaluationError as exc:
        refused = exc.reason
    assert refused == walk_every_node(values, limits)


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"instanceType": "u1.micro", 1: "x"}, "spec.1"),
        ({"instanceType": "u1.micro", "disks": [{"name": "a", True: 1}]}, "spec.disks[0].True"),
        ({"instanceType": "u1.micro", None: 1}, "spec.None"),
    ],
)
def test_a_yaml_key_that_is_not_a_string_is_refused_by_its_path_not_a_type_error(
    spec: Mapping[Any, Any], where: str
) -> None:
    # Only a YAML file can write `1:` or `true:` (JSON keys are strings); digesting such values
    # raised a TypeError that named nothing: `webhook evaluate` died as an internal error, a
    # `--state` load counted the application unknown for "'<' not supported".
    found = platform()
    for prepare in (found.values, found.prepare):
        with pytest.raises(EvaluationError) as refused:
            prepare("VMInstance", spec)
        assert refused.value.path == where
        assert "not a string" in refused.value.reason


STRING_KEYED = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=2), children, max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(STRING_KEYED, st.integers() | st.booleans() | st.none())
def test_the_first_key_not_a_string_is_found_wherever_it_is(values: object, key: object) -> None:
    assert non_string_key(values) is None
    assert non_string_key({"a": [values, {key: 1}]}) == f"spec.a[1].{key!r}"

"""Values are measured before any work is done on them, at a cost the bound itself caps."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import platform
from webhook.core.bounds import ValuesLimits, check_values
from webhook.core.errors import EvaluationError


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
    with pytest.raises(EvaluationError, match="more than 50000 entries"):
        platform().charge("Kubernetes", spec, namespace="tenant-x")
    assert defaulted == []


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

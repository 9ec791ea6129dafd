"""The unknown-key walk reports what a plain recursive walk over every value reports.

The walk runs on every admission, so it skips work (a scalar is only counted against the node
budget; a path is spelled only where it is used). Whatever the values, and however early the
budget runs out, it must find the same keys, with the same hints, in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from webhook.core.base.spelling import did_you_mean
from webhook.core.pricing import unknown_keys as module
from webhook.core.pricing.unknown_keys import MAX_FINDINGS, MAX_NODES, UnknownKey, unknown_keys

SCHEMA: dict[str, Any] = {
    "properties": {
        "size": {"type": "string"},
        "groups": {
            "additionalProperties": {
                "properties": {"replicas": {}, "gpus": {"items": {"properties": {"name": {}}}}}
            }
        },
        "free": {"x-kubernetes-preserve-unknown-fields": True},
        "open": {"properties": {"a": {}}, "additionalProperties": True},
        "list": {"items": {"properties": {"name": {}}}},
    }
}
KEYS = st.sampled_from(
    ["size", "groups", "free", "open", "list", "replicas", "gpus", "name", "a", "siz", "nmae"]
)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(0, 3) | st.just("x"),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=30,
)


def every_value(values: object, schema: Mapping[str, Any], max_nodes: int) -> list[UnknownKey]:
    """The specification: visit every value, scalars included, building each path."""
    found: list[UnknownKey] = []
    budget = [max_nodes]

    def walk(value: object, schema: Any, path: str) -> None:
        budget[0] -= 1
        if budget[0] < 0 or len(found) >= MAX_FINDINGS or not isinstance(schema, Mapping):
            return
        if schema.get("x-kubernetes-preserve-unknown-fields") is True:
            return
        if isinstance(value, Mapping):
            properties = schema.get("properties")
            extra = schema.get("additionalProperties")
            if not isinstance(properties, Mapping) and not isinstance(extra, Mapping):
                return
            for key, item in value.items():
                where = f"{path}.{key}" if path else str(key)
                if isinstance(properties, Mapping) and key in properties:
                    walk(item, properties[key], where)
                elif isinstance(extra, Mapping):
                    walk(item, extra, where)
                elif extra is True or not isinstance(properties, Mapping):
                    continue
                else:
                    if len(found) >= MAX_FINDINGS:
                        return
                    found.append(UnknownKey(where, did_you_mean(str(key), map(str, properties))))
        elif isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, Mapping):
                for index, item in enumerate(value):
                    walk(item, items, f"{path}[{index}]")

    walk(values, schema, "")
    return found


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=5), st.integers(1, 12))
@example({"size": "x", "groups": {"g": {"siz": 1}}}, 3)  # the scalar spends the last node
def test_the_walk_finds_what_a_walk_over_every_value_finds(
    values: dict[str, Any], max_nodes: int
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "MAX_NODES", max_nodes)
        assert unknown_keys(values, SCHEMA) == every_value(values, SCHEMA, max_nodes)


@pytest.mark.parametrize("spent", [MAX_NODES // 2 - 4, MAX_NODES // 2 - 3, MAX_NODES // 2 - 2])
def test_the_walk_stops_where_a_walk_over_every_value_stops_at_the_real_budget(
    spent: int,
) -> None:
    """The same edge at the shipped MAX_NODES, unpatched, so it holds compiled too: known items
    spend the budget (two nodes each), and the misspelt keys after them straddle its end."""
    values = {"list": [{"name": "x"}] * spent + [{"nmae": 1, "name": "x"}] * 4}
    found = unknown_keys(values, SCHEMA)
    assert found == every_value(values, SCHEMA, MAX_NODES)
    assert 0 < len(found) < 4  # the budget ran out among the misspelt items

"""Evaluation's shortcuts past jsonpath-ng find exactly what jsonpath-ng finds.

A path like ``$.gpus[*].name`` is answered "no match" without jsonpath-ng when the keys before
its wildcard lead nowhere or to an empty container. Whatever the values, the charge (terms,
paths, digest) or the error must be the one jsonpath-ng alone gives.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.base.errors import EvaluationError
from webhook.core.pricing import evaluation
from webhook.core.pricing.catalog import StaticCatalog
from webhook.core.pricing.contracts import compile_contract

CONTRACT = compile_contract(
    "Thing",
    {
        "terms": [
            {"name": "gpus", "devices": "$.gpus[*].name"},
            {"name": "deep", "devices": "$.a.b[*].c.*"},
            {"name": "each", "forEach": "$.a.groups.*", "devices": "@.gpus[*].name"},
        ]
    },
    source="test",
)
KEYS = st.sampled_from(["gpus", "a", "b", "c", "groups", "name", "x"])
SCALARS = st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(["", "nvidia.com/A"])
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=12,
)


def outcome(values: Any) -> object:
    """The interpreter's outcome: the shortcut is its own (the compiled form walks its own
    steps, tested against jsonpath-ng alone in ``test_compiled``)."""
    try:
        charge = evaluation.interpret(CONTRACT, values, StaticCatalog())
    except EvaluationError as exc:
        return ("error", str(exc))
    return (charge.resources, charge.terms, charge.digest)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=4))
def test_the_no_match_shortcut_agrees_with_jsonpath(values: dict[str, Any]) -> None:
    fast = outcome(values)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation, "_leads_nowhere", lambda datum, keys: False)
        slow = outcome(values)
    assert fast == slow


def test_no_gpus_charge_no_devices_and_listed_gpus_do() -> None:
    contract = CONTRACT
    assert evaluation.evaluate(contract, {"gpus": []}, StaticCatalog()).resources == {}
    listed = {"gpus": [{"name": "nvidia.com/A"}, {"name": "nvidia.com/A"}]}
    assert evaluation.evaluate(contract, listed, StaticCatalog()).resources == {"nvidia.com/A": 2}

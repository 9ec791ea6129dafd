"""A values key the kind's schema does not know is a warning naming the closest known key."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import platform, request, state
from webhook.core.admission.decisions import Policy, decide
from webhook.core.pricing.unknown_keys import MAX_FINDINGS, unknown_key_warnings, unknown_keys

PLATFORM = platform()


def schema(kind: str) -> Any:
    found = PLATFORM.kind(kind)
    assert found is not None
    return found.schema


@pytest.mark.parametrize(
    ("kind", "values", "expected"),
    [
        pytest.param(
            "VMDisk",
            {"storag": "50Gi"},
            ["VMDisk: storag is not in the VMDisk schema (did you mean storage?); it is ignored"],
            id="typo-at-the-root",
        ),
        pytest.param(
            "Kubernetes",
            {"nodeGroups": {"md0": {"minReplica": 1}}},
            [
                "Kubernetes: nodeGroups.md0.minReplica is not in the Kubernetes schema "
                "(did you mean minReplicas?); it is ignored"
            ],
            id="typo-inside-a-map-of-objects",
        ),
        pytest.param("VMDisk", {"storage": "50Gi"}, [], id="known-keys-are-silent"),
        pytest.param(
            "Postgres",
            {"zzzz": 1},
            ["Postgres: zzzz is not in the Postgres schema; it is ignored"],
            id="nothing-close",
        ),
    ],
)
def test_unknown_keys_are_named_with_the_closest_known_one(
    kind: str, values: Any, expected: list[str]
) -> None:
    assert unknown_key_warnings(kind, values, schema(kind)) == expected


def test_a_schema_that_preserves_unknown_fields_allows_anything() -> None:
    open_schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert unknown_keys({"anything": 1}, open_schema) == []


def test_a_flood_of_unknown_keys_is_reported_bounded() -> None:
    values = {f"k{i}": i for i in range(10_000)}
    assert len(unknown_keys(values, schema("VMDisk"))) == MAX_FINDINGS


def test_admission_warns_about_an_unknown_key_and_still_decides() -> None:
    current = state({"tenant-acme": {"storage": "100Gi"}})
    decision = decide(request("VMDisk", "tenant-acme", "d", {"storag": "50Gi"}), current, Policy())
    assert decision.allowed
    assert any("did you mean storage?" in w for w in decision.warnings)

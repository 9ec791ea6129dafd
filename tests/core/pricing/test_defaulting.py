"""Structural defaulting, as Cozystack applies it when it reads an application back."""

from typing import Any

from webhook.core.pricing.defaulting import apply_defaults

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "replicas": {"type": "integer", "default": 2},
        "resources": {"type": "object", "default": {}, "properties": {"cpu": {}}},
        "controlPlane": {
            "type": "object",
            "default": {},
            "properties": {
                "apiServer": {
                    "type": "object",
                    "default": {},
                    "properties": {"resourcesPreset": {"type": "string", "default": "c1.medium"}},
                }
            },
        },
        "nodeGroups": {
            "type": "object",
            "default": {},
            "additionalProperties": {
                "type": "object",
                "properties": {"maxReplicas": {"type": "integer", "default": 10}},
            },
        },
        "shards": {
            "type": "array",
            "items": {"type": "object", "properties": {"replicas": {"default": 3}}},
        },
        "note": {"type": "string", "nullable": True, "default": "x"},
    },
}


def test_absent_document_means_all_defaults() -> None:
    assert apply_defaults(None, SCHEMA) == {
        "replicas": 2,
        "resources": {},
        "controlPlane": {"apiServer": {"resourcesPreset": "c1.medium"}},
        "nodeGroups": {},
        "note": "x",
    }


def test_defaults_nest_into_the_defaults_just_set() -> None:
    assert apply_defaults({}, SCHEMA)["controlPlane"]["apiServer"] == {
        "resourcesPreset": "c1.medium"
    }


def test_explicit_values_win() -> None:
    assert apply_defaults({"replicas": 5}, SCHEMA)["replicas"] == 5


def test_null_is_treated_as_absent_unless_nullable() -> None:
    defaulted = apply_defaults({"replicas": None, "note": None}, SCHEMA)
    assert defaulted["replicas"] == 2
    assert defaulted["note"] is None


def test_additional_properties_values_are_defaulted() -> None:
    defaulted = apply_defaults({"nodeGroups": {"gpu": {}, "big": {"maxReplicas": 1}}}, SCHEMA)
    assert defaulted["nodeGroups"] == {"gpu": {"maxReplicas": 10}, "big": {"maxReplicas": 1}}


def test_list_items_are_defaulted() -> None:
    defaulted = apply_defaults({"shards": [{}, {"replicas": 1}]}, SCHEMA)
    assert defaulted["shards"] == [{"replicas": 3}, {"replicas": 1}]


def test_input_is_not_mutated_and_defaults_are_not_shared() -> None:
    sparse: dict[str, Any] = {}
    first = apply_defaults(sparse, SCHEMA)
    first["resources"]["cpu"] = "9"
    assert sparse == {}
    assert apply_defaults({}, SCHEMA)["resources"] == {}


def test_sparse_and_already_defaulted_values_default_alike() -> None:
    once = apply_defaults({"nodeGroups": {"md1": {}}}, SCHEMA)
    assert apply_defaults(once, SCHEMA) == once

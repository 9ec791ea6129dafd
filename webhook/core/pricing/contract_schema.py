"""The JSON Schema of the reservation contract language.

A contract is data: the ``spec`` of a ``ReservationContract`` document, or the
``spec.reservation`` block of an ApplicationDefinition. ``webhook contract-schema`` prints this
schema so operators can validate contracts in their editors and CI. The meaning of each field is
documented in :mod:`webhook.core.pricing.contracts`.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["CONTRACT_API_VERSION", "CONTRACT_KIND", "CONTRACT_SCHEMA", "DOCUMENT_SCHEMA"]

CONTRACT_API_VERSION: Final = "reservation.cozystack.io/v1alpha1"
CONTRACT_KIND: Final = "ReservationContract"

_PATH = {"type": "string", "pattern": r"^[$@]", "description": "JSONPath into the values"}
_PATH_WITH_DEFAULT = {
    "type": "object",
    "required": ["path"],
    "additionalProperties": False,
    "properties": {"path": _PATH, "default": {}},
}
_TEST = {
    "description": "A path that must be truthy, or a comparison of the value at a path.",
    "oneOf": [
        _PATH,
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["path"],
            "minProperties": 2,
            "maxProperties": 2,
            "properties": {"path": _PATH, "equals": {}, "in": {"type": "array", "minItems": 1}},
        },
    ],
}
_CONDITION = {"oneOf": [_TEST, {"type": "array", "minItems": 1, "items": _TEST}]}
_LITERAL_QUANTITY = {
    "oneOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": r"^[^$@]"},
    ]
}

_DEFINITIONS: dict[str, Any] = {
    "count": {
        "description": "An integer: a constant, a path, or a product, sum or maximum of counts.",
        "oneOf": [
            {"type": "integer", "minimum": 0},
            _PATH,
            _PATH_WITH_DEFAULT,
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["product"],
                "properties": {
                    "product": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/count"}}
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["sum"],
                "properties": {
                    "sum": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/count"}}
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["max"],
                "properties": {
                    "max": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/count"}}
                },
            },
        ],
    },
    "quantity": {
        "description": "A quantity: a literal, a path, or a product, sum or maximum of quantities.",
        "oneOf": [
            _LITERAL_QUANTITY,
            _PATH,
            _PATH_WITH_DEFAULT,
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["product"],
                "properties": {
                    "product": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"$ref": "#/$defs/quantity"},
                    }
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["sum"],
                "properties": {
                    "sum": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/quantity"}}
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["max"],
                "properties": {
                    "max": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/quantity"}}
                },
            },
        ],
    },
    "name": {
        "description": "A name: a literal string or a path to one.",
        "oneOf": [{"type": "string"}, _PATH_WITH_DEFAULT],
    },
    "size": {
        "description": "Where one unit's CPU and memory come from.",
        "oneOf": [
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["instanceType"],
                "properties": {
                    "instanceType": {"$ref": "#/$defs/name"},
                    "namespaced": {"type": "boolean"},
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["preset"],
                "properties": {"preset": {"$ref": "#/$defs/name"}, "overrides": _PATH},
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["resources"],
                "properties": {
                    "resources": {
                        "type": "object",
                        "minProperties": 1,
                        "additionalProperties": {"$ref": "#/$defs/quantity"},
                    },
                    "require": {"type": "array", "items": _PATH},
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["first"],
                "properties": {
                    "first": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/size"}}
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["max"],
                "properties": {
                    "max": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/size"}}
                },
            },
        ],
    },
    "term": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "anyOf": [
            {"required": ["size"]},
            {"required": ["storage"]},
            {"required": ["devices"]},
            {"required": ["objects"]},
        ],
        "properties": {
            "name": {"type": "string", "pattern": r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"},
            "description": {"type": "string"},
            "forEach": _PATH,
            "ifNone": {"type": "object", "additionalProperties": {"type": "object"}},
            "when": _CONDITION,
            "unless": _CONDITION,
            "count": {"$ref": "#/$defs/count"},
            "size": {"$ref": "#/$defs/size"},
            "storage": {"$ref": "#/$defs/quantity"},
            # The term's storage is persistent volumes: "kept" when removed units keep theirs
            # (a StatefulSet's default), "released" when they are deleted with the unit. Either
            # way a volume never shrinks: see webhook.core.pricing.volumes.
            "volume": {"enum": ["kept", "released"]},
            "devices": _PATH,
            "objects": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": {"$ref": "#/$defs/count"},
            },
        },
    },
}

CONTRACT_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Reservation contract",
    "type": "object",
    "additionalProperties": False,
    "oneOf": [{"required": ["terms"]}, {"required": ["exempt"]}],
    "properties": {
        "description": {"type": "string"},
        "terms": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/term"}},
        "exempt": {
            "type": "object",
            "additionalProperties": False,
            "required": ["reason"],
            "properties": {"reason": {"type": "string", "minLength": 1}},
        },
    },
    "$defs": _DEFINITIONS,
}

DOCUMENT_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "ReservationContract document",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": CONTRACT_API_VERSION},
        "kind": {"const": CONTRACT_KIND},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}},
        },
        "spec": {
            "type": "object",
            "required": ["kind"],
            "properties": {"kind": {"type": "string", "minLength": 1}},
        },
    },
}

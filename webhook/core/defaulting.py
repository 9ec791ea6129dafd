"""Structural defaulting of application values from a kind's openAPISchema.

Cozystack stores application values sparse and applies the schema defaults only when it reads an
application back (``applySpecDefaults``), so a CREATE arrives sparse while an UPDATE's old object
arrives defaulted. Both sides must be defaulted alike before evaluation, or a no-op edit would
look like a size change. This follows Kubernetes structural defaulting: a missing or ``null``
property with a ``default`` gets a copy of it (``null`` is kept only where the schema says
``nullable``), and defaulting then recurses into properties,
``additionalProperties`` values and list items, including into the defaults it just set.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["apply_defaults"]


def apply_defaults(values: object, schema: Mapping[str, Any]) -> Any:
    """Return a defaulted deep copy of ``values``; an absent (``None``) document is ``{}``."""
    document = {} if values is None else copy.deepcopy(values)
    return _default(document, schema)


def _default(value: Any, schema: Mapping[str, Any]) -> Any:
    if isinstance(value, dict):
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            for name, child in properties.items():
                if not isinstance(child, Mapping):
                    continue
                missing = name not in value or (value[name] is None and not child.get("nullable"))
                if missing and "default" in child:
                    value[name] = copy.deepcopy(child["default"])
                if name in value and value[name] is not None:
                    value[name] = _default(value[name], child)
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            known = properties if isinstance(properties, Mapping) else {}
            for name in list(value):
                if name not in known and value[name] is not None:
                    value[name] = _default(value[name], extra)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [_default(item, items) if item is not None else item for item in value]
    return value

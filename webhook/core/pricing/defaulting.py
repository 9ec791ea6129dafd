"""Structural defaulting of application values from a kind's openAPISchema.

Cozystack stores application values sparse and applies the schema defaults only when it reads an
application back (``applySpecDefaults``), so a CREATE arrives sparse while an UPDATE's old object
arrives defaulted. Both sides must be defaulted alike before evaluation, or a no-op edit would
look like a size change. This follows Kubernetes structural defaulting: a missing or ``null``
property with a ``default`` gets a copy of it (``null`` is kept only where the schema says
``nullable``), and defaulting then recurses into properties,
``additionalProperties`` values and list items, including into the defaults it just set.

What defaulting adds is bounded too (``max_added`` entries): values within their bound of entries
may hold thousands of empty items a default fills in (19,000 empty node groups become 114,000
entries), and everything after defaulting costs per entry on the shared loop.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.base.errors import EvaluationError
from webhook.core.pricing.bounds import entries

__all__ = ["Defaulter", "apply_defaults", "compile_defaults"]

_MISSING = object()


@dataclass(frozen=True, slots=True)
class _Property:
    name: str
    default: Any  # _MISSING when the schema gives none
    nullable: bool
    copy_default: bool  # a container default the schema does not describe further
    child: Defaulter | None
    size: int = 1  # entries the default adds: its maps, lists and scalars together


@dataclass(frozen=True, slots=True)
class Defaulter:
    """A schema compiled for defaulting: only the branches that hold a default somewhere."""

    properties: tuple[_Property, ...] = ()
    known: frozenset[str] = frozenset()
    extra: Defaulter | None = None
    items: Defaulter | None = None

    def apply(self, values: object, *, max_added: int | None = None) -> Any:
        """The defaulted values; see :func:`apply_defaults`. Raises :class:`EvaluationError`
        once the defaults set would add more than ``max_added`` entries (``None``: no bound),
        before setting any more of them."""
        room = [max_added if max_added is not None else -1, max_added or 0]
        return self._default({} if values is None else values, room)

    def _default(self, value: Any, room: list[int]) -> Any:
        if isinstance(value, dict):
            if not self.properties and self.extra is None:
                return value
            result = dict(value)
            for prop in self.properties:
                current = result.get(prop.name, _MISSING)
                if prop.default is not _MISSING and (
                    current is _MISSING or (current is None and not prop.nullable)
                ):
                    if room[0] >= 0:  # bounded: -1 is none
                        room[0] -= prop.size
                        if room[0] < 0:
                            raise EvaluationError(
                                "spec",
                                f"the schema's defaults would add more than {room[1]} entries "
                                "to the values; refused before evaluation",
                            )
                    current = _copy(prop.default) if prop.copy_default else prop.default
                    result[prop.name] = current
                if prop.child is not None and current is not _MISSING and current is not None:
                    result[prop.name] = prop.child._default(current, room)
            if self.extra is not None:
                for name, item in result.items():
                    if name not in self.known and item is not None:
                        result[name] = self.extra._default(item, room)
            return result
        if isinstance(value, list) and self.items is not None:
            items = self.items
            return [items._default(item, room) if item is not None else None for item in value]
        return value


def _copy(default: Any) -> Any:
    """A private copy of a container default; the usual ``{}`` and ``[]`` cost next to nothing."""
    if not default:
        return type(default)()
    return copy.deepcopy(default)


def compile_defaults(schema: Mapping[str, Any]) -> Defaulter | None:
    """Compile ``schema``; ``None`` when nothing in it has a default."""
    properties: list[_Property] = []
    raw = schema.get("properties")
    if isinstance(raw, Mapping):
        for name, child_schema in raw.items():
            if not isinstance(child_schema, Mapping):
                continue
            child = compile_defaults(child_schema)
            has_default = "default" in child_schema
            if child is None and not has_default:
                continue
            default = child_schema["default"] if has_default else _MISSING
            properties.append(
                _Property(
                    name=str(name),
                    default=default,
                    nullable=bool(child_schema.get("nullable")),
                    copy_default=isinstance(default, (dict, list)) and child is None,
                    child=child,
                    size=entries(default) if has_default else 0,
                )
            )
    extra_schema = schema.get("additionalProperties")
    extra = compile_defaults(extra_schema) if isinstance(extra_schema, Mapping) else None
    items_schema = schema.get("items")
    items = compile_defaults(items_schema) if isinstance(items_schema, Mapping) else None
    if not properties and extra is None and items is None:
        return None
    known = frozenset(raw) if isinstance(raw, Mapping) else frozenset()
    return Defaulter(tuple(properties), known, extra, items)


def apply_defaults(values: object, schema: Mapping[str, Any]) -> Any:
    """Return the defaulted values; an absent (``None``) document is ``{}``.

    Neither argument is modified. Every mapping and list on a path to a default is a new
    object; the rest is shared with the input, so treat the result as read-only (evaluation
    does). Compile once with :func:`compile_defaults` where the same schema serves many calls.
    """
    defaulter = compile_defaults(schema)
    document = {} if values is None else values
    return defaulter.apply(document) if defaulter is not None else document

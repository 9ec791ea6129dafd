"""Values keys a kind's schema does not know: a typo charged as if it were absent.

``storag: 50Gi`` on a VMDisk is not ``storage``: the contract never reads it, so the disk is
charged the schema default (5Gi) and the tenant is never told. Cozystack keeps such keys, so
admission cannot refuse them; it warns instead, naming the key and the closest known one. The
walk follows the kind's ``openAPISchema`` (``properties``, ``additionalProperties``,
``items``) and stops where the schema allows anything (``x-kubernetes-preserve-unknown-fields``,
``additionalProperties: true``, or combinators it does not interpret). It is bounded: at most
:data:`MAX_NODES` values are visited and :data:`MAX_FINDINGS` keys reported. It runs on every
admission, so it walks a :class:`KeyIndex` of the schema (each node's known keys, the child per
key, the ``additionalProperties``/``items`` child, whether anything goes), made once per kind
(:attr:`webhook.core.pricing.kinds.ApplicationKind.key_index`) and each node read once, when a
value first reaches it, rather than the raw mapping looked up again on every request.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from webhook.core.base.spelling import did_you_mean

__all__ = [
    "MAX_FINDINGS",
    "KeyIndex",
    "UnknownKey",
    "index_schema",
    "unknown_key_warnings",
    "unknown_keys",
]

MAX_FINDINGS: Final = 5
MAX_NODES: Final = 10_000


@dataclass(frozen=True, slots=True)
class UnknownKey:
    path: str  # dotted, as the other messages name values paths: nodeGroups.md0.storag
    hint: str  # " (did you mean X?)" or ""


class KeyIndex:
    """One schema node as the walk reads it, read from the schema the first time a value
    reaches it (a schema is the platform's, never changed once loaded; the nodes no value
    reaches are never read, so the index costs nothing for the parts of a schema no tenant
    writes, and its size is the schema's, whatever the values)."""

    __slots__ = (
        "_schema",
        "declared",
        "items",
        "known",
        "others",
        "read",
        "shapeless",
        "skip",
        "stop",
    )

    def __init__(self, schema: object) -> None:
        self._schema = schema
        self.read = False
        self.stop = (
            True  # anything goes here: not a schema, or x-kubernetes-preserve-unknown-fields
        )
        self.declared: dict[Any, KeyIndex] | None = None  # properties: the child per known key
        self.known: tuple[str, ...] = ()  # the known keys, in schema order, for the hint
        self.others: KeyIndex | None = None  # additionalProperties, when a schema
        self.skip = (
            False  # an undeclared key is allowed: additionalProperties true, or no properties
        )
        self.shapeless = True  # neither properties nor additionalProperties: nothing to compare
        self.items: KeyIndex | None = None

    def read_schema(self) -> None:
        """Read this node's schema, once; its children are read when a value reaches them.
        ``read`` is set last: a node is never seen half read (reading twice gives the same)."""
        schema = self._schema
        if (
            isinstance(schema, Mapping)
            and schema.get("x-kubernetes-preserve-unknown-fields") is not True
        ):
            properties = schema.get("properties")
            extra = schema.get("additionalProperties")
            if isinstance(properties, Mapping):
                self.declared = {key: KeyIndex(child) for key, child in properties.items()}
                self.known = tuple(map(str, properties))
            if isinstance(extra, Mapping):
                self.others = KeyIndex(extra)
            self.skip = extra is True or self.declared is None
            self.shapeless = self.declared is None and self.others is None
            items = schema.get("items")
            if isinstance(items, Mapping):
                self.items = KeyIndex(items)
            self.stop = False
        self.read = True


def index_schema(schema: Mapping[str, Any]) -> KeyIndex:
    """The index the walk reads ``schema`` through (made once per kind)."""
    return KeyIndex(schema)


def unknown_keys(values: object, schema: Mapping[str, Any] | KeyIndex) -> list[UnknownKey]:
    """The keys in ``values`` that ``schema`` does not declare, in document order."""
    found: list[UnknownKey] = []
    budget = [MAX_NODES]
    index = schema if isinstance(schema, KeyIndex) else index_schema(schema)
    _walk(values, index, "", found, budget)
    return found


def unknown_key_warnings(
    kind: str, values: object, schema: Mapping[str, Any] | KeyIndex
) -> list[str]:
    """One warning per unknown key, for kubectl and the CLI."""
    if not isinstance(schema, KeyIndex) and not schema:
        return []  # no schema: nothing to compare against (an index of one walks to nothing)
    return [
        f"{kind}: {item.path} is not in the {kind} schema{item.hint}; it is ignored"
        for item in unknown_keys(values, schema)
    ]


def _walk(
    value: object, node: KeyIndex, path: str, found: list[UnknownKey], budget: list[int]
) -> None:
    budget[0] -= 1
    if budget[0] < 0 or len(found) >= MAX_FINDINGS:
        return
    if not node.read:
        node.read_schema()
    if node.stop:
        return
    if isinstance(value, Mapping):
        if node.shapeless:
            return  # no object shape declared: nothing to compare against
        declared, others = node.declared, node.others
        for key, item in value.items():
            child = declared.get(key) if declared is not None else None
            if child is None:
                if others is not None:
                    child = others
                elif node.skip:
                    continue
                else:
                    if len(found) >= MAX_FINDINGS:
                        return
                    where = f"{path}.{key}" if path else str(key)
                    found.append(UnknownKey(where, _hint(str(key), node.known)))
                    continue
            if type(item) in _SCALARS:
                budget[0] -= 1  # all a scalar costs the walk: it holds no keys
                continue
            where = f"{path}.{key}" if path else str(key)
            _walk(item, child, where, found, budget)
    elif isinstance(value, list):
        items = node.items
        if items is not None:
            for index, item in enumerate(value):
                if type(item) in _SCALARS:
                    budget[0] -= 1
                    continue
                _walk(item, items, f"{path}[{index}]", found, budget)


def _hint(word: str, known: tuple[str, ...]) -> str:
    """:func:`did_you_mean` for an unknown key, remembered for short keys.

    difflib's comparison costs far more than the rest of the walk (~130 us a key), and the
    same unknown key comes back write after write (a chart's stale field, a team's habit). A
    key past a Kubernetes name's length is hostile or a mistake: answered, never kept. The
    known keys are the node's, spelled once when the index read it.
    """
    if len(word) > _REMEMBERED_KEY_CHARS:
        return did_you_mean(word, known)
    return _remembered_hint(word, known)


_REMEMBERED_KEY_CHARS: Final = 253


@functools.lru_cache(maxsize=1024)
def _remembered_hint(word: str, known: tuple[str, ...]) -> str:
    return did_you_mean(word, known)


# JSON's scalars: visiting one only counts it against the budget.
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})

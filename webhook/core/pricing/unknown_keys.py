"""Values keys a kind's schema does not know: a typo charged as if it were absent.

``storag: 50Gi`` on a VMDisk is not ``storage``: the contract never reads it, so the disk is
charged the schema default (5Gi) and the tenant is never told. Cozystack keeps such keys, so
admission cannot refuse them; it warns instead, naming the key and the closest known one. The
walk follows the kind's ``openAPISchema`` (``properties``, ``additionalProperties``,
``items``) and stops where the schema allows anything (``x-kubernetes-preserve-unknown-fields``,
``additionalProperties: true``, or combinators it does not interpret). It is bounded: at most
:data:`MAX_NODES` values are visited and :data:`MAX_FINDINGS` keys reported.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from webhook.core.base.spelling import did_you_mean

__all__ = ["MAX_FINDINGS", "UnknownKey", "unknown_key_warnings", "unknown_keys"]

MAX_FINDINGS: Final = 5
MAX_NODES: Final = 10_000


@dataclass(frozen=True, slots=True)
class UnknownKey:
    path: str  # dotted, as the other messages name values paths: nodeGroups.md0.storag
    hint: str  # " (did you mean X?)" or ""


def unknown_keys(values: object, schema: Mapping[str, Any]) -> list[UnknownKey]:
    """The keys in ``values`` that ``schema`` does not declare, in document order."""
    found: list[UnknownKey] = []
    budget = [MAX_NODES]
    _walk(values, schema, "", found, budget)
    return found


def unknown_key_warnings(kind: str, values: object, schema: Mapping[str, Any]) -> list[str]:
    """One warning per unknown key, for kubectl and the CLI."""
    if not schema:
        return []
    return [
        f"{kind}: {item.path} is not in the {kind} schema{item.hint}; it is ignored"
        for item in unknown_keys(values, schema)
    ]


def _walk(
    value: object, schema: Mapping[str, Any], path: str, found: list[UnknownKey], budget: list[int]
) -> None:
    budget[0] -= 1
    if budget[0] < 0 or len(found) >= MAX_FINDINGS or not isinstance(schema, Mapping):
        return
    if schema.get("x-kubernetes-preserve-unknown-fields") is True:
        return
    if isinstance(value, Mapping):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        # Checked once per object, not once per key: this walk runs on every admission.
        declared = properties if isinstance(properties, Mapping) else None
        others = extra if isinstance(extra, Mapping) else None
        if declared is None and others is None:
            return  # no object shape declared: nothing to compare against
        for key, item in value.items():
            if declared is not None and key in declared:
                child: Any = declared[key]
            elif others is not None:
                child = others
            elif extra is True or declared is None:
                continue
            else:
                if len(found) >= MAX_FINDINGS:
                    return
                where = f"{path}.{key}" if path else str(key)
                found.append(UnknownKey(where, _hint(str(key), declared)))
                continue
            if type(item) in _SCALARS:
                budget[0] -= 1  # all a scalar costs the walk: it holds no keys
                continue
            where = f"{path}.{key}" if path else str(key)
            _walk(item, child, where, found, budget)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                if type(item) in _SCALARS:
                    budget[0] -= 1
                    continue
                _walk(item, items, f"{path}[{index}]", found, budget)


def _hint(word: str, declared: Mapping[str, Any]) -> str:
    """:func:`did_you_mean` for an unknown key, remembered for short keys.

    difflib's comparison costs far more than the rest of the walk (~130 us a key), and the
    same unknown key comes back write after write (a chart's stale field, a team's habit). A
    key past a Kubernetes name's length is hostile or a mistake: answered, never kept.
    """
    known = tuple(map(str, declared))
    if len(word) > _REMEMBERED_KEY_CHARS:
        return did_you_mean(word, known)
    return _remembered_hint(word, known)


_REMEMBERED_KEY_CHARS: Final = 253


@functools.lru_cache(maxsize=1024)
def _remembered_hint(word: str, known: tuple[str, ...]) -> str:
    return did_you_mean(word, known)


# JSON's scalars: visiting one only counts it against the budget.
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})

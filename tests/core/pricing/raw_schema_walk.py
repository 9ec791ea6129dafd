"""The unknown-key walk as it was before the schema index: over the kind's raw ``openAPISchema``
mapping, looked up again at every value. Kept only as the reference the indexed walk must
equal (:mod:`tests.core.pricing.test_unknown_keys_index`) and for ``benchmarks.stages``'s
before/after figure."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

from webhook.core.base.spelling import did_you_mean
from webhook.core.pricing.unknown_keys import UnknownKey

_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def raw_unknown_keys(
    values: object, schema: Mapping[str, Any], *, max_nodes: int, max_findings: int
) -> list[UnknownKey]:
    """The old ``unknown_keys``, verbatim but for its bounds, passed in."""
    found: list[UnknownKey] = []
    budget = [max_nodes]

    def walk(value: object, schema: Mapping[str, Any], path: str) -> None:
        budget[0] -= 1
        if budget[0] < 0 or len(found) >= max_findings or not isinstance(schema, Mapping):
            return
        if schema.get("x-kubernetes-preserve-unknown-fields") is True:
            return
        if isinstance(value, Mapping):
            properties = schema.get("properties")
            extra = schema.get("additionalProperties")
            declared = properties if isinstance(properties, Mapping) else None
            others = extra if isinstance(extra, Mapping) else None
            if declared is None and others is None:
                return
            for key, item in value.items():
                if declared is not None and key in declared:
                    child: Any = declared[key]
                elif others is not None:
                    child = others
                elif extra is True or declared is None:
                    continue
                else:
                    if len(found) >= max_findings:
                        return
                    where = f"{path}.{key}" if path else str(key)
                    found.append(UnknownKey(where, _hint(str(key), declared)))
                    continue
                if type(item) in _SCALARS:
                    budget[0] -= 1
                    continue
                where = f"{path}.{key}" if path else str(key)
                walk(item, child, where)
        elif isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, Mapping):
                for index, item in enumerate(value):
                    if type(item) in _SCALARS:
                        budget[0] -= 1
                        continue
                    walk(item, items, f"{path}[{index}]")

    walk(values, schema, "")
    return found


def _hint(word: str, declared: Mapping[str, Any]) -> str:
    """The old hint: the known keys spelt out per unknown key, short keys remembered."""
    known = tuple(map(str, declared))
    if len(word) > 253:
        return did_you_mean(word, known)
    return _remembered_hint(word, known)


@functools.lru_cache(maxsize=1024)
def _remembered_hint(word: str, known: tuple[str, ...]) -> str:
    return did_you_mean(word, known)

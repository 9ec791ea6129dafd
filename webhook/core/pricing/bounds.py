"""Bounds on an application's values, checked before any work is done on them.

Values are tenant input, and everything downstream (the cache key's canonical JSON, schema
defaulting, JSONPath matching) costs time proportional to their size and recursion
proportional to their depth, on the one event loop every admission shares. So a document is
measured first, by an iterative walk that stops as soon as a bound is passed: the check itself
costs at most ``max_nodes`` steps, whatever was sent. The bounds sit far above any real
application (a Kubernetes cluster with a thousand node groups is some twenty thousand nodes)
and far below what blocks the loop for long.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import compress
from typing import Final

from webhook.core.base.errors import EvaluationError

__all__ = ["DEFAULT_VALUES_LIMITS", "ValuesLimits", "check_values", "entries", "non_string_key"]


@dataclass(frozen=True, slots=True)
class ValuesLimits:
    """How large and how deep one application's values may be."""

    max_nodes: int = 20_000  # maps, lists and scalars together
    max_depth: int = 64  # nesting of maps and lists
    # Entries the kind's schema defaults may add to them: a thousand node groups (the most a
    # forEach reads) add some 5,000; 19,000 empty ones would add 95,000.
    max_defaulted: int = 10_000


DEFAULT_VALUES_LIMITS: Final = ValuesLimits()


def check_values(values: object, limits: ValuesLimits = DEFAULT_VALUES_LIMITS) -> None:
    """Raise :class:`EvaluationError` if ``values`` pass a bound; costs at most ``max_nodes``.

    Every value is counted when its container is visited; only containers are queued (a
    scalar has nothing more to check), so the walk visits containers in the same order, and
    refuses at the same point, as one that queued every node. This runs on every admission.
    """
    seen = 1  # nodes counted so far: the ones visited and the ones queued or skipped
    stack: list[tuple[object, int]] = [(values, 1)]
    while stack:
        value, depth = stack.pop()
        # ``type(...) is`` first: the common JSON containers skip the slower ABC check.
        if type(value) is dict or isinstance(value, Mapping):
            children: Iterable[object] = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        size = len(value)
        if seen + size > limits.max_nodes:  # before queueing any of them
            raise EvaluationError(
                "spec",
                f"the values hold more than {limits.max_nodes} entries; refused before evaluation",
            )
        if size and depth >= limits.max_depth:
            raise EvaluationError(
                "spec", f"the values nest deeper than {limits.max_depth} levels; refused"
            )
        seen += size
        if size > _WIDE:  # a wide one is looked at in C: each child's type, no Python step
            kinds = set(map(type, children))
            if kinds <= _SCALARS:
                continue  # nothing to queue: a map of scalars
            if kinds <= _JSON_TYPES:  # JSON's own containers, picked out in order
                contained = map(_CONTAINERS.__contains__, map(type, children))
                stack.extend((child, depth + 1) for child in compress(children, contained))
                continue
        for child in children:
            kind = type(child)
            if (
                kind is dict
                or kind is list
                or (kind not in _SCALARS and isinstance(child, Mapping | list | tuple))
            ):
                stack.append((child, depth + 1))


def entries(value: object) -> int:
    """How many entries ``value`` is, as the bounds count them: maps, lists and scalars
    together (for values already bounded, or a schema's own defaults)."""
    if isinstance(value, Mapping):
        return 1 + sum(entries(child) for child in value.values())
    if isinstance(value, list | tuple):
        return 1 + sum(entries(child) for child in value)
    return 1


# What JSON and YAML values mostly are: never containers, so no ABC check is needed for them.
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})
_CONTAINERS: Final = frozenset({dict, list})
_JSON_TYPES: Final = _SCALARS | _CONTAINERS
# Children past which a container's are looked at in C: below it the set and the maps cost
# more than the Python steps they save (1,800 lists nested 10 deep, each of one child).
_WIDE: Final = 32


def non_string_key(values: object, path: str = "spec") -> str | None:
    """Where ``values`` (already bounded) hold their first mapping key that is not a string, as
    a path (``spec.disks[0].1``); ``None`` if every key is one.

    JSON keys are always strings, so only a YAML file can write one (``1:``, ``true:``). Asked
    only once digesting the values failed: no admission pays for the walk.
    """
    stack: list[tuple[object, str]] = [(values, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, Mapping):
            for key in value:
                if not isinstance(key, str):
                    return f"{where}.{key!r}"
            stack.extend((child, f"{where}.{key}") for key, child in reversed(list(value.items())))
        elif isinstance(value, list | tuple):
            stack.extend((child, f"{where}[{i}]") for i, child in reversed(list(enumerate(value))))
    return None

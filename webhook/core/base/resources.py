"""Resource lists: the charge, budget and usage maps of quota arithmetic.

A resource list maps a shorthand resource key (``cpu``, ``memory``, ``storage``,
``services.loadbalancers``, a GPU device name ...) to an exact :class:`~decimal.Decimal`.
Every function here is total and returns a new mapping; none mutates its arguments. Keys whose
value is zero are kept where they carry meaning (a budget of ``0`` is a limit) and dropped from
sums where they do not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from webhook.core.base.quantities import format_quantity

__all__ = [
    "ResourceList",
    "add",
    "exceeded",
    "format_resources",
    "mask",
    "maximum",
    "positive_part",
    "scale",
    "subtract",
    "to_strings",
    "total",
]

ResourceList = Mapping[str, Decimal]

_ZERO = Decimal(0)


def add(left: ResourceList, right: ResourceList) -> dict[str, Decimal]:
    """Key-wise sum."""
    result = dict(left)
    for key, value in right.items():
        result[key] = result.get(key, _ZERO) + value
    return result


def subtract(left: ResourceList, right: ResourceList) -> dict[str, Decimal]:
    """Key-wise ``left - right``; keys only in ``right`` come out negative."""
    result = dict(left)
    for key, value in right.items():
        result[key] = result.get(key, _ZERO) - value
    return result


def total(lists: Iterable[ResourceList]) -> dict[str, Decimal]:
    """Key-wise sum of many lists."""
    result: dict[str, Decimal] = {}
    for item in lists:
        for key, value in item.items():
            result[key] = result.get(key, _ZERO) + value
    return result


def scale(resources: ResourceList, factor: Decimal) -> dict[str, Decimal]:
    """Every value multiplied by ``factor``."""
    return {key: value * factor for key, value in resources.items()}


def maximum(left: ResourceList, right: ResourceList) -> dict[str, Decimal]:
    """Key-wise maximum; a key present on one side only keeps its value."""
    result = dict(left)
    for key, value in right.items():
        result[key] = max(result.get(key, value), value)
    return result


def positive_part(resources: ResourceList) -> dict[str, Decimal]:
    """Only the keys whose value is above zero: the increases of a delta."""
    return {key: value for key, value in resources.items() if value > 0}


def mask(resources: ResourceList, keys: Iterable[str]) -> dict[str, Decimal]:
    """Only the given keys."""
    wanted = set(keys)
    return {key: value for key, value in resources.items() if key in wanted}


def exceeded(requested: ResourceList, available: ResourceList) -> list[str]:
    """Keys of ``available`` that ``requested`` goes above, sorted.

    Keys that ``available`` does not mention are unlimited. Equality fits.
    """
    return sorted(key for key, limit in available.items() if requested.get(key, _ZERO) > limit)


def to_strings(resources: ResourceList) -> dict[str, str]:
    """Canonical quantity strings, keys sorted: the JSON form of a charge."""
    return {key: format_quantity(resources[key]) for key in sorted(resources)}


def format_resources(resources: ResourceList, keys: Iterable[str] | None = None) -> str:
    """``cpu=2, memory=8Gi``: the form Kubernetes quota messages use."""
    chosen = sorted(resources) if keys is None else sorted(keys)
    return ", ".join(f"{key}={format_quantity(resources.get(key, _ZERO))}" for key in chosen)

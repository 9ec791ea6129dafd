"""The overcommit factor: a platform-set discount per tenant and per application.

A provider may sell more than it has by letting a workload reserve less than it declares: the
pool is charged ``ceil(declared / factor)`` per key, rounded up to the key's granularity (1m of
cpu, 1 byte or 1 unit of anything else), never down. A factor is the annotation
:data:`OVERCOMMIT_ANNOTATION` (``"cpu=2,memory=1.2"``: comma-separated ``key=decimal``) on an
application, or on a Tenant object for its namespace and, unless a descendant sets its own, its
subtree. The effective factor of an application is its own annotation, else the nearest
tenant's (the whole annotation: keys it does not name are 1.0). Absent means 1.0.

Copied literally, a tenant-writable factor would be a tenant-writable discount on the tenant's
own budget, so only the platform may set, change or remove one (:class:`OvercommitRules`
``admins``, matched against the request's ``userInfo``), within bounds: ``1.0 <= factor <= max``
per key (a factor below 1.0 would be a surcharge) and at most ``step`` away from the old
object's factor per update, so a rollout walks 1.0, 1.1, 1.2 ... and a revert is one small step.

Pure: parsing, bounds, steps, who may, and the division.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Final

__all__ = [
    "DEFAULT_ADMINS",
    "DEFAULT_MAXIMUM",
    "OVERCOMMIT_ANNOTATION",
    "OvercommitError",
    "OvercommitRules",
    "apply_factors",
    "format_factors",
    "granularity",
    "parse_factors",
]

OVERCOMMIT_ANNOTATION: Final = "reservation.cozystack.io/overcommit"
# Who may set a factor by default: Kubernetes' superuser group, and the group Cozystack grants
# cluster-admin (cozystack/cozystack pkg/registry/core/tenantnamespace/rest.go treats both as
# privileged; the Keycloak group of the same name maps to it).
DEFAULT_ADMINS: Final = frozenset({"system:masters", "cozystack-cluster-admin"})
DEFAULT_MAXIMUM: Final = {"cpu": Decimal("4"), "memory": Decimal("1.5")}
DEFAULT_STEP: Final = Decimal("0.1")
ONE: Final = Decimal(1)
MAX_ANNOTATION_CHARS: Final = 512
MAX_KEYS: Final = 16
_DECIMAL = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?")
_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")
_MILLI: Final = Decimal("0.001")


class OvercommitError(ValueError):
    """A factor annotation that cannot stand; the message says why and what would."""


@dataclass(frozen=True)
class OvercommitRules:
    """Who may set factors and within which bounds (the platform's configuration).

    ``admins`` holds group names and user names (a ServiceAccount is the user
    ``system:serviceaccount:<namespace>:<name>``). A key without a ``maximum`` may carry no
    factor above 1.0.
    """

    admins: frozenset[str] = DEFAULT_ADMINS
    maximum: Mapping[str, Decimal] = field(default_factory=lambda: dict(DEFAULT_MAXIMUM))
    step: Decimal = DEFAULT_STEP

    def may_set(self, user: str, groups: Iterable[str]) -> bool:
        return user in self.admins or any(group in self.admins for group in groups)

    def who(self) -> str:
        return ", ".join(sorted(self.admins)) or "nobody"

    def check(self, old: Mapping[str, Decimal], new: Mapping[str, Decimal]) -> str:
        """Why going from ``old`` to ``new`` is refused, or ``""``: bounds, then the step."""
        for key in sorted(set(old) | set(new)):
            was, wanted = old.get(key, ONE), new.get(key, ONE)
            top = self.maximum.get(key, ONE)
            if wanted < ONE:
                return (
                    f"{key}={wanted} is below 1.0: a factor divides what is reserved, and "
                    "one below 1.0 would be a surcharge; the bounds are 1.0 to "
                    f"{_plain(top)}"
                )
            if wanted > top:
                return f"{key}={wanted} is above the maximum {_plain(top)} for {key}"
            if abs(wanted - was) > self.step:
                if wanted > was:
                    bound = f"the largest allowed next value is {_plain(min(was + self.step, top))}"
                else:
                    bound = (
                        f"the smallest allowed next value is {_plain(max(was - self.step, ONE))}"
                    )
                return (
                    f"{key} may change by at most {_plain(self.step)} per update: "
                    f"{_plain(was)} -> {_plain(wanted)} refused; {bound}"
                )
        return ""


def parse_factors(text: object) -> dict[str, Decimal]:
    """``"cpu=2,memory=1.2"`` as exact decimals; raises :class:`OvercommitError`."""
    if not isinstance(text, str):
        raise OvercommitError("must be a string like cpu=2,memory=1.2")
    if len(text) > MAX_ANNOTATION_CHARS:
        raise OvercommitError(f"longer than {MAX_ANNOTATION_CHARS} characters")
    factors: dict[str, Decimal] = {}
    items = [item.strip() for item in text.split(",") if item.strip()]
    if len(items) > MAX_KEYS:
        raise OvercommitError(f"more than {MAX_KEYS} keys")
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not _KEY.fullmatch(key):
            raise OvercommitError(f"{item!r} is not key=decimal (e.g. memory=1.2)")
        if not _DECIMAL.fullmatch(value):
            raise OvercommitError(f"{key}: {value!r} is not a decimal like 1.25")
        if key in factors:
            raise OvercommitError(f"{key}: given twice")
        factors[key] = Decimal(value)
    return factors


def format_factors(factors: Mapping[str, Decimal]) -> str:
    return ",".join(f"{key}={_plain(value)}" for key, value in sorted(factors.items()))


def granularity(key: str) -> Decimal:
    """The smallest unit a charge of ``key`` is rounded up to: 1m of cpu, else 1."""
    return _MILLI if key == "cpu" or key.endswith(".cpu") else ONE


def apply_factors(
    declared: Mapping[str, Decimal], factors: Mapping[str, Decimal]
) -> dict[str, Decimal]:
    """What is reserved for ``declared``: ``ceil(declared / factor)`` per key, rounded up to
    the key's granularity; keys without a factor (or a factor of 1.0) unchanged."""
    reserved: dict[str, Decimal] = {}
    for key, value in declared.items():
        factor = factors.get(key, ONE)
        if factor == ONE or value == 0:
            reserved[key] = value
            continue
        unit = granularity(key)
        units = (value / factor / unit).to_integral_value(rounding=ROUND_CEILING)
        reserved[key] = units * unit
    return reserved


def _plain(value: Decimal) -> str:
    """A factor as people write it: 1.2, 4, 1.25."""
    return format(value.normalize(), "f")

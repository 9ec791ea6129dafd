"""Budget keys: which keys a tenant budget may carry, and the application counts among them.

A Tenant's ``resourceQuotas`` enters the webhook as hostile input and leaves it twice: as the
budget its pool is checked against, and, through Cozystack's tenant chart (cozy-lib's
``flatten``), as the ResourceQuota ``tenant-quota`` in keys ``limits.<key>`` and
``requests.<key>`` (``storage`` as ``requests.storage``, plain object counts verbatim). So a key
must be one Kubernetes accepts in a ResourceQuota's ``hard`` both as written and as rendered:
``ValidateResourceQuotaResourceName`` (``pkg/apis/core/validation/validation.go``) wants a
qualified name (``IsQualifiedName``: an optional DNS-1123 subdomain prefix of at most 253
characters, ``/``, a name of at most 63 characters ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``),
and without a ``/`` one of the standard quota names (``IsStandardQuotaResourceName``,
``pkg/apis/core/helper/helpers.go``); ``ValidateResourceQuantityValue`` wants a whole number for
object counts and extended resources (every key with a ``/``). A budget holds at most
:data:`MAX_BUDGET_KEYS` keys: every key is work on every decision in its subtree and a label in
``/metrics``.

Counts are keys: ``count/<plural>.apps.cozystack.io`` limits how many applications of that kind
a pool holds, every application charging 1 of its kind's key (``count/tenants.apps.cozystack.io``
counts sub-tenants). ResourceQuota's own ``count/<resource>.<group>`` syntax is kept, but only
plurals the platform's ApplicationDefinitions declare are accepted: a count of anything else
(``count/deployments.apps``, a misspelt plural) would be a budget nothing counts, and the chart
would render it as ``limits.count/...``/``requests.count/...``, which Kubernetes accepts and
nothing counts either.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from decimal import Decimal
from typing import Final

from webhook.core.base.errors import EvaluationError
from webhook.core.base.spelling import closest_name

__all__ = [
    "COUNTED_GROUP",
    "COUNT_PREFIX",
    "MAX_BUDGET_KEYS",
    "MAX_KEY_CHARS",
    "OBJECT_COUNTS",
    "SIZE_KEYS",
    "check_budget_keys",
    "count_key",
    "counted_plural",
    "is_count_key",
    "key_problem",
]

COUNT_PREFIX: Final = "count/"
COUNTED_GROUP: Final = "apps.cozystack.io"
_COUNT_SUFFIX: Final = "." + COUNTED_GROUP
# The most keys one budget may set. Cozystack ships 31 kinds (so 31 count keys), 4 sizes and 9
# object counts; 64 leaves room for a platform's GPU models without letting one Tenant write
# thousands of keys into every decision of its subtree and into /metrics.
MAX_BUDGET_KEYS: Final = 64
# IsQualifiedName's bounds: a 253-character prefix, "/", a 63-character name.
MAX_KEY_CHARS: Final = 253 + 1 + 63
_NAME_CHARS: Final = 63
_SUBDOMAIN_CHARS: Final = 253
# The chart prefixes every key it does not emit verbatim: the prefix part must stay a subdomain.
_RENDERED_PREFIX: Final = "requests."
_NAME: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", re.ASCII)
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# Keys without "/" whose rendered forms are standard quota names: the four sizes cozy-lib
# renders as limits./requests. (storage as requests.storage), and the object counts it emits
# verbatim that Kubernetes accepts (flatten also emits services.clusterip, which
# IsStandardQuotaResourceName refuses, so the chart's ResourceQuota would fail to apply).
_PLAIN_KEYS: Final = (
    "cpu",
    "memory",
    "ephemeral-storage",
    "storage",
    "pods",
    "services",
    "services.loadbalancers",
    "services.nodeports",
    "configmaps",
    "secrets",
    "persistentvolumeclaims",
    "replicationcontrollers",
    "resourcequotas",
)
SIZE_KEYS: Final = frozenset(_PLAIN_KEYS[:4])  # the compute sizes a ResourceQuota names
OBJECT_COUNTS: Final = frozenset(_PLAIN_KEYS[4:])  # object counts it names without count/
_SHOWN: Final = 60  # characters of a hostile key quoted back in a message


def count_key(plural: str) -> str:
    """The budget key counting applications of the kind with this plural."""
    return f"{COUNT_PREFIX}{plural}{_COUNT_SUFFIX}"


def is_count_key(key: str) -> bool:
    """Whether ``key`` counts applications (``count/<plural>.apps.cozystack.io``)."""
    return key.startswith(COUNT_PREFIX) and key.endswith(_COUNT_SUFFIX)


def counted_plural(key: str) -> str | None:
    """The plural a count key counts; ``None`` for any other key."""
    if not is_count_key(key):
        return None
    return key[len(COUNT_PREFIX) : -len(_COUNT_SUFFIX)] or None


def key_problem(key: object, value: Decimal, plurals: Collection[str]) -> str:
    """Why ``key`` (with ``value``) cannot be a budget key, or ``""``.

    ``plurals`` are the application plurals the platform defines, the only ones a count key
    may name.
    """
    if not isinstance(key, str) or not key:
        return "a budget key must be a non-empty string"
    if len(key) > MAX_KEY_CHARS:
        return (
            f"a budget key is at most {MAX_KEY_CHARS} characters (a qualified name); "
            f"this one has {len(key)}"
        )
    qualified = _qualified_problem(key)
    if qualified:
        return qualified
    if "/" not in key:
        if key in _PLAIN_KEYS:
            return _whole_problem(key, value) if key in OBJECT_COUNTS else ""
        hint = closest_name(key, _PLAIN_KEYS)
        return (
            f"not a resource a ResourceQuota can limit: a key without a '/' is one of "
            f"{', '.join(_PLAIN_KEYS)}"
            + (f" (did you mean {hint}?)" if hint and hint != key else "")
            + "; other resources are qualified names such as nvidia.com/GA102GL_A10"
        )
    prefix = key.split("/", 1)[0]
    if len(_RENDERED_PREFIX) + len(prefix) > _SUBDOMAIN_CHARS:
        return (
            f"the tenant chart renders this key as {_RENDERED_PREFIX}{prefix[:20]}.../..., whose "
            f"prefix would pass the {_SUBDOMAIN_CHARS} characters Kubernetes allows"
        )
    if key.startswith(COUNT_PREFIX):
        count = _count_problem(key, plurals)
        if count:
            return count
    return _whole_problem(key, value)


def check_budget_keys(
    budget: Mapping[str, Decimal],
    plurals: Collection[str],
    *,
    kept: Iterable[str] = (),
) -> None:
    """Refuse a budget with too many keys or a key :func:`key_problem` refuses.

    ``kept`` are the keys the stored object already had: they entered before these rules and
    are left alone, so an existing tenant's next write is not refused for them. Raises
    :class:`EvaluationError` at ``resourceQuotas`` or ``resourceQuotas[<key>]``.
    """
    before = set(kept)
    added = [key for key in budget if key not in before]
    if len(budget) > MAX_BUDGET_KEYS and added:
        raise EvaluationError(
            "resourceQuotas",
            f"{len(budget)} keys exceed the limit of {MAX_BUDGET_KEYS} per budget",
        )
    for key in added:
        problem = key_problem(key, budget[key], plurals)
        if problem:
            raise EvaluationError(f"resourceQuotas[{_shown(key)}]", problem)


def _qualified_problem(key: str) -> str:
    """IsQualifiedName's verdict, in a sentence."""
    parts = key.split("/")
    if len(parts) > 2:
        return "a qualified name has at most one '/' (prefix/name, e.g. nvidia.com/GA102GL_A10)"
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix or len(prefix) > _SUBDOMAIN_CHARS or not _SUBDOMAIN.fullmatch(prefix):
            return (
                "the part before '/' must be a DNS subdomain: lower-case letters, digits, '-' "
                f"and '.', at most {_SUBDOMAIN_CHARS} characters"
            )
    if not name or len(name) > _NAME_CHARS or not _NAME.fullmatch(name):
        return (
            "the name must be letters, digits, '-', '_' and '.', start and end with a letter "
            f"or digit, and be at most {_NAME_CHARS} characters"
        )
    return ""


def _count_problem(key: str, plurals: Collection[str]) -> str:
    rest = key[len(COUNT_PREFIX) :]
    if not key.endswith(_COUNT_SUFFIX) or not counted_plural(key):
        return (
            f"only applications of {COUNTED_GROUP} are counted: write "
            f"count/<plural>.{COUNTED_GROUP} (the tenant chart would render this key as "
            f"limits.{_shown(key)} and requests.{_shown(key)}, which nothing counts)"
        )
    plural = rest[: -len(_COUNT_SUFFIX)]
    if plural in plurals:
        return ""
    hint = closest_name(plural, plurals)
    suggestion = f"did you mean {count_key(hint)}? " if hint and hint != plural else ""
    return (
        f'no application kind has the plural "{_shown(plural)}": {suggestion}'
        f"known plurals: {', '.join(sorted(plurals)) or 'none'}"
    )


def _whole_problem(key: str, value: Decimal) -> str:
    if value == value.to_integral_value():
        return ""
    return "must be a whole number (Kubernetes counts objects and extended resources in units)"


def _shown(text: str) -> str:
    """A key as quoted back: printable ASCII, shortened (a key may be hostile)."""
    safe = "".join(c if c.isascii() and c.isprintable() else "?" for c in text)
    return safe if len(safe) <= _SHOWN else safe[: _SHOWN - 3] + "..."

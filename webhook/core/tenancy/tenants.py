"""Cozystack's tenant naming rules and tenant budgets.

A tenant named ``bar`` created in namespace ``tenant-foo`` owns namespace ``tenant-foo-bar``;
one created in ``tenant-root`` owns ``tenant-bar``; the root tenant (``root`` in
``tenant-root``) owns ``tenant-root``. Tenant names match ``^[a-z][a-z0-9]*$`` (no dashes), which
is what makes a namespace's parent derivable from its name alone (``pool.go``
``parentNamespace``). A tenant's budget is its ``spec.resourceQuotas`` in the shorthand keys
tenants write (``cpu``, ``memory``, ``storage`` ...); prefixed keys are refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Final

from webhook.core.base.errors import EvaluationError, QuantityError
from webhook.core.base.quantities import parse_quantity

__all__ = [
    "ROOT_NAMESPACE",
    "TENANT_KIND",
    "TENANT_NAME",
    "ancestors",
    "beneath",
    "is_tenant_namespace",
    "owned_namespace",
    "owner_release",
    "parent_namespace",
    "parse_budget",
]

TENANT_KIND: Final = "Tenant"
ROOT_NAMESPACE: Final = "tenant-root"
TENANT_NAME: Final = re.compile(r"[a-z][a-z0-9]*")
_PREFIX: Final = "tenant-"
# Prefixes that cozy-lib's flatten would mangle (``limits.requests.cpu``): refused, not guessed.
_QUOTA_PREFIXES: Final = ("requests.", "limits.")


def is_tenant_namespace(namespace: str) -> bool:
    return namespace.startswith(_PREFIX) and len(namespace) > len(_PREFIX)


def parent_namespace(namespace: str) -> str:
    """The namespace of the parent tenant; ``""`` for the root and for non-tenant namespaces."""
    if namespace == ROOT_NAMESPACE or not is_tenant_namespace(namespace):
        return ""
    rest = namespace[len(_PREFIX) :]
    if "-" not in rest:
        return ROOT_NAMESPACE
    return namespace.rsplit("-", 1)[0]


def ancestors(namespace: str) -> list[str]:
    """The namespace itself, then each parent up to the root: ``[tenant-a-b, tenant-a, root]``."""
    chain = []
    current = namespace
    while current:
        chain.append(current)
        current = parent_namespace(current)
    return chain


def below_toward(pool: str, namespace: str) -> str:
    """The namespace directly below ``pool`` on the way down to ``namespace`` (``pool`` for
    ``pool`` itself; ``namespace`` when it is not beneath ``pool``): whose share of the pool a
    write in ``namespace`` takes, sub-tenants counting as their tenant."""
    chain = ancestors(namespace)
    if pool in chain:
        index = chain.index(pool)
        return chain[index - 1] if index > 0 else pool
    return namespace


def beneath(namespace: str, top: str) -> bool:
    """Whether ``namespace`` is ``top`` or a tenant namespace below it. Not a prefix test: the
    root's children are ``tenant-<name>``, not ``tenant-root-<name>``."""
    if top == ROOT_NAMESPACE:
        return is_tenant_namespace(namespace)
    return bool(top) and (namespace == top or namespace.startswith(top + "-"))


def owned_namespace(release_namespace: str, name: str) -> str:
    """The namespace a tenant named ``name``, created in ``release_namespace``, owns."""
    if release_namespace == ROOT_NAMESPACE:
        return f"{_PREFIX}{name}"
    return f"{release_namespace}-{name}"


def owner_release(namespace: str) -> tuple[str, str] | None:
    """The (HelmRelease name, namespace) of the tenant owning ``namespace``, if it is a tenant's."""
    if namespace == ROOT_NAMESPACE:
        return ROOT_NAMESPACE, ROOT_NAMESPACE
    parent = parent_namespace(namespace)
    if not parent:
        return None
    return f"{_PREFIX}{namespace.rsplit('-', 1)[1]}", parent


def parse_budget(values: object) -> dict[str, Decimal]:
    """A tenant's ``resourceQuotas`` as a resource list; empty means unbounded.

    Raises :class:`EvaluationError` at ``resourceQuotas[<key>]`` for a prefixed key (naming the
    shorthand to use), a non-quantity, or a negative value.
    """
    if not isinstance(values, Mapping):
        return {}
    quotas = values.get("resourceQuotas")
    if quotas is None:
        return {}
    if not isinstance(quotas, Mapping):
        raise EvaluationError("resourceQuotas", "must be a map of resource names to quantities")
    budget: dict[str, Decimal] = {}
    for key, raw in quotas.items():
        where = f"resourceQuotas[{key}]"
        name = str(key)
        if name.startswith(_QUOTA_PREFIXES):
            shorthand = name.split(".", 1)[1]
            raise EvaluationError(
                where,
                f'prefixed keys are not supported: use the shorthand key "{shorthand}" '
                "(the tenant chart renders limits and requests from it)",
            )
        try:
            value = parse_quantity(raw)
        except QuantityError as exc:
            raise EvaluationError(where, str(exc)) from None
        if value < 0:
            raise EvaluationError(where, "must not be negative")
        budget[name] = value
    return budget

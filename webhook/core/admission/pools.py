"""Tenant pools, kept incrementally.

Cozystack's controller (``computePools``) makes every tenant with a budget a *pool*: the tenant
plus every descendant without a budget. A descendant with its own budget is a *carve-out*, charged
to the nearest bounded ancestor, also through unbounded tenants in between. Only the keys a budget
sets are limited.

A carve-out occupies, per key, ``max(budget, usage of its subtree)`` of its parent's pool, where
Cozystack charges the budget alone. The difference matters once a budget is lowered below what
the subtree already uses (allowed, reported overcommitted): with the budget alone, the parent
would regain room that is still in use, and a tenant could lower a full child's budget to zero,
refill the parent, and repeat. With the maximum, lowering frees nothing until usage really drops,
and removing a budget moves the subtree's usage back into the parent like any other increase.

We apply that rule per resource key. For a key its budget does not set, a bounded child is
unbounded, so its usage of that key flows up to the parent's pool instead of escaping every
limit (in ``computePools`` a child bounding only ``memory`` takes its ``cpu`` out of the
parent's ``cpu`` pool). Every case of Cozystack's own tests holds unchanged.

Each node keeps ``usage``: its own applications' charges plus, per key, each child's
*contribution* (``max(budget, usage)`` for keys the child bounds, its usage for the rest). For a
bounded tenant, ``usage`` on its budget keys is exactly the pool's reserved figure. Applying a
charge or a budget change walks up only while some node's contribution changes: time
proportional to the tenant depth, never to the number of tenants or applications.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from webhook.core.base import resources as rl
from webhook.core.tenancy.tenants import is_tenant_namespace, parent_namespace

__all__ = ["Node", "PoolView", "TenantTree"]

_ZERO = Decimal(0)


@dataclass(slots=True, eq=False)
class Node:
    """One tenant namespace in the tree."""

    namespace: str
    parent: Node | None
    budget: dict[str, Decimal] = field(default_factory=dict)
    usage: dict[str, Decimal] = field(default_factory=dict)
    children: dict[str, Node] = field(default_factory=dict)
    declared: bool = False  # a Tenant object owns this namespace

    @property
    def bounded(self) -> bool:
        return bool(self.budget)

    def contribution(self, key: str) -> Decimal:
        """What this subtree reserves in its parent's pool for ``key``: for a key it bounds,
        its budget or its usage, whichever is larger (lowering a budget frees nothing used)."""
        used = self.usage.get(key, _ZERO)
        if key in self.budget:
            return max(self.budget[key], used)
        return used


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool as reported: budget, reserved, available and who is in it."""

    namespace: str
    budget: Mapping[str, Decimal]
    reserved: Mapping[str, Decimal]
    members: tuple[str, ...]
    carve_outs: tuple[str, ...]

    @property
    def available(self) -> dict[str, Decimal]:
        return rl.subtract(self.budget, self.reserved)

    @property
    def overcommitted(self) -> dict[str, Decimal]:
        """Keys where reserved exceeds the budget, by how much. Reported, never enforced."""
        return {k: -v for k, v in self.available.items() if v < 0}


class TenantTree:
    """The tenant namespaces, their budgets and their usage."""

    def __init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        # While deferred (:meth:`defer`): usage added per namespace and key, not yet carried up.
        self._deferred: dict[Node, dict[str, Decimal]] | None = None

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, namespace: str) -> Node | None:
        return self._nodes.get(namespace)

    def node(self, namespace: str) -> Node | None:
        """The node for a tenant namespace, created with its ancestors on first use."""
        found = self._nodes.get(namespace)
        if found is not None or not is_tenant_namespace(namespace):
            return found
        parent_name = parent_namespace(namespace)
        parent = self.node(parent_name) if parent_name else None
        created = Node(namespace, parent)
        self._nodes[namespace] = created
        if parent is not None:
            parent.children[namespace] = created
        return created

    def nodes(self) -> Iterator[Node]:
        return iter(self._nodes.values())

    # -- changes -------------------------------------------------------------------------

    def add_usage(self, namespace: str, delta: Mapping[str, Decimal]) -> None:
        """Add an application charge (or its change) in ``namespace``."""
        start = self.node(namespace)
        if start is None:
            return
        deferred = self._deferred
        if deferred is not None:
            sums = deferred.get(start)
            if sums is None:
                sums = deferred[start] = {}
            for key, value in delta.items():
                if value:
                    sums[key] = sums.get(key, _ZERO) + value
            return
        for key, value in delta.items():
            if value:
                _propagate(start, key, value)

    def defer(self) -> None:
        """Hold usage added from now on per namespace until :meth:`flush` carries it up.

        A load adds a charge per application to a few namespaces each: carried up one by one,
        every charge walks the tenant chain; summed first, each namespace walks it once. The
        figures after :meth:`flush` are those of adding one by one (the final usage is a
        function of the budgets and each namespace's own sum, whatever the order); budgets may
        change meanwhile, but usage must not be read until then.
        """
        if self._deferred is None:
            self._deferred = {}

    def flush(self) -> None:
        """Carry up the usage held since :meth:`defer`, and stop holding it."""
        deferred, self._deferred = self._deferred, None
        for start, sums in (deferred or {}).items():
            for key, value in sums.items():
                if value:
                    _propagate(start, key, value)

    def set_budget(self, namespace: str, budget: Mapping[str, Decimal]) -> None:
        """Give a tenant namespace a new budget (empty: unbounded)."""
        node = self.node(namespace)
        if node is None:
            return
        changes = self.budget_change(node, budget)
        node.budget = dict(budget)
        if node.parent is not None:
            for key, value in changes.items():
                if value:
                    _propagate(node.parent, key, value)

    def declare(self, namespace: str, *, declared: bool) -> None:
        node = self.node(namespace)
        if node is not None:
            node.declared = declared

    # -- questions -----------------------------------------------------------------------

    @staticmethod
    def budget_change(node: Node, budget: Mapping[str, Decimal]) -> dict[str, Decimal]:
        """How ``node``'s contribution to its parent changes if its budget becomes ``budget``."""
        change: dict[str, Decimal] = {}
        for key in set(node.budget) | set(budget) | set(node.usage):
            before = node.contribution(key)
            used = node.usage.get(key, _ZERO)
            after = max(budget[key], used) if key in budget else used
            if after != before:
                change[key] = after - before
        return change

    def chain(self, namespace: str) -> Iterator[Node]:
        """The known nodes from ``namespace`` (or its nearest known ancestor) up to the root."""
        node = self._nodes.get(namespace)
        while node is None and namespace:
            namespace = parent_namespace(namespace)
            node = self._nodes.get(namespace)
        return _chain(node)

    def bounder(self, namespace: str, key: str) -> Node | None:
        """The nearest tenant, ``namespace`` included, whose budget limits ``key``."""
        return next((n for n in self.chain(namespace) if key in n.budget), None)

    def pool_root(self, namespace: str) -> Node | None:
        """Cozystack's ``poolRootOf``: the nearest tenant, inclusive, with any budget."""
        return next((n for n in self.chain(namespace) if n.bounded), None)

    def view(self, node: Node) -> PoolView:
        """The pool rooted at a bounded ``node``; walks the pool, so for reports only."""
        members: list[str] = []
        carve_outs: list[str] = []
        stack = [node]
        while stack:
            current = stack.pop()
            members.append(current.namespace)
            for child in current.children.values():
                (carve_outs.append(child.namespace) if child.bounded else stack.append(child))
        reserved = {key: node.usage.get(key, _ZERO) for key in node.budget}
        return PoolView(
            node.namespace,
            dict(node.budget),
            reserved,
            tuple(sorted(members)),
            tuple(sorted(carve_outs)),
        )

    def pools(self) -> list[PoolView]:
        return [self.view(n) for n in sorted(self._nodes.values(), key=_by_name) if n.bounded]

    def ceiling(self, namespace: str) -> dict[str, Decimal]:
        """The most ``namespace``'s own applications could reserve, per limited key.

        Cozystack's ``EnforcedHard``: the pool's available figure minus what every other member
        and carve-out reserves, never below zero, for the keys some ancestor bounds.
        """
        node = self._nodes.get(namespace)
        if node is None:
            return {}
        own = self.own_usage(node)
        result: dict[str, Decimal] = {}
        for key in {k for n in _chain(node) for k in n.budget}:
            pool = self.bounder(namespace, key)
            if pool is not None:
                others = pool.usage.get(key, _ZERO) - own.get(key, _ZERO)
                result[key] = max(pool.budget[key] - others, _ZERO)
        return result

    @staticmethod
    def own_usage(node: Node) -> dict[str, Decimal]:
        """Usage of the namespace's own applications (usage minus its children's shares)."""
        own = dict(node.usage)
        for child in node.children.values():
            for key in set(child.budget) | set(child.usage):
                own[key] = own.get(key, _ZERO) - child.contribution(key)
        return {k: v for k, v in own.items() if v}


def _propagate(start: Node, key: str, value: Decimal) -> None:
    """Add ``value`` to ``start``'s usage of ``key`` and carry the change in each node's
    contribution upwards, stopping where a contribution does not change."""
    node: Node | None = start
    while node is not None and value:
        before = node.contribution(key)
        node.usage[key] = node.usage.get(key, _ZERO) + value
        value = node.contribution(key) - before
        node = node.parent


def _chain(node: Node | None) -> Iterator[Node]:
    current: Node | None = node
    while current is not None:
        yield current
        current = current.parent


def _by_name(node: Node) -> str:
    return node.namespace

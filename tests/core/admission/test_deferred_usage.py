"""Usage held per namespace and carried up at once ends where adding it one by one ends.

A load defers the tenant tree's usage (:meth:`~webhook.core.admission.pools.TenantTree.defer`)
and flushes it once; budgets may change in between. Whatever the operations, the tree after the
flush must equal the tree that applied each one as it came.
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.admission.pools import TenantTree

NAMESPACES = ["tenant-root", "tenant-a", "tenant-a-b", "tenant-a-b-c", "tenant-d", "default"]
KEYS = ["cpu", "memory", "storage"]
AMOUNTS = st.decimals(-50, 50, places=3, allow_nan=False, allow_infinity=False)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(
            st.just("usage"),
            st.sampled_from(NAMESPACES),
            st.dictionaries(st.sampled_from(KEYS), AMOUNTS, max_size=3),
        ),
        st.tuples(
            st.just("budget"),
            st.sampled_from(NAMESPACES),
            st.dictionaries(st.sampled_from(KEYS), st.decimals(0, 60, places=0), max_size=3),
        ),
    ),
    max_size=40,
)


def figures(tree: TenantTree) -> list[tuple[str, dict[str, Decimal], dict[str, Decimal]]]:
    return [
        (node.namespace, dict(node.budget), {k: v for k, v in node.usage.items() if v})
        for node in tree.nodes()
    ]


@settings(max_examples=400, deadline=None)
@given(OPERATIONS)
def test_deferred_usage_ends_where_usage_added_one_by_one_ends(
    operations: list[tuple[str, str, dict[str, Decimal]]],
) -> None:
    direct, deferred = TenantTree(), TenantTree()
    deferred.defer()
    for what, namespace, amounts in operations:
        for tree in (direct, deferred):
            if what == "usage":
                tree.add_usage(namespace, amounts)
            else:
                tree.set_budget(namespace, amounts)
    deferred.flush()
    assert figures(deferred) == figures(direct)
    for tree in (direct, deferred):  # once flushed, usage is carried up as it comes
        tree.add_usage("tenant-a-b", {"cpu": Decimal(1)})
    assert figures(deferred) == figures(direct)
    node = deferred.get("tenant-a-b")
    assert node is not None

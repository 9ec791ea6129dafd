"""Pools kept incrementally agree with pools computed from scratch."""

from __future__ import annotations

import random

import pytest

from tests.builders import state, tenant, thing
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import Application

NAMESPACES = ["tenant-a", "tenant-a-b", "tenant-a-b-c", "tenant-a-d", "tenant-e", "tenant-e-f"]
BUDGETS = [None, {"cpu": "10"}, {"memory": "8Gi"}, {"cpu": "4", "memory": "2Gi"}]


def snapshot(current: ReservationState) -> dict[str, object]:
    """Budgets and non-zero usage of every node that has either."""
    nodes = {
        node.namespace: (dict(node.budget), {k: v for k, v in node.usage.items() if v})
        for node in current.tree.nodes()
    }
    return {namespace: value for namespace, value in nodes.items() if value != ({}, {})}


@pytest.mark.parametrize("seed", range(20))
def test_incremental_usage_equals_a_fresh_recount(seed: int) -> None:
    rng = random.Random(seed)
    current = state({})
    live: dict[tuple[str, str, str], Application] = {}
    for step in range(60):
        namespace = rng.choice(NAMESPACES)
        action = rng.random()
        if action < 0.3:
            app = tenant(namespace, rng.choice(BUDGETS))
        elif action < 0.8:
            app = thing(
                namespace,
                f"t{rng.randrange(5)}",
                cpu=str(rng.randrange(4)),
                memory=f"{rng.randrange(3)}Gi",
            )
        else:
            if not live:
                continue
            key = rng.choice(sorted(live))
            current.forget(key)
            del live[key]
            continue
        current.observe(app)
        live[app.key] = app
        fresh = state({}, *live.values())
        assert snapshot(current) == snapshot(fresh), f"seed {seed}, step {step}"


def test_members_and_carve_outs_follow_compute_pools() -> None:
    current = state(
        {"tenant-foo": {"cpu": "10"}, "tenant-foo-bar": None, "tenant-foo-bar-baz": {"cpu": "4"}}
    )
    (foo, baz) = current.tree.pools()
    assert foo.members == ("tenant-foo", "tenant-foo-bar")
    assert foo.carve_outs == ("tenant-foo-bar-baz",)
    assert baz.members == ("tenant-foo-bar-baz",)


def test_non_tenant_namespaces_are_in_no_pool() -> None:
    current = state({}, thing("default", cpu="1"))
    assert current.tree.get("default") is None
    assert current.tree.pool_root("default") is None

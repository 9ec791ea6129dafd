"""A sub-tenant admitted in warn beyond what fits takes no room above it: the cap's rules.

Properties over any pool, any old and new quota, any usage: capping never lets the pool
above count more than before the write, never counts more than the declared quota, and a cap
binds only the quota it was computed for.
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from tests.builders import state as build_state
from tests.builders import tenant
from webhook.core.admission.carveouts import budget_digest, capped, effective_budget, kept_budget
from webhook.core.admission.pools import TenantTree

POOL = "tenant-acme"
CHILD = "tenant-acme-x"
KEYS = ("cpu", "memory")

amounts = st.integers(min_value=0, max_value=64).map(Decimal)
quotas = st.dictionaries(st.sampled_from(KEYS), amounts, max_size=2)


def tree(budget: dict[str, Decimal], old: dict[str, Decimal] | None, used: Decimal) -> TenantTree:
    built = TenantTree()
    built.set_budget(POOL, budget)
    built.add_usage("tenant-acme-y", {"memory": Decimal(3), "cpu": Decimal(1)})  # a sibling
    built.add_usage(CHILD, {"memory": used})
    if old is not None:
        built.set_budget(CHILD, old)
    return built


@given(
    budget=quotas,
    old=st.none() | quotas,
    used=amounts,
    declared=quotas,
    create=st.booleans(),
)
def test_a_capped_quota_never_takes_room_from_the_pool_above(
    budget: dict[str, Decimal],
    old: dict[str, Decimal] | None,
    used: Decimal,
    declared: dict[str, Decimal],
    create: bool,
) -> None:
    pools = tree(budget, old, used)
    parent = pools.get(POOL)
    child = pools.get(CHILD)
    assert parent is not None
    assert child is not None
    before = dict(parent.usage)
    counted = kept_budget(pools, CHILD, declared, None if create else (old or {}))
    cap = capped(declared, counted)
    effective = effective_budget(declared, cap)
    pools.set_budget(CHILD, effective)
    for key, value in parent.usage.items():
        assert value <= before.get(key, Decimal(0)), f"{key}: the pool above grew"
    for key, value in effective.items():
        assert value <= declared[key]
        assert child.budget.get(key, value) <= declared[key]


@given(declared=quotas, other=quotas, counted=quotas)
def test_a_cap_binds_only_the_quota_it_was_made_for(
    declared: dict[str, Decimal], other: dict[str, Decimal], counted: dict[str, Decimal]
) -> None:
    cap = capped(declared, counted)
    if budget_digest(other) != budget_digest(declared):
        assert effective_budget(other, cap) == other
    for key, value in effective_budget(declared, cap).items():
        assert value == min(declared[key], counted.get(key, declared[key]))


def test_equal_quantities_written_differently_are_one_quota() -> None:
    assert budget_digest({"memory": Decimal("1073741824")}) == budget_digest(
        {"memory": Decimal("1073741824.000")}
    )
    assert budget_digest({"memory": Decimal(1)}) != budget_digest({"memory": Decimal(2)})


TI = Decimal(1024**4)


def test_a_cap_applies_once_its_tenant_is_stored_with_that_quota_and_survives_a_rebuild() -> None:
    pools = {"tenant-acme": {"memory": "64Gi"}}
    state = build_state(pools)
    cap = capped({"memory": 1000 * TI}, {"memory": Decimal(0)})
    state.set_caps("tenant-acme", {"tenant-acme-big": cap})  # written before the Tenant is
    state.observe(tenant("tenant-acme-big", {"memory": "1000Ti"}))
    acme = state.tree.get("tenant-acme")
    assert acme is not None
    assert acme.usage.get("memory", Decimal(0)) == 0, "the pool above counts nothing more"
    assert set(state.capped()) == {"tenant-acme-big"}
    rebuilt = build_state({**pools, "tenant-acme-big": {"memory": "1000Ti"}})
    rebuilt.carry_caps(state)
    rebuilt_acme = rebuilt.tree.get("tenant-acme")
    assert rebuilt_acme is not None
    assert rebuilt_acme.usage.get("memory", Decimal(0)) == 0
    state.observe(tenant("tenant-acme-big", {"memory": "2Gi"}))  # another quota: counted
    assert acme.usage["memory"] == 2 * 1024**3
    assert state.capped() == {}

"""Every stored application counts 1 of its kind's count key, whatever happens to its size.

The state's incremental tree must agree with :func:`recount` and with a plain count of what is
stored, through creates, updates that break or fix the values, deletes, and sub-tenants that
come and go; the root tenant counts nowhere.
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from tests.builders import platform, state, tenant
from webhook.core.admission.state import ReservationState, recount
from webhook.core.tenancy.applications import Application

VMS = "count/vminstances.apps.cozystack.io"
TENANTS = "count/tenants.apps.cozystack.io"
GOOD = {"instanceType": "u1.micro"}
BROKEN = {"instanceType": "u9.nonexistent"}  # no record: unknown, yet it exists
NAMESPACES = ["tenant-acme", "tenant-acme-dev"]

moves = st.lists(
    st.tuples(
        st.sampled_from(["vm", "broken", "delete", "sub-tenant", "no-sub-tenant"]),
        st.sampled_from(NAMESPACES),
        st.sampled_from(["a", "b", "c"]),
    ),
    max_size=40,
)


def counted(current: ReservationState, namespace: str, key: str) -> Decimal:
    node = current.tree.get(namespace)
    return node.usage.get(key, Decimal(0)) if node is not None else Decimal(0)


@given(moves)
def test_the_count_is_what_is_stored_through_any_sequence(
    sequence: list[tuple[str, str, str]],
) -> None:
    current = state({"tenant-acme": {VMS: "100", "memory": "1Ti"}, "tenant-acme-dev": None})
    stored: set[tuple[str, str, str]] = set()
    for move, namespace, name in sequence:
        key = ("VMInstance", namespace, name)
        if move in ("vm", "broken"):
            current.observe(Application(*key, GOOD if move == "vm" else BROKEN))
            stored.add(key)
        elif move == "delete":
            current.forget(key)
            stored.discard(key)
        elif move == "sub-tenant":
            current.observe(Application("Tenant", "tenant-acme-dev", name, {}))
        else:
            current.forget(("Tenant", "tenant-acme-dev", name))
        assert recount(current) == {}
    assert counted(current, "tenant-acme", VMS) == len(stored)
    mine = {k for k in stored if k[1] == "tenant-acme-dev"}
    assert counted(current, "tenant-acme-dev", VMS) == len(mine)
    assert all(k in current.unknown() or current.record(k) is not None for k in stored)


def test_a_sub_tenant_counts_in_its_parent_and_the_root_nowhere() -> None:
    current = ReservationState(platform())
    current.observe(Application("Tenant", "tenant-root", "root", {}))
    assert counted(current, "tenant-root", TENANTS) == 0
    current.observe(tenant("tenant-acme"))
    current.observe(tenant("tenant-acme-dev"))
    assert counted(current, "tenant-root", TENANTS) == 2
    assert counted(current, "tenant-acme", TENANTS) == 1
    current.forget(("Tenant", "tenant-acme", "dev"))
    assert counted(current, "tenant-root", TENANTS) == 1
    assert recount(current) == {}

"""A new version of an application that changes nothing the state reads (a label storm) is
restamped, not priced again, and leaves the state exactly as observing it again would."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import state, tenant, thing
from webhook.core.admission.pending import Hold
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import Application

POOL = "tenant-acme"
GI = Decimal(1024**3)


def view(current: ReservationState) -> tuple[object, ...]:
    """Everything a decision reads of the state, as plain values."""
    node = current.tree.get(POOL)
    return (
        sorted((key, record.version, dict(record.resources)) for key, record in current.records()),
        dict(current.unknown()),
        dict(node.usage) if node else None,
        dict(node.budget) if node else None,
        dict(current.pending.remote(POOL)),
        sorted(current.pending.awaiting().items()),
        len(current.pending),
        dict(current._tenant_versions),
    )


def built(apps: list[Application], holds: list[Hold]) -> ReservationState:
    current = state({POOL: {"memory": "1000Gi"}}, *apps)
    current.pending.track(POOL, holds, version=10)
    return current


sizes = st.integers(min_value=0, max_value=4)


@settings(max_examples=150, deadline=None)
@given(
    memory=st.lists(sizes, min_size=1, max_size=4),
    unevaluable=st.integers(min_value=-1, max_value=3),
    chosen=st.integers(min_value=-1, max_value=3),
    version=st.integers(min_value=1, max_value=20),
    holds=st.lists(
        st.tuples(st.integers(min_value=-1, max_value=3), st.integers(0, 20), sizes), max_size=4
    ),
)
def test_restamping_is_observing_the_unchanged_application_again(
    memory: list[int],
    unevaluable: int,
    chosen: int,
    version: int,
    holds: list[tuple[int, int, int]],
) -> None:
    apps: list[Application] = [
        replace(thing(POOL, f"t{i}", memory=f"{gib}Gi"), version=3) for i, gib in enumerate(memory)
    ]
    if 0 <= unevaluable < len(apps):  # one whose values cannot be read: held as unknown
        apps[unevaluable] = replace(apps[unevaluable], spec={"memory": "lots"})
    acme = replace(tenant(POOL, {"memory": "1000Gi"}), version=3)
    target = acme if chosen < 0 or chosen >= len(apps) else apps[chosen]
    entries = [
        Hold(
            id=f"h{n}",
            key=acme.key if index < 0 or index >= len(apps) else apps[index].key,
            namespace=POOL,
            increase={"memory": gib * GI},
            charge={"memory": gib * GI} if index >= 0 else {"memory": 1000 * GI},
            after=after,
        )
        for n, (index, after, gib) in enumerate(holds)
    ]
    restamped, observed = built(apps, entries), built(apps, entries)
    assert restamped.restamp(target.key, version)
    observed.observe(replace(target, version=version))
    assert view(restamped) == view(observed)


def test_an_application_the_state_does_not_hold_is_not_restamped() -> None:
    current = state({POOL: {"memory": "10Gi"}})
    assert not current.restamp(("Thing", POOL, "never-seen"), 5)
    assert not current.restamp(("Tenant", "tenant-root", "never-seen"), 5)

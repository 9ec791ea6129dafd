"""Carve-outs occupy ``max(budget, usage)`` of their parent's pool: the lowering attacks."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tests.builders import request, state
from webhook.admission.admit import apply_admitted
from webhook.core.admission.decisions import Decision, Policy, decide
from webhook.core.admission.state import ReservationState
from webhook.core.base.quantities import parse_quantity

ENFORCE = Policy()


def write(current: ReservationState, *args: Any, **kwargs: Any) -> Decision:
    """Decide one request and store what was admitted, as the API server would."""
    admission = request(*args, **kwargs)
    decision = decide(admission, current, ENFORCE)
    apply_admitted(current, admission, decision)
    return decision


def reserved(current: ReservationState, namespace: str, key: str = "memory") -> Decimal:
    node = current.tree.get(namespace)
    assert node is not None
    return node.usage.get(key, Decimal(0))


def quota(memory: str) -> dict[str, Any]:
    return {"resourceQuotas": {"memory": memory}}


def test_lowering_a_carve_out_frees_nothing_still_used() -> None:
    current = state({"tenant-foo": {"memory": "16Gi"}})
    assert write(current, "Tenant", "tenant-foo", "s1", quota("12Gi")).allowed
    assert write(current, "Thing", "tenant-foo-s1", "vm", {"memory": "12Gi"}).allowed
    lowered = write(
        current,
        "Tenant",
        "tenant-foo",
        "s1",
        quota("0"),
        operation="UPDATE",
        old_spec=quota("12Gi"),
    )
    assert lowered.allowed, lowered.message  # lowering is allowed ...
    assert any("overcommitted" in w for w in lowered.warnings)  # ... with a warning
    assert reserved(current, "tenant-foo") == parse_quantity("12Gi")  # ... and frees nothing
    second = write(current, "Tenant", "tenant-foo", "s2", quota("12Gi"))
    assert not second.allowed
    assert "pool tenant-foo" in second.message
    refill = write(current, "Thing", "tenant-foo", "fill", {"memory": "8Gi"})
    assert not refill.allowed
    assert write(current, "Thing", "tenant-foo", "fill", {"memory": "4Gi"}).allowed
    assert reserved(current, "tenant-foo") == parse_quantity("16Gi")


def test_a_lowered_carve_out_admits_nothing_new_into_itself() -> None:
    current = state({"tenant-foo": {"memory": "16Gi"}})
    write(current, "Tenant", "tenant-foo", "s1", quota("12Gi"))
    write(current, "Thing", "tenant-foo-s1", "vm", {"memory": "12Gi"})
    write(
        current,
        "Tenant",
        "tenant-foo",
        "s1",
        quota("0"),
        operation="UPDATE",
        old_spec=quota("12Gi"),
    )
    more = write(current, "Thing", "tenant-foo-s1", "more", {"memory": "1Mi"})
    assert not more.allowed
    assert "pool tenant-foo-s1" in more.message


def test_a_lowered_carve_out_frees_its_parent_only_as_usage_really_drops() -> None:
    current = state({"tenant-foo": {"memory": "16Gi"}})
    write(current, "Tenant", "tenant-foo", "s1", quota("12Gi"))
    write(current, "Thing", "tenant-foo-s1", "a", {"memory": "8Gi"})
    write(current, "Thing", "tenant-foo-s1", "b", {"memory": "4Gi"})
    write(
        current,
        "Tenant",
        "tenant-foo",
        "s1",
        quota("2Gi"),
        operation="UPDATE",
        old_spec=quota("12Gi"),
    )
    assert reserved(current, "tenant-foo") == parse_quantity("12Gi")
    write(
        current, "Thing", "tenant-foo-s1", "a", None, operation="DELETE", old_spec={"memory": "8Gi"}
    )
    assert reserved(current, "tenant-foo") == parse_quantity("4Gi")  # usage 4Gi over budget 2Gi
    write(
        current, "Thing", "tenant-foo-s1", "b", None, operation="DELETE", old_spec={"memory": "4Gi"}
    )
    assert reserved(current, "tenant-foo") == parse_quantity("2Gi")  # back to the budget


def test_removing_a_lowered_budget_keeps_the_usage_in_the_parent() -> None:
    current = state({"tenant-foo": {"memory": "16Gi"}})
    write(current, "Tenant", "tenant-foo", "s1", quota("12Gi"))
    write(current, "Thing", "tenant-foo-s1", "vm", {"memory": "12Gi"})
    write(
        current,
        "Tenant",
        "tenant-foo",
        "s1",
        quota("0"),
        operation="UPDATE",
        old_spec=quota("12Gi"),
    )
    removed = write(
        current, "Tenant", "tenant-foo", "s1", {}, operation="UPDATE", old_spec=quota("0")
    )
    assert removed.allowed, removed.message
    assert reserved(current, "tenant-foo") == parse_quantity("12Gi")
    # now unbounded, s1 grows the parent's pool directly, checked there
    assert not write(current, "Thing", "tenant-foo-s1", "more", {"memory": "5Gi"}).allowed
    assert write(current, "Thing", "tenant-foo-s1", "more", {"memory": "4Gi"}).allowed


def test_adding_a_budget_below_usage_to_an_unbounded_child_moves_nothing_out() -> None:
    current = state({"tenant-foo": {"memory": "16Gi"}, "tenant-foo-s1": None})
    write(current, "Thing", "tenant-foo-s1", "vm", {"memory": "10Gi"})
    added = write(
        current, "Tenant", "tenant-foo", "s1", quota("1Gi"), operation="UPDATE", old_spec={}
    )
    assert added.allowed, added.message
    assert reserved(current, "tenant-foo") == parse_quantity("10Gi")
    assert not write(current, "Thing", "tenant-foo", "fill", {"memory": "7Gi"}).allowed

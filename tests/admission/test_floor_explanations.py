"""A refusal says when the pool counts an application at a floor, naming only the requester's."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from tests.builders import review, thing
from tests.builders import state as build_state
from webhook.admission.ledger.settle import explain_floors
from webhook.core.admission.decisions import Policy, decide
from webhook.core.admission.pending import Hold
from webhook.core.admission.reviews import parse_review
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.tenants import ROOT_NAMESPACE, owned_namespace

POOL = "tenant-acme"
GI = Decimal(1024**3)


def pool_with_a_floor_in(namespace: str, pool: str = POOL) -> ReservationState:
    """A 4Gi pool whose application ``secret-project`` in ``namespace`` shrank to 1Gi while a
    label patch that read 4Gi may still be stored: the pool counts it at 4Gi."""
    current = build_state(
        {
            pool: {"memory": "4Gi"},
            owned_namespace(pool, "a"): None,
            owned_namespace(pool, "b"): None,
        },
        replace(thing(namespace, "secret-project", memory="4Gi"), version=5),
    )
    label = Hold(
        id="label",
        key=("Thing", namespace, "secret-project"),
        namespace=namespace,
        increase={},
        charge={"memory": 4 * GI},
        after=6,
        until="2099-01-01T00:00:00.000000Z",
        update=True,
    )
    current.pending.track(pool, [label], version=6)
    current.observe(replace(thing(namespace, "secret-project", memory="1Gi"), version=7))
    return current


def refused(current: ReservationState, namespace: str) -> str:
    request = parse_review(review("Thing", namespace, "mine", {"memory": "2Gi"}))
    decision = decide(request, current, Policy())
    assert not decision.allowed
    assert decision.reason == "exceeded"
    return explain_floors(decision, current, 25.0, namespace).message


def test_a_refusal_never_names_another_tenants_application_held_at_its_floor() -> None:
    current = pool_with_a_floor_in(f"{POOL}-a")
    message = refused(current, f"{POOL}-b")
    assert "secret-project" not in message
    assert f"{POOL}-a" not in message
    assert "an update admitted moments ago may still write back" in message


def test_a_refusal_names_the_requesters_own_application_held_at_its_floor() -> None:
    current = pool_with_a_floor_in(f"{POOL}-b")
    assert f"Thing {POOL}-b/secret-project" in refused(current, f"{POOL}-b")


def test_a_refusal_by_the_root_pool_names_the_requesters_own_application_held_at_its_floor() -> (
    None
):
    # The root's children are tenant-<name>, not tenant-root-<name>: beneath it all the same.
    mine = owned_namespace(ROOT_NAMESPACE, "b")
    current = pool_with_a_floor_in(mine, pool=ROOT_NAMESPACE)
    assert f"Thing {mine}/secret-project" in refused(current, mine)
    other = refused(
        pool_with_a_floor_in(owned_namespace(ROOT_NAMESPACE, "a"), ROOT_NAMESPACE), mine
    )
    assert "1 application of another tenant" in other

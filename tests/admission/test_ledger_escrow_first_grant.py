"""A cold pool's first slice: the first create into a pool this process holds no slice of and
has no recent rate for is answered from a slice granted for it, in one write (the exact path
would write its entry, and the next round the grant)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.admission.test_ledger import POOL, Cluster, Replica, create, grow, preview
from tests.admission.test_ledger_escrow import _visits
from webhook.admission.ledger import escrowed as escrowed_module
from webhook.admission.ledger.slices import slice_records
from webhook.core.admission.decisions import decide
from webhook.core.admission.reviews import AdmissionRequest


def _records(cluster: Cluster) -> dict[str, object]:
    return dict(slice_records(cluster.objects[POOL].get("status") or {}))


async def cold_pool(
    cluster: Cluster, budget: str = "64Gi", seed: str = "1Gi", **settings: Any
) -> Replica:
    """Replica ``a`` (escrow on) meeting a pool it holds nothing of: the pool's
    TenantReservation exists (another replica, escrow off, admitted ``seed`` into it) and the
    watch has delivered it."""
    other = Replica(cluster, "other", {POOL: {"memory": budget}})
    assert (await other.admit(create("seed", seed))).allowed
    a = Replica(cluster, "a", {POOL: {"memory": budget}}, escrow=True, **settings)
    a.deliver()
    return a


async def test_a_cold_pools_first_create_is_answered_from_a_slice_granted_for_it() -> None:
    cluster = Cluster()
    a = await cold_pool(cluster)
    writes = cluster.writes
    assert (await a.admit(create("x", "1Gi"))).allowed
    assert cluster.writes == writes + 1, "one write: the grant; no entry"
    assert a.ledger.spends == 1
    assert len(_records(cluster)) == 1
    assert (await a.admit(create("y", "1Gi"))).allowed
    assert cluster.writes == writes + 1, "the next create spends the same slice"


async def test_a_dry_run_or_an_update_opens_no_slice() -> None:
    cluster = Cluster()
    a = await cold_pool(cluster, dry_run_holds=True)
    assert (await a.admit(preview("p", "1Gi"))).allowed
    assert (await a.admit(grow("seed", "1Gi", "2Gi", uid="u-grow"))).allowed
    assert _records(cluster) == {}, "only a real CREATE is worth a slice"
    assert a.ledger.spends == 0


async def test_near_the_bound_a_cold_pool_opens_no_slice_and_the_exact_path_admits() -> None:
    cluster = Cluster()
    a = await cold_pool(cluster, budget="4Gi")
    assert (await a.admit(create("x", "2Gi"))).allowed
    assert _records(cluster) == {}, "a quarter of 1Gi free is too small to split"
    assert (await a.admit(create("last", "1Gi"))).allowed
    assert not (await a.admit(create("over", "1"))).allowed


async def test_a_tenant_whose_pool_cannot_be_granted_pays_no_grant_attempt_per_create() -> None:
    # Creates into a pool too full to split: the first tries a grant (none is made), and its
    # charge leaves the pool rated, so the next creates go straight to the exact path: a
    # tenant cannot make every create wait for a grant round that writes nothing.
    cluster = Cluster()
    a = await cold_pool(cluster, budget="4Gi")
    tried = _visits(a)
    for index in range(3):
        assert (await a.admit(create(f"vm{index}", "1Gi"))).allowed
    assert tried == [POOL], "one grant attempt, on the first create only"
    assert _records(cluster) == {}


async def test_creates_arriving_while_the_first_slice_is_granted_spend_from_it() -> None:
    # A burst's first creates into a cold pool come together: all wait for the one grant
    # rather than each writing an entry of its own.
    cluster = Cluster()
    a = await cold_pool(cluster)
    writes = cluster.writes
    answers = await asyncio.gather(*(a.admit(create(f"vm{i}", "1Gi")) for i in range(6)))
    assert all(answer.allowed for answer in answers)
    assert cluster.writes == writes + 1, "one write in all: the grant"
    assert a.ledger.spends == 6


async def test_a_rate_decayed_below_one_admission_still_grants_one_more_like_it() -> None:
    # One create, then a round a little later: the rate has decayed below one of its charge
    # in the time a grant is sized for, and a grant floored to whole units (a CPU) or one
    # short of the charge answered nothing, so a pool's first slice waited for more creates.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi", "cpu": "64"}}, escrow=True)
    escrowed = a.escrowed
    now = [0.0]
    escrowed.monotonic = lambda: now[0]
    assert (await a.admit(create("x", "1Gi", cpu="1"))).allowed  # no object yet: exact
    assert _records(cluster) == {}
    now[0] += 4  # a fifth of a CPU a second, decayed below one CPU in the five seconds sized
    assert await a.ledger.escrow() == 1
    (record,) = slice_records(cluster.objects[POOL]["status"]).values()
    assert record.granted["cpu"] >= 1
    assert record.granted["memory"] >= 1024**3


async def test_a_tenant_keeping_its_pool_too_full_to_split_pays_no_second_decision_per_create(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Once the pool is rated and still has no slice, a create is decided by the exact path
    # alone: looking for a cold pool to open costs no decision of its own each time.
    cluster = Cluster()
    a = await cold_pool(cluster, budget="4Gi")
    assert (await a.admit(create("first", "1Gi"))).allowed  # rated now; too full to split
    decided: list[str] = []

    def counted(request: AdmissionRequest, *args: Any) -> Any:
        decided.append(request.name)
        return decide(request, *args)

    monkeypatch.setattr(escrowed_module, "decide", counted)
    for index in range(2):
        assert (await a.admit(create(f"vm{index}", "1Gi"))).allowed
    assert decided == [], "no slice: the escrow's own decisions are skipped"
    assert _records(cluster) == {}

"""How large a slice is granted: a pool's first grant is sized from its rate as it will be, not
from the fraction of it a young decayed sum holds, when the pool has the room; near the bound
the grant stays what the rate says, or none."""

from __future__ import annotations

from tests.admission.test_ledger import POOL, Cluster, Replica, create
from webhook.admission.ledger.slices import slice_records

GI = 1024**3


async def _first_grant(budget: str) -> int:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": budget}}, escrow=True)
    for index in range(3):
        assert (await a.admit(create(f"warm{index}", "1Gi"))).allowed
    await a.ledger.escrow()
    records = slice_records(cluster.objects[POOL].get("status") or {})
    return sum(int(r.outstanding().get("memory", 0)) for r in records.values())


async def test_a_busy_pools_first_grant_holds_more_than_a_young_rate_says() -> None:
    # 3Gi admitted just now: as a 5 s decayed sum that is 0.6Gi/s, 3Gi for 5 s; the rate it
    # is the start of is larger, and the pool has the room for it.
    assert await _first_grant("1000Gi") > 3 * GI


async def test_near_the_bound_the_first_grant_is_still_bounded_by_the_free_room() -> None:
    granted = await _first_grant("16Gi")
    assert 0 < granted <= (16 - 3) * GI // 4
    assert await _first_grant("4Gi") == 0

"""How large a slice is granted: a pool's first grant is sized from its rate as it will be, not
from the fraction of it a young decayed sum holds, when the pool has the room; near the bound
the grant stays what the rate says, or none."""

from __future__ import annotations

from decimal import Decimal

from tests.admission.test_ledger import POOL, Cluster, Replica, create
from webhook.admission.ledger.recent import RecentAdmissions
from webhook.admission.ledger.sizing import Rates, refill
from webhook.admission.ledger.slices import slice_records
from webhook.core.admission.escrow import EscrowBounds

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


def test_a_young_burst_parks_no_more_than_a_grants_share_of_a_shared_pool() -> None:
    # A tenant's one-second burst of 1Gi creates into a shared pool, then nothing: a slice
    # just granted a share of the free room still read as short of a second of the young
    # burst's estimated rate, and was granted a share of what was left round after round:
    # 17Gi of 40Gi parked, refused to the pool's other tenants on every other replica.
    bounds, recent, now = EscrowBounds(), RecentAdmissions(30.0), 0.0
    for _ in range(20):
        recent.note("p", {"memory": Decimal(GI)}, "VMInstance", now)
        now += 0.05
    budget, used, held = {"memory": Decimal(60 * GI)}, Decimal(20 * GI), Decimal(0)
    for _ in range(8):  # the duty's rounds, four a second
        now += 0.25
        rates = Rates(
            rate=_decimal(recent.rate("p", now)),
            expected=_decimal(recent.estimate("p", now)),
            warmth=recent.warmth("p", now),
            last=recent.last("p"),
        )
        counted = {"memory": used + held}
        held += refill(rates, {"memory": held}, budget, counted, bounds).get("memory", 0)
    assert held > 0, "the burst was granted a slice"
    free = budget["memory"] - used
    assert held <= free * bounds.share, f"{held / GI:.1f}Gi of {free / GI:.0f}Gi parked"


def _decimal(rates: dict[str, float]) -> dict[str, Decimal]:
    return {key: Decimal(str(round(value, 6))) for key, value in rates.items()}

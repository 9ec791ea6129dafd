"""Room that left a slice is released by the watches' own traffic, not by a consistent read on
every sweep: a consistent read of a kind lists every object of it, and with a fold every escrow
round each replica would list the kind back to back. A denial for the budget still confirms it,
so the room is never lost near the bound."""

from __future__ import annotations

from tests.admission.test_ledger import POOL, Cluster, Replica, create, thing
from tests.admission.test_ledger_escrow import _minted, _stored


class Confirming(Replica):
    """A replica whose consistent reads are recorded and bring its watches up to date."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.confirmed: list[tuple[str, int]] = []

    def confirm(self, kind: str, revision: int) -> None:
        self.confirmed.append((kind, revision))
        self.seen = max(self.seen, revision)


async def test_a_fold_makes_no_replica_list_the_kind_on_its_sweep() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "16Gi"}}, escrow=True)
    b = Confirming(cluster, "b", {POOL: {"memory": "16Gi"}})
    for index in range(3):
        assert (await a.admit(create(f"warm{index}", "1Gi"))).allowed
    await a.ledger.escrow()
    request, text = _minted(a, "x", "2Gi", "mutate-x")
    assert (await a.admit(request)).allowed
    stored = _stored(cluster, "x", "2Gi", text)
    a.observe(stored)
    await a.ledger.escrow()  # the spend is folded: 2Gi departs at this version
    b.deliver()
    assert b.ledger._book.slices.count.departed(POOL)
    b.ledger.sweep()
    assert b.confirmed == [], "no consistent read for room a watch's next event releases"


async def test_a_denial_near_the_bound_still_confirms_the_departed_room() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "16Gi"}}, escrow=True)
    b = Confirming(cluster, "b", {POOL: {"memory": "16Gi"}})
    for index in range(3):
        assert (await a.admit(create(f"warm{index}", "1Gi"))).allowed
    await a.ledger.escrow()
    request, text = _minted(a, "x", "2Gi", "mutate-x")
    assert (await a.admit(request)).allowed
    stored = _stored(cluster, "x", "2Gi", text)
    a.observe(stored)
    await a.ledger.escrow()
    b.deliver()
    for index in range(3):  # b's state observes the warm-up creates and x (but not the fold)
        b.state.observe(thing(cluster, f"warm{index}", "1Gi"))
    b.state.observe(stored)
    (record,) = b.ledger._book.slices.count.records(POOL).values()
    held = int(record.outstanding().get("memory", 0))
    free = 16 * 1024**3 - 5 * 1024**3 - held
    # Counted twice (observed and departed) it would not fit; confirmed, it does.
    decision = await b.admit(create("fits", str(free)))
    assert decision.allowed, decision.message
    assert b.confirmed, "the denial confirmed the kind the departed room waits for"

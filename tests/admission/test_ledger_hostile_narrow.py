"""Attacks on the draining of a slice record that misses kinds lately admitted
(``Escrowed.narrow``): a tenant of a shared pool must not keep every other tenant's creates off
the pool's slice for longer than the drain takes."""

from __future__ import annotations

from dataclasses import replace

from tests.admission.test_ledger import POLICY, Clock, Cluster, Replica
from tests.builders import review
from webhook.core.admission.decisions import mutate
from webhook.core.admission.reviews import AdmissionRequest, parse_review
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, Application
from webhook.core.tenancy.records import parse_recorded_charge

POOL, HOSTILE, VICTIM = "tenant-acme", "tenant-acme-evil", "tenant-acme-ops"
TREE: dict[str, dict[str, str] | None] = {POOL: {"memory": "640Gi"}, HOSTILE: None, VICTIM: None}


async def test_a_never_stored_spend_and_one_free_create_of_a_new_kind_keep_a_shared_pool_off_its_slice_for_the_store_bound() -> (  # noqa: E501
    None
):
    # The hostile tenant of a shared pool sends one create of the slice's kind whose object is
    # never stored (a name that already exists: admitted, then AlreadyExists), answered from
    # the slice, and then one VMDisk (it charges only storage, which the quota does not name:
    # free). The VMDisk is a kind the record misses, so the record is "narrow": it takes no
    # more spends, and it is removed only once every spend is folded, which for the spend
    # whose object never comes is the store bound (60 s). For that minute every other
    # tenant's create takes the exact path (a ledger write each); one such pair per kind the
    # record misses, each busy period. Without the never-stored spend the drain and the new
    # grant take under a second.
    cluster = Cluster()
    clock = Clock()
    seed = Replica(cluster, "seed", TREE, clock=clock)
    seeded = parse_review(review("Thing", VICTIM, "seed", {"memory": "1Gi"}, uid="seed"))
    assert (await seed.admit(seeded)).allowed
    a = Replica(cluster, "a", TREE, escrow=True, clock=clock)
    escrowed = a.escrowed
    now = [100.0]
    escrowed.monotonic = lambda: now[0]
    a.deliver(POOL)
    stored: list[Application] = []

    def minted(kind: str, namespace: str, name: str, spec: dict[str, str]) -> AdmissionRequest:
        body = parse_review(review(kind, namespace, name, spec, uid=f"mutate-{name}"))
        written = mutate(body, a.state, POLICY).patch[0]["value"]
        assert isinstance(written, dict)
        recorded = parse_recorded_charge(written[CHARGE_ANNOTATION])
        stored.append(Application(kind, namespace, name, spec, recorded=recorded))
        return parse_review(review(kind, namespace, name, spec, uid=name, annotations=written))

    def observe_stored() -> None:
        for app in stored:
            a.observe(replace(app, version=cluster.bump()))
        stored.clear()

    async def second(index: int) -> int:
        spent = 0
        for quarter in range(4):
            before = a.ledger.spends
            request = minted("Thing", VICTIM, f"vm{index}-{quarter}", {"memory": "256Mi"})
            decided = await a.admit(request)
            assert decided.allowed, decided.message
            spent += a.ledger.spends - before
            observe_stored()
            now[0] += 0.25
            clock.now += 0.25
            a.deliver(POOL)
            await a.ledger.escrow()
            a.deliver(POOL)
        return spent

    for index in range(10):  # the victim's steady creates warm the slice up
        await second(index)
    assert escrowed.escrow.record(POOL) is not None
    before = a.ledger.spends
    phantom = minted("Thing", HOSTILE, "taken", {"memory": "256Mi"})
    stored.clear()  # AlreadyExists: admitted, never stored
    assert (await a.admit(phantom)).allowed
    assert a.ledger.spends == before + 1, "the phantom is answered from the slice"
    free = parse_review(review("VMDisk", HOSTILE, "disk", {}, uid="disk"))
    assert (await a.admit(free)).allowed
    spends = 0
    for index in range(10, 70):  # the next minute of the victim's creates
        spends += await second(index)
    victims = 60 * 4
    assert spends >= victims * 3 // 4, (
        f"{spends} of {victims} victim creates answered from the slice in the minute after "
        "the hostile's never-stored create and one free create of a new kind"
    )

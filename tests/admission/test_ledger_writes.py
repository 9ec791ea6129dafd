"""What the ledger's writes carry and when the leader writes: less, never at a tenant's gain.

Every write of a pool's TenantReservation is on an admission's path (the batch waits for it),
so each carries no more than it needs: no managedFields (the API server keeps its own), no
``expected`` charge where it is the entry's ``charge``, and the leader does not rewrite a busy
pool's summary between its batches. Each test is named after what a tenant would try against
the relaxed form, and fails on a naive one.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s_client

from tests.admission.test_ledger import POOL, Clock, Cluster, Replica, create, grow, thing
from tests.builders import state as build_state
from tests.realkube import reservations_on_real_apiserver
from webhook.admission.ledger import LedgerSettings
from webhook.admission.ledger.book import Book
from webhook.admission.ledger.commit import Commit
from webhook.admission.ledger.entries import TENANT_RESERVATIONS, hold_of, parse_hold
from webhook.core.admission.decisions import Decision
from webhook.core.base import resources as rl
from webhook.core.tenancy.applications import Application
from webhook.kube.client import KubeClient

OTHER = "tenant-other"


async def test_a_shrink_stored_before_the_growth_it_raced_does_not_settle_the_growths_hold() -> (
    None
):
    # x grows 2Gi -> 3Gi (held: +1Gi, expected 3Gi) while a shrink to 1Gi, decided on the same
    # copy, is stored first. Were the entry to say only "+1Gi", the shrink (newer, at 1Gi)
    # would settle it, and the growth, stored next, would land on a pool that let y in.
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    a.observe(thing(cluster, "x", "2Gi"))
    assert (await a.admit(grow("x", "2Gi", "3Gi", uid="grow"))).allowed
    [entry] = cluster.entries()
    assert entry["charge"] == {"memory": "1Gi"}
    assert entry["expected"] == {"memory": "3Gi"}, "an UPDATE's entry says what it settles on"
    a.observe(thing(cluster, "x", "1Gi"))  # the shrink, stored after the ledger write
    decision = await a.admit(create("y", "3Gi"))
    assert not decision.allowed, "1Gi (x) + 1Gi (the growth, still pending) + 3Gi (y) > 4Gi"
    assert decision.reason == "exceeded"


async def test_a_create_entry_without_its_expected_charge_settles_only_on_its_whole_charge() -> (
    None
):
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    b = Replica(cluster, "b", {POOL: {"memory": "4Gi"}})
    assert (await a.admit(create("x", "2Gi"))).allowed
    [entry] = cluster.entries()
    assert "expected" not in entry, "a CREATE's expected charge is its charge: left out"
    b.deliver()  # the other replica reads the entry back
    for replica in (a, b):
        replica.observe(thing(cluster, "x", "1Gi"))  # another write of the name
        assert len(replica.state.pending) == 1, "an object showing less settles nothing"
        replica.observe(thing(cluster, "x", "2Gi"))
        assert len(replica.state.pending) == 0, "the object as admitted settles it"


def test_an_entry_that_says_nothing_of_its_expected_charge_expects_its_charge() -> None:
    hold = parse_hold(
        POOL,
        {"id": "u", "application": f"Thing/{POOL}/x", "charge": {"memory": "2Gi"}},
        7,
        {},
    )
    assert dict(hold.charge) == dict(hold.increase) == {"memory": 2 * 1024**3}
    explicit = parse_hold(
        POOL,
        {"id": "u", "application": f"Thing/{POOL}/x", "charge": {"memory": "2Gi"}, "expected": {}},
        7,
        {},
    )
    assert dict(explicit.charge) == {}, "an explicit expected charge is kept as written"


class Recording:
    """A client that remembers every body the ledger sends (over the stub API server)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.bodies: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def replace(self, ref: Any, obj: dict[str, Any], *, status: bool = False) -> Any:
        self.bodies.append(obj)
        return await self.inner.replace(ref, obj, status=status)


async def test_a_status_write_sends_no_managed_fields_and_keeps_the_rest_of_the_metadata() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "4Gi"}})
    assert (await a.admit(create("x", "1Gi"))).allowed
    stored = cluster.objects[POOL]
    stored["metadata"]["managedFields"] = [{"manager": "Python", "fieldsV1": {"f:status": {}}}]
    stored["metadata"]["uid"] = "the-uid"
    stored["metadata"]["resourceVersion"] = str(cluster.bump())  # as the server stores it
    a.deliver()
    recording = Recording(a.ledger.client)
    a.ledger._book.client = recording  # type: ignore[assignment]
    assert (await a.admit(create("y", "1Gi"))).allowed
    [body] = recording.bodies
    assert "managedFields" not in body["metadata"]
    assert body["metadata"]["uid"] == "the-uid"
    assert body["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


async def test_a_tenant_keeping_its_pool_busy_never_holds_back_another_pools_summary() -> None:
    clock = Clock()
    cluster = Cluster()
    tenants: dict[str, dict[str, str] | None] = {POOL: {"memory": "8Gi"}, OTHER: {"memory": "8Gi"}}
    a = Replica(cluster, "a", tenants, clock=clock)
    assert await a.ledger.reconcile() == 2  # both pools' objects written once
    clock.now += 10
    a.observe(Application("Thing", OTHER, "quiet", {"memory": "1Gi"}, version=cluster.bump()))
    assert (await a.admit(create("x", "1Gi"))).allowed  # the busy pool: written just now
    a.observe(thing(cluster, "other", "2Gi"))  # its summary changes too, nothing to drop
    assert await a.ledger.reconcile() == 1, "the busy pool waits for its next write, only it"
    assert reserved(cluster, OTHER) == summary(a, OTHER), "the quiet pool's is made true"


def reserved(cluster: Cluster, pool: str) -> object:
    return (cluster.objects[pool].get("status") or {}).get("reserved")


def summary(replica: Replica, pool: str) -> dict[str, str]:
    node = replica.state.tree.get(pool)
    assert node is not None
    return rl.to_strings(replica.state.tree.view(node).reserved)


async def test_a_busy_pools_summary_rides_on_its_next_write_and_is_made_true_once_quiet() -> None:
    clock = Clock()
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}}, clock=clock)
    assert (await a.admit(create("x", "1Gi"))).allowed
    writes = cluster.writes
    a.observe(thing(cluster, "other", "2Gi"))  # the summary changes; no entry settles
    assert await a.ledger.reconcile() == 0, "written within the period: the next write carries it"
    assert cluster.writes == writes
    clock.now += a.ledger.settings.reconcile_seconds
    assert await a.ledger.reconcile() == 0, "only how much is reserved moved: it waits longer"
    clock.now += a.ledger.settings.summary_seconds
    assert await a.ledger.reconcile() == 1, "quiet for a while: the leader makes it true"
    assert reserved(cluster, POOL) == summary(a, POOL)


async def test_a_pool_turning_overcommitted_is_written_within_a_period_not_the_summarys() -> None:
    # Only how much is reserved waits for summary_seconds; the Overcommitted condition
    # changing (an operator's alert reads it) is made true by the leader's next pass.
    clock = Clock()
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}}, clock=clock)
    assert (await a.admit(create("x", "1Gi"))).allowed
    a.observe(thing(cluster, "other", "9Gi"))  # stored past the budget: overcommitted
    clock.now += a.ledger.settings.reconcile_seconds
    assert await a.ledger.reconcile() == 1
    (condition,) = cluster.objects[POOL]["status"]["conditions"]
    assert condition["status"] == "True"


async def test_a_tenant_keeping_its_pool_busy_cannot_keep_an_expired_hold_listed() -> None:
    clock = Clock()
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "8Gi"}}, clock=clock, grace_seconds=5.0)
    assert (await a.admit(create("never", "1Gi"))).allowed  # never stored
    clock.now += 6  # past its grace
    assert (await a.admit(create("x", "1Gi"))).allowed  # the pool was just written
    assert [e["application"] for e in cluster.entries()] == [f"Thing/{POOL}/x"]
    a.observe(thing(cluster, "x", "1Gi"))
    assert await a.ledger.reconcile() == 1, "a settled entry to drop: written at once"
    assert cluster.entries() == []


class Live:
    """The live state as the book needs it: one state, every watch caught up."""

    def __init__(self) -> None:
        self.state = build_state({POOL: {"memory": "4Gi"}})

    def observed_version(self, kind: str) -> int:
        return sys.maxsize

    def confirm(self, kind: str, revision: int) -> None:
        return None


def one_gibibyte(book: Book, name: str) -> dict[str, Any]:
    """A pending entry of 1Gi for the VMInstance ``name``, expiring now."""
    return {
        "id": "u",
        "application": f"VMInstance/{POOL}/{name}",
        "charge": {"memory": "1Gi"},
        "expires": book.now(),
    }


@pytest.mark.kube
async def test_a_real_api_server_keeps_the_managed_fields_a_status_write_leaves_out(
    tmp_path: Path,
) -> None:
    async with reservations_on_real_apiserver(tmp_path / "kube", POOL) as client:
        book = Book(client, Live(), LedgerSettings(replica="a"), clock=Clock())
        current = await book.ensure(POOL)
        entry = one_gibibyte(book, "x")
        written = await book.write(POOL, current, {"pending": [entry]})
        managers = (written["metadata"] or {}).get("managedFields") or []
        assert {m.get("subresource") for m in managers} == {None, "status"}, managers
        assert written["spec"] == {"pool": POOL}
        again = await book.write(POOL, written, {"pending": []})  # from a copy with them
        assert len(again["metadata"]["managedFields"]) == 2
        stored = await client.get(TENANT_RESERVATIONS, POOL, POOL)
        assert stored["metadata"]["managedFields"] == again["metadata"]["managedFields"]
        assert stored["status"]["pending"] == []


async def test_a_tenant_value_full_of_separators_is_written_byte_for_byte_in_compact_json() -> None:
    # Every batch sends the pool's whole object: compact JSON, the same content in fewer
    # bytes. Only the encoder's own separators go; what a tenant wrote (here a name made of
    # ", " and ": ") reaches the API server unchanged.
    received: list[bytes] = []

    async def put(request: web.Request) -> web.Response:
        raw = await request.read()
        received.append(raw)
        stored = json.loads(raw)
        stored["metadata"]["resourceVersion"] = "8"
        return web.json_response(stored)

    app = web.Application()
    app.router.add_put("/{tail:.*}", put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    configuration = k8s_client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    client = KubeClient(configuration)
    try:
        book = Book(client, Live(), LedgerSettings(replica="a"), clock=Clock())
        current = {
            "apiVersion": "reservation.cozystack.io/v1alpha1",
            "kind": "TenantReservation",
            "metadata": {"name": POOL, "namespace": POOL, "resourceVersion": "7"},
            "spec": {"pool": POOL},
        }
        hostile = 'x, "y": {z}, '
        entry = one_gibibyte(book, hostile)
        written = await book.write(POOL, current, {"pending": [entry]})
    finally:
        await client.close()
        await runner.cleanup()
    [raw] = received
    sent = {**current, "status": {"pending": [entry]}}
    assert json.loads(raw) == sent, "the same content"
    assert raw == json.dumps(sent, separators=(",", ":")).encode(), "compact"
    assert len(raw) < len(json.dumps(sent).encode())
    assert written["status"]["pending"][0]["application"].endswith(hostile)


_AMOUNTS = st.dictionaries(
    st.sampled_from(["cpu", "memory", "storage"]),
    st.integers(min_value=0, max_value=4).map(lambda n: Decimal(n * 1024**3)),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(_AMOUNTS.filter(bool), _AMOUNTS, _AMOUNTS)
def test_an_entry_leaving_out_its_expected_charge_settles_as_its_writer_holds_it(
    increase: dict[str, Decimal], expected: dict[str, Decimal], floor: dict[str, Decimal]
) -> None:
    # Whatever the pool increase, the object's whole charge and the previews it absorbs (the
    # floor), every replica reading the entry back expects what its writer holds: an absent
    # ``expected`` never lets a copy of the object showing only the increase settle it.
    book = SimpleNamespace(settings=LedgerSettings(replica="a"), clock=lambda: 0.0, now=lambda: "x")
    commit = Commit(book, None, None)  # type: ignore[arg-type]
    request = create("x", "1Gi", uid="u")
    decision = Decision(True, "allowed", charged_pools={POOL: increase}, expected=expected)
    entry = commit._entry(request, decision, POOL, floor=floor)
    written, read = hold_of(entry, decision, POOL), parse_hold(POOL, entry, 7, {})
    assert dict(read.increase) == dict(written.increase)
    assert dict(read.charge) == dict(written.charge) == expected

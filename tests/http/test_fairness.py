"""Fair admission over HTTP: one tenant's costly reviews wait behind its own, not everyone's."""

from __future__ import annotations

import asyncio
import gc
import http.client
import io
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import review, state
from webhook.admission.admit import Admission
from webhook.core.admission.decisions import Decision, Policy
from webhook.core.admission.reviews import AdmissionRequest
from webhook.http.app import MAX_REVIEW_VALUES, create_app, fairness_key, metrics_key
from webhook.http.fairness import FairAdmission, peek
from webhook.settings import Settings

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]
JSON = {"Content-Type": "application/json"}
TENANTS = {
    "tenant-acme": {"memory": "1Ti"},
    "tenant-acme-dev": None,
    "tenant-acme-dev-ci": None,
    "tenant-beta": {"memory": "1Ti"},
    **{f"tenant-t{index}": {"memory": "1Ti"} for index in range(8)},
}
# Just under the values bound (20,000 entries): each is decided in full, allowed with warnings.
MADE_UP_KEYS = 19_990


class Recording(Admission):
    """An admission that notes the namespace of each decision as it starts."""

    def __init__(self) -> None:
        super().__init__(state(TENANTS), Policy())
        self.order: list[str] = []

    async def validate(self, request: AdmissionRequest) -> Decision:
        self.order.append(request.namespace)
        return await super().validate(request)


def heavy(namespace: str, index: int) -> bytes:
    """A dry-run VMInstance CREATE whose spec carries 19,990 made-up keys (about 330 KB), one
    number changed per request so no memo ever hits."""
    spec: dict[str, Any] = {"instanceType": "u1.micro", "marker": index}
    spec.update({f"x{key:05d}": key for key in range(MADE_UP_KEYS)})
    body = review("VMInstance", namespace, f"flood{index}", spec, dry_run=True, uid=f"h{index}")
    return json.dumps(body).encode()


def raw_post(body: bytes) -> bytes:
    head = "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def victim(name: str = "probe", namespace: str = "tenant-beta") -> dict[str, Any]:
    return review("VMInstance", namespace, name, {"instanceType": "u1.micro"}, uid=name)


async def answer(client: Client, body: bytes | dict[str, Any]) -> dict[str, Any]:
    if isinstance(body, bytes):
        response = await client.post("/validate", data=io.BytesIO(body), headers=JSON)
    else:
        response = await client.post("/validate", json=body)
    assert response.status == 200, await response.text()
    result: dict[str, Any] = (await response.json())["response"]
    return result


def hold_the_seat(fair: FairAdmission) -> Callable[[], None]:
    """Take the one seat as a decision would, so every review that arrives waits its turn;
    returns what gives it back."""
    ticket = fair.queue.arrive("(test)", 1.0, now=0.0)
    assert ticket is not None
    assert fair.queue.dispatch() is ticket

    def give_back() -> None:
        fair.queue.charge(ticket, 0.0)
        fair._dispatch()

    return give_back


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(30):
        while not condition():
            await asyncio.sleep(0.005)


async def test_a_12_connection_heavy_values_flood_never_delays_another_tenants_decision(
    aiohttp_client: MakeClient,
) -> None:
    admission = Recording()
    client = await aiohttp_client(create_app(admission, Settings()))
    template = heavy("tenant-acme-dev", 0)

    def attacker(connection: int) -> list[dict[str, Any]]:
        """One of twelve connections, in a thread of its own as an outside client is, each
        sending the next heavy review (one number changed) as soon as the last is answered."""
        sent = http.client.HTTPConnection(client.host, client.port, timeout=60)
        answers = []
        for index in range(4):
            body = template.replace(b'"marker": 0', f'"marker": {connection * 10 + index}'.encode())
            sent.request("POST", "/validate", body, JSON)
            answers.append(json.loads(sent.getresponse().read())["response"])
        sent.close()
        return answers

    def probe() -> int:
        """The victim, on a connection opened before the flood (the API server keeps its own
        open): how many flood reviews were decided after it was sent and before it."""
        sent = http.client.HTTPConnection(client.host, client.port, timeout=60)
        sent.connect()
        deadline = time.monotonic() + 60
        while len(admission.order) < 14 and time.monotonic() < deadline:  # at full strength
            time.sleep(0.005)
        sent_after = len(admission.order)
        sent.request("POST", "/validate", json.dumps(victim()).encode(), JSON)
        assert json.loads(sent.getresponse().read())["response"]["allowed"]
        sent.close()
        return admission.order.index("tenant-beta") - sent_after

    flood = [asyncio.to_thread(attacker, connection) for connection in range(12)]
    decided_before, *sent = await asyncio.gather(asyncio.to_thread(probe), *flood)
    # Arrival order decides it after every flood review whose body was in before it; fair
    # order at most after the one already given the seat when it arrived.
    assert decided_before <= 1, admission.order
    answers = [result for results in sent for result in results]
    assert len(answers) == 48
    assert all(result["allowed"] for result in answers)
    assert all("x00000" in " ".join(result.get("warnings", ())) for result in answers)


async def test_many_tenants_each_sending_one_heavy_request_are_all_decided(
    aiohttp_client: MakeClient,
) -> None:
    admission = Recording()
    client = await aiohttp_client(create_app(admission, Settings(fair_queue_length=1)))
    give_back = hold_the_seat(client.app[fairness_key])
    tenants = [f"tenant-t{index}" for index in range(8)]
    sent = [asyncio.create_task(answer(client, heavy(t, i))) for i, t in enumerate(tenants)]
    await until(lambda: client.app[fairness_key].queue.waiting == len(tenants))
    give_back()
    answers = await asyncio.gather(*sent)
    # A queue of one per tenant refuses none of them: each tenant has only one waiting.
    assert all(result["allowed"] for result in answers), answers
    assert sorted(admission.order) == sorted(tenants)


async def test_a_tenant_cycling_namespaces_of_its_subtree_is_one_flow(
    aiohttp_client: MakeClient,
) -> None:
    admission = Recording()
    client = await aiohttp_client(create_app(admission, Settings(fair_queue_length=2)))
    give_back = hold_the_seat(client.app[fairness_key])
    subtree = ["tenant-acme", "tenant-acme-dev", "tenant-acme-dev-ci"] * 2
    assert {peek(heavy(ns, 0)).flow for ns in subtree} == {"tenant-acme"}
    sent = [asyncio.create_task(answer(client, heavy(ns, i))) for i, ns in enumerate(subtree)]
    await until(lambda: sum(task.done() for task in sent) == len(subtree) - 2)
    probe = asyncio.create_task(answer(client, victim()))
    await until(lambda: client.app[fairness_key].queue.waiting == 3)
    give_back()
    answers = [*await asyncio.gather(*sent), await probe]
    refused = [result for result in answers if not result["allowed"]]
    assert len(refused) == len(subtree) - 2  # two waiting places for the whole subtree
    for result in refused:
        assert result["status"]["code"] == 429
        assert result["status"]["reason"] == "TooManyRequests"
        assert "too many requests from tenant-acme are waiting" in result["status"]["message"]
        assert result["status"]["details"]["retryAfterSeconds"] >= 1
    assert answers[-1]["allowed"]  # the other tenant is never refused for it
    exposed = client.app[metrics_key].expose().decode()
    assert 'reservation_fair_throttled_total{reason="queue-full",tenant="tenant-acme"} 4.0' in (
        exposed
    )


async def test_a_review_past_the_wait_limit_is_denied_429_and_the_next_tenant_is_not(
    aiohttp_client: MakeClient,
) -> None:
    admission = Recording()
    client = await aiohttp_client(create_app(admission, Settings(timeout_seconds=2)))
    fair = client.app[fairness_key]
    give_back = hold_the_seat(fair)
    result = await answer(client, heavy("tenant-acme", 0))  # waits 0.25 s, then refused
    assert not result["allowed"]
    assert result["status"]["code"] == 429
    assert "waited over 0.25s for their turn" in result["status"]["message"]
    assert result["uid"] == "h0"
    give_back()
    assert (await answer(client, victim()))["allowed"]
    assert admission.order == ["tenant-beta"]  # the refused review was never decided


async def test_slow_bodies_from_one_tenant_hold_no_seat(aiohttp_client: MakeClient) -> None:
    client = await aiohttp_client(create_app(Recording(), Settings()))
    body = heavy("tenant-acme", 0)
    streams = []
    for _ in range(12):  # twelve connections, each sending half a body and then stalling
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(raw_post(body)[: len(body) // 2])
        await writer.drain()
        streams.append((reader, writer))
    async with asyncio.timeout(5):
        probe = await answer(client, victim())
    assert probe["allowed"]
    assert client.app[fairness_key].queue.waiting == 0  # none of them is queued: still reading
    for _, writer in streams:
        writer.close()


@pytest.mark.parametrize(
    ("body", "flow", "uid"),
    [
        pytest.param(
            json.dumps(victim("a", "tenant-acme-dev")).encode(), "tenant-acme", "a", id="review"
        ),
        pytest.param(
            b'{"request": {"uid" : "u", "namespace" :\n "tenant-beta"}}',
            "tenant-beta",
            "u",
            id="spaced",
        ),
        pytest.param(
            b'{"request": {"uid": "u", "name": "\\"namespace\\": \\"tenant-beta\\""}}',
            "(unread)",
            "u",
            id="a-namespace-written-inside-a-string-is-not-read",
        ),
        pytest.param(
            b'{"request": {"uid": "u", "namespace": "Tenant-Beta"}}', "(unread)", "u", id="bad"
        ),
        pytest.param(b"x" * 5000 + b'"namespace": "tenant-beta"', "(unread)", "", id="far"),
    ],
)
def test_a_reviews_flow_is_read_from_its_first_bytes(body: bytes, flow: str, uid: str) -> None:
    peeked = peek(body)
    assert (peeked.flow, peeked.uid) == (flow, uid)


async def test_a_body_of_seven_mib_of_empty_lists_is_denied_before_it_is_decoded(
    aiohttp_client: MakeClient,
) -> None:
    admission = Recording()
    client = await aiohttp_client(create_app(admission, Settings()))
    body = review("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.micro"}, uid="big")
    body["request"]["object"]["metadata"]["managedFields"] = [{"fieldsV1": [[]] * 1_700_000}]
    result = await answer(client, json.dumps(body).encode())
    assert not result["allowed"]
    assert result["uid"] == "big"
    assert result["status"]["code"] == 413
    assert f"more than {MAX_REVIEW_VALUES} JSON values" in result["status"]["message"]
    assert admission.order == []  # never decoded, never decided


class Suspending(Recording):
    """An admission whose decision first waits on I/O (as a key re-read or the ledger does),
    noting when it goes on."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()
        self.proceed = asyncio.Event()
        self.resumed = asyncio.Event()

    async def validate(self, request: AdmissionRequest) -> Decision:
        self.waiting.set()
        await self.proceed.wait()  # waits on something: gives its turn back
        self.resumed.set()
        return await super().validate(request)


async def test_a_decision_that_waited_on_io_goes_on_only_in_its_turn(
    aiohttp_client: MakeClient,
) -> None:
    admission = Suspending()
    client = await aiohttp_client(create_app(admission, Settings()))
    fair = client.app[fairness_key]
    sent = asyncio.create_task(answer(client, victim("first", "tenant-acme")))
    await until(admission.waiting.is_set)  # its first step ran; it waits: the seat is free
    give_back = hold_the_seat(fair)  # another tenant's costly decision takes the seat
    admission.proceed.set()  # what it waited for is there
    await asyncio.sleep(0.05)
    assert not admission.resumed.is_set()  # it goes on only once the seat is given back
    give_back()
    assert (await sent)["allowed"]
    assert admission.resumed.is_set()


def test_a_create_named_past_the_first_bytes_is_still_queued_in_its_tenants_flow() -> None:
    # A mutating webhook sees a create's name before the API server validates it, so a tenant
    # can push the request's namespace (written after the name) past any fixed prefix: the
    # review must still wait in its own tenant's flow, not in one shared with other tenants.
    request = {
        "uid": "u",
        "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": "Postgres"},
        "resource": {"group": "apps.cozystack.io", "version": "v1alpha1", "resource": "postgreses"},
        "name": "a" * 8000,
        "namespace": "tenant-acme-dev",
        "operation": "CREATE",
        "userInfo": {"username": "alice"},
        "object": {"metadata": {"name": "a" * 8000, "namespace": "tenant-acme-dev"}},
    }
    compact = (",", ":")  # as the API server writes it
    body = json.dumps({"kind": "AdmissionReview", "request": request}, separators=compact)
    assert peek(body.encode()) == ("tenant-acme", "u")


@given(name=st.text(max_size=6000) | st.text(alphabet='"\\:n amespc', max_size=6000))
def test_whatever_a_create_is_named_its_review_waits_in_its_namespaces_flow(name: str) -> None:
    request = {"uid": "u", "name": name, "namespace": "tenant-beta-x", "operation": "CREATE"}
    review = {"request": request, "object": {"namespace": "tenant-acme"}}
    assert peek(json.dumps(review, separators=(",", ":")).encode()).flow == "tenant-beta"


async def test_a_review_decoding_many_containers_sets_off_no_collection_while_it_runs() -> None:
    """A body of a few hundred thousand lists, decoded in one step, would set off a collection
    every 700 of them, each walking what the state made since its last full sync."""
    seen: list[bool] = []
    collections: list[int] = []

    def counting(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    async def decision() -> int:
        seen.append(gc.isenabled())
        gc.callbacks.append(counting)
        try:
            lists: list[list[int]] = [[] for _ in range(50_000)]  # what decoding them makes
        finally:
            gc.callbacks.remove(counting)
        await asyncio.sleep(0)  # waits on I/O: the next step is paused alike
        seen.append(gc.isenabled())
        return len(lists)

    assert gc.isenabled()
    made, _ = await FairAdmission(wait_seconds=1.0).run("tenant-acme", 1, decision())
    assert made == 50_000
    assert seen == [False, False], "each step ran with the collector paused"
    assert collections == [], "no collection during the step"
    assert gc.isenabled(), "and it is on again after"


async def test_a_step_that_raises_leaves_the_collector_as_it_found_it() -> None:
    async def failing() -> None:
        raise ValueError("a decision's fault")

    with pytest.raises(ValueError, match="fault"):
        await FairAdmission(wait_seconds=1.0).run("tenant-acme", 1, failing())
    assert gc.isenabled()
    gc.disable()  # a process that runs with it off keeps it off
    try:
        await FairAdmission(wait_seconds=1.0).run("tenant-acme", 1, asyncio.sleep(0))
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_the_collection_a_reviews_step_leaves_is_charged_to_its_flow() -> None:
    """Deferred past the step, it would run at the next allocation, after the step's CPU was
    read: a flood of reviews keeping their containers across a wait took a fifth more of the
    loop than its flow was charged."""
    clock = [0.0]  # the CPU clock the queue charges by: a collection takes a second of it

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            clock[0] += 1.0

    async def decision() -> list[list[int]]:
        return [[] for _ in range(50_000)]  # kept: the review holds its body to the answer

    charged: list[float] = []
    fair = FairAdmission(wait_seconds=1.0, cpu=lambda: clock[0])
    fair.on_done = lambda flow, waited, cpu: charged.append(cpu)
    gc.callbacks.append(collected)
    try:
        kept, _ = await fair.run("tenant-acme", 1, decision())
    finally:
        gc.callbacks.remove(collected)
    assert len(kept) == 50_000
    assert charged[0] >= 1.0, "what the step left was collected, and charged, in its window"

"""Leader election on a Lease: one leader at a time, a quick hand-over, no leadership past the
renew deadline, and takeover of a silent holder only after the lease duration.

Every test runs real electors, each with its own client as separate replicas would have,
against the emulated API server. Durations are scaled down from client-go's defaults
(15 s / 10 s / 2 s) so that the whole file runs in a few seconds; the assertions are stated
in terms of those durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from tests.apiserver.server import EmulatedAPIServer
from webhook.kube.client import KubeClient
from webhook.kube.lease import JITTER_FACTOR, LEASES, MICROTIME_FORMAT, LeaderElector

NAMESPACE = "cozy-system"
NAME = "reservation-webhook"
LEASE = 0.6
DEADLINE = 0.4
RETRY = 0.1
# Scheduling noise allowed on top of a bound the election itself promises.
SLACK = 0.1


@dataclass(frozen=True)
class Timing:
    lease_duration: float = LEASE
    renew_deadline: float = DEADLINE
    retry_period: float = RETRY


SCALED = Timing()


class Change(NamedTuple):
    """One leadership flip, with how many requests the server had seen by then."""

    at: float
    leading: bool
    requests: int


@dataclass
class Replica:
    elector: LeaderElector
    stop: asyncio.Event
    task: asyncio.Task[None]
    changes: list[Change] = field(default_factory=list)

    @property
    def identity(self) -> str:
        return self.elector.identity

    def claims(self) -> list[Change]:
        return [change for change in self.changes if change.leading]


class Cluster:
    """Replicas competing for one Lease on one emulated API server."""

    def __init__(self, server: EmulatedAPIServer, kubeconfig: Path) -> None:
        self.server = server
        self.kubeconfig = kubeconfig
        self.replicas: list[Replica] = []
        self.clients: list[KubeClient] = []

    def start(
        self,
        identity: str,
        *,
        timing: Timing = SCALED,
        kubeconfig: Path | None = None,
    ) -> Replica:
        client = KubeClient.from_kubeconfig(str(kubeconfig or self.kubeconfig))
        self.clients.append(client)
        elector = LeaderElector(
            client,
            namespace=NAMESPACE,
            name=NAME,
            identity=identity,
            lease_duration=timing.lease_duration,
            renew_deadline=timing.renew_deadline,
            retry_period=timing.retry_period,
        )
        stop = asyncio.Event()
        replica = Replica(elector, stop, asyncio.create_task(elector.run(stop)))
        elector.on_change = lambda leading: replica.changes.append(
            Change(time.monotonic(), leading, len(self.server.requests))
        )
        self.replicas.append(replica)
        return replica

    async def close(self) -> None:
        for replica in self.replicas:
            replica.stop.set()
        tasks = [replica.task for replica in self.replicas]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for client in self.clients:
            await client.close()

    def lease(self) -> dict[str, Any]:
        lease = self.server.get(LEASES.group, LEASES.plural, NAMESPACE, NAME)
        assert lease is not None, "the Lease does not exist"
        return lease

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.lease()["spec"]
        return spec

    def leaders(self) -> list[str]:
        return [r.identity for r in self.replicas if not r.task.done() and r.elector.is_leader]

    async def wait_for_leader(self, within: float) -> Replica:
        async with asyncio.timeout(within):
            while True:
                for replica in self.replicas:
                    if not replica.task.done() and replica.elector.is_leader:
                        return replica
                await asyncio.sleep(0.005)

    async def sample(self, seconds: float, every: float = 0.01) -> list[tuple[float, list[str]]]:
        """Who leads, and when, sampled for ``seconds``; each sample also checks that the
        Lease names the leader."""
        samples: list[tuple[float, list[str]]] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            leaders = self.leaders()
            if leaders:
                assert [self.spec()["holderIdentity"]] == leaders
            samples.append((time.monotonic(), leaders))
            await asyncio.sleep(every)
        return samples


@pytest.fixture
async def server() -> AsyncIterator[EmulatedAPIServer]:
    api = EmulatedAPIServer()
    api.resource("coordination.k8s.io", "v1", "leases", "Lease")
    async with api:
        yield api


@pytest.fixture
async def cluster(server: EmulatedAPIServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(server, server.kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield cluster
    finally:
        await cluster.close()


def wall(value: str) -> datetime:
    return datetime.strptime(value, MICROTIME_FORMAT).replace(tzinfo=UTC)


def puts(server: EmulatedAPIServer, start: int, end: int | None = None) -> int:
    return sum(1 for request in server.requests[start:end] if request.method == "PUT")


async def test_a_lone_elector_creates_the_lease_and_leads(cluster: Cluster) -> None:
    replica = cluster.start("replica-a")
    await cluster.wait_for_leader(within=1.0)

    lease = cluster.lease()
    spec = lease["spec"]
    assert (lease["apiVersion"], lease["kind"]) == ("coordination.k8s.io/v1", "Lease")
    assert spec["holderIdentity"] == "replica-a"
    assert spec["leaseDurationSeconds"] == 1  # whole seconds, rounded up from 0.6
    assert spec["leaseTransitions"] == 0
    assert abs(wall(spec["acquireTime"]) - datetime.now(UTC)).total_seconds() < 5
    assert wall(spec["renewTime"]) >= wall(spec["acquireTime"])
    assert replica.elector.leader == "replica-a"
    assert [change.leading for change in replica.changes] == [True]
    assert replica.elector.transitions == 1


async def test_the_leader_keeps_renewing_the_lease(cluster: Cluster) -> None:
    cluster.start("replica-a")
    await cluster.wait_for_leader(within=1.0)
    first = cluster.spec()
    await asyncio.sleep(3 * RETRY)
    later = cluster.spec()
    assert wall(later["renewTime"]) > wall(first["renewTime"])
    assert later["acquireTime"] == first["acquireTime"]
    assert later["leaseTransitions"] == 0


async def test_two_electors_never_lead_at_once_and_the_lease_names_the_leader(
    cluster: Cluster,
) -> None:
    cluster.start("replica-a")
    cluster.start("replica-b")
    leader = await cluster.wait_for_leader(within=1.0)

    samples = await cluster.sample(seconds=0.6)

    assert len(samples) > 30
    assert all(leaders == [leader.identity] for _, leaders in samples)
    (follower,) = [r for r in cluster.replicas if r is not leader]
    assert follower.changes == []
    assert follower.elector.leader == leader.identity
    assert cluster.spec()["leaseTransitions"] == 0


async def test_a_stopping_leader_releases_and_the_follower_takes_over_at_once(
    cluster: Cluster,
) -> None:
    # A long lease makes the point: the hand-over cannot be expiry, it must be the release.
    timing = Timing(lease_duration=2.0, renew_deadline=1.0)
    cluster.start("replica-a", timing=timing)
    cluster.start("replica-b", timing=timing)
    leader = await cluster.wait_for_leader(within=1.0)
    (follower,) = [r for r in cluster.replicas if r is not leader]
    await asyncio.sleep(3 * RETRY)

    stopped = time.monotonic()
    leader.stop.set()
    async with asyncio.timeout(1.0):
        await leader.task

    assert not leader.elector.is_leader
    assert [change.leading for change in leader.changes] == [True, False]
    assert cluster.spec()["holderIdentity"] in ("", follower.identity)
    assert await cluster.wait_for_leader(within=0.5) is follower
    assert time.monotonic() - stopped < 2.0 / 4
    assert cluster.spec()["holderIdentity"] == follower.identity
    assert cluster.spec()["leaseTransitions"] == 1


async def test_a_leader_cut_off_from_the_api_server_steps_down_within_the_renew_deadline(
    cluster: Cluster, server: EmulatedAPIServer
) -> None:
    cluster.start("replica-a")
    cluster.start("replica-b")
    leader = await cluster.wait_for_leader(within=1.0)
    (follower,) = [r for r in cluster.replicas if r is not leader]
    await asyncio.sleep(3 * RETRY)

    cut = time.monotonic()
    server.pause()
    samples = await cluster.sample(seconds=DEADLINE + LEASE)

    stepped_down = [change for change in leader.changes if not change.leading]
    assert stepped_down, "the leader kept believing it leads"
    assert stepped_down[0].at <= cut + DEADLINE + RETRY
    assert all(leaders == [] for at, leaders in samples if at > cut + DEADLINE)
    assert all(leaders in ([], [leader.identity]) for _, leaders in samples)
    assert follower.changes == []

    server.resume()
    again = await cluster.wait_for_leader(within=2.0)
    assert cluster.spec()["holderIdentity"] == again.identity
    assert cluster.leaders() == [again.identity]


async def test_a_leader_whose_renewals_fail_steps_down_and_claims_nothing_until_a_write_succeeds(
    cluster: Cluster, server: EmulatedAPIServer
) -> None:
    cluster.start("replica-a")
    cluster.start("replica-b")
    leader = await cluster.wait_for_leader(within=1.0)
    await asyncio.sleep(3 * RETRY)

    failing = 10  # more PUTs than the leader can send within its renew deadline
    mark = len(server.requests)
    cut = time.monotonic()
    server.fail_next(failing, 500, method="PUT")
    async with asyncio.timeout(DEADLINE + RETRY + SLACK):
        while leader.elector.is_leader:
            await asyncio.sleep(0.005)
    await asyncio.sleep(RETRY)

    (stepped_down,) = [change for change in leader.changes if not change.leading]
    assert stepped_down.at <= cut + DEADLINE + RETRY
    again = await cluster.wait_for_leader(within=3.0)
    claims = [c for replica in cluster.replicas for c in replica.claims() if c.at > cut]
    assert claims, "the new leader was never announced"
    assert all(puts(server, mark, claim.requests) > failing for claim in claims)
    assert cluster.spec()["holderIdentity"] == again.identity
    assert all(leaders in ([], [again.identity]) for _, leaders in await cluster.sample(0.3))


async def test_a_holder_that_dies_without_releasing_is_replaced_only_after_the_lease_duration(
    cluster: Cluster,
) -> None:
    cluster.start("replica-a")
    cluster.start("replica-b")
    leader = await cluster.wait_for_leader(within=1.0)
    (follower,) = [r for r in cluster.replicas if r is not leader]
    await asyncio.sleep(3 * RETRY)

    leader.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await leader.task
    died = time.monotonic()
    assert not leader.elector.is_leader
    await asyncio.sleep(0.05)  # a renewal cut off mid-flight may still land
    last = cluster.spec()
    assert last["holderIdentity"] == leader.identity  # nothing was released

    assert await cluster.wait_for_leader(within=LEASE + 1.0) is follower
    taken = cluster.spec()
    assert taken["holderIdentity"] == follower.identity
    assert taken["leaseTransitions"] == 1
    assert (wall(taken["acquireTime"]) - wall(last["renewTime"])).total_seconds() >= LEASE
    assert time.monotonic() - died <= LEASE + (1 + JITTER_FACTOR) * RETRY + SLACK


def abandoned_lease(holder: str, *, transitions: int) -> dict[str, Any]:
    """A Lease whose holder stopped renewing an hour ago, by its own clock."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 1,
            "acquireTime": "2020-01-01T00:00:00.000000Z",
            "renewTime": "2020-01-01T00:00:00.000000Z",
            "leaseTransitions": transitions,
        },
    }


async def test_an_old_renew_time_is_not_trusted_a_newcomer_watches_for_a_full_lease_duration(
    cluster: Cluster, server: EmulatedAPIServer
) -> None:
    server.create(abandoned_lease("replica-gone", transitions=0))
    started = time.monotonic()
    replica = cluster.start("replica-a")

    assert await cluster.wait_for_leader(within=LEASE + 1.0) is replica
    (claim,) = replica.claims()
    assert claim.at - started >= LEASE
    assert claim.at - started <= LEASE + (1 + JITTER_FACTOR) * RETRY + SLACK
    assert cluster.spec()["leaseTransitions"] == 1


async def test_two_contenders_for_an_expired_lease_leave_exactly_one_leader(
    cluster: Cluster, server: EmulatedAPIServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.kube.lease")
    server.create(abandoned_lease("replica-gone", transitions=4))
    # An hour-old renewTime does not count: expiry is judged by watching the record, so both
    # contenders first wait a full lease duration. Holding their reads until after it has
    # passed makes both read the same resourceVersion, and both write with it.
    timing = Timing(lease_duration=1.2, renew_deadline=0.8)
    contenders = [cluster.start(name, timing=timing) for name in ("replica-b", "replica-c")]
    await asyncio.sleep(0.9)
    assert cluster.leaders() == []
    server.pause()
    await asyncio.sleep(0.4)
    server.resume()

    winner = await cluster.wait_for_leader(within=1.0)
    (loser,) = [r for r in contenders if r is not winner]
    samples = await cluster.sample(seconds=0.5)

    assert all(leaders == [winner.identity] for _, leaders in samples)
    assert loser.changes == []
    assert cluster.spec()["holderIdentity"] == winner.identity
    assert cluster.spec()["leaseTransitions"] == 5
    lost = [
        record
        for record in caplog.records
        if record.getMessage() == "lost the race for the lease"
        and getattr(record, "fields", {}).get("identity") == loser.identity
    ]
    assert lost, "the loser never got a conflict"


async def test_an_unreachable_api_server_is_logged_and_retried_never_raised(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    nowhere = tmp_path / "nowhere"
    nowhere.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "test-token"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    replica = cluster.start("replica-a", kubeconfig=nowhere)
    await asyncio.sleep(5 * RETRY)

    assert not replica.task.done()
    assert not replica.elector.is_leader
    replica.stop.set()
    async with asyncio.timeout(1.0):
        await replica.task  # returns, does not raise
    warnings = [r for r in caplog.records if r.name == "webhook.kube.lease"]
    assert len(warnings) >= 2
    assert all(r.levelno == logging.WARNING for r in warnings)
    assert {getattr(r, "fields", {}).get("status") for r in warnings} == {0}


async def test_a_failing_api_server_is_retried_until_it_answers(
    cluster: Cluster, server: EmulatedAPIServer
) -> None:
    server.fail_next(3, 503)
    replica = cluster.start("replica-a")
    assert await cluster.wait_for_leader(within=2.0) is replica
    assert cluster.spec()["holderIdentity"] == "replica-a"


async def test_a_failing_leadership_hook_does_not_stop_the_election(cluster: Cluster) -> None:
    replica = cluster.start("replica-a")

    def broken(leading: bool) -> None:
        raise RuntimeError("hook failed")

    replica.elector.on_change = broken
    await cluster.wait_for_leader(within=1.0)
    await asyncio.sleep(3 * RETRY)
    assert replica.elector.is_leader
    assert not replica.task.done()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param(
            {"lease_duration": 0.4, "renew_deadline": 0.4},
            "lease_duration must be greater than renew_deadline",
            id="lease-not-longer-than-the-renew-deadline",
        ),
        pytest.param(
            {"renew_deadline": 0.2, "retry_period": 0.2},
            "renew_deadline must be greater than retry_period",
            id="renew-deadline-within-one-jittered-retry",
        ),
        pytest.param({"retry_period": 0.0}, "retry_period", id="no-retry-period"),
        pytest.param({"identity": ""}, "identity", id="no-identity"),
    ],
)
async def test_settings_that_would_let_two_replicas_lead_are_refused(
    server: EmulatedAPIServer, tmp_path: Path, settings: dict[str, Any], message: str
) -> None:
    client = KubeClient.from_kubeconfig(str(server.kubeconfig(tmp_path / "kubeconfig")))
    arguments: dict[str, Any] = {
        "namespace": NAMESPACE,
        "name": NAME,
        "identity": "replica-a",
        "lease_duration": LEASE,
        "renew_deadline": DEADLINE,
        "retry_period": RETRY,
        **settings,
    }
    with pytest.raises(ValueError, match=message):
        LeaderElector(client, **arguments)
    await client.close()

"""The reflector against the emulated API server: list, watch, resume, relist, stay honest."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.apiserver.server import EmulatedAPIServer
from tests.cluster import kube_client
from tests.kube.reflecting import (
    THINGS,
    EmptyList,
    Mirror,
    following,
    reflector,
    run,
    running,
    thing,
)
from tests.waiting import eventually
from webhook.kube.client import ApiError, KubeClient, ResourceRef, WatchTimeout
from webhook.kube.reflector import Reflector


async def test_lists_then_follows_changes(server: EmulatedAPIServer, client: KubeClient) -> None:
    for index in range(1200):  # more than two pages
        server.create(thing(f"t{index:04d}", index))
    async with following(client) as (watcher, mirror):
        assert len(mirror.items) == 1200
        server.update({**thing("t0001", 42), "metadata": {"name": "t0001", "namespace": "ns"}})
        server.delete("example.io", "things", "ns", "t0002")
        server.create(thing("new", 7))
        await eventually(
            lambda: (
                mirror.items.get("t0001") == 42
                and "t0002" not in mirror.items
                and mirror.items.get("new") == 7
            )
        )
        assert watcher.first_sync_seconds is not None


async def test_a_dropped_watch_resumes_without_losing_events(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    async with following(client) as (_, mirror):
        server.drop_watches()
        server.create(thing("during", 1))
        await eventually(lambda: mirror.items.get("during") == 1)
        assert mirror.replaces == 1  # resumed from its resourceVersion, no relist


async def test_410_on_resume_relists(server: EmulatedAPIServer, client: KubeClient) -> None:
    server.create(thing("old", 1))
    async with following(client) as (watcher, mirror):
        server.drop_watches()
        server.create(thing("fresh", 2))
        server.delete("example.io", "things", "ns", "old")
        server.compact()
        await eventually(lambda: mirror.items == {"fresh": 2})
        assert watcher.relists >= 1 or mirror.replaces >= 2


async def test_a_silent_watch_is_dead_and_the_state_stale(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    async with following(client) as (watcher, _):
        server.pause()  # no bookmarks, no answers
        await eventually(lambda: not watcher.synced, timeout=3)
        server.resume()
        await eventually(lambda: watcher.synced, timeout=5)


async def test_an_unreachable_server_at_start_is_never_synced(tmp_path: Path) -> None:
    server = EmulatedAPIServer()
    server.resource("example.io", "v1", "things", "Thing")
    async with server:
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    # the server is gone now: the reflector keeps trying, with backoff, and never claims sync
    async with kube_client(kubeconfig) as client:
        mirror = Mirror()
        watcher = reflector(client, mirror)
        async with running(watcher):
            await asyncio.sleep(0.5)
            assert not watcher.synced
            assert watcher.last_error


async def test_server_errors_back_off_and_recover(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    server.fail_next(3, 503, method="GET")
    async with following(client) as (watcher, _):
        assert "503" in watcher.last_error


async def test_pages_are_reduced_as_they_arrive_and_replace_the_view_at_once(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    for index in range(1200):  # three pages
        server.create(thing(f"t{index:04d}", index))
    replaced: list[list[Any]] = []
    reduced: list[int] = []

    def reduce(obj: dict[str, Any]) -> Any:
        reduced.append(len(replaced))
        value = obj["spec"]["value"]
        return None if value % 2 else value  # None: dropped

    watcher = Reflector(
        client,
        THINGS,
        on_replace=replaced.append,
        on_event=lambda kind, obj: None,
        reduce=reduce,
        read_timeout=0.5,
    )
    async with running(watcher):
        await eventually(lambda: watcher.synced)
        assert len(reduced) == 1200
        assert set(reduced) == {0}  # every object reduced before the one replace
        assert len(replaced) == 1
        assert replaced[0] == list(range(0, 1200, 2))


async def test_a_list_that_is_not_served_is_reported_with_its_url_and_backs_off(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    missing = ResourceRef("example.io", "v1", "widgets")
    watcher = Reflector(
        client,
        missing,
        on_replace=lambda items: None,
        on_event=lambda kind, obj: None,
        backoff=(0.1, 10.0),
    )
    async with running(watcher):
        await asyncio.sleep(1.5)
        lists = [r for r in server.requests if r.path.endswith("/widgets")]
        assert not watcher.synced
        assert "404" in watcher.list_error
        assert f"{client.host}/apis/example.io/v1/widgets" in watcher.list_error
        assert 2 <= len(lists) <= 6  # 0.1 s doubling with jitter: a handful, not hundreds
        assert watcher.list_failures == len(lists)


async def test_one_event_the_consumer_cannot_take_does_not_stop_the_watch(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    mirror = Mirror()

    def event(kind: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "bad":
            raise KeyError("spec")
        mirror.event(kind, obj)

    watcher = Reflector(client, THINGS, on_replace=mirror.replace, on_event=event, read_timeout=0.5)
    async with running(watcher):
        await eventually(lambda: watcher.synced)
        server.create(thing("bad", 1))
        server.create(thing("good", 2))
        await eventually(lambda: mirror.items.get("good") == 2)
        assert watcher.synced


async def test_a_kind_cozystack_api_lists_empty_is_still_followed(tmp_path: Path) -> None:
    """cozystack-api lists a kind with no objects at resourceVersion "0", and its watch from
    "0" is deaf: watched from there, the first object would never be seen."""
    emulated = EmulatedAPIServer(bookmark_interval=0.1)
    emulated.resource("example.io", "v1", "things", "Thing", aggregated=True)
    async with emulated, kube_client(emulated.kubeconfig(tmp_path / "kubeconfig")) as client:
        mirror = Mirror()
        watching = reflector(client, mirror, read_timeout=5.0, watch_timeout=30)
        async with running(watching):
            await eventually(lambda: watching.synced)
            emulated.create(thing("first", 1))
            await eventually(lambda: mirror.items == {"first": 1})


async def test_a_watch_that_worked_before_it_broke_backs_off_from_the_start(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    # A watch that delivered events and then fell silent is a first failure each time, not
    # the next of a run: otherwise a replica whose watches break now and then (a stalled
    # node, a restarted API server) waits ever longer to reconnect, up to the ceiling.
    mirror = Mirror()
    watcher = reflector(client, mirror, backoff=(0.02, 60.0))
    runs: list[int] = []
    delay = watcher._delay

    def recorded(failures: int) -> float:
        runs.append(failures)
        return delay(failures)

    watcher._delay = recorded  # type: ignore[method-assign]
    async with running(watcher):
        await eventually(lambda: watcher.synced)
        for round_ in range(4):
            server.silence_watches()
            await eventually(lambda: not watcher.synced, timeout=5)
            name = f"after{round_}"
            server.create(thing(name, round_))
            await eventually(lambda n=name, v=round_: mirror.items.get(n) == v)  # type: ignore[misc]
        assert runs
        assert max(runs) == 1, runs


class BrokenWatchClient(EmptyList):
    """Lists one empty page; every watch breaks at once, before its first event."""

    async def watch(self, path: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        raise WatchTimeout(f"watch {path}: silent")
        yield {}  # an async generator


async def test_a_watch_broken_as_its_replica_stops_leaves_no_unretrieved_error() -> None:
    # asyncio logs "Task exception was never retrieved" for such a watch, whenever the
    # garbage collector gets to it: noise in an operator's log, at a random later moment.
    watcher = reflector(BrokenWatchClient(), Mirror())  # type: ignore[arg-type]
    before = asyncio.all_tasks()
    _, task = await run(watcher)
    await asyncio.sleep(0)  # the reflector lists and opens its watch, whose consumer is due
    (consumer,) = [t for t in asyncio.all_tasks() - before if "consume" in repr(t.get_coro())]
    task.cancel()  # ... and the replica stops before the reflector hears the watch broke
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    unretrieved = consumer._log_traceback  # asyncio's own flag
    assert isinstance(consumer.exception(), WatchTimeout)  # it did break, not get cancelled
    assert not unretrieved


class ErrorEventClient(EmptyList):
    """Lists one empty page; every watch opens and sends one ERROR event (by default etcd
    unavailable; a 410: a history compacted faster than the kind is listed and watched)."""

    def __init__(self, code: int = 500, reason: str = "InternalError") -> None:
        super().__init__()
        self.status = {"kind": "Status", "code": code, "reason": reason, "message": "etcd"}

    async def watch(self, path: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        yield {"type": "ERROR", "object": self.status}


def recorded_delays(watcher: Reflector) -> list[int]:
    """The failure counts ``watcher`` computes its backoffs from, in order, as it runs."""
    counts: list[int] = []
    delay = watcher._delay

    def recorded(failures: int) -> float:
        counts.append(failures)
        return delay(failures)

    watcher._delay = recorded  # type: ignore[method-assign]
    return counts


async def test_a_watch_answering_every_open_with_an_error_event_backs_off() -> None:
    # An ERROR event is what broke the watch, not a sign it worked: counted as heard, it
    # reset the backoff at every reopen, so a sick API server answering each watch with one
    # was reopened at the shortest backoff (several a second per kind per replica) for good.
    client = ErrorEventClient()
    watcher = reflector(client, Mirror(), backoff=(0.001, 60.0))  # type: ignore[arg-type]
    runs = recorded_delays(watcher)
    async with running(watcher):
        await eventually(lambda: len(runs) >= 5)
    assert runs[:5] == [1, 2, 3, 4, 5], runs


async def test_a_page_the_consumer_cannot_reduce_is_a_failed_list_retried_not_a_dead_reflector(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    # Anything one object makes the list raise (the reduce, the decoding of its page) used
    # to end run(): nothing restarts it, so a kind listed before stayed unsynced for good,
    # and the whole state with it.
    mirror = Mirror()
    poisoned = {"on": True}

    def reduce(obj: dict[str, Any]) -> dict[str, Any]:
        if poisoned["on"] and obj["metadata"]["name"] == "deep":
            raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")
        return obj

    server.create(thing("deep", 1))
    watcher = reflector(client, mirror, reduce=reduce)
    async with running(watcher) as task:
        await eventually(lambda: watcher.list_failures >= 2)
        assert not task.done()
        assert "maximum recursion depth" in watcher.list_error
        assert not watcher.synced
        poisoned["on"] = False
        await eventually(lambda: watcher.synced)
        assert mirror.items == {"deep": 1}


class EmptyWatchClient(EmptyList):
    """Lists one empty page; every watch opens and ends normally at once, with nothing sent (a
    proxy or an aggregated API server closing the stream early)."""

    async def watch(self, path: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        return
        yield {}  # an async generator


async def test_a_watch_that_ends_at_once_every_time_is_not_reopened_in_a_tight_loop() -> None:
    # A normal end reset the backoff and reopened at once, so a stream closed as soon as it
    # opened was reopened without a pause, for good: one request after another to the API
    # server and a busy event loop, while the kind still looked synced.
    client = EmptyWatchClient()
    watcher = reflector(client, Mirror(), backoff=(0.05, 0.2))  # type: ignore[arg-type]
    async with running(watcher):
        await asyncio.sleep(0.5)
    assert 1 <= client.watches <= 12, client.watches
    assert "ended at once" in watcher.last_error


async def test_a_watch_expired_every_time_it_opens_is_not_relisted_in_a_tight_loop() -> None:
    # A 410 relisted at once and reset the backoff: a server whose every watch expired as it
    # opened was listed (the whole kind, every tenant's objects) without a pause, for good.
    client = ErrorEventClient(410, "Expired")
    watcher = reflector(client, Mirror(), backoff=(0.05, 0.2))  # type: ignore[arg-type]
    async with running(watcher):
        await asyncio.sleep(0.5)
    assert 1 <= client.watches <= 12, client.watches
    assert watcher.relists == client.watches
    assert "expired as it opened" in watcher.last_error


class FlakyListExpiringWatchClient(ErrorEventClient):
    """Lists fail ``failing`` times, then list one empty page; every watch expires (410)."""

    def __init__(self, failing: int) -> None:
        super().__init__(410, "Expired")
        self.failing = failing

    async def list_page(self, path: str, **options: Any) -> tuple[dict[str, Any], int]:
        if self.failing > 0:
            self.failing -= 1
            raise ApiError(503, "ServiceUnavailable", "etcd")
        return await super().list_page(path, **options)


async def test_an_expiry_after_list_failures_backs_off_as_the_first_expiry_does() -> None:
    # The expiries' own count, not the list failures before them: five failed lists left the
    # first expiry's wait at the fifth step (the relist the backoff delays took seconds).
    client = FlakyListExpiringWatchClient(failing=5)
    watcher = reflector(client, Mirror(), backoff=(0.001, 60.0))  # type: ignore[arg-type]
    delays = recorded_delays(watcher)
    async with running(watcher):
        await eventually(lambda: len(delays) >= 8)
    assert delays[:8] == [1, 2, 3, 4, 5, 1, 2, 3], delays


async def test_watches_that_keep_expiring_as_they_open_relist_since_the_first() -> None:
    # Readiness excuses a kind relisting past its patience; counted afresh at each expiry, the
    # patience restarted every cycle and every kind's admissions were refused most of the time.
    client = ErrorEventClient(410, "Expired")
    watcher = reflector(client, Mirror(), backoff=(0.01, 0.05))  # type: ignore[arg-type]
    since: list[float | None] = []
    back_off = watcher._back_off

    async def recorded(message: str, failures: int, stop: asyncio.Event) -> None:
        since.append(watcher.listing_since)
        await back_off(message, failures, stop)

    watcher._back_off = recorded  # type: ignore[method-assign]
    async with running(watcher):
        await eventually(lambda: len(since) >= 4)
    assert since[0] is not None
    assert set(since[:4]) == {since[0]}, since

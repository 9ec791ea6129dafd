"""The emulated API server keeps the kube-apiserver contract that other tests lean on.

Each test drives it over HTTP with a plain aiohttp client, as an informer would,
and states one protocol rule: wire shapes and Status errors, the resourceVersion
discipline, watch semantics, and the faults a test can inject. If one of these
fails, every test built on the emulator is testing a server that does not exist.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from tests.apiserver.server import APIError, EmulatedAPIServer, _next_item, _Signal

GROUP = "apps.cozystack.io"
VERSION = "v1alpha1"
API = f"/apis/{GROUP}/{VERSION}"
TENANTS = f"{API}/tenants"
LIMIT = 5.0  # seconds any single test may take
CONFLICT = (
    'Operation cannot be fulfilled on tenants.apps.cozystack.io "acme": the object has been '
    "modified; please apply your changes to the latest version and try again"
)


def tenants(namespace: str) -> str:
    return f"{API}/namespaces/{namespace}/tenants"


def tenant(
    name: str,
    namespace: str = "alpha",
    *,
    labels: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Tenant", "metadata": metadata, **fields}


@pytest.fixture
async def server() -> AsyncIterator[EmulatedAPIServer]:
    api = EmulatedAPIServer(bookmark_interval=0.1)
    api.resource(GROUP, VERSION, "tenants", "Tenant", status=True)
    api.resource("", "v1", "configmaps", "ConfigMap")
    api.resource("", "v1", "namespaces", "Namespace", namespaced=False, status=True)
    async with api:
        yield api


@pytest.fixture
async def http(server: EmulatedAPIServer) -> AsyncIterator[aiohttp.ClientSession]:
    headers = {"Authorization": "Bearer test-token"}
    async with aiohttp.ClientSession(base_url=server.base_url, headers=headers) as session:
        yield session


class Watch:
    """Reads a watch response one newline-delimited JSON event at a time."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self) -> dict[str, Any]:
        line = await self.response.content.readline()
        assert line, "the watch stream ended"
        event: dict[str, Any] = json.loads(line)
        return event

    async def types_and_names(self, count: int) -> list[tuple[str, str]]:
        events = [await self.next() for _ in range(count)]
        return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]

    async def versions_until_cut(self) -> list[str]:
        """The resourceVersion of each event read until the connection is cut mid-body."""
        versions: list[str] = []
        try:
            while True:
                versions.append((await self.next())["object"]["metadata"]["resourceVersion"])
        except aiohttp.ClientPayloadError:
            return versions

    async def ended(self) -> bool:
        return await self.response.content.readline() == b""

    async def silent_for(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.response.content.readline(), seconds)
        except TimeoutError:
            return True
        return False


@asynccontextmanager
async def watching(
    http: aiohttp.ClientSession, path: str = TENANTS, **params: str
) -> AsyncIterator[Watch]:
    async with http.get(path, params={"watch": "true", **params}) as response:
        assert response.status == 200
        yield Watch(response)


async def send(
    http: aiohttp.ClientSession, method: str, path: str, body: Any = None, **params: str
) -> tuple[int, dict[str, Any]]:
    async with http.request(method, path, json=body, params=params) as response:
        return response.status, await response.json()


# --- objects, lists and optimistic concurrency -----------------------------------------------


async def test_a_list_carries_the_current_resource_version_and_items_in_key_order(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        for name, namespace in [("b", "beta"), ("z", "alpha"), ("a", "alpha")]:
            server.create(tenant(name, namespace))
        status, everywhere = await send(http, "GET", TENANTS)
        _, in_alpha = await send(http, "GET", tenants("alpha"))
    assert status == 200
    assert (everywhere["kind"], everywhere["apiVersion"]) == ("TenantList", f"{GROUP}/{VERSION}")
    assert everywhere["metadata"] == {"resourceVersion": server.resource_version}
    assert [i["metadata"]["name"] for i in everywhere["items"]] == ["a", "z", "b"]
    assert [i["metadata"]["name"] for i in in_alpha["items"]] == ["a", "z"]


async def test_create_fills_in_the_server_side_fields_and_refuses_a_duplicate(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        before = int(server.resource_version)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Tenant", "metadata": {"name": "acme"}}
        status, created = await send(http, "POST", tenants("alpha"), body)
        again, duplicate = await send(http, "POST", tenants("alpha"), body)
        generated_body = {"metadata": {"generateName": "acme-"}}
        _, generated = await send(http, "POST", tenants("alpha"), generated_body)
    meta = created["metadata"]
    assert status == 201
    assert meta["namespace"] == "alpha"
    assert meta["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert (meta["generation"], meta["resourceVersion"]) == (1, str(before + 1))
    assert again == 409
    assert (duplicate["reason"], duplicate["message"]) == (
        "AlreadyExists",
        'tenants.apps.cozystack.io "acme" already exists',
    )
    assert generated["metadata"]["name"].startswith("acme-")
    assert len(generated["metadata"]["name"]) == len("acme-") + 5


async def test_an_update_with_a_stale_resource_version_is_a_conflict(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        stale = server.create(tenant("acme", spec={"size": 1}))
        fresh = {**stale, "spec": {"size": 2}}
        first, updated = await send(http, "PUT", f"{tenants('alpha')}/acme", fresh)
        second, conflict = await send(http, "PUT", f"{tenants('alpha')}/acme", stale)
        unconditional = {**stale, "metadata": {**stale["metadata"], "resourceVersion": ""}}
        third, forced = await send(http, "PUT", f"{tenants('alpha')}/acme", unconditional)
    assert first == 200
    assert int(updated["metadata"]["resourceVersion"]) > int(stale["metadata"]["resourceVersion"])
    assert updated["metadata"]["generation"] == 2
    assert second == 409
    assert conflict["kind"] == "Status"
    assert (conflict["reason"], conflict["code"], conflict["message"]) == (
        "Conflict",
        409,
        CONFLICT,
    )
    assert conflict["details"] == {"name": "acme", "group": GROUP, "kind": "tenants"}
    assert (third, forced["spec"]) == (200, {"size": 1})


async def test_an_unconditioned_resource_stores_a_stale_update_as_cozystack_api_does() -> None:
    # cozystack-api's Update reads the HelmRelease and writes it back with no precondition:
    # of two updates that read one version, the one written last wins.
    api = EmulatedAPIServer()
    api.resource(GROUP, VERSION, "vminstances", "VMInstance", unconditioned=True)
    path = f"{API}/namespaces/alpha/vminstances/x"
    headers = {"Authorization": "Bearer test-token"}
    async with api, asyncio.timeout(LIMIT), aiohttp.ClientSession(headers=headers) as http:
        read = api.create(
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VMInstance",
             "metadata": {"name": "x", "namespace": "alpha"},
             "spec": {"instanceType": "u1.medium"}}
        )  # fmt: skip
        shrink = {**read, "spec": {"instanceType": "u1.micro"}}
        labelled = {**read, "metadata": {**read["metadata"], "labels": {"touch": "1"}}}
        first, shrunk = await send(http, "PUT", api.base_url + path, shrink)
        second, stale = await send(http, "PUT", api.base_url + path, labelled)
        stored = api.get(GROUP, "vminstances", "alpha", "x")
    assert (first, second) == (200, 200)
    assert int(stale["metadata"]["resourceVersion"]) > int(shrunk["metadata"]["resourceVersion"])
    assert stored is not None
    assert stored["spec"] == {"instanceType": "u1.medium"}, "the shrink was written over"


async def test_an_update_that_changes_nothing_writes_nothing(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        created = server.create(tenant("acme", spec={"size": 1}))
        version = created["metadata"]["resourceVersion"]
        async with watching(http, resourceVersion=version, allowWatchBookmarks="true") as stream:
            status, same = await send(http, "PUT", f"{tenants('alpha')}/acme", created)
            first = await stream.next()
    assert status == 200
    assert same["metadata"]["resourceVersion"] == version == server.resource_version
    assert first["type"] == "BOOKMARK"


async def test_the_status_subresource_and_the_main_resource_change_separate_fields(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        status, created = await send(
            http, "POST", tenants("alpha"), tenant("acme", spec={"size": 1}, status={"ok": True})
        )
        with_status = {**created, "spec": {"size": 99}, "status": {"phase": "Ready"}}
        _, after_status = await send(http, "PUT", f"{tenants('alpha')}/acme/status", with_status)
        with_spec = {**after_status, "spec": {"size": 2}, "status": {"phase": "Lost"}}
        _, after_spec = await send(http, "PUT", f"{tenants('alpha')}/acme", with_spec)
    assert status == 201
    assert "status" not in created
    assert after_status["status"] == {"phase": "Ready"}
    assert after_status["spec"] == {"size": 1}
    assert after_status["metadata"]["generation"] == 1
    assert after_spec["spec"] == {"size": 2}
    assert after_spec["status"] == {"phase": "Ready"}
    assert after_spec["metadata"]["generation"] == 2


async def test_a_merge_patch_sets_fields_removes_nulls_and_honours_a_resource_version(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        created = server.create(tenant("acme", labels={"a": "1", "b": "2"}))
        stale = created["metadata"]["resourceVersion"]
        headers = {"Content-Type": "application/merge-patch+json"}
        path = f"{tenants('alpha')}/acme"
        patch = {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"size": 3}}
        async with http.patch(path, data=json.dumps(patch), headers=headers) as response:
            patched = await response.json()
        stale_patch = {"metadata": {"resourceVersion": stale}, "spec": {"size": 4}}
        async with http.patch(path, data=json.dumps(stale_patch), headers=headers) as response:
            conflict = response.status, (await response.json())["reason"]
        async with http.patch(path, json={"spec": {}}) as response:
            unsupported = response.status, (await response.json())["reason"]
    assert patched["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert patched["spec"] == {"size": 3}
    assert conflict == (409, "Conflict")
    assert unsupported == (415, "UnsupportedMediaType")


async def test_dry_run_validates_and_answers_but_stores_and_emits_nothing(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        version = server.resource_version
        async with watching(http, resourceVersion=version) as stream:
            status, dry = await send(http, "POST", tenants("alpha"), tenant("dry"), dryRun="All")
            invalid, _ = await send(http, "POST", tenants("alpha"), {"metadata": {}}, dryRun="All")
            missing, _ = await send(http, "GET", f"{tenants('alpha')}/dry")
            unchanged = server.resource_version
            server.create(tenant("real"))
            first = await stream.next()
    assert (status, dry["metadata"]["name"]) == (201, "dry")
    assert "resourceVersion" not in dry["metadata"]
    assert (invalid, missing) == (422, 404)
    assert unchanged == version
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "real")


async def test_delete_returns_the_object_and_watchers_see_it_deleted(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        server.create(tenant("acme"))
        async with watching(http, resourceVersion=server.resource_version) as stream:
            status, deleted = await send(http, "DELETE", f"{tenants('alpha')}/acme")
            event = await stream.next()
        gone, _ = await send(http, "GET", f"{tenants('alpha')}/acme")
    assert (status, deleted["metadata"]["name"]) == (200, "acme")
    assert deleted["metadata"]["resourceVersion"] == server.resource_version
    assert (event["type"], event["object"]) == ("DELETED", deleted)
    assert gone == 404


async def test_finalizers_keep_a_deleted_object_until_the_last_one_is_removed(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        guarded = tenant("acme")
        guarded["metadata"]["finalizers"] = ["example.com/cleanup"]
        server.create(guarded)
        async with watching(http, resourceVersion=server.resource_version) as stream:
            _, terminating = await send(http, "DELETE", f"{tenants('alpha')}/acme")
            released = {**terminating, "metadata": {**terminating["metadata"], "finalizers": []}}
            await send(http, "PUT", f"{tenants('alpha')}/acme", released)
            events = await stream.types_and_names(2)
    assert terminating["metadata"]["deletionTimestamp"]
    assert events == [("MODIFIED", "acme"), ("DELETED", "acme")]
    assert server.get(GROUP, "tenants", "alpha", "acme") is None


# --- watches ---------------------------------------------------------------------------------


async def test_a_watch_from_a_resource_version_replays_every_change_after_it(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        acme = server.create(tenant("acme"))
        since = server.resource_version
        server.update({**acme, "spec": {"size": 2}})
        server.create(tenant("beta"))
        server.delete(GROUP, "tenants", "alpha", "acme")
        async with watching(http, resourceVersion=since) as stream:
            events = [await stream.next() for _ in range(3)]
            server.create(tenant("live"))
            live = await stream.next()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "acme"),
        ("ADDED", "beta"),
        ("DELETED", "acme"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in [*events, live]]
    assert versions == sorted(versions)
    assert versions[0] > int(since)
    assert live["object"]["metadata"]["name"] == "live"


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"resourceVersion": "0"}, id="resource-version-zero"),
        pytest.param({}, id="resource-version-unset"),
    ],
)
async def test_a_watch_without_a_starting_point_begins_with_synthetic_added_events(
    server: EmulatedAPIServer, http: aiohttp.ClientSession, params: dict[str, str]
) -> None:
    async with asyncio.timeout(LIMIT):
        server.create(tenant("b"))
        server.create(tenant("a"))
        async with watching(http, **params) as stream:
            initial = await stream.types_and_names(2)
            server.create(tenant("c"))
            live = await stream.types_and_names(1)
    assert initial == [("ADDED", "a"), ("ADDED", "b")]
    assert live == [("ADDED", "c")]


async def test_send_initial_events_ends_the_initial_state_with_an_annotated_bookmark(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        server.create(tenant("a"))
        params = {
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true",
        }
        async with watching(http, **params) as stream:
            added, bookmark = await stream.next(), await stream.next()
    assert added["type"] == "ADDED"
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"] == {
        "resourceVersion": server.resource_version,
        "annotations": {"k8s.io/initial-events-end": "true"},
    }


async def test_bookmarks_arrive_only_when_allowed_and_carry_just_the_resource_version(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        version = server.create(tenant("acme"))["metadata"]["resourceVersion"]
        async with watching(http, resourceVersion=version, allowWatchBookmarks="true") as stream:
            bookmarks = [await stream.next() for _ in range(2)]
        async with watching(http, resourceVersion=version) as quiet:
            silent = await quiet.silent_for(0.3)
    assert [b["type"] for b in bookmarks] == ["BOOKMARK", "BOOKMARK"]
    assert bookmarks[0]["object"] == {
        "kind": "Tenant",
        "apiVersion": f"{GROUP}/{VERSION}",
        "metadata": {"resourceVersion": version},
    }
    assert silent


async def test_a_watch_from_before_compaction_gets_one_410_error_event_and_ends(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        old = server.resource_version
        server.create(tenant("acme"))
        server.compact()
        compacted_at = server.resource_version
        async with watching(http, resourceVersion=old) as stream:
            error = await stream.next()
            ended = await stream.ended()
        async with watching(http, resourceVersion=server.resource_version) as current:
            server.create(tenant("after"))
            still_works = await current.types_and_names(1)
    assert error["type"] == "ERROR"
    assert error["object"] == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {old} ({compacted_at})",
        "reason": "Expired",
        "code": 410,
    }
    assert ended
    assert still_works == [("ADDED", "after")]


async def test_a_watch_older_than_the_bounded_history_is_410_too() -> None:
    api = EmulatedAPIServer(history_limit=2)
    api.resource(GROUP, VERSION, "tenants", "Tenant")
    async with asyncio.timeout(LIMIT), api:
        start = api.resource_version
        for name in "abc":
            api.create(tenant(name))
        headers = {"Authorization": "Bearer test-token"}
        async with aiohttp.ClientSession(base_url=api.base_url, headers=headers) as http:
            async with watching(http, resourceVersion=start) as stream:
                expired = await stream.next()
            async with watching(http, resourceVersion=str(int(start) + 1)) as stream:
                kept = await stream.types_and_names(2)
    assert (expired["type"], expired["object"]["code"]) == ("ERROR", 410)
    assert kept == [("ADDED", "b"), ("ADDED", "c")]


async def test_timeout_seconds_ends_the_stream_cleanly(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with watching(http, timeoutSeconds="1") as stream:
            ended = await stream.ended()
        elapsed = loop.time() - started
    assert ended
    assert 0.9 <= elapsed < 2.0


async def test_drop_watches_cuts_every_stream_mid_body(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        server.create(tenant("acme"))
        async with watching(http, resourceVersion="0") as stream:
            await stream.next()
            server.drop_watches()
            with pytest.raises(aiohttp.ClientPayloadError):
                await stream.next()


async def test_a_bookmark_due_while_a_change_is_queued_never_carries_the_watch_past_it(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    """kube-apiserver queues a bookmark behind the watcher's events, so a watch resumed from
    the last resourceVersion it read misses nothing, even when it broke right after."""
    async with asyncio.timeout(LIMIT):
        start = server.resource_version
        async with watching(http, resourceVersion=start, allowWatchBookmarks="true") as stream:
            seen = [(await stream.next())["object"]["metadata"]["resourceVersion"]]
            time.sleep(2 * server.bookmark_interval)  # the next bookmark falls due, unsent
            server.resume()  # wakes the watch while the bookmark is due
            server.drop_watches()
            server.create(tenant("missed"))
            seen += await stream.versions_until_cut()
        assert seen[-1] == start  # nothing read past the change the cut kept from the stream
        async with watching(http, resourceVersion=seen[-1]) as resumed:
            replayed = await resumed.types_and_names(1)
    assert replayed == [("ADDED", "missed")]


@settings(max_examples=200, deadline=None)
@given(
    queued=st.lists(st.integers(0, 9), max_size=6),
    waits=st.lists(st.sampled_from([0.0, 0.0001]), min_size=7, max_size=7),
)
def test_a_watch_reads_every_queued_event_before_its_wait_can_run_out(
    queued: list[int], waits: list[float]
) -> None:
    """The wait's end sends a bookmark at the current revision: it comes only once nothing is
    queued, whatever the wait (0 when a bookmark is overdue)."""

    async def read() -> list[object]:
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | _Signal] = asyncio.Queue()
        for n in queued:
            queue.put_nowait(("ADDED", {"n": n}))
        return [await _next_item(queue, wait) for wait in waits[: len(queued) + 1]]

    assert asyncio.run(read()) == [("ADDED", {"n": n}) for n in queued] + [None]


async def test_silenced_watches_stay_open_but_send_nothing_while_new_ones_work(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        version = server.resource_version
        async with watching(http, resourceVersion=version, allowWatchBookmarks="true") as stream:
            await stream.next()
            server.silence_watches()
            server.create(tenant("unheard"))
            silent = await stream.silent_for(0.4)
            async with watching(http, resourceVersion=version) as fresh:
                replayed = await fresh.types_and_names(1)
    assert silent
    assert replayed == [("ADDED", "unheard")]


async def test_pause_holds_requests_and_watch_events_until_resume(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        async with watching(http, resourceVersion=server.resource_version) as stream:
            server.pause()
            pending = asyncio.create_task(send(http, "GET", TENANTS))
            server.create(tenant("queued"))
            await asyncio.sleep(0.2)
            waiting = not pending.done()
            silent = await stream.silent_for(0.1)
            server.resume()
            status, _ = await pending
            delivered = await stream.types_and_names(1)
    assert waiting
    assert silent
    assert status == 200
    assert delivered == [("ADDED", "queued")]


# --- selectors and pagination ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        pytest.param("tier=gold", ["a"], id="equality"),
        pytest.param("tier==gold", ["a"], id="double-equals"),
        pytest.param("tier!=gold", ["b", "c"], id="inequality-includes-unlabelled"),
        pytest.param("tier", ["a", "b"], id="exists"),
        pytest.param("!tier", ["c"], id="does-not-exist"),
        pytest.param("tier,env=prod", ["b"], id="comma-is-and"),
        pytest.param("tier in (gold,silver)", ["a", "b"], id="set-in"),
        pytest.param("tier notin (gold)", ["b", "c"], id="set-notin"),
    ],
)
async def test_a_label_selector_filters_the_list(
    server: EmulatedAPIServer, http: aiohttp.ClientSession, selector: str, names: list[str]
) -> None:
    server.create(tenant("a", labels={"tier": "gold"}))
    server.create(tenant("b", labels={"tier": "silver", "env": "prod"}))
    server.create(tenant("c", labels={"env": "prod"}))
    async with asyncio.timeout(LIMIT):
        _, listed = await send(http, "GET", TENANTS, labelSelector=selector)
    assert [item["metadata"]["name"] for item in listed["items"]] == names


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        pytest.param("metadata.name=a", ["a", "a"], id="name"),
        pytest.param("metadata.namespace=beta", ["a"], id="namespace"),
        pytest.param("metadata.namespace!=beta,metadata.name!=a", ["b"], id="negated-and"),
    ],
)
async def test_a_field_selector_filters_by_name_and_namespace(
    server: EmulatedAPIServer, http: aiohttp.ClientSession, selector: str, names: list[str]
) -> None:
    for name, namespace in [("a", "alpha"), ("b", "alpha"), ("a", "beta")]:
        server.create(tenant(name, namespace))
    async with asyncio.timeout(LIMIT):
        _, listed = await send(http, "GET", TENANTS, fieldSelector=selector)
        unsupported, error = await send(http, "GET", TENANTS, fieldSelector="spec.size=1")
    assert [item["metadata"]["name"] for item in listed["items"]] == names
    assert (unsupported, error["message"]) == (400, "field label not supported: spec.size")


async def test_a_selective_watch_sees_objects_enter_and_leave_its_selection(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        params = {"resourceVersion": server.resource_version, "labelSelector": "tier=gold"}
        async with watching(http, **params) as stream:
            gold = server.create(tenant("a", labels={"tier": "gold"}))
            silver = server.update({**gold, "metadata": {**gold["metadata"], "labels": {}}})
            server.create(tenant("b", labels={"tier": "silver"}))
            server.update(
                {**silver, "metadata": {**silver["metadata"], "labels": {"tier": "gold"}}}
            )
            server.delete(GROUP, "tenants", "alpha", "a")
            events = [await stream.next() for _ in range(4)]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("DELETED", "a"),
        ("ADDED", "a"),
        ("DELETED", "a"),
    ]
    left = events[1]["object"]["metadata"]
    assert left["labels"] == {"tier": "gold"}
    assert left["resourceVersion"] == silver["metadata"]["resourceVersion"]


async def test_pages_from_limit_and_continue_share_one_snapshot(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    for name in "abcde":
        server.create(tenant(name))
    async with asyncio.timeout(LIMIT):
        _, first = await send(http, "GET", TENANTS, limit="2")
        server.delete(GROUP, "tenants", "alpha", "d")
        server.create(tenant("f"))
        pages = [first]
        while token := pages[-1]["metadata"].get("continue"):
            _, page = await send(http, "GET", TENANTS, limit="2", **{"continue": token})
            pages.append(page)
    names = [item["metadata"]["name"] for page in pages for item in page["items"]]
    assert names == ["a", "b", "c", "d", "e"]
    assert [len(page["items"]) for page in pages] == [2, 2, 1]
    assert first["metadata"]["remainingItemCount"] == 3
    assert {page["metadata"]["resourceVersion"] for page in pages} == {
        first["metadata"]["resourceVersion"]
    }


async def test_a_continue_token_from_before_compaction_is_410_expired(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    for name in "abc":
        server.create(tenant(name))
    async with asyncio.timeout(LIMIT):
        _, first = await send(http, "GET", TENANTS, limit="1")
        server.create(tenant("d"))
        server.compact()
        token = first["metadata"]["continue"]
        status, error = await send(http, "GET", TENANTS, limit="1", **{"continue": token})
    assert (status, error["reason"], error["code"]) == (410, "Expired", 410)


async def test_an_exact_resource_version_lists_the_past(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    server.create(tenant("a"))
    then = server.resource_version
    server.create(tenant("b"))
    async with asyncio.timeout(LIMIT):
        _, past = await send(
            http, "GET", TENANTS, resourceVersion=then, resourceVersionMatch="Exact"
        )
    assert past["metadata"]["resourceVersion"] == then
    assert [item["metadata"]["name"] for item in past["items"]] == ["a"]


# --- faults, errors, auth, discovery ---------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        pytest.param(409, "Conflict", id="conflict"),
        pytest.param(500, "InternalError", id="internal-error"),
        pytest.param(503, "ServiceUnavailable", id="service-unavailable"),
    ],
)
async def test_fail_next_answers_with_the_status_then_the_server_recovers(
    server: EmulatedAPIServer, http: aiohttp.ClientSession, code: int, reason: str
) -> None:
    server.create(tenant("acme"))
    server.fail_next(2, code)
    async with asyncio.timeout(LIMIT):
        failures = [await send(http, "GET", f"{tenants('alpha')}/acme") for _ in range(2)]
        recovered, _ = await send(http, "GET", f"{tenants('alpha')}/acme")
    assert [(s, body["kind"], body["reason"], body["code"]) for s, body in failures] == [
        (code, "Status", reason, code)
    ] * 2
    assert recovered == 200


async def test_fail_next_for_one_method_leaves_the_others_alone(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    acme = server.create(tenant("acme"))
    server.fail_next(1, 409, method="put")
    async with asyncio.timeout(LIMIT):
        read, _ = await send(http, "GET", f"{tenants('alpha')}/acme")
        write, conflict = await send(http, "PUT", f"{tenants('alpha')}/acme", acme)
        retried, _ = await send(http, "PUT", f"{tenants('alpha')}/acme", acme)
    assert (read, write, retried) == (200, 409, 200)
    assert conflict["message"] == CONFLICT


@pytest.mark.parametrize(
    ("method", "path", "body", "code", "reason"),
    [
        pytest.param("GET", f"{API}/widgets", None, 404, "NotFound", id="unknown-resource"),
        pytest.param(
            "GET", f"{API}/namespaces/alpha/tenants/nope", None, 404, "NotFound", id="no-object"
        ),
        pytest.param("POST", tenants("alpha"), b"{not json", 400, "BadRequest", id="not-json"),
        pytest.param("POST", tenants("alpha"), b"[1, 2]", 400, "BadRequest", id="not-an-object"),
        pytest.param(
            "POST",
            tenants("alpha"),
            {"apiVersion": f"{GROUP}/v9", "metadata": {"name": "x"}},
            400,
            "BadRequest",
            id="api-version-mismatch",
        ),
        pytest.param(
            "POST",
            tenants("alpha"),
            {"kind": "Widget", "metadata": {"name": "x"}},
            422,
            "Invalid",
            id="kind-mismatch",
        ),
        pytest.param(
            "POST", tenants("alpha"), {"metadata": {}}, 422, "Invalid", id="no-name-on-create"
        ),
        pytest.param(
            "POST",
            tenants("alpha"),
            {"metadata": {"name": "Bad_Name"}},
            422,
            "Invalid",
            id="name-not-a-dns-subdomain",
        ),
        pytest.param("PUT", tenants("alpha"), {}, 405, "MethodNotAllowed", id="put-on-collection"),
        pytest.param("POST", TENANTS, {}, 405, "MethodNotAllowed", id="create-without-namespace"),
        pytest.param(
            "GET",
            "/api/v1/namespaces/alpha/configmaps/x/status",
            None,
            404,
            "NotFound",
            id="status-of-a-kind-without-one",
        ),
    ],
)
async def test_a_bad_request_gets_the_status_the_real_server_sends(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: object,
    code: int,
    reason: str,
) -> None:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    async with asyncio.timeout(LIMIT), http.request(method, path, data=data, headers=headers) as r:
        status, error = r.status, await r.json()
    assert status == code
    assert (error["kind"], error["apiVersion"], error["status"]) == ("Status", "v1", "Failure")
    assert (error["reason"], error["code"]) == (reason, code)


async def test_the_invalid_status_names_the_kind_the_object_and_the_field(
    http: aiohttp.ClientSession,
) -> None:
    async with asyncio.timeout(LIMIT):
        _, missing = await send(http, "POST", tenants("alpha"), {"metadata": {}})
        _, wrong = await send(
            http, "POST", tenants("alpha"), {"kind": "Widget", "metadata": {"name": "x"}}
        )
    assert missing["message"] == (
        'Tenant.apps.cozystack.io "" is invalid: '
        "metadata.name: Required value: name or generateName is required"
    )
    assert missing["details"]["causes"] == [
        {
            "reason": "FieldValueRequired",
            "message": "Required value: name or generateName is required",
            "field": "metadata.name",
        }
    ]
    assert wrong["message"] == (
        'Widget.apps.cozystack.io "x" is invalid: kind: Invalid value: "Widget": must be Tenant'
    )


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-token"),
        pytest.param({"Authorization": "Bearer wrong"}, id="wrong-token"),
    ],
)
async def test_requests_without_the_bearer_token_are_unauthorized(
    server: EmulatedAPIServer, headers: dict[str, str]
) -> None:
    async with (
        asyncio.timeout(LIMIT),
        aiohttp.ClientSession(base_url=server.base_url, headers=headers) as anonymous,
        anonymous.get(TENANTS) as response,
    ):
        status, body = response.status, await response.json()
    assert status == 401
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Unauthorized", 401)


async def test_discovery_lists_groups_resources_and_the_status_subresource(
    http: aiohttp.ClientSession,
) -> None:
    async with asyncio.timeout(LIMIT):
        _, groups = await send(http, "GET", "/apis")
        _, resources = await send(http, "GET", API)
        _, core = await send(http, "GET", "/api/v1")
        _, versions = await send(http, "GET", "/api")
        _, version = await send(http, "GET", "/version")
    assert [g["name"] for g in groups["groups"]] == [GROUP]
    assert groups["groups"][0]["preferredVersion"]["groupVersion"] == f"{GROUP}/{VERSION}"
    assert resources["groupVersion"] == f"{GROUP}/{VERSION}"
    by_name = {r["name"]: r for r in resources["resources"]}
    assert set(by_name) == {"tenants", "tenants/status"}
    assert by_name["tenants"]["kind"] == "Tenant"
    assert by_name["tenants"]["namespaced"] is True
    assert {"list", "watch", "create", "update", "patch", "delete"} <= set(
        by_name["tenants"]["verbs"]
    )
    assert by_name["tenants/status"]["verbs"] == ["get", "patch", "update"]
    assert {r["name"] for r in core["resources"]} == {
        "configmaps",
        "namespaces",
        "namespaces/status",
    }
    assert versions["versions"] == ["v1"]
    assert version["gitVersion"].startswith("v1.")


# --- direct access and the official client ---------------------------------------------------


async def test_direct_writes_bump_the_resource_version_and_reach_watchers(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(LIMIT):
        async with watching(http, resourceVersion=server.resource_version) as stream:
            created = server.create(tenant("acme"))
            updated = server.update({**created, "spec": {"size": 2}})
            events = [await stream.next() for _ in range(2)]
        with pytest.raises(APIError) as conflict:
            server.update(created)
    assert (
        int(updated["metadata"]["resourceVersion"])
        == int(created["metadata"]["resourceVersion"]) + 1
    )
    assert [e["object"] for e in events] == [created, updated]
    assert (conflict.value.code, conflict.value.reason) == (409, "Conflict")
    assert server.objects(GROUP, "tenants") == [updated]


async def test_cluster_scoped_resources_live_outside_namespaces(
    server: EmulatedAPIServer, http: aiohttp.ClientSession
) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "alpha"}}
    async with asyncio.timeout(LIMIT):
        status, created = await send(http, "POST", "/api/v1/namespaces", body)
        _, fetched = await send(http, "GET", "/api/v1/namespaces/alpha")
        _, with_status = await send(
            http, "PUT", "/api/v1/namespaces/alpha/status", {**fetched, "status": {"phase": "x"}}
        )
    assert status == 201
    assert "namespace" not in created["metadata"]
    assert with_status["status"] == {"phase": "x"}


@pytest.mark.parametrize(
    ("namespace", "name", "subresource", "path"),
    [
        pytest.param(None, None, "", TENANTS, id="all-namespaces"),
        pytest.param("alpha", None, "", tenants("alpha"), id="one-namespace"),
        pytest.param(
            "alpha", "acme", "status", f"{tenants('alpha')}/acme/status", id="status-subresource"
        ),
    ],
)
def test_a_resource_knows_its_url_paths(
    namespace: str | None, name: str | None, subresource: str, path: str
) -> None:
    api = EmulatedAPIServer()
    resource = api.resource(GROUP, VERSION, "tenants", "Tenant", status=True)
    namespaces = api.resource("", "v1", "namespaces", "Namespace", namespaced=False)
    assert resource.path(namespace, name, subresource) == path
    assert namespaces.path("ignored", "alpha") == "/api/v1/namespaces/alpha"


async def test_the_kubeconfig_loads_into_the_official_client_with_host_and_token(
    server: EmulatedAPIServer, tmp_path: Path
) -> None:
    path = server.kubeconfig(tmp_path / "kubeconfig")
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(path), client_configuration=configuration
    )
    assert configuration.host == server.base_url
    assert list(configuration.api_key.values()) == ["Bearer test-token"]


async def test_the_official_client_lists_and_watches_through_the_emulator(
    server: EmulatedAPIServer, tmp_path: Path
) -> None:
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(server.kubeconfig(tmp_path / "kubeconfig")),
        client_configuration=configuration,
    )
    server.create(tenant("acme"))

    def list_then_watch() -> tuple[dict[str, Any], list[tuple[str, str]]]:
        with k8s_client.ApiClient(configuration) as api_client:
            api = k8s_client.CustomObjectsApi(api_client)
            listed = cast(
                "dict[str, Any]",
                api.list_namespaced_custom_object(GROUP, VERSION, "alpha", "tenants"),
            )
            watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
            stream = watch.stream(  # type: ignore[no-untyped-call]
                api.list_cluster_custom_object,
                GROUP,
                VERSION,
                "tenants",
                resource_version="0",
                timeout_seconds=1,
            )
            events = [(e["type"], e["object"]["metadata"]["name"]) for e in stream]
            return listed, events

    async with asyncio.timeout(LIMIT):
        listed, events = await asyncio.to_thread(list_then_watch)
    assert [item["metadata"]["name"] for item in listed["items"]] == ["acme"]
    assert events == [("ADDED", "acme")]


# --- aggregated resources: served as cozystack-api serves applications -------------------------


@pytest.fixture
async def aggregated() -> AsyncIterator[EmulatedAPIServer]:
    api = EmulatedAPIServer(bookmark_interval=0.1)
    api.resource(GROUP, VERSION, "tenants", "Tenant", aggregated=True)
    api.resource("", "v1", "configmaps", "ConfigMap")
    async with api:
        yield api


async def test_an_aggregated_list_is_at_its_newest_object_or_at_0_when_empty(
    aggregated: EmulatedAPIServer,
) -> None:
    headers = {"Authorization": "Bearer test-token"}
    async with aiohttp.ClientSession(base_url=aggregated.base_url, headers=headers) as http:
        _, empty = await send(http, "GET", TENANTS, limit="1")
        assert empty["metadata"] == {"resourceVersion": "0"}
        first = aggregated.create(tenant("a"))
        aggregated.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": "alpha"},
            }
        )
        aggregated.create(tenant("b"))
        aggregated.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "d", "namespace": "alpha"},
            }
        )
        _, full = await send(http, "GET", TENANTS, limit="1")
    assert full["metadata"] == {
        "resourceVersion": str(int(first["metadata"]["resourceVersion"]) + 2)
    }
    assert [i["metadata"]["name"] for i in full["items"]] == ["a", "b"], "no pages"


async def test_an_aggregated_watch_from_0_is_deaf_and_from_n_sends_what_is_newer(
    aggregated: EmulatedAPIServer,
) -> None:
    headers = {"Authorization": "Bearer test-token"}
    async with aiohttp.ClientSession(base_url=aggregated.base_url, headers=headers) as http:
        old = aggregated.create(tenant("old"))
        async with asyncio.timeout(LIMIT), watching(http, resourceVersion="0") as deaf:
            bookmark = await deaf.next()
            assert bookmark["type"] == "BOOKMARK"
            assert bookmark["object"]["metadata"]["annotations"] == {
                "k8s.io/initial-events-end": "true"
            }
            aggregated.create(tenant("new"))
            assert await deaf.silent_for(0.3)
        since = old["metadata"]["resourceVersion"]
        async with asyncio.timeout(LIMIT), watching(http, resourceVersion=since) as live:
            assert await live.types_and_names(1) == [("ADDED", "new")]
            aggregated.create(tenant("newer"))
            assert await live.types_and_names(1) == [("ADDED", "newer")]

"""What a watch lost is put right: a consistent read finds it, a GET fetches it, and no late
event reverts it. cozystack-api's watches can lose an event and stay open; the emulated
server's ``lose_next_events`` does that on demand."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import app, cluster, tenant
from tests.state.test_live import live_of, metrics
from tests.test_live import MICRO, Caller, replica, wait_ready
from tests.waiting import eventually
from webhook.kube.client import ApiError
from webhook.state.live import LiveState

VMS = ("apps.cozystack.io", "vminstances")
GiB = 1024**3
# Resynced every second, not every five minutes; and watches the server keeps open past
# each test: a watch reopened from before a lost event replays it, so the reopen, not the
# resync, would put it right, and nothing here could tell a repair happened.
FAST: dict[str, Any] = {"watch_resync_seconds": 1.0, "watch_read_timeout": 600.0}


def memory(live: LiveState) -> Any:
    node = live.state.tree.get("tenant-acme")
    return node.usage.get("memory") if node else None


def gets(server: Any, name: str) -> int:
    """GETs of one application by name (the repairs' fetches)."""
    return sum(1 for r in server.requests if r.method == "GET" and r.path.endswith(f"/{name}"))


async def test_a_change_the_watch_lost_is_put_right_by_the_next_resync(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "100Gi"}))
        server.create(app("VMInstance", "tenant-acme", "vm", MICRO))
        async with replica(kubeconfig, certs, **FAST) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            assert memory(live) == 1 * GiB
            server.lose_next_events(1)
            server.patch(*VMS, "tenant-acme", "vm", {"spec": {"instanceType": "u1.small"}})
            await eventually(lambda: memory(live) == 2 * GiB, 15)
            assert live.repairs == {"VMInstance": 1}
            assert "reservation_watch_repairs 1.0" in await metrics(caller, webhook)


async def test_a_deletion_the_watch_lost_is_put_right_by_the_next_resync(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "100Gi"}))
        server.create(app("VMInstance", "tenant-acme", "vm", MICRO))
        server.create(app("VMInstance", "tenant-acme", "kept", MICRO))
        async with replica(kubeconfig, certs, **FAST) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            assert memory(live) == 2 * GiB
            server.lose_next_events(1)
            server.delete(*VMS, "tenant-acme", "vm")
            await eventually(lambda: memory(live) == 1 * GiB, 15)
            assert live.state.record(("VMInstance", "tenant-acme", "vm")) is None
            assert live.repairs == {"VMInstance": 1}


async def test_an_event_older_than_a_repair_never_reverts_it(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    # A repair runs ahead of the watch; were the watch then to deliver the change before it
    # (late, not lost), the state would count the older spec again: smaller after a growth,
    # the tenant's way past its budget. An event older than what is held is ignored.
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "100Gi"}))
        created = server.create(app("VMInstance", "tenant-acme", "vm", MICRO))
        async with replica(kubeconfig, certs, **FAST) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            server.lose_next_events(1)
            server.patch(*VMS, "tenant-acme", "vm", {"spec": {"instanceType": "u1.medium"}})
            await eventually(lambda: memory(live) == 4 * GiB, 15)
            watch = live._apps["vminstances"]
            watch.reflector.on_event("MODIFIED", created)  # the change before, delivered late
            assert memory(live) == 4 * GiB
            gone = {**created, "metadata": {**created["metadata"]}}
            server.lose_next_events(1)
            server.delete(*VMS, "tenant-acme", "vm")
            await eventually(lambda: memory(live) == 0, 15)
            watch.reflector.on_event("MODIFIED", gone)  # a change from before the deletion
            assert memory(live) == 0


async def test_losing_many_events_costs_a_bounded_number_of_fetches_per_read(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    # A tenant whose writes outrun the watch cannot turn repairs into a storm of GETs: each
    # read fetches at most repair_objects, and reads are spaced; the rest wait for the next.
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "100Gi"}))
        async with replica(kubeconfig, certs, **FAST) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            live.settings = type(live.settings)(
                **{**live.settings.__dict__, "repair_objects": 2, "resync_seconds": 1.0}
            )
            server.lose_next_events(6)
            for index in range(6):
                server.create(app("VMInstance", "tenant-acme", f"vm{index}", MICRO))
            await eventually(lambda: live.repairs.get("VMInstance", 0) >= 2, 45)  # reads are spaced
            fetched = sum(gets(server, f"vm{index}") for index in range(6))
            assert fetched <= 2 * live.consistent_reads
            await eventually(lambda: memory(live) == 6 * GiB, 30)
            assert live.repairs == {"VMInstance": 6}


async def test_an_object_the_read_shows_is_never_forgotten_on_a_lagging_404(
    tmp_path: Path, certs: Path, caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cozystack-api answers a GET from its cache, which may not have seen a name deleted and
    # re-created yet: it answers 404 for an object the HelmRelease read shows. Deleting it on
    # that 404 would drop it from the count (and settle its hold) until the watch delivered it
    # again: a window past the budget. Only an object the read no longer shows is deleted.
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "100Gi"}))
        server.create(app("VMInstance", "tenant-acme", "vm", MICRO))
        async with replica(kubeconfig, certs, watch_resync_seconds=0) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            request = live.client.request

            async def lagging(method: str, path: str, **options: Any) -> Any:
                if method == "GET" and path.endswith("/vminstances/vm"):
                    raise ApiError(404, "NotFound", 'vminstances "vm" not found')
                return await request(method, path, **options)

            monkeypatch.setattr(live.client, "request", lagging)
            watch = live._apps["vminstances"]
            key = ("tenant-acme", "vm")
            assert await live.repair("VMInstance", watch, [key], 10**9, {key}) == 0
            assert memory(live) == 1 * GiB
            assert await live.repair("VMInstance", watch, [key], 10**9, set()) == 1
            assert memory(live) == 0


def release(kind: str, namespace: str, name: str, label: str) -> dict[str, Any]:
    """A HelmRelease as kube-apiserver stores an application (``label``: its name label)."""
    return {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "apps.cozystack.io/application.kind": kind,
                "apps.cozystack.io/application.group": "apps.cozystack.io",
                "apps.cozystack.io/application.name": label,
            },
        },
        "spec": {"values": {}},
    }


async def test_the_root_tenant_labelled_other_than_its_name_never_stalls_the_tenant_kind(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    # cozystack-api names an application after its HelmRelease without the kind's prefix
    # (TrimPrefix), not after the name label; the root tenant's HelmRelease `tenant-root` is
    # labelled `tenant-root` and served as Tenant `root`. Keyed by the label, every read of the
    # Tenant kind found an object the state never holds and one it holds but the read never
    # shows: the kind was never confirmed (the ledger's waits on it ran to their bound, for
    # every tenant) and both were fetched at every read.
    async with cluster(tmp_path) as (server, kubeconfig):
        server.resource("helm.toolkit.fluxcd.io", "v2", "helmreleases", "HelmRelease")
        # Each HelmRelease before its application: the application is then never older than
        # what the read shows (cozystack-api serves both at one resourceVersion).
        server.create(release("Tenant", "tenant-root", "tenant-root", "tenant-root"))
        server.create(tenant("tenant-root", "root"))
        server.create(release("Tenant", "tenant-root", "tenant-acme", "acme"))
        server.create(tenant("tenant-root", "acme", {"memory": "100Gi"}))
        async with replica(kubeconfig, certs, **FAST) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            written = int(server.resource_version)
            await eventually(lambda: live._confirmed.get("Tenant", 0) >= written, 10)
            fetched = [
                r.path for r in server.requests if r.method == "GET" and "/tenants/" in r.path
            ]
            assert fetched == [], fetched
            assert live.repairs == {}
            releases = [r for r in server.requests if r.path.endswith("/helmreleases")]
            assert releases, "the Tenant kind was read as its HelmReleases"
            # ... as their metadata only: a release's values can be large; its name is not.
            assert all("as=PartialObjectMetadataList" in r.accept for r in releases)


@asynccontextmanager
async def acme_with_a_vm(
    tmp_path: Path, certs: Path, caller: Caller, **settings: Any
) -> AsyncIterator[tuple[Any, LiveState]]:
    """A replica, ready, of a cluster where tenant acme has one VM (1 GiB); ``settings``
    replace the fast resync."""
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "100Gi"}))
        server.create(app("VMInstance", "tenant-acme", "vm", MICRO))
        async with replica(kubeconfig, certs, **(settings or FAST)) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            assert memory(live) == 1 * GiB
            yield server, live


def vm_not_found_once(
    monkeypatch: pytest.MonkeyPatch, live: LiveState, first: Callable[[], Awaitable[None]]
) -> list[str]:
    """The next GET of the VM answers 404 after ``first``; the list says when it answered."""
    request = live.client.request
    answered: list[str] = []

    async def not_found(method: str, path: str, **kwargs: Any) -> Any:
        if method == "GET" and path.endswith("/vminstances/vm") and not answered:
            await first()
            answered.append(path)
            raise ApiError(404, "NotFound", 'vminstances.apps.cozystack.io "vm" not found')
        return await request(method, path, **kwargs)

    monkeypatch.setattr(live.client, "request", not_found)
    return answered


async def nothing() -> None:
    return None


async def test_a_late_deletion_of_the_name_before_a_recreate_never_hides_the_new_object(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    # A tenant deletes a VM and creates a larger one of the same name; the watch is late with
    # both and a repair fetches the new VM first. Were the late deletion (of the old VM, at a
    # version before the new one's) then applied, the new VM would count nothing until the
    # next read found it: the tenant's way past its budget, while the kind stood confirmed.
    async with acme_with_a_vm(tmp_path, certs, caller) as (server, live):
        server.lose_next_events(2)
        deleted = server.delete(*VMS, "tenant-acme", "vm")
        server.create(app("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.medium"}))
        await eventually(lambda: memory(live) == 4 * GiB, 15)
        watch = live._apps["vminstances"]
        watch.reflector.on_event("DELETED", deleted)  # the old VM's deletion, delivered late
        assert memory(live) == 4 * GiB
        assert live.state.record(("VMInstance", "tenant-acme", "vm")) is not None


async def test_a_not_found_older_than_the_read_never_hides_what_the_read_showed(
    tmp_path: Path, certs: Path, caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cozystack-api answers a GET from its cache, which can be behind the read (a HelmRelease
    # list from kube-apiserver): a VM deleted and created again, both lost by the watch, is
    # listed at its new version and yet not found. Taken as a deletion, its tombstone (at the
    # read's revision) then ignored the VM at every later repair: it counted nothing for good.
    async with acme_with_a_vm(tmp_path, certs, caller) as (server, live):
        answered = vm_not_found_once(monkeypatch, live, nothing)
        server.lose_next_events(2)
        server.delete(*VMS, "tenant-acme", "vm")
        server.create(app("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.small"}))
        await eventually(lambda: answered, 15)
        assert memory(live) == 1 * GiB, "the VM the read showed is not dropped"
        await eventually(lambda: memory(live) == 2 * GiB, 15)


async def test_an_object_created_again_while_its_deletion_is_fetched_is_not_deleted(
    tmp_path: Path, certs: Path, caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watch lost a VM's deletion; the tenant creates it again (larger) while the repair's
    # GET is in flight, and the watch delivers that at once. The GET, answered before the
    # create, says 404: taken as the deletion of the new VM (tombstoned at its version), it
    # removed it, and every later event and repair of it was ignored: it counted nothing.
    async with acme_with_a_vm(tmp_path, certs, caller) as (server, live):

        async def created_again() -> None:
            server.create(app("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.small"}))
            await eventually(lambda: memory(live) == 2 * GiB, 5)

        answered = vm_not_found_once(monkeypatch, live, created_again)
        server.lose_next_events(1)
        server.delete(*VMS, "tenant-acme", "vm")
        await eventually(lambda: answered, 15)
        await eventually(lambda: "VMInstance" not in live._resyncing, 5)  # repair done
        assert memory(live) == 2 * GiB
        repaired = live._last_read["VMInstance"]
        await eventually(  # the next read of the kind, its repairs done: it keeps the VM
            lambda: (
                live._last_read["VMInstance"] > repaired and "VMInstance" not in live._resyncing
            ),
            15,
        )
        assert memory(live) == 2 * GiB


async def test_a_tenant_deleting_objects_during_reads_never_keeps_the_kind_unconfirmed(
    tmp_path: Path, certs: Path, caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tenant that deletes a VM of its own while a read of the kind is under way (created,
    # listed, deleted, the deletion delivered): the read shows a VM the state rightly no longer
    # holds. Taken for one the watch lost, it was fetched (404) and the read left the kind
    # unconfirmed; with a deletion at every read, every ledger wait on the kind ran to its
    # bound, for every tenant of the pools waiting on it.
    async with acme_with_a_vm(tmp_path, certs, caller) as (server, live):
        list_page = live.client.list_page
        churned: list[str] = []

        def holds(name: str) -> bool:
            return ("tenant-acme", name) in live._held.get("VMInstance", {})

        async def churning(path: str, **kwargs: Any) -> Any:
            if not path.endswith("/vminstances"):
                return await list_page(path, **kwargs)
            name = f"churn{len(churned)}"
            churned.append(name)
            server.create(app("VMInstance", "tenant-acme", name, MICRO))
            await eventually(lambda: holds(name), 5)
            listed = await list_page(path, **kwargs)
            server.delete(*VMS, "tenant-acme", name)
            await eventually(lambda: not holds(name), 5)
            return listed

        monkeypatch.setattr(live.client, "list_page", churning)
        await eventually(lambda: len(churned) >= 1, 15)
        written = int(server.resource_version)
        await eventually(lambda: live._confirmed.get("VMInstance", 0) >= written, 10)
        assert live.repairs.get("VMInstance", 0) == 0


async def test_a_stale_fetch_answered_across_a_relist_never_resurrects_a_deleted_object(
    tmp_path: Path, certs: Path, caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A repair's GET (cozystack-api answers it from its cache) is in flight when the tenant
    # deletes the VM and the watch lists the kind afresh (its history compacted). The list
    # drops the remembered deletions; the GET's stale answer, the VM as it was, was then
    # applied as news: a deleted VM counted against the pool (its siblings refused) until
    # the next read of the kind noticed it.
    async with acme_with_a_vm(tmp_path, certs, caller, watch_resync_seconds=0) as (server, live):
        watch = live._apps["vminstances"]
        request = live.client.request

        async def stale_across_a_relist(method: str, path: str, **options: Any) -> Any:
            if not (method == "GET" and path.endswith("/vminstances/vm")):
                return await request(method, path, **options)
            stale = await request(method, path, **options)  # the cache's answer
            relists = watch.reflector.relists
            server.silence_watches()  # the relist, not the watch, tells of the deletion
            server.delete(*VMS, "tenant-acme", "vm")
            server.compact()
            server.drop_watches()
            await eventually(
                lambda: watch.reflector.relists > relists and watch.reflector.listed, 15
            )
            await eventually(lambda: memory(live) == 0, 15)
            return stale

        monkeypatch.setattr(live.client, "request", stale_across_a_relist)
        key = ("tenant-acme", "vm")
        await live.repair("VMInstance", watch, [key], 10**9, set())
        assert live.state.record(("VMInstance", "tenant-acme", "vm")) is None
        assert memory(live) == 0


async def test_a_relist_between_a_read_and_its_repairs_never_resurrects_a_deleted_object(
    tmp_path: Path, certs: Path, caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watch lost a VM's growth, so a read finds it behind; before the read's repairs run,
    # the tenant deletes the VM and the watch lists the kind afresh, forgetting the deletions.
    # The read still wants the VM at the version it listed, and the fetch answered from
    # cozystack-api's cache (the VM before its deletion) brought it back into the count.
    async with acme_with_a_vm(tmp_path, certs, caller, watch_resync_seconds=0) as (server, live):
        watch = live._apps["vminstances"]
        request, read_kind = live.client.request, live._read_kind
        server.lose_next_events(1)
        server.patch(*VMS, "tenant-acme", "vm", {"spec": {"instanceType": "u1.small"}})
        stale = await request("GET", f"{watch.reflector.resource.path('tenant-acme')}/vm")

        async def read_then_relist(kind: str, reflector: Any) -> Any:
            read = await read_kind(kind, reflector)
            relists = reflector.relists
            server.silence_watches()  # the relist, not the watch, tells of the deletion
            server.delete(*VMS, "tenant-acme", "vm")
            server.compact()
            server.drop_watches()
            await eventually(lambda: reflector.relists > relists and reflector.listed, 15)
            return read

        async def cached(method: str, path: str, **options: Any) -> Any:
            if method == "GET" and path.endswith("/vminstances/vm"):
                return stale  # the cache's answer, from before the deletion
            return await request(method, path, **options)

        monkeypatch.setattr(live, "_read_kind", read_then_relist)
        monkeypatch.setattr(live.client, "request", cached)
        await live._consistent_read("VMInstance")
        assert live.state.record(("VMInstance", "tenant-acme", "vm")) is None
        assert memory(live) == 0

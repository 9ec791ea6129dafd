"""Consistent reads are spaced by the bytes they list as well as by objects, and resyncs of
different kinds never run together.

Expiring entries drive consistent reads: with fat VMDisks stored, three VMDisk CREATEs a second
admitted but never stored kept VMDisk reads going at some 45 MB/s, spaced by object count only;
and every kind, listed together at the first sync, was resynced together every 300 s.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from webhook.kube.client import KubeClient, ResourceRef
from webhook.state.live import APPS_GROUP, APPS_VERSION, AppWatch, LiveSettings, LiveState

FAT_READ = 40 * 10**6  # bytes one read of the fat kind lists


class Client:
    """Answers every list with one page of three releases, as large as the test says."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lists = 0

    async def list_page(self, path: str, **_: Any) -> tuple[dict[str, Any], int]:
        self.lists += 1
        items = [
            {"metadata": {"name": f"d{i}", "namespace": "tenant-a", "resourceVersion": "4"}}
            for i in range(3)
        ]
        return {"metadata": {"resourceVersion": "9"}, "items": items}, self.size


def live_of(client: Client, *kinds: tuple[str, str], **settings: Any) -> LiveState:
    live = LiveState(cast(KubeClient, client), LiveSettings(**settings))
    for kind, plural in kinds:
        reflector = live._app_reflector(ResourceRef(APPS_GROUP, APPS_VERSION, plural), kind)
        reflector.listed = True
        live._apps[plural] = AppWatch(kind, reflector, cast("asyncio.Task[None]", None))
    return live


async def test_expiring_entries_drive_reads_spaced_by_the_bytes_they_list() -> None:
    client = Client(FAT_READ)
    live = live_of(client, ("VMDisk", "vmdisks"), resync_seconds=1.0)
    watch = live._apps["vmdisks"]
    _, items = await live._read_kind("VMDisk", watch.reflector)
    assert len(items) == 3
    gap = live.read_gap("VMDisk")
    assert gap == FAT_READ / live.settings.confirm_bytes  # ~9.5 s, not 3 objects' 0.5 s
    reads: list[str] = []

    async def read(kind: str) -> None:
        reads.append(kind)

    live._consistent_read = read  # type: ignore[method-assign]
    live.resync_due(0.0)  # the list itself was the first read
    live.resync_due(gap - 0.5)
    await asyncio.sleep(0)
    assert reads == []
    live.resync_due(gap + 0.5)
    await asyncio.sleep(0)
    assert reads == ["VMDisk"]


async def test_resyncs_of_different_kinds_never_run_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = live_of(Client(1000), ("VMDisk", "vmdisks"), ("VMInstance", "vminstances"))
    release = asyncio.Event()
    running: list[str] = []
    most = 0

    async def read(kind: str) -> None:
        nonlocal most
        running.append(kind)
        most = max(most, len(running))
        await release.wait()
        running.remove(kind)

    monkeypatch.setattr(live, "_consistent_read", read)
    live.resync_due(0.0)  # both listed together: both due together
    live.resync_due(301.0)
    live.resync_due(302.0)
    await asyncio.sleep(0)
    assert len(running) == 1
    first = running[0]
    release.set()
    await asyncio.gather(*live._resyncing.values())
    release.clear()
    live.resync_due(303.0)
    await asyncio.sleep(0)
    assert len(running) == 1
    assert running[0] != first  # the other kind, once the first is done
    release.set()
    await asyncio.gather(*live._resyncing.values())
    assert most == 1

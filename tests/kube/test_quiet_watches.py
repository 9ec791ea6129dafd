"""A quiet kind's watch, against a real kube-apiserver, never stops being synced.

kube-apiserver sends no bookmark on a watch of a kind nothing writes, so such a watch is
silent for as long as nothing changes: instance types, ApplicationDefinitions, and most
application kinds, most of the time. A reflector takes a watch silent past its read timeout
for dead, and while it reconnects the state is unsynced and every admission is refused. So each
watch asks the server to end it within two thirds of the read timeout, and is reopened at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.cluster import kube_client
from tests.realkube import real_apiserver
from webhook.kube.client import ResourceRef
from webhook.kube.reflector import Reflector

CONFIGMAPS = ResourceRef("", "v1", "configmaps")
READ_TIMEOUT = 3.0


def test_each_watch_asks_the_server_to_end_it_before_its_read_timeout() -> None:
    def timeout(read: float, watch: int) -> int:
        reflector = Reflector(
            None,  # type: ignore[arg-type]  # never asked: nothing is listed or watched
            CONFIGMAPS,
            on_replace=lambda items: None,
            on_event=lambda kind, obj: None,
            read_timeout=read,
            watch_timeout=watch,
        )
        return reflector.server_timeout

    assert timeout(90.0, 300) == 60
    assert timeout(90.0, 30) == 30  # a shorter watch timeout stands
    assert timeout(0.5, 300) == 1  # whole seconds: the server takes no less


@pytest.mark.kube
async def test_a_watch_of_a_kind_nothing_writes_stays_synced_past_its_read_timeout(
    tmp_path: Path,
) -> None:
    # Before, the watch asked for the 300 s default: silent at 3 s, declared dead, and unsynced
    # while it reconnected, each time, with a backoff that grew because nothing was heard.
    with real_apiserver(tmp_path / "kube") as kubeconfig:
        async with kube_client(kubeconfig) as client:
            reflector = Reflector(
                client,
                CONFIGMAPS,
                namespace="kube-public",  # nothing writes its configmaps after start-up
                on_replace=lambda items: None,
                on_event=lambda kind, obj: None,
                read_timeout=READ_TIMEOUT,
            )
            stop = asyncio.Event()
            task = asyncio.create_task(reflector.run(stop))
            try:
                for _ in range(200):
                    if reflector.synced:
                        break
                    await asyncio.sleep(0.05)
                assert reflector.synced, reflector.last_error
                unsynced = 0
                for _ in range(int(READ_TIMEOUT * 3 / 0.05)):  # three read timeouts
                    await asyncio.sleep(0.05)
                    unsynced += not reflector.synced
                assert unsynced == 0, reflector.last_error
                assert reflector.last_error == ""
            finally:
                stop.set()
                await task

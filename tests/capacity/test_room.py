"""The room figure is read out of band from nodes and pods, and switched off by a 403."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.apiserver.server import EmulatedAPIServer
from tests.capacity.test_rebalance import register, seed_objects
from webhook.capacity.room import RoomWatch
from webhook.kube.client import KubeClient

Mi = 1024**2


async def test_the_largest_free_node_memory_is_read_and_kept_coarse(tmp_path: Path) -> None:
    async with EmulatedAPIServer() as api:
        register(api)
        for obj in seed_objects():
            api.create(obj)
        client = KubeClient.from_kubeconfig(str(api.kubeconfig(tmp_path / "kubeconfig")))
        try:
            # 13002Mi free on worker-blue, kept only as coarse as answers use it: 16Gi.
            assert await RoomWatch(client).read() == 16384 * Mi
        finally:
            await client.close()


async def test_without_read_access_there_is_no_figure_and_so_no_warning(tmp_path: Path) -> None:
    async with EmulatedAPIServer() as api:
        register(api)
        for obj in seed_objects():
            api.create(obj)
        client = KubeClient.from_kubeconfig(str(api.kubeconfig(tmp_path / "kubeconfig")))
        watch = RoomWatch(client, interval=0.01)
        watch.book.largest = 1  # a figure from before the access was taken away
        api.fail_next(1, 403)
        stop = asyncio.Event()
        task = asyncio.create_task(watch.run(stop))
        try:
            await asyncio.sleep(0.2)
            assert watch.book.largest is None
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await client.close()

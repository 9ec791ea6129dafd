"""The reflector behind cozystack-api's watch, which answers from its own cache: a watch from
resourceVersion ``r`` starts with every object newer than ``r`` as ``ADDED``, in name order, not
in resourceVersion order (seen live at cozystack 3c780acd: from 289, ``c`` 294, ``e`` 296, ``f``
293), then follows changes. A stream that breaks inside that burst has delivered a newer object
before an older one it never got to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from tests.kube.reflecting import Mirror, reflector, running
from tests.waiting import eventually
from webhook.kube.client import WatchTimeout


class CachedWatchClient:
    """cozystack-api's list and watch of one kind: a list at the largest resourceVersion among
    its items, a watch from ``r`` that sends what is newer than ``r`` by name; the first watch
    breaks after its first event."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[int, int]] = {"a": (10, 1)}  # name -> (rv, value)
        self.watches: list[str] = []
        self.more = asyncio.Event()

    def _obj(self, name: str) -> dict[str, Any]:
        rv, value = self.objects[name]
        return {
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)},
            "spec": {"value": value},
        }

    async def list_page(self, path: str, **_: Any) -> tuple[dict[str, Any], int]:
        top = max(rv for rv, _ in self.objects.values())
        items = [self._obj(n) for n in sorted(self.objects)]
        return {"metadata": {"resourceVersion": str(top)}, "items": items}, 100

    async def watch(
        self, path: str, *, resource_version: str = "", **_: Any
    ) -> AsyncIterator[dict[str, Any]]:
        self.watches.append(resource_version)
        if len(self.watches) == 1:
            await self.more.wait()  # the tenant writes while this watch is open...
            raise WatchTimeout("the stream broke")  # ... and it breaks before they are sent
        since = int(resource_version or 0)
        for name in sorted(self.objects):
            if self.objects[name][0] > since:
                yield {"type": "ADDED", "object": self._obj(name)}
                if len(self.watches) == 2:
                    raise WatchTimeout("the stream broke inside the burst")
        await asyncio.sleep(3600)


async def test_a_watch_broken_inside_cozystack_apis_name_ordered_burst_loses_no_object() -> None:
    client = CachedWatchClient()
    mirror = Mirror()
    watcher = reflector(client, mirror, read_timeout=30.0)  # type: ignore[arg-type]
    async with running(watcher):
        await eventually(lambda: watcher.synced and client.watches)
        client.objects["z"] = (11, 7)  # created first (rv 11), named last
        client.objects["b"] = (12, 2)  # then b (rv 12), named before it
        client.more.set()
        # the resumed watch from 10 sends b (12) and breaks; z (11) never came
        await eventually(lambda: len(client.watches) >= 3)
        await asyncio.sleep(0.5)
        assert mirror.items.get("z") == 7, (client.watches, watcher.resource_version, mirror.items)
    assert mirror.items == {"a": 1, "b": 2, "z": 7}

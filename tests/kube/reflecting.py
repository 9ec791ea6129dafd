"""Builders for the reflector's tests: Things (served by the ``server`` fixture of this folder),
the view a consumer keeps of them, a reflector of them running (and synced) for the length of a
block, and a client that lists one empty page, for fakes of the watch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from tests.waiting import eventually
from webhook.kube.client import KubeClient, ResourceRef
from webhook.kube.reflector import Reflector

THINGS = ResourceRef("example.io", "v1", "things")


def thing(name: str, value: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1",
        "kind": "Thing",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"value": value},
    }


class Mirror:
    """What a consumer sees: name -> spec.value."""

    def __init__(self) -> None:
        self.items: dict[str, int] = {}
        self.replaces = 0

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.replaces += 1
        self.items = {i["metadata"]["name"]: i["spec"]["value"] for i in items}

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.items.pop(obj["metadata"]["name"], None)
        else:
            self.items[obj["metadata"]["name"]] = obj["spec"]["value"]


def reflector(client: KubeClient, mirror: Mirror, **kwargs: Any) -> Reflector:
    options: dict[str, Any] = {"read_timeout": 0.5, "watch_timeout": 2, "backoff": (0.02, 0.1)}
    return Reflector(
        client, THINGS, on_replace=mirror.replace, on_event=mirror.event, **{**options, **kwargs}
    )


async def run(reflector: Reflector) -> tuple[asyncio.Event, asyncio.Task[None]]:
    stop = asyncio.Event()
    return stop, asyncio.create_task(reflector.run(stop))


@asynccontextmanager
async def running(reflector: Reflector) -> AsyncIterator[asyncio.Task[None]]:
    """``reflector`` running until the block ends, then stopped and awaited; its task."""
    stop, task = await run(reflector)
    try:
        yield task
    finally:
        stop.set()
        await task


@asynccontextmanager
async def following(client: KubeClient, **options: Any) -> AsyncIterator[tuple[Reflector, Mirror]]:
    """A :func:`reflector` (with ``options``) into a new mirror, running and synced when the
    block begins, stopped when it ends."""
    mirror = Mirror()
    watcher = reflector(client, mirror, **options)
    async with running(watcher):
        await eventually(lambda: watcher.synced)
        yield watcher, mirror


class EmptyList:
    """A client whose lists are one empty page at version 5; its watches are a subclass's,
    which counts them in :attr:`watches`."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0

    async def list_page(self, path: str, **_: Any) -> tuple[dict[str, Any], int]:
        self.lists += 1
        return {"metadata": {"resourceVersion": "5"}, "items": []}, 40

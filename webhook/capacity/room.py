"""The largest free node memory, re-read out of band for the admission warning on room.

Every ``interval`` seconds one LIST of nodes and one of pods feed
:func:`~webhook.core.capacity.room.largest_free`, kept only as coarse as a warning uses it
(:func:`~webhook.core.capacity.room.coarse_room`). It is off unless the server may read nodes and
pods: a 403 turns it off (no warning is ever given from a guess) and it asks again much later. Any
other failure clears the figure until the next good read, so a warning never rests on a stale
snapshot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Final

from webhook.core.capacity.room import RoomBook, coarse_room, largest_free
from webhook.core.capacity.snapshot_objects import snapshot_from_objects
from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.waits import sleep_unless_stopped

__all__ = ["RoomWatch"]

log = logging.getLogger(__name__)

NODES: Final = ResourceRef("", "v1", "nodes", namespaced=False)
PODS: Final = ResourceRef("", "v1", "pods")
FORBIDDEN_RETRY: Final = 600.0


class RoomWatch:
    def __init__(self, client: KubeClient, *, interval: float = 60.0) -> None:
        self.client = client
        self.interval = interval
        self.book = RoomBook()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            wait = self.interval
            try:
                self.book.largest = await self.read()
            except ApiError as exc:
                self.book.largest = None
                if exc.status == 403:
                    log.info("room warnings off: no read access to nodes and pods")
                    wait = FORBIDDEN_RETRY
                else:
                    log.warning("reading node room failed", extra={"error": str(exc)})
            except Exception:  # one bad read never stops the loop
                self.book.largest = None
                log.exception("reading node room failed")
            if await sleep_unless_stopped(wait, stop):
                return

    async def read(self) -> int | None:
        objects: list[Mapping[str, Any]] = []
        for ref, kind in ((NODES, "Node"), (PODS, "Pod")):
            listed = await self.client.request("GET", ref.path())
            items = listed.get("items")
            for item in items if isinstance(items, list) else []:
                if isinstance(item, Mapping):
                    objects.append({**item, "kind": kind})
        # Only the coarse figure is kept: nothing finer can reach an answer.
        return coarse_room(largest_free(snapshot_from_objects(objects)))

"""The cluster's ResourceQuotas, watched for the pod-level guard's warnings.

One reflector over ``resourcequotas`` in every namespace feeds a :class:`QuotaBook`. The guard
only adds warnings, so readiness never waits for it: until the first list arrives the book is
empty and no warning is given. A quota that does not parse is kept with the keys that do
(:func:`~webhook.core.capacity.guard.quota_from_object`), and a bad event is logged and skipped,
never raised out of the reflector.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from webhook.core.capacity.guard import QuotaBook, quota_from_object
from webhook.kube.client import KubeClient, ResourceRef
from webhook.kube.reflector import Reflector

__all__ = ["RESOURCE_QUOTAS", "QuotaWatch"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]

RESOURCE_QUOTAS: Final = ResourceRef("", "v1", "resourcequotas")


class QuotaWatch:
    """Keeps a :class:`QuotaBook` in step with the cluster's ResourceQuotas."""

    def __init__(self, client: KubeClient, *, read_timeout: float = 90.0) -> None:
        self.book = QuotaBook()
        self.reflector = Reflector(
            client,
            RESOURCE_QUOTAS,
            on_replace=self._replace,
            on_event=self._event,
            read_timeout=read_timeout,
        )

    async def run(self, stop: asyncio.Event) -> None:
        await self.reflector.run(stop)

    def _replace(self, items: list[Obj]) -> None:
        self.book.replace((_namespace(item), quota_from_object(item)) for item in items)

    def _event(self, event_type: str, obj: Obj) -> None:
        try:
            if event_type == "DELETED":
                self.book.forget(_namespace(obj), str(obj.get("metadata", {}).get("name", "")))
            else:
                self.book.observe(_namespace(obj), quota_from_object(obj))
        except Exception:  # one bad object never stops the watch
            log.exception("skipping a ResourceQuota event")


def _namespace(obj: Obj) -> str:
    metadata = obj.get("metadata")
    return str(metadata.get("namespace", "")) if isinstance(metadata, dict) else ""

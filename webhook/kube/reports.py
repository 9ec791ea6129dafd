"""Writing the policy reports: one OpenReports ``Report`` per tenant namespace, by the leader.

The content is computed in the core (:mod:`webhook.core.admission.policy_reports`); this adapter
only compares it with what is stored and writes the reports that differ, so an unchanged cluster
costs one list per round and no write. Reports come one at a time and stored ones are kept only
as a digest of their content and a resourceVersion, so memory stays a few bytes per namespace
whatever the reports hold. The list selects by name (``metadata.name`` is a field
selector every resource supports): whatever else a tenant stores in its namespace, decoy
reports included, is never read. A stored report that differs (a tenant edited it, or the
state changed) is replaced with the resourceVersion read; a conflict or an API error leaves
that one namespace for the next round, and the others are still written. When the OpenReports
CRD is not installed (404) or the server may not read reports (403), the writer says so once
and looks again every :data:`ABSENT_SECONDS`: reports are an operator's view, never a reason
for the webhook to fail.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import AsyncIterable, Callable, Iterable, Mapping
from typing import Any, Final

from webhook.core.admission.policy_reports import REPORT_NAME, report_content
from webhook.kube.client import ApiError, KubeClient, ResourceRef, ResponseTooLarge

__all__ = ["ABSENT_SECONDS", "PAGE", "PAGE_BYTES", "REPORTS", "ReportWriter"]

log = logging.getLogger(__name__)

REPORTS: Final = ResourceRef("openreports.io", "v1alpha1", "reports")
ABSENT_SECONDS: Final = 600.0
# Reports listed per page, and the most bytes one page may take: a report may be up to etcd's
# 1.5 MiB (a tenant may write its own, in every namespace it has), so 50 of them could be 75 MiB
# to read and parse at once. A page past PAGE_BYTES is not read; it is asked again at half the
# size (down to one report, which always fits) and the size grows back after a page that fits.
PAGE: Final = 50
PAGE_BYTES: Final = 4 * 1024 * 1024

Obj = dict[str, Any]


class ReportWriter:
    """Keeps every tenant namespace's ``Report`` equal to the computed one."""

    def __init__(self, client: KubeClient, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.clock = clock
        self.written = 0  # reports created or replaced, since start
        # Rounds that went through every namespace, counted after their writes are in
        # ``written``: a reader that sees it grow knows the round's writes are all counted.
        self.rounds = 0
        self.absent = ""  # why reports cannot be written now ("" when they can)
        self._retry_at = 0.0

    async def reconcile(
        self, reports: Iterable[tuple[str, Obj]] | AsyncIterable[tuple[str, Obj]]
    ) -> int:
        """Write the reports (namespace, report) that differ from the stored ones; returns how
        many were written."""
        if self.absent and self.clock() < self._retry_at:
            return 0
        try:
            stored = await self._stored()
        except ApiError as exc:
            if exc.status not in (403, 404):  # unreachable, 5xx: the next round tries again
                log.info("policy reports deferred", extra={"fields": {"error": str(exc)}})
                return 0
            if not self.absent:
                log.warning(
                    "policy reports not written",
                    extra={
                        "fields": {
                            "error": str(exc),
                            "status": exc.status,
                            "hint": "install the OpenReports CRD (reports.openreports.io) "
                            "and grant the webhook its reports",
                        }
                    },
                )
            self.absent = str(exc)
            self._retry_at = self.clock() + ABSENT_SECONDS
            return 0
        if self.absent:
            log.info("policy reports written again")
            self.absent = ""
        written = 0
        async for namespace, report in _each(reports):
            old = stored.get(namespace)
            if old is not None and old[0] == digest(report):
                continue
            try:
                await self._write(report, old[1] if old is not None else None)
            except ApiError as exc:
                log.info(
                    "policy report deferred",
                    extra={"fields": {"namespace": namespace, "error": str(exc)}},
                )
                continue
            written += 1
        self.written += written
        self.rounds += 1
        return written

    async def _stored(self) -> dict[str, tuple[str, str]]:
        """Our report in every namespace as (content digest, resourceVersion); nothing else is
        read, and no report is kept whole."""
        found: dict[str, tuple[str, str]] = {}
        params = {"fieldSelector": f"metadata.name={REPORT_NAME}"}
        size = PAGE
        while True:
            try:
                page = await self.client.request(
                    "GET",
                    REPORTS.path(),
                    params={**params, "limit": str(size)},
                    max_bytes=PAGE_BYTES,
                )
            except ResponseTooLarge:
                if size == 1:
                    raise
                size = max(1, size // 2)
                continue
            size = min(PAGE, size * 2)
            for item in page.get("items") or []:
                metadata = item.get("metadata") if isinstance(item, dict) else None
                if isinstance(metadata, dict) and metadata.get("name") == REPORT_NAME:
                    namespace = str(metadata.get("namespace") or "")
                    found[namespace] = (digest(item), str(metadata.get("resourceVersion") or ""))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return found
            params = {**params, "continue": str(token)}

    async def _write(self, report: Obj, version: str | None) -> None:
        metadata = report["metadata"]
        if version is None:
            try:
                await self.client.create(REPORTS, report)
                return
            except ApiError as exc:
                if exc.status != 409:  # AlreadyExists: stored, but not as the list showed it
                    raise
            current = await self.client.get(REPORTS, metadata["namespace"], metadata["name"])
            version = str((current.get("metadata") or {}).get("resourceVersion") or "")
        replacement = {**report, "metadata": {**metadata, "resourceVersion": version}}
        await self.client.replace(REPORTS, replacement)


def digest(report: Mapping[str, Any]) -> str:
    """A digest of what :func:`report_content` compares, stable across a round trip."""
    text = json.dumps(report_content(report), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


async def _each(
    reports: Iterable[tuple[str, Obj]] | AsyncIterable[tuple[str, Obj]],
) -> AsyncIterable[tuple[str, Obj]]:
    if isinstance(reports, AsyncIterable):
        async for item in reports:
            yield item
    else:
        for item in reports:
            yield item

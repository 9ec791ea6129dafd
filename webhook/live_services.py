"""The live side of a replica: cluster state, ledger, leader election and the periodic duties.

:class:`LiveServices` assembles what a replica serving the cluster runs beside its listener:
the live state and the ledger (both readiness conditions), the pod-level and room watches
(warnings only), the leader election, and the duties each round runs on its own so one that
fails never stops the others: certificates (the leader rotates, every replica copies the
Secret), expiry of pending charges, the record keys, the drift recount, the pool statuses and,
in a loop of their own, the leader's policy reports.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from webhook.admission.ledger import Ledger, LedgerSettings
from webhook.capacity.quotas import QuotaWatch
from webhook.capacity.room import RoomWatch
from webhook.core.admission.policy_reports import (
    ReportContext,
    assemble_report,
    report_findings,
    report_namespaces,
)
from webhook.core.admission.state import ReservationState, recount
from webhook.kube.client import KubeClient
from webhook.kube.lease import LeaderElector
from webhook.kube.reports import ReportWriter
from webhook.settings import Settings
from webhook.state.live import LiveSettings, LiveState
from webhook.tenancy.record_keys import RecordKeySecret
from webhook.tls.rotation import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS, CertificateRotator
from webhook.waits import sleep_unless_stopped

__all__ = ["CERTIFICATE_SECONDS", "DRIFT_SECONDS", "REPORT_PART", "REPORT_SECONDS", "LiveServices"]

log = logging.getLogger("webhook.server")  # its lines are the server's, which runs it

# How often a replica copies the TLS Secret into its certificate directory. The kubelet
# refreshes a mounted Secret within about a minute; copying more often only adds API reads.
# How often the periodic duties run. Certificates change rarely; the drift recount walks every
# application, so it runs seldom and never on the admission path's cadence.
CERTIFICATE_SECONDS: Final = 30.0
DRIFT_SECONDS: Final = 300.0
# How often the leader recomputes the policy reports (each a full walk of the state, yielding
# to admission between namespaces); a report is written only when its content changed.
REPORT_SECONDS: Final = 60.0
REPORT_PART: Final = 500  # applications evaluated between two yields to the event loop


class LiveServices:
    """The live side of a replica: cluster state, ledger, leader election, and the leader's
    duties (pool statuses, expiry of pending charges, the drift check)."""

    def __init__(self, client: KubeClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.live = LiveState(
            client,
            LiveSettings(
                namespace=settings.namespace,
                read_timeout=settings.watch_read_timeout,
                resync_seconds=settings.watch_resync_seconds,
            ),
        )
        self.ledger = Ledger(
            client,
            self.live,
            LedgerSettings(
                replica=settings.replica,
                grace_seconds=settings.grace_seconds,
                store_seconds=settings.api_request_timeout_seconds,
                read_timeout=settings.watch_read_timeout,
                dry_run_holds=settings.dry_run_holds,
                escrow=settings.escrow,
                namespace_share=settings.ledger_namespace_share,
            ),
        )
        self.live.required["ledger (tenantreservations)"] = lambda: self.ledger.synced
        # The pod-level guard: warnings only, so readiness does not wait for it.
        self.quotas = QuotaWatch(client, read_timeout=settings.watch_read_timeout)
        # "No node has room right now": off unless the operator grants the server read access
        # to nodes and pods and sets WEBHOOK_ROOM_WARNINGS=on (see "Making room for a VM").
        self.room: RoomWatch | None = None
        if os.environ.get("WEBHOOK_ROOM_WARNINGS", "off") == "on":
            self.room = RoomWatch(client)
        self.elector = LeaderElector(
            client,
            namespace=settings.namespace,
            name=settings.lease_name,
            identity=settings.replica,
        )
        self.drift = 0
        self.record_keys_read = 0.0  # Unix time of the last good read of the record keys
        self.record_keys = RecordKeySecret(
            client,
            namespace=settings.namespace,
            name=os.environ.get("WEBHOOK_RECORD_KEY_SECRET", "reservation-webhook-records"),
        )
        # Self-managed certificates unless cert-manager issues them (the cert-manager overlay).
        self.rotator: CertificateRotator | None = None
        if os.environ.get("WEBHOOK_CERTS", "self") != "cert-manager":
            self.rotator = CertificateRotator(
                client,
                namespace=settings.namespace,
                secret=os.environ.get("WEBHOOK_TLS_SECRET", "reservation-webhook-tls"),
                service="reservation-webhook",
                webhooks=[
                    (MUTATING_WEBHOOKS, "reservation-webhook"),
                    (VALIDATING_WEBHOOKS, "reservation-webhook"),
                ],
            )
        # OpenReports policy reports, one per tenant namespace (see "Policy reports").
        self.reports: ReportWriter | None = None
        if os.environ.get("WEBHOOK_POLICY_REPORTS", "on") != "off":
            self.reports = ReportWriter(client)
        self.report_seconds = REPORT_SECONDS
        self._last: dict[str, float] = {}  # duty -> when it last ran (monotonic)
        self._was_leader = False
        self.failures: dict[str, int] = {}  # duty -> how often it raised, since start
        self.on_failure: Callable[[str], None] = lambda duty: None  # e.g. count in a metric

    async def run(self, stop: asyncio.Event) -> None:
        # The record keys before any application is observed: records are verified as they come.
        keys = await self.record_keys.bootstrap(stop)
        if keys is None:
            return
        self.live.use_keys(keys)
        self.record_keys_read = time.time()
        loops = [
            asyncio.create_task(loop)
            for loop in (
                self.live.run(stop),
                self.ledger.reflector.run(stop),
                self.quotas.run(stop),
                *([self.room.run(stop)] if self.room is not None else []),
                self.elector.run(stop),
                self._duties(stop),
                self._reports(stop),
                *([self._escrow(stop)] if self.settings.escrow else []),
            )
        ]
        try:
            ended = await asyncio.gather(*loops, return_exceptions=True)
        finally:
            # Every loop has ended (cancelled, if this is) before :meth:`close` may close the
            # client: none is left running on a closed client, or holding connections past
            # the process.
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome

    async def close(self) -> None:
        """Close the cluster client: once :meth:`run` has ended and the requests being
        answered have drained (an admission still answering during the drain writes its
        pool's object through it)."""
        await self.client.close()

    async def _duties(self, stop: asyncio.Event) -> None:
        """Every round runs each duty on its own: one that raises (a bad pool, a bad object,
        a failed write) is logged and counted, and the others, and the next round, still run."""
        while not stop.is_set():
            leader = self.elector.is_leader
            became_leader, self._was_leader = leader and not self._was_leader, leader
            await self._guarded("certificates", self._certificates(leader, became_leader))
            await self._guarded("expiry", _now(self.ledger.sweep))
            if self._due("record-keys", CERTIFICATE_SECONDS):
                await self._guarded("record-keys", self._record_keys())
            state = self.live.state
            if state.synced:
                if self._due("drift", DRIFT_SECONDS):
                    await self._guarded("recount", _now(self._recount, state))
                if leader:
                    await self._guarded("pool-status", self.ledger.reconcile())
            await sleep_unless_stopped(self.ledger.settings.reconcile_seconds, stop)

    async def _escrow(self, stop: asyncio.Event) -> None:
        """With ``--escrow on``: fold, refill, renew and return this replica's slices and
        reclaim expired ones, off the admission path (docs/escrow.md)."""
        while not stop.is_set():
            if self.live.state.synced:
                await self._guarded("escrow", self.ledger.escrow())
            await self.ledger.escrow_rest(stop)

    async def _record_keys(self) -> None:
        """Every replica: follow a rotation of the record-key Secret."""
        keys = await self.record_keys.read()
        if keys is not None:
            self.record_keys_read = time.time()
        if keys is not None and keys != self.live.keys:
            self.live.use_keys(keys)
            log.info(
                "record keys reloaded",
                extra={
                    "fields": {
                        "current": keys.current_id,
                        "published": len(keys.published),
                        "previous": len(keys.previous),
                    }
                },
            )

    async def refresh_record_keys(self, kid: str) -> None:
        """A request carries a record signed with key ``kid``, unknown here: re-read at once."""
        keys = await self.record_keys.reread_for(kid, self.live.keys)
        if keys is not None:
            self.live.use_keys(keys)

    async def reload_record_keys(self) -> None:
        """Re-read the record keys now (what each round of duties does)."""
        await self._record_keys()

    async def _reports(self, stop: asyncio.Event) -> None:
        """The leader's policy reports, in a loop of their own: however many reports a round
        writes (tenants may edit theirs), the other duties never wait for it."""
        if self.reports is None:
            return
        while not stop.is_set():
            if (
                self.elector.is_leader
                and self.live.state.synced
                and self._due("policy-reports", self.report_seconds)
            ):
                await self._guarded("policy-reports", self._policy_reports(self.reports))
            await sleep_unless_stopped(self.ledger.settings.reconcile_seconds, stop)

    async def _policy_reports(self, writer: ReportWriter) -> None:
        """The leader: every tenant namespace's Report, computed a part at a time so admission
        is never held for the whole walk, and handed to the writer one by one."""
        state = self.live.state
        keys = report_namespaces(state)
        context = ReportContext.of(state, self.quotas.book, keys)

        async def reports() -> AsyncIterator[tuple[str, dict[str, Any]]]:
            for namespace, apps in keys.items():
                findings = []
                for start in range(0, len(apps), REPORT_PART):
                    part = apps[start : start + REPORT_PART]
                    findings += report_findings(self.live.state, namespace, part, context)
                    await asyncio.sleep(0)
                yield namespace, assemble_report(namespace, findings)

        await writer.reconcile(reports())

    def _recount(self, state: ReservationState) -> None:
        self.drift = len(recount(state))

    async def _guarded(self, duty: str, work: Awaitable[object]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            self.failures[duty] = self.failures.get(duty, 0) + 1
            log.exception("periodic duty failed", extra={"fields": {"duty": duty}})
            try:
                self.on_failure(duty)
            except Exception:  # counting must never stop the loop either
                log.exception("counting a failed duty failed")

    def _due(self, duty: str, seconds: float, *, now: bool = False) -> bool:
        """Whether ``duty`` should run (at most every ``seconds``); records that it does."""
        clock = time.monotonic()
        last = self._last.get(duty)
        if now or last is None or clock - last >= seconds:
            self._last[duty] = clock
            return True
        return False

    async def _certificates(self, leader: bool, became_leader: bool) -> None:
        """The leader rotates (at once when it takes over); every replica copies the Secret
        into its certificate directory."""
        if self.rotator is None:
            return
        if leader and self._due("rotate", CERTIFICATE_SECONDS, now=became_leader):
            await self.rotator.reconcile()
        if self._due("files", CERTIFICATE_SECONDS):
            await self.rotator.sync_files(Path(self.settings.cert_dir))


async def _now(function: Callable[..., object], *args: object) -> None:
    """Run a synchronous duty as an awaitable, so one guard covers both kinds."""
    function(*args)

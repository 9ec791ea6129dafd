"""Running the webhook: TLS listener, certificate reloading, live services, graceful shutdown.

:class:`WebhookServer` wires the HTTP application to a TLS listener whose certificate pair is
reloaded when the files change on disk, marks the server ready once it serves, and on SIGTERM
stops accepting, lets in-flight requests finish (bounded by ``shutdown_seconds``) and returns.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from webhook.admission.admit import Admission
from webhook.admission.ledger import MAX_ENTRIES, Ledger, LedgerSettings
from webhook.capacity.quotas import QuotaWatch
from webhook.capacity.room import RoomWatch
from webhook.core.admission.policy_reports import (
    ReportContext,
    assemble_report,
    report_findings,
    report_namespaces,
)
from webhook.core.admission.state import ReservationState, recount
from webhook.core.capacity.guard import QuotaBook
from webhook.core.pricing.platform import Platform
from webhook.http.app import (
    create_app,
    create_metrics_app,
    edges_key,
    metrics_key,
    readiness_key,
)
from webhook.http.edges import observe_handshakes
from webhook.kube.client import KubeClient
from webhook.kube.config import connect, in_cluster
from webhook.kube.lease import LeaderElector
from webhook.kube.reports import ReportWriter
from webhook.settings import Settings
from webhook.state.live import LiveSettings, LiveState
from webhook.tenancy.record_keys import RecordKeySecret
from webhook.tls.contexts import CertificateReloader
from webhook.tls.rotation import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS, CertificateRotator
from webhook.waits import sleep_unless_stopped

__all__ = ["ListenError", "LiveServices", "WebhookServer", "serve"]

log = logging.getLogger(__name__)

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
# A connection must deliver a complete request header within this many seconds of opening (or
# of the previous response), else it is closed: a client that sends half a header, or holds an
# idle connection, cannot pin a socket. aiohttp's keep-alive timer does both: it starts when the
# connection opens and closes it if no full request has arrived by then. The API server's
# idle connections (Go's 90 s default) simply reconnect.
IDLE_SECONDS: Final = 15.0


class LiveServices:
    """The live side of a replica: cluster state, ledger, leader election, and the leader's
    duties (pool statuses, expiry of pending charges, the drift check)."""

    def __init__(self, client: KubeClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.live = LiveState(
            client,
            LiveSettings(namespace=settings.namespace, read_timeout=settings.watch_read_timeout),
        )
        self.ledger = Ledger(
            client,
            self.live,
            LedgerSettings(
                replica=settings.replica,
                grace_seconds=settings.grace_seconds,
                read_timeout=settings.watch_read_timeout,
                dry_run_holds=settings.dry_run_holds,
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
            await self.client.close()
            return
        self.live.use_keys(keys)
        self.record_keys_read = time.time()
        await asyncio.gather(
            self.live.run(stop),
            self.ledger.reflector.run(stop),
            self.quotas.run(stop),
            *([self.room.run(stop)] if self.room is not None else []),
            self.elector.run(stop),
            self._duties(stop),
            self._reports(stop),
        )
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


class WebhookServer:
    """One webhook process: the application, its TLS listener and its reloader.

    ``state`` is a fixed state (manifest directories); ``services`` the live cluster instead.
    """

    def __init__(
        self,
        state: ReservationState | Callable[[], ReservationState] | None,
        settings: Settings,
        *,
        services: LiveServices | None = None,
        quotas: QuotaBook | None = None,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self.settings = settings
        self.services = services
        if services is not None:
            self.admission = Admission(
                lambda: services.live.state,
                settings.policy,
                reserver=services.ledger,
                quotas=services.quotas.book,
                room=services.room.book if services.room is not None else None,
                refresh_keys=services.refresh_record_keys,
            )
        elif state is not None:
            self.admission = Admission(state, settings.policy, quotas=quotas)
        else:
            raise ValueError("a webhook server needs a state or live services")
        self.app = create_app(self.admission, settings)
        client_ca = Path(settings.client_ca) if settings.client_ca else None
        self.reloader = CertificateReloader(
            settings.cert_file, settings.key_file, client_ca=client_ca
        )
        observe_handshakes(self.reloader.context, self.app[edges_key])
        metrics = self.app[metrics_key]
        metrics.certificate_expiry.set_function(lambda: self.reloader.not_after.timestamp())
        if services is not None:
            services.on_failure = lambda duty: metrics.background_failures.labels(duty).inc()
            metrics.watch_live(
                first_sync=lambda: services.live.first_sync_seconds or 0.0,
                drift=lambda: float(services.drift),
                conflicts=lambda: float(services.ledger.conflicts),
                leader=lambda: services.elector.is_leader,
            )
            ledger = services.ledger
            metrics.watch_ledger(
                limits={"pool": MAX_ENTRIES, "tenant": ledger.settings.share_limit},
                share=ledger.settings.namespace_share,
                largest=ledger.largest_share,
                capped=lambda: float(len(services.live.state.capped())),
                reads=lambda: float(services.live.consistent_reads),
            )
            metrics.watch_health(
                unavailable=services.live.unavailable_kinds,
                problems=services.live.problem_counts,
            )
            services.ledger.on_batch = metrics.watch_operations(
                holds=lambda: float(services.ledger.holds()),
                record_keys_read=lambda: services.record_keys_read,
                previous_keys=lambda: float(len(services.live.keys.previous)),
            )
            self.app[readiness_key].explain = services.live.explain
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=settings.shutdown_seconds,
            keepalive_timeout=idle_seconds,
        )
        self._metrics_runner = web.AppRunner(
            create_metrics_app(metrics), handle_signals=False, access_log=None
        )
        self.metrics_port = 0
        self.served = False  # set once both listeners are up: only then is a shutdown logged
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.port = 0

    async def start(self) -> None:
        if self.services is not None:
            self._tasks.append(asyncio.create_task(self.services.run(self._stop)))
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.settings.listen_host,
            self.settings.listen_port,
            ssl_context=self.reloader.context,
        )
        await site.start()
        self.port = _bound_port(site, self.settings.listen_port)
        await self._metrics_runner.setup()
        metrics_site = web.TCPSite(
            self._metrics_runner, self.settings.metrics_host, self.settings.metrics_port
        )
        await metrics_site.start()
        self.metrics_port = _bound_port(metrics_site, self.settings.metrics_port)
        self.app[readiness_key].serving = True
        self.served = True
        self._tasks.append(
            asyncio.create_task(self.reloader.run(self.settings.cert_reload_seconds, self._stop))
        )
        log.info(
            "serving",
            extra={
                "fields": {
                    "host": self.settings.listen_host,
                    "port": self.port,
                    "metrics_port": self.metrics_port,
                    "serial": f"{self.reloader.serial:x}",
                }
            },
        )

    def stop(self) -> None:
        """Ask the server to shut down (what SIGTERM does)."""
        self._stop.set()

    async def wait(self) -> None:
        """Serve until :meth:`stop`, then shut down gracefully."""
        await self._stop.wait()
        self.app[readiness_key].serving = False
        # A server that never served has nothing to shut down in the operator's eyes: it closes
        # what did start (a listener, the cluster client) quietly, and the reason it could not
        # start stays the last line on the screen.
        if self.served:
            log.info(
                "shutting down",
                extra={"fields": {"grace_seconds": self.settings.shutdown_seconds}},
            )
        await self._runner.cleanup()
        await self._metrics_runner.cleanup()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.served:
            log.info("stopped")


async def _now(function: Callable[..., object], *args: object) -> None:
    """Run a synchronous duty as an awaitable, so one guard covers both kinds."""
    function(*args)


async def serve(
    state: ReservationState | None,
    settings: Settings,
    *,
    quotas: QuotaBook | None = None,
    load: Callable[[], ReservationState] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT: on ``state``, or on the cluster when it is ``None``.

    ``quotas`` are the ResourceQuotas read with ``state`` (the pod-level guard's warnings).
    With ``load``, the state is loaded in a thread after the listener is up, so ``/livez``
    answers while a large state loads; until it is loaded ``/readyz`` fails and every request
    is denied "state not synced" (fail closed). A load that fails stops the server.
    """
    services = None
    if state is not None:
        # The loaded state lives as long as the process: keep it out of the collector's walks
        # (a full collection over 200,000 applications pauses for tens of milliseconds).
        gc.collect()
        gc.freeze()
    current = [state if state is not None else ReservationState(Platform(), synced=False)]

    def state_of() -> ReservationState:
        return current[0]

    if state is None and load is None:
        client = connect(settings.kubeconfig) if settings.kubeconfig else in_cluster()
        services = LiveServices(client, settings)
        try:
            if services.rotator is not None:
                await services.rotator.bootstrap(Path(settings.cert_dir))
        except BaseException:
            await client.close()
            raise
    server = WebhookServer(
        state_of if state is not None or load is not None else None,
        settings,
        services=services,
        quotas=quotas,
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stop)
    try:
        await server.start()
    except OSError as exc:
        server.stop()
        await server.wait()  # closes what did start (a listener, the cluster client)
        if server.port:  # the admission port bound: the metrics port did not
            where, flag = f"{settings.metrics_host}:{settings.metrics_port}", "--metrics-listen"
        else:
            where, flag = f"{settings.listen_host}:{settings.listen_port}", "--listen"
        raise ListenError(
            f"cannot listen on {where}: {exc.strerror or exc}; pass another {flag} HOST:PORT "
            "or stop what holds it"
        ) from None
    if load is not None:
        try:
            current[0] = await asyncio.to_thread(load)
            gc.collect()  # as for a state given loaded, above
            gc.freeze()
        except BaseException:
            server.stop()
            await server.wait()
            raise
    await server.wait()


def _bound_port(site: web.TCPSite, asked: int) -> int:
    """The port a site listens on: the real one when 0 was asked for."""
    server = site._server  # the bound asyncio server
    sockets = getattr(server, "sockets", None) or ()
    return int(sockets[0].getsockname()[1]) if sockets else asked


class ListenError(OSError):
    """The listener cannot bind (the port is taken, the address is not ours)."""

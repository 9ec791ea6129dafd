"""Running the webhook: TLS listener, certificate reloading, live services, graceful shutdown.

:class:`WebhookServer` wires the HTTP application to a TLS listener whose certificate pair is
reloaded when the files change on disk, marks the server ready once it serves, and on SIGTERM
stops accepting, lets in-flight requests finish (bounded by ``shutdown_seconds``) and returns.
What it runs beside the listener on a live cluster is :mod:`webhook.live_services`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Final

from aiohttp import web

from webhook.admission.admit import Admission
from webhook.admission.ledger import MAX_ENTRIES
from webhook.core.admission.state import ReservationState
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
from webhook.kube.config import connect, in_cluster
from webhook.live_services import REPORT_PART, LiveServices
from webhook.settings import Settings
from webhook.tls.contexts import CertificateReloader

__all__ = ["REPORT_PART", "ListenError", "LiveServices", "WebhookServer", "serve"]

log = logging.getLogger(__name__)

# A connection must deliver a complete request header within this many seconds of opening (or
# of the previous response), else it is closed: a client that sends half a header, or holds an
# idle connection, cannot pin a socket. aiohttp's keep-alive timer does both: it starts when the
# connection opens and closes it if no full request has arrived by then. The API server's
# idle connections (Go's 90 s default) simply reconnect.
IDLE_SECONDS: Final = 15.0


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
                unreadable=lambda: float(services.client.unreadable_events),
            )
            ledger = services.ledger
            metrics.watch_ledger(
                limits={"pool": MAX_ENTRIES, "tenant": ledger.settings.share_limit},
                share=ledger.settings.namespace_share,
                largest=ledger.largest_share,
                capped=lambda: float(len(services.live.state.capped())),
                reads=lambda: float(services.live.consistent_reads),
                repairs=lambda: float(sum(services.live.repairs.values())),
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
            if ledger.escrowing:
                metrics.escrow.watch(ledger.slices)
                ledger.on_fallback = metrics.escrow.fell_back
                ledger.on_escrow_write = metrics.escrow.wrote
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
        # The live services stop once the requests being answered have drained: those still
        # answering decide from a state that follows the cluster and write through its client.
        self._services_stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.port = 0

    async def start(self) -> None:
        if self.services is not None:
            self._tasks.append(asyncio.create_task(self.services.run(self._services_stop)))
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
                extra={
                    "fields": {
                        "delay_seconds": self.settings.shutdown_delay_seconds,
                        "grace_seconds": self.settings.shutdown_seconds,
                    }
                },
            )
            # Not ready, still serving: calls the proxies still send here are answered.
            await asyncio.sleep(max(0.0, self.settings.shutdown_delay_seconds))
        await self._runner.cleanup()  # the requests being answered drain first
        await self._metrics_runner.cleanup()
        self._services_stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.services is not None:
            await self.services.close()
        if self.served:
            log.info("stopped")


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

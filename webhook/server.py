"""Running the webhook: TLS listener, certificate reloading, graceful shutdown.

:class:`WebhookServer` wires the HTTP application to a TLS listener whose certificate pair is
reloaded when the files change on disk, marks the server ready once it serves, and on SIGTERM
stops accepting, lets in-flight requests finish (bounded by ``shutdown_seconds``) and returns.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from aiohttp import web

from webhook.admission import Admission
from webhook.core.state import ReservationState
from webhook.http.app import create_app, metrics_key, readiness_key
from webhook.settings import Settings
from webhook.tls.contexts import CertificateReloader

__all__ = ["WebhookServer", "serve"]

log = logging.getLogger(__name__)


class WebhookServer:
    """One webhook process: the application, its TLS listener and its reloader."""

    def __init__(self, state: ReservationState, settings: Settings) -> None:
        self.settings = settings
        self.admission = Admission(state, settings.policy)
        self.app = create_app(self.admission, settings)
        client_ca = Path(settings.client_ca) if settings.client_ca else None
        self.reloader = CertificateReloader(
            settings.cert_file, settings.key_file, client_ca=client_ca
        )
        self.app[metrics_key].certificate_expiry.set_function(
            lambda: self.reloader.not_after.timestamp()
        )
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=settings.shutdown_seconds,
        )
        self._stop = asyncio.Event()
        self._reloading: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.settings.listen_host,
            self.settings.listen_port,
            ssl_context=self.reloader.context,
        )
        await site.start()
        server = site._server  # the bound asyncio server: the real port when 0 was asked for
        sockets = getattr(server, "sockets", None) or ()
        self.port = sockets[0].getsockname()[1] if sockets else self.settings.listen_port
        self.app[readiness_key].serving = True
        self._reloading = asyncio.create_task(
            self.reloader.run(self.settings.cert_reload_seconds, self._stop)
        )
        log.info(
            "serving",
            extra={
                "host": self.settings.listen_host,
                "port": self.port,
                "serial": f"{self.reloader.serial:x}",
            },
        )

    def stop(self) -> None:
        """Ask the server to shut down (what SIGTERM does)."""
        self._stop.set()

    async def wait(self) -> None:
        """Serve until :meth:`stop`, then shut down gracefully."""
        await self._stop.wait()
        self.app[readiness_key].serving = False
        log.info("shutting down", extra={"grace_seconds": self.settings.shutdown_seconds})
        await self._runner.cleanup()
        if self._reloading is not None:
            await self._reloading
        log.info("stopped")


async def serve(state: ReservationState, settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT."""
    server = WebhookServer(state, settings)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stop)
    await server.start()
    await server.wait()

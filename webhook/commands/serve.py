"""``webhook serve``: the admission webhook itself, over TLS, from manifests or a live cluster.

Its flags are the command-line spelling of the settings (``webhook.settings`` merges them with
the settings file and the environment); the handler checks what can be checked before it
listens (the platform, the per-kind modes, a cluster to read) so a bad flag fails at once, then
hands over to the server. aiohttp and the Kubernetes client load only here, when it runs.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from webhook.commands.console import EXIT_CODES
from webhook.commands.options import (
    add_overcommit,
    add_record_key,
    overcommit_flags,
    record_keys,
    require_platform,
)
from webhook.core.admission.modes import MODES

if TYPE_CHECKING:
    from webhook.core.admission.state import ReservationState
    from webhook.core.capacity.guard import QuotaBook
    from webhook.core.tenancy.records import RecordKeys

__all__ = ["add_parser"]

log = logging.getLogger("webhook")


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``serve`` to the ``webhook`` command line."""
    serve = commands.add_parser("serve", help="serve AdmissionReviews over TLS", epilog=EXIT_CODES)
    serve.add_argument(
        "--state", action="append", metavar="DIR", help="directory of manifests (repeatable)"
    )
    serve.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="read the state from this cluster (default without --state: in-cluster)",
    )
    serve.add_argument("--listen", metavar="HOST:PORT", help="default 127.0.0.1:8443")
    serve.add_argument(
        "--cert-dir",
        metavar="DIR",
        help="holds tls.crt and tls.key (reloaded when they change); default certs",
    )
    serve.add_argument("--client-ca", metavar="FILE", help="require client certificates from it")
    serve.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="plain-HTTP /metrics; default <host>:8080"
    )
    add_record_key(serve)
    serve.add_argument(
        "--timeout-seconds",
        type=int,
        metavar="N",
        help="the webhook configuration's timeoutSeconds (1-30, default 10)",
    )
    serve.add_argument(
        "--ledger-namespace-share",
        metavar="RATIO",
        help="share of a pool's ledger one tenant's unsettled admissions may take "
        "(0-1, default 0.1: 100 of 1,000 entries)",
    )
    serve.add_argument(
        "--fair-queue-length",
        type=int,
        metavar="N",
        help="reviews one tenant may have waiting for its turn before a 429 (default 50)",
    )
    serve.add_argument("--mode", choices=MODES, help="default: enforce")
    add_overcommit(serve)
    serve.add_argument(
        "--mode-for", action="append", metavar="KIND=MODE", help="a mode for one kind (repeatable)"
    )
    serve.add_argument(
        "--dry-run-holds",
        choices=("on", "off"),
        help="hold a dry run's charge like a write's, for API servers that store dry runs "
        "(cozystack-api does); default on",
    )
    serve.add_argument(
        "--escrow",
        choices=("on", "off"),
        help="admit creates from slices of busy pools' room held by this replica, in memory "
        "(docs/escrow.md); default off",
    )
    serve.add_argument(
        "--watch-resync-seconds",
        metavar="SECONDS",
        help="read every application kind this often to put right what its watch lost "
        "(0: only when the ledger waits on it); default 300",
    )
    serve.add_argument("--config", metavar="FILE", help="settings file (YAML)")
    serve.add_argument(
        "--log-level", metavar="LEVEL", help="debug, info, warning, error (default info)"
    )
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from webhook.logs import configure as configure_logs
    from webhook.server import serve
    from webhook.settings import check_mode_kinds, load_settings

    flags = {
        "state": args.state,
        "kubeconfig": args.kubeconfig,
        "listen": args.listen,
        "cert_dir": args.cert_dir,
        "client_ca": args.client_ca,
        "metrics_listen": args.metrics_listen,
        "record_key_file": args.record_key_file,
        "timeout_seconds": args.timeout_seconds,
        "ledger_namespace_share": args.ledger_namespace_share,
        "fair_queue_length": args.fair_queue_length,
        "mode": args.mode,
        "mode_for": args.mode_for,
        **overcommit_flags(args),
        "dry_run_holds": args.dry_run_holds,
        "escrow": args.escrow,
        "watch_resync_seconds": args.watch_resync_seconds,
        "config": args.config,
        "log_level": args.log_level,
    }
    settings = load_settings(flags)
    configure_logs(settings.log_level)
    if settings.state:
        # Check what can be checked before listening: the platform, and the per-kind modes.
        from webhook.state.manifests import load_platform

        platform = load_platform(settings.state)
        require_platform(platform, settings.state)
        check_mode_kinds(settings.mode_for, list(platform.kinds))
        kinds = sorted(platform.kinds)
    else:
        # Fail before logging anything when there is no cluster to read.
        from webhook.kube.config import connect, in_cluster

        connect(settings.kubeconfig) if settings.kubeconfig else in_cluster()
        # A live cluster may declare kinds beyond the bundled platform: warn, don't refuse.
        from webhook.defaults import platform_dir
        from webhook.state.manifests import load_platform

        kinds = sorted(load_platform([platform_dir()]).kinds)
        for kind in check_mode_kinds(settings.mode_for, kinds, strict=False):
            log.warning(
                "mode for a kind the bundled platform does not declare",
                extra={"fields": {"kind": kind, "mode": settings.mode_for[kind]}},
            )
    modes = {kind: settings.policy.mode_for(kind) for kind in sorted({*kinds, *settings.mode_for})}
    log.info("modes", extra={"fields": {"default": settings.mode, "modes": modes}})
    from webhook.core.capacity.guard import QuotaBook

    if settings.state and not settings.record_key_file:
        log.info(
            "charge records are signed with a key of this process: records written by another "
            "process are not believed (give --record-key-file to keep one)"
        )
    quotas = QuotaBook()  # filled with the state's ResourceQuotas as it loads
    load = None
    if settings.state:
        paths = settings.state
        keys = record_keys(settings.record_key_file)

        def load() -> ReservationState:
            return _load_state_logging(paths, quotas, keys)

    asyncio.run(serve(None, settings, quotas=quotas, load=load))
    return 0


def _load_state_logging(
    paths: Sequence[str], quotas: QuotaBook, keys: RecordKeys | None
) -> ReservationState:
    """Load manifest directories, logging counts every few seconds (the server's progress)."""
    from webhook.state.manifests import load_state

    started = time.monotonic()
    last = [started]

    def progress(files: int, total: int, manifests: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 2.0:
            last[0] = now
            log.info(
                "loading state",
                extra={"fields": {"files": files, "of": total, "manifests": manifests}},
            )

    state = load_state(paths, quotas=quotas, keys=keys, progress=progress)
    require_platform(state.platform, paths)
    log.info(
        "state loaded",
        extra={
            "fields": {
                "applications": len(state),
                "kinds": len(state.platform.kinds),
                "seconds": round(time.monotonic() - started, 3),
            }
        },
    )
    return state

"""Rejections at the edges, logged once each with the peer and the reason, rate-limited.

What never becomes an admission decision is otherwise invisible: a body that is not an
AdmissionReview (400), one over the size limit (413), a TLS handshake that fails (a client
certificate missing or not trusted, a protocol mismatch) and plain HTTP sent to the TLS port.
Each is logged as one line naming the peer and the reason. A misbehaving client can send
thousands a second, so each reason logs at most once per :data:`INTERVAL` seconds; the next
line says how many were left out meanwhile.

Handshake failures never reach aiohttp, and asyncio drops them silently unless in debug mode;
the SSL context's ``sslobject_class`` (a documented extension point) sees them instead.
"""

from __future__ import annotations

import logging
import ssl
import sys
import time
from collections.abc import Callable
from typing import Final

__all__ = ["INTERVAL", "EdgeLog", "observe_handshakes"]

log = logging.getLogger("webhook.edges")

INTERVAL: Final = 10.0
MAX_REASONS: Final = 256  # reasons tracked at once; a flood of distinct ones cannot grow memory

# OpenSSL's reason codes, in words an operator can act on.
_TLS_REASONS: Final = {
    "HTTP_REQUEST": "plain HTTP on the TLS port",
    "HTTPS_PROXY_REQUEST": "an HTTP proxy request on the TLS port",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no client certificate",
    "CERTIFICATE_VERIFY_FAILED": "client certificate not trusted",
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust our CA",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the client rejected our certificate",
    "WRONG_VERSION_NUMBER": "not TLS, or a TLS version we do not accept",
    "UNSUPPORTED_PROTOCOL": "a TLS version we do not accept",
    "NO_SHARED_CIPHER": "no cipher in common",
}


class EdgeLog:
    """Logs each (kind, reason) at most once per ``interval`` seconds."""

    def __init__(
        self, *, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._skipped: dict[tuple[str, str], int] = {}

    def rejected(self, kind: str, peer: str, reason: str) -> bool:
        """Note one rejection; returns whether it was logged."""
        key = (kind, reason)
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return False
        if last is None and len(self._last) >= MAX_REASONS:
            oldest = min(self._last, key=self._last.__getitem__)
            self._last.pop(oldest)
            self._skipped.pop(oldest, None)
        self._last[key] = now
        skipped = self._skipped.pop(key, 0)
        fields: dict[str, object] = {"edge": kind, "peer": peer, "reason": reason}
        if skipped:
            fields["suppressed"] = skipped
        log.warning("rejected at the edge", extra={"fields": fields})
        return True


def observe_handshakes(context: ssl.SSLContext, edges: EdgeLog) -> None:
    """Log every failed TLS handshake on ``context`` through ``edges``."""

    class _Observed(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise
            except ssl.SSLError as exc:
                edges.rejected("tls", _peer(), _tls_reason(exc))
                raise

    context.sslobject_class = _Observed


def _tls_reason(exc: ssl.SSLError) -> str:
    code = str(getattr(exc, "reason", "") or "")
    words = _TLS_REASONS.get(code)
    if words is not None:
        return words
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _peer() -> str:
    """The remote address of the connection whose handshake is running, when it can be told.

    asyncio's SSL protocol calls ``do_handshake`` from its own method; its transport knows the
    peer. Anything unexpected here only loses the address, never the log line.
    """
    try:
        caller = sys._getframe(2).f_locals.get("self")
        transport = getattr(caller, "_transport", None)
        peer = transport.get_extra_info("peername") if transport is not None else None
        if isinstance(peer, tuple) and len(peer) >= 2:
            return f"{peer[0]}:{peer[1]}"
    except Exception:
        pass
    return "unknown"

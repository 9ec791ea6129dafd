"""SSL contexts for the webhook server and its clients, and hot reload of the serving pair.

A Secret mounted into a pod is updated by the kubelet swapping a ``..data`` symlink, and
cert-manager renews certificates weeks before they expire, so the serving pair changes under a
running server. aiohttp's ``TCPSite`` holds one ``ssl.SSLContext`` for its lifetime;
:class:`CertificateReloader` polls the files (inotify misses symlink swaps on many volume
types) and loads a new pair into that same context, which new handshakes then use. A broken or
half-written pair is refused and the last good one keeps serving: a webhook without a valid
certificate fails every admission in the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from webhook.tls.certificates import CertificateError, CertificateInfo, check_pair
from webhook.waits import sleep_unless_stopped

__all__ = ["CertificateReloader", "client_context", "server_context"]

log = logging.getLogger(__name__)


def server_context(
    cert_file: Path, key_file: Path, *, client_ca: Path | None = None
) -> ssl.SSLContext:
    """A TLS 1.2+ server context serving the pair; with ``client_ca``, clients must present a
    certificate that CA issued."""
    context = _new_server_context(client_ca)
    _load(_read_pair(cert_file, key_file), context)
    return context


def client_context(
    ca_file: Path, *, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    """A TLS 1.2+ client context that trusts only ``ca_file``, optionally presenting a pair."""
    if (cert_file is None) != (key_file is None):
        raise CertificateError("a client certificate needs both cert_file and key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _trust(context, ca_file)
    if cert_file is not None and key_file is not None:
        _load(_read_pair(cert_file, key_file), context)
    return context


class CertificateReloader:
    """Keeps one server context serving the newest good pair found at two paths.

    Call :meth:`check` (or let :meth:`run` call it) to look at the files again. The constructor
    raises :class:`CertificateError` when the initial pair is broken: a server must not start
    without one.
    """

    def __init__(self, cert_file: Path, key_file: Path, *, client_ca: Path | None = None) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._pair = _read_pair(cert_file, key_file)
        self._context = _new_server_context(client_ca)
        _load(self._pair, self._context)
        self._last_error: str | None = None
        self._reloads = 0

    @property
    def context(self) -> ssl.SSLContext:
        """The context to give the server; the same object for the reloader's lifetime."""
        return self._context

    @property
    def serial(self) -> int:
        """Serial number of the certificate being served."""
        return self._pair.info.serial

    @property
    def not_after(self) -> datetime:
        """Expiry (UTC) of the certificate being served."""
        return self._pair.info.not_after

    @property
    def last_error(self) -> str | None:
        """Why the files on disk are not being served, or None when they are."""
        return self._last_error

    @property
    def reloads(self) -> int:
        """How many times a new pair has been loaded since construction."""
        return self._reloads

    def check(self) -> bool:
        """Load the pair on disk if it changed and is good; True when a new pair was loaded."""
        try:
            cert_pem, key_pem = _read(self._cert_file), _read(self._key_file)
            if _fingerprint(cert_pem, key_pem) == self._pair.fingerprint:
                self._recovered()
                return False
            pair = _pair(cert_pem, key_pem, cert_file=self._cert_file, key_file=self._key_file)
            # A scratch context first: a pair OpenSSL refuses halfway would leave the live
            # context holding a certificate without its key.
            _load(pair, ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self._context)
        except CertificateError as exc:
            self._failed(str(exc))
            return False
        self._pair = pair
        self._reloads += 1
        self._last_error = None
        log.info(
            "loaded serving certificate serial %x, valid until %s",
            pair.info.serial,
            pair.info.not_after.isoformat(),
            extra={
                "fields": {
                    "serial": f"{pair.info.serial:x}",
                    "not_after": pair.info.not_after.isoformat(),
                }
            },
        )
        return True

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """Call :meth:`check` every ``interval`` seconds until ``stop`` is set."""
        while not await sleep_unless_stopped(interval, stop):
            try:
                self.check()
            except Exception:
                # The loop must outlive a surprise: if it died, the pod would serve the old
                # certificate until it expired and then fail every admission.
                log.exception("certificate check failed")

    def _failed(self, error: str) -> None:
        if error != self._last_error:
            log.warning(
                "not reloading the serving certificate, still serving serial %x: %s",
                self.serial,
                error,
                extra={"fields": {"serial": f"{self.serial:x}", "error": error}},
            )
        self._last_error = error

    def _recovered(self) -> None:
        if self._last_error is not None:
            log.info("the serving certificate files are good again")
            self._last_error = None


@dataclass(frozen=True, slots=True)
class _Pair:
    """A certificate and key as read together, checked to belong together."""

    cert_file: Path
    key_file: Path
    cert_pem: bytes
    key_pem: bytes
    fingerprint: str
    info: CertificateInfo


def _new_server_context(client_ca: Path | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # Kubernetes API servers speak TLS 1.2 and 1.3; older versions are only an attack surface.
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if client_ca is not None:
        _trust(context, client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _trust(context: ssl.SSLContext, ca_file: Path) -> None:
    pem = _read(ca_file)
    try:
        context.load_verify_locations(cadata=pem.decode("ascii"))
    except (UnicodeDecodeError, ssl.SSLError):
        raise CertificateError(f"{ca_file}: not a PEM CA certificate") from None


def _read_pair(cert_file: Path, key_file: Path) -> _Pair:
    return _pair(_read(cert_file), _read(key_file), cert_file=cert_file, key_file=key_file)


def _pair(cert_pem: bytes, key_pem: bytes, *, cert_file: Path, key_file: Path) -> _Pair:
    info = check_pair(cert_pem, key_pem, cert_source=str(cert_file), key_source=str(key_file))
    return _Pair(
        cert_file=cert_file,
        key_file=key_file,
        cert_pem=cert_pem,
        key_pem=key_pem,
        fingerprint=_fingerprint(cert_pem, key_pem),
        info=info,
    )


def _load(pair: _Pair, *contexts: ssl.SSLContext) -> None:
    """Load exactly the bytes that were checked, not whatever the paths hold by now."""
    with _private_files(pair.cert_pem, pair.key_pem) as (cert_path, key_path):
        for context in contexts:
            try:
                context.load_cert_chain(cert_path, key_path)
            except ssl.SSLError as exc:
                raise CertificateError(
                    f"{pair.cert_file} and {pair.key_file}: OpenSSL refused the pair "
                    f"({exc.reason or exc})"
                ) from None


@contextlib.contextmanager
def _private_files(*contents: bytes) -> Iterator[Sequence[str]]:
    """Paths that OpenSSL can open holding ``contents``, gone when the block ends.

    ``load_cert_chain`` takes only paths. On Linux the files live in memory (``memfd``), so a
    pod with a read-only root filesystem and no writable /tmp can still reload.
    """
    if sys.platform == "linux":
        descriptors: list[int] = []
        try:
            for content in contents:
                descriptors.append(os.memfd_create("webhook-tls", os.MFD_CLOEXEC))
                with os.fdopen(descriptors[-1], "wb", closefd=False) as stream:
                    stream.write(content)
            yield [f"/proc/self/fd/{descriptor}" for descriptor in descriptors]
        finally:
            for descriptor in descriptors:
                os.close(descriptor)
    else:
        with tempfile.TemporaryDirectory(prefix="webhook-tls-") as directory:
            paths = [os.path.join(directory, str(index)) for index in range(len(contents))]
            for path, content in zip(paths, contents, strict=True):
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                    f.write(content)
            yield paths


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CertificateError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _fingerprint(*contents: bytes) -> str:
    """SHA-256 over the files' contents, each length-prefixed so that no two splits collide."""
    digest = hashlib.sha256()
    for content in contents:
        digest.update(len(content).to_bytes(8, "big"))
        digest.update(content)
    return digest.hexdigest()

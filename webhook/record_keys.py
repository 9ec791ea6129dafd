"""Where the key that signs charge records comes from (see :mod:`webhook.core.records`).

In a cluster the key lives in a Secret of the webhook's namespace, managed like the TLS Secret:
the first replica to start creates it with a random key (a create is atomic; a replica that
loses the race reads the winner's), every replica reads it before it serves and again on each
round of its duties, so a rotation reaches every replica within a round. Only the webhook's
ServiceAccount can read it (RBAC grants ``get`` on this one name); tenants cannot.

The Secret's data: ``current`` (the signing key, 32 bytes or more) and, during a rotation,
``previous`` (the key it replaces, still accepted when verifying). To rotate, an operator moves
``current`` to ``previous`` and writes a new ``current``; once every application has been
written again, or the operator accepts that records still signed with the old key are evaluated
as they stand, ``previous`` is removed.

Offline (``--state``, ``review``, ``report``) the key comes from ``--record-key-file`` (the
first non-empty line is the current key, any further lines previous keys), or else is
generated per process: records written by another process are then not believed and every
application is evaluated as it stands.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from webhook.core.records import MIN_KEY_BYTES, RecordKeys
from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.waits import sleep_unless_stopped

__all__ = ["RECORD_KEY_SECRET", "RecordKeyError", "RecordKeySecret", "keys_from_file"]

log = logging.getLogger(__name__)

RECORD_KEY_SECRET: Final = "reservation-webhook-records"
SECRETS: Final = ResourceRef("", "v1", "secrets")
CURRENT: Final = "current"
PREVIOUS: Final = "previous"


class RecordKeyError(ValueError):
    """A record key that cannot be used: names where it came from and why."""


def keys_from_file(path: str | Path) -> RecordKeys:
    """Keys from a file: the first non-empty line signs, further lines are previous keys."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise RecordKeyError(f"{path}: cannot read the record key: {exc.strerror}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise RecordKeyError(f"{path}: no record key in the file")
    short = [i + 1 for i, line in enumerate(lines) if len(line) < MIN_KEY_BYTES]
    if short:
        raise RecordKeyError(
            f"{path}: key on line {short[0]} is shorter than {MIN_KEY_BYTES} bytes"
        )
    return RecordKeys(lines[0], tuple(lines[1:]))


def keys_from_secret(secret: Mapping[str, Any], where: str) -> RecordKeys:
    """Keys from the Secret's data; raises :class:`RecordKeyError` naming the Secret."""
    data = secret.get("data")
    if not isinstance(data, Mapping):
        raise RecordKeyError(f"{where}: no data")
    decoded: dict[str, bytes] = {}
    for name in (CURRENT, PREVIOUS):
        value = data.get(name)
        if value is None:
            continue
        try:
            decoded[name] = base64.b64decode(str(value), validate=True)
        except binascii.Error:
            raise RecordKeyError(f"{where}: data.{name} is not base64") from None
        if len(decoded[name]) < MIN_KEY_BYTES:
            raise RecordKeyError(f"{where}: data.{name} is shorter than {MIN_KEY_BYTES} bytes")
    if CURRENT not in decoded:
        raise RecordKeyError(f"{where}: data.{CURRENT} missing")
    previous = (decoded[PREVIOUS],) if PREVIOUS in decoded else ()
    return RecordKeys(decoded[CURRENT], previous)


class RecordKeySecret:
    """The Secret holding the record keys: created once, read by every replica."""

    def __init__(self, client: KubeClient, *, namespace: str, name: str = RECORD_KEY_SECRET):
        self.client = client
        self.namespace = namespace
        self.name = name

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def bootstrap(
        self, stop: asyncio.Event, *, retry_seconds: float = 2.0
    ) -> RecordKeys | None:
        """Before any application is observed: the keys, creating the Secret if it is missing.

        Retries until the API server answers with a usable Secret (a replica that cannot sign
        or verify records must not decide) or ``stop`` is set (then ``None``).
        """
        while not stop.is_set():
            try:
                secret = await self._get()
                if secret is None:
                    secret = await self._create()
                if secret is not None:
                    return keys_from_secret(secret, self.where)
            except ApiError as exc:
                log.warning(
                    "record key secret not ready",
                    extra={
                        "fields": {"secret": self.where, "status": exc.status, "error": str(exc)}
                    },
                )
            except RecordKeyError as exc:
                log.error("record key secret unusable", extra={"fields": {"error": str(exc)}})
            await sleep_unless_stopped(retry_seconds, stop)
        return None

    async def read(self) -> RecordKeys | None:
        """The keys as the Secret holds them now; ``None`` (logged) when it cannot be read."""
        try:
            secret = await self._get()
            if secret is None:
                log.warning("record key secret missing", extra={"fields": {"secret": self.where}})
                return None
            return keys_from_secret(secret, self.where)
        except ApiError as exc:
            log.warning(
                "record key secret not read",
                extra={"fields": {"secret": self.where, "status": exc.status, "error": str(exc)}},
            )
        except RecordKeyError as exc:
            log.error("record key secret unusable", extra={"fields": {"error": str(exc)}})
        return None

    async def _get(self) -> dict[str, Any] | None:
        try:
            return await self.client.get(SECRETS, self.namespace, self.name)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def _create(self) -> dict[str, Any] | None:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "type": "Opaque",
            "data": {CURRENT: base64.b64encode(secrets.token_bytes(MIN_KEY_BYTES)).decode()},
        }
        try:
            created = await self.client.create(SECRETS, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return await self._get()  # another replica created it first: use theirs
        log.info("created the record key secret", extra={"fields": {"secret": self.where}})
        return created

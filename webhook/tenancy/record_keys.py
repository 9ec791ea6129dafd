"""Where the key that signs charge records comes from (see :mod:`webhook.core.tenancy.records`).

In a cluster the key lives in a Secret of the webhook's namespace, managed like the TLS Secret:
the first replica to start creates it with a random key (a create is atomic; a replica that
loses the race reads the winner's), every replica reads it before it serves and again on each
round of its duties, so a rotation reaches every replica within a round. Only the webhook's
ServiceAccount can read it (RBAC grants ``get`` on this one name); tenants cannot.

The Secret's data: ``current`` (the signing key, 32 bytes or more) and, during a rotation,
``next`` (a published key: accepted when verifying, never used to sign), ``previous`` (the key
``current`` replaced, accepted until ``previous-until``, an RFC 3339 time) and ``retired-<id>``
(keys past their window: what they signed still counts for its persistent volumes' high marks,
which only ever raise a charge, and for nothing else). A retired key's name says when it was
retired, ``retired-<UTC time>-<id>`` (``retired-20261202T013000Z-3f...``): the Secret holds
nothing else that would say so, and a rotation keeps the 8 retired most recently, the one it
retires among them, dropping the oldest (a name without a time counts as older than any with
one). Every record names
the id of the key that signed it (:func:`webhook.core.tenancy.records.key_id`), so a replica that
meets an id it does not know re-reads the Secret at once (at most once a second, shared by the
requests waiting) before it refuses anything: replicas that read the Secret at different times
never refuse each other's records.

A rotation (:meth:`RecordKeySecret.publish` then :meth:`RecordKeySecret.promote`, or the same
edits with kubectl) publishes the new key as ``next`` first; once every replica has read it
(one re-read round, 30 s) it is promoted: ``current`` becomes ``previous`` with
``previous-until`` = now + the window (default 24 hours), ``next`` becomes ``current``. Records
signed with the old key keep verifying until the window ends; after it, replicas stop believing
the key (each re-read) and such records are evaluated as they stand, as if unsigned, except for
their volume marks. A ``previous``
without ``previous-until`` is accepted for the default window from when a replica first reads
it.

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
import re
import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from webhook.core.tenancy.records import MIN_KEY_BYTES, RecordKeys, key_id
from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.waits import sleep_unless_stopped

__all__ = [
    "DEFAULT_WINDOW_SECONDS",
    "RECORD_KEY_SECRET",
    "RETIRED_TIME",
    "RecordKeyError",
    "RecordKeySecret",
    "keys_from_file",
    "keys_from_secret",
    "retired_at",
]

log = logging.getLogger(__name__)

RECORD_KEY_SECRET: Final = "reservation-webhook-records"
SECRETS: Final = ResourceRef("", "v1", "secrets")
CURRENT: Final = "current"
NEXT: Final = "next"
PREVIOUS: Final = "previous"
PREVIOUS_UNTIL: Final = "previous-until"
RETIRED_PREFIX: Final = "retired-"  # retired-<time>-<key id>: keys past their window, for marks
MAX_RETIRED: Final = 8
# When a key was retired, in its name: fixed width, so names in this form sort as their times do.
RETIRED_TIME: Final = "%Y%m%dT%H%M%SZ"
_RETIRED_AT: Final = re.compile(r"retired-([0-9]{8}T[0-9]{6}Z)(?:-.*)?")
# How long records signed with a retired key keep verifying after a rotation: long enough for
# a slow rollout and a day of ordinary writes to re-sign what is written, short enough that a
# leaked old key stops counting. Records not written by then are evaluated as they stand.
DEFAULT_WINDOW_SECONDS: Final = 24 * 3600.0
# A replica that meets a record signed with a key it does not know re-reads the Secret at most
# this often (requests arriving meanwhile wait for the same read).
REREAD_SECONDS: Final = 1.0


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


def keys_from_secret(
    secret: Mapping[str, Any],
    where: str,
    *,
    now: float | None = None,
    first_seen: dict[bytes, float] | None = None,
) -> RecordKeys:
    """Keys from the Secret's data; raises :class:`RecordKeyError` naming the Secret.

    A previous key whose window has ended (``previous-until``, else the default window from
    ``first_seen``, when this reader first met it) is dropped: it verifies nothing any more.
    """
    data = secret.get("data")
    if not isinstance(data, Mapping):
        raise RecordKeyError(f"{where}: no data")
    decoded: dict[str, bytes] = {}
    for name in (CURRENT, NEXT, PREVIOUS, PREVIOUS_UNTIL):
        value = data.get(name)
        if value is None:
            continue
        try:
            decoded[name] = base64.b64decode(str(value), validate=True)
        except binascii.Error:
            raise RecordKeyError(f"{where}: data.{name} is not base64") from None
        if name != PREVIOUS_UNTIL and len(decoded[name]) < MIN_KEY_BYTES:
            raise RecordKeyError(f"{where}: data.{name} is shorter than {MIN_KEY_BYTES} bytes")
    if CURRENT not in decoded:
        raise RecordKeyError(f"{where}: data.{CURRENT} missing")
    clock = time.time() if now is None else now
    retired: list[bytes] = []
    for name in sorted(data):
        if str(name).startswith(RETIRED_PREFIX):
            try:
                key = base64.b64decode(str(data[name]), validate=True)
            except binascii.Error:
                raise RecordKeyError(f"{where}: data.{name} is not base64") from None
            if len(key) >= MIN_KEY_BYTES:
                retired.append(key)
    previous: tuple[bytes, ...] = ()
    if PREVIOUS in decoded:
        key = decoded[PREVIOUS]
        if PREVIOUS_UNTIL in decoded:
            until = _until(decoded[PREVIOUS_UNTIL], where)
        else:
            seen = first_seen.setdefault(key, clock) if first_seen is not None else clock
            until = seen + DEFAULT_WINDOW_SECONDS
        if clock < until:
            previous = (key,)
        else:
            retired.append(key)
    published = (decoded[NEXT],) if NEXT in decoded and decoded[NEXT] != decoded[CURRENT] else ()
    return RecordKeys(decoded[CURRENT], previous, published, tuple(retired))


def _until(raw: bytes, where: str) -> float:
    try:
        moment = datetime.fromisoformat(raw.decode("ascii").strip().replace("Z", "+00:00"))
    except (UnicodeDecodeError, ValueError):
        raise RecordKeyError(f"{where}: data.{PREVIOUS_UNTIL} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


class RecordKeySecret:
    """The Secret holding the record keys: created once, read by every replica."""

    def __init__(self, client: KubeClient, *, namespace: str, name: str = RECORD_KEY_SECRET):
        self.client = client
        self.namespace = namespace
        self.name = name
        self._first_seen: dict[bytes, float] = {}  # previous key -> when first read here
        self._reread = asyncio.Lock()
        self._last_reread = float("-inf")  # monotonic

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
                    return self._keys(secret)
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
            return self._keys(secret)
        except ApiError as exc:
            log.warning(
                "record key secret not read",
                extra={"fields": {"secret": self.where, "status": exc.status, "error": str(exc)}},
            )
        except RecordKeyError as exc:
            log.error("record key secret unusable", extra={"fields": {"error": str(exc)}})
        return None

    async def reread_for(self, kid: str, known: RecordKeys) -> RecordKeys | None:
        """The keys after a re-read, when a record names key ``kid`` that ``known`` lacks.

        Requests waiting meanwhile share one read, and the Secret is read at most once per
        :data:`REREAD_SECONDS`; ``None`` when nothing new came of it (the id stays unknown, or
        the Secret could not be read): the record is then judged with the keys there are.
        """
        if known.knows(kid):
            return None
        async with self._reread:
            if time.monotonic() - self._last_reread < REREAD_SECONDS:
                return None
            self._last_reread = time.monotonic()
            keys = await self.read()
        if keys is None or keys == known:
            return None
        log.info(
            "record keys re-read for an unknown key id",
            extra={"fields": {"kid": kid[:16], "known": keys.knows(kid)}},
        )
        return keys

    async def publish(self) -> str:
        """Rotation, step 1: publish a new key as ``next`` (accepted, not signing); its id."""
        secret = await self._get()
        if secret is None:
            raise RecordKeyError(f"{self.where}: missing; start the webhook first")
        data = dict(secret.get("data") or {})
        if NEXT not in data:
            data[NEXT] = _b64(secrets.token_bytes(MIN_KEY_BYTES))
            await self.client.replace(SECRETS, {**secret, "data": data})
        return _kid(data[NEXT])

    async def promote(
        self, *, window_seconds: float = DEFAULT_WINDOW_SECONDS, now: float | None = None
    ) -> str:
        """Rotation, step 2 (once every replica has read ``next``): ``next`` signs, the old
        ``current`` is accepted until now + ``window_seconds``; the new key's id."""
        secret = await self._get()
        if secret is None:
            raise RecordKeyError(f"{self.where}: missing; start the webhook first")
        data = dict(secret.get("data") or {})
        if NEXT not in data:
            raise RecordKeyError(f"{self.where}: no published key; publish one first")
        clock = time.time() if now is None else now
        until = datetime.fromtimestamp(clock + window_seconds, UTC)
        if PREVIOUS in data:  # kept for the volume marks it signed, never for anything else
            _retire(data, datetime.fromtimestamp(clock, UTC))
        data[PREVIOUS] = data[CURRENT]
        data[PREVIOUS_UNTIL] = _b64(until.strftime("%Y-%m-%dT%H:%M:%SZ").encode())
        data[CURRENT] = data.pop(NEXT)
        await self.client.replace(SECRETS, {**secret, "data": data})
        return _kid(data[CURRENT])

    def _keys(self, secret: Mapping[str, Any]) -> RecordKeys:
        return keys_from_secret(secret, self.where, first_seen=self._first_seen)

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


def _retire(data: dict[str, Any], at: datetime) -> str:
    """Move ``data``'s ``previous`` key to ``retired-<at>-<id>`` (its name); keep the
    :data:`MAX_RETIRED` retired most recently, this one among them, dropping the oldest.

    The same key retired under another name before is kept once, under the new name.
    """
    key = data.pop(PREVIOUS)
    data.pop(PREVIOUS_UNTIL, None)
    name = f"{RETIRED_PREFIX}{at.strftime(RETIRED_TIME)}-{_kid(key)}"
    others = [k for k in data if str(k).startswith(RETIRED_PREFIX) and data[k] != key]
    for duplicate in [k for k in data if str(k).startswith(RETIRED_PREFIX) and k not in others]:
        del data[duplicate]
    others.sort(key=lambda other: (retired_at(other), other))  # oldest first
    for old in others[: max(len(others) + 1 - MAX_RETIRED, 0)]:
        del data[old]
    data[name] = key
    return name


def retired_at(name: str) -> str:
    """When the key ``name`` holds was retired, as its name says (:data:`RETIRED_TIME`, which
    sorts as time does); ``""``, older than any time, when it does not say."""
    found = _RETIRED_AT.fullmatch(name)
    return found[1] if found else ""


def _kid(encoded: object) -> str:
    return key_id(base64.b64decode(str(encoded)))

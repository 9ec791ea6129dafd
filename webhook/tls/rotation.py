"""Self-managed certificates: one Secret holds the CA and the serving pair, and rotating either
never fails a handshake.

Without cert-manager the webhook is its own certificate authority. The API server trusts the
webhook through the ``caBundle`` of its webhook configurations, the replicas serve whatever pair
their certificate directory holds, and the two sides learn of a change at different times (the
API server through an informer within seconds, a replica through the kubelet's refresh of the
mounted Secret within about a minute, or :meth:`CertificateRotator.sync_files`). Every step of
a rotation therefore keeps this true: any pair a replica may still serve verifies against any
``caBundle`` the API server may still hold.

- A serving pair is renewed from the same CA, so ``caBundle`` does not change.
- A new CA is first published next to the old one (bundle ``[new, old]``) while the pair signed
  by the old CA keeps serving. A pair from the new CA is issued only on a later reconcile that
  finds the configurations already showing that bundle. The old CA leaves the bundle once the
  new pair has been in the Secret for :data:`PROPAGATION`, long enough for every replica to
  serve it.

Only the leader writes (:meth:`CertificateRotator.reconcile`), with the resourceVersion it read,
so two leaders in a hand-over cannot interleave half-rotations. Every replica copies the Secret
into its certificate directory when that directory is writable. API errors are logged and
retried on the next round, never raised: certificates are renewed weeks ahead, and a webhook
whose duty loop died would stop renewing them altogether.

This module reads and writes; what is due is decided in ``renewal``, the ``caBundle`` of the
webhook configurations is read and set in ``ca_bundles``, and the Secret's data is encoded in
``secret_data``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.tls.ca_bundles import (
    CONFLICT_RETRIES,
    MUTATING_WEBHOOKS,
    VALIDATING_WEBHOOKS,
    Configuration,
    with_ca_bundle,
)
from webhook.tls.certificates import (
    CA_CERT,
    TLS_CERT,
    TLS_KEY,
    CertificateError,
    _parse_pair,
    _whole_seconds,
    _write_atomically,
)
from webhook.tls.renewal import PROPAGATION, Renewal, RenewalPlan, load_serving
from webhook.tls.secret_data import SECRET_TYPE, SECRETS, encode_data, secret_data, with_data

__all__ = [
    "MUTATING_WEBHOOKS",
    "PROPAGATION",
    "SECRETS",
    "VALIDATING_WEBHOOKS",
    "CertificateRotator",
    "service_dns_names",
]

log = logging.getLogger(__name__)
Obj = dict[str, Any]


# What a write into a mounted Secret volume (read-only) or a directory we may not write gets.
_UNWRITABLE: Final = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def service_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    """The names the API server and in-cluster clients may use for a Service, most specific
    first (the API server dials ``{service}.{namespace}.svc``)."""
    return (
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        service,
        f"{service}.{namespace}",
    )


class CertificateRotator:
    """Keeps the TLS Secret and the webhook configurations' ``caBundle`` current.

    ``webhooks`` names the configurations (resource and name) whose every webhook must trust
    the Secret's ``ca.crt``. :meth:`reconcile` is for the leader, :meth:`sync_files` for every
    replica; neither raises.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        secret: str,
        service: str,
        webhooks: Sequence[tuple[ResourceRef, str]],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        ca_days: int = 3650,
        serving_days: int = 90,
        rotate_before: timedelta = timedelta(days=30),
        ca_rotate_before: timedelta = timedelta(days=365),
    ) -> None:
        # A validity no longer than its renewal margin would renew on every round.
        if timedelta(days=serving_days) <= rotate_before:
            raise ValueError("serving_days must be longer than rotate_before")
        if timedelta(days=ca_days) <= ca_rotate_before:
            raise ValueError("ca_days must be longer than ca_rotate_before")
        self.client = client
        self.namespace = namespace
        self.secret = secret
        self.service = service
        self.webhooks = tuple(webhooks)
        self.clock = clock
        self.ca_days = ca_days
        self.serving_days = serving_days
        self.rotate_before = rotate_before
        self.ca_rotate_before = ca_rotate_before
        self.dns_names = service_dns_names(service, namespace)
        self._renewal = Renewal(
            service=service,
            namespace=namespace,
            dns_names=self.dns_names,
            ca_days=ca_days,
            serving_days=serving_days,
            rotate_before=rotate_before,
            ca_rotate_before=ca_rotate_before,
        )
        self._unwritable: set[Path] = set()

    # --- the leader ---------------------------------------------------------------------------

    async def reconcile(self) -> bool:
        """Create, renew or rotate what is due and publish the CA bundle; True if it wrote."""
        written = _Written()
        try:
            await self._reconcile(_whole_seconds(self.clock()), written)
        except ApiError as exc:
            self._warn("certificate reconcile failed", exc)
        except Exception:
            log.exception("certificate reconcile failed", extra={"fields": self._fields()})
        return written.anything

    async def _reconcile(self, now: datetime, written: _Written) -> None:
        secret = await self._get_secret()
        configurations = [await self._get_configuration(ref, name) for ref, name in self.webhooks]
        if secret is None:
            data = self._renewal.fresh(now)
            try:
                secret = await self.client.create(SECRETS, self._new_secret(data))
            except ApiError as exc:
                if exc.status != 409:
                    raise
                log.info(
                    "the TLS secret was created meanwhile; reconciling next round",
                    extra={"fields": self._fields()},
                )
                return
            written.anything = True
            self._created(data)
        else:
            data = secret_data(secret)
            bundle = data.get(CA_CERT, b"")
            published = all(c.shows(bundle) for c in configurations)
            plan = self._renewal.plan(data, now, published=published)
            if plan.data != data:
                try:
                    secret = await self.client.replace(SECRETS, with_data(secret, plan.data))
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                    log.info(
                        "the TLS secret changed meanwhile; reconciling next round",
                        extra={"fields": self._fields()},
                    )
                    return
                written.anything = True
                self._updated(plan)
        bundle = secret_data(secret).get(CA_CERT, b"")
        for configuration in configurations:
            if await self._publish(configuration, bundle):
                written.anything = True

    # --- the webhook configurations -----------------------------------------------------------

    async def _get_configuration(self, ref: ResourceRef, name: str) -> Configuration:
        try:
            return Configuration(ref, name, await self.client.get(ref, "", name))
        except ApiError as exc:
            if exc.status != 404:
                raise
            self._warn("webhook configuration not found", exc, configuration=f"{ref.plural}/{name}")
            return Configuration(ref, name, None)

    async def _publish(self, configuration: Configuration, bundle: bytes) -> bool:
        """Make every webhook of ``configuration`` trust ``bundle``; True if it wrote."""
        where = f"{configuration.ref.plural}/{configuration.name}"
        try:
            for attempt in range(CONFLICT_RETRIES + 1):
                if configuration.obj is None or configuration.shows(bundle):
                    return False
                try:
                    await self.client.replace(
                        configuration.ref, with_ca_bundle(configuration.obj, bundle)
                    )
                except ApiError as exc:
                    if exc.status != 409 or attempt == CONFLICT_RETRIES:
                        raise
                    configuration = await self._get_configuration(
                        configuration.ref, configuration.name
                    )
                    continue
                log.info(
                    "published the CA bundle",
                    extra={"fields": {**self._fields(), "configuration": where}},
                )
                return True
        except ApiError as exc:
            self._warn("CA bundle not published", exc, configuration=where)
        return False

    # --- every replica ------------------------------------------------------------------------

    async def bootstrap(self, cert_dir: Path, *, retry_seconds: float = 2.0) -> None:
        """Before the server listens: make sure ``cert_dir`` holds a pair.

        Creates the Secret when it does not exist (a create is atomic, so any replica may do it;
        one that loses the race reads the winner's), then copies it into ``cert_dir``. Retries
        until the API server answers: a replica without a pair cannot serve anyway. The leader
        publishes the CA bundle on its next round.
        """
        while not ((cert_dir / TLS_CERT).exists() and (cert_dir / TLS_KEY).exists()):
            try:
                if await self._get_secret() is None:
                    data = self._renewal.fresh(_whole_seconds(self.clock()))
                    try:
                        await self.client.create(SECRETS, self._new_secret(data))
                        self._created(data)
                    except ApiError as exc:
                        if exc.status != 409:
                            raise
            except ApiError as exc:
                self._warn("TLS secret not ready", exc)
            if await self.sync_files(cert_dir):
                return
            await asyncio.sleep(retry_seconds)

    async def sync_files(self, cert_dir: Path) -> bool:
        """Copy ``tls.crt``, ``tls.key`` and ``ca.crt`` from the Secret into ``cert_dir`` where
        they differ; True if it wrote.

        Each file is replaced atomically. A directory that cannot be written (a mounted Secret
        volume is read-only) is left to the kubelet's refresh from then on.
        """
        if cert_dir in self._unwritable:
            return False
        try:
            secret = await self._get_secret()
        except ApiError as exc:
            self._warn("TLS secret not read", exc)
            return False
        except Exception:
            log.exception("TLS secret not read", extra={"fields": self._fields()})
            return False
        if secret is None:
            log.warning("TLS secret not created yet", extra={"fields": self._fields()})
            return False
        data = secret_data(secret)
        # ca.crt first: whoever reads the directory finds the CA before a pair it signed.
        files = {name: data[name] for name in (CA_CERT, TLS_KEY, TLS_CERT) if name in data}
        try:
            _parse_pair(
                files.get(TLS_CERT, b""),
                files.get(TLS_KEY, b""),
                cert_source=f"{self._where()} {TLS_CERT}",
                key_source=f"{self._where()} {TLS_KEY}",
            )
        except CertificateError as exc:
            # The reloader would refuse the pair anyway; the leader repairs the Secret.
            log.warning(
                "TLS secret holds no usable pair",
                extra={"fields": {**self._fields(), "error": str(exc)}},
            )
            return False
        changed = [name for name, content in files.items() if _read(cert_dir / name) != content]
        try:
            cert_dir.mkdir(parents=True, exist_ok=True)
            for name in changed:
                _write_atomically(
                    cert_dir / name, files[name], mode=0o600 if name == TLS_KEY else 0o644
                )
        except OSError as exc:
            if exc.errno in _UNWRITABLE:
                self._unwritable.add(cert_dir)
                log.info(
                    "certificate directory is not writable; the kubelet refreshes it instead",
                    extra={"fields": {**self._fields(), "dir": str(cert_dir), "error": str(exc)}},
                )
            else:
                log.warning(
                    "certificate files not written",
                    extra={"fields": {**self._fields(), "dir": str(cert_dir), "error": str(exc)}},
                )
            return False
        if changed:
            log.info(
                "certificate files updated from the TLS secret",
                extra={"fields": {**self._fields(), "dir": str(cert_dir), "files": changed}},
            )
        return bool(changed)

    # --- the Secret ---------------------------------------------------------------------------

    async def _get_secret(self) -> Obj | None:
        try:
            return await self.client.get(SECRETS, self.namespace, self.secret)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _new_secret(self, data: Mapping[str, bytes]) -> Obj:
        return {
            "apiVersion": SECRETS.api_version,
            "kind": "Secret",
            "metadata": {"name": self.secret, "namespace": self.namespace},
            "type": SECRET_TYPE,
            "data": encode_data(data),
        }

    # --- logs ---------------------------------------------------------------------------------

    def _created(self, data: Mapping[str, bytes]) -> None:
        serving = load_serving(data[TLS_CERT], data[TLS_KEY])
        fields = self._fields()
        if serving is not None:
            fields["serial"] = f"{serving.serial_number:x}"
            fields["not_after"] = serving.not_valid_after_utc.isoformat()
        log.info("created the TLS secret with a new CA", extra={"fields": fields})

    def _updated(self, plan: RenewalPlan) -> None:
        fields: dict[str, object] = {**self._fields(), "changes": list(plan.changes)}
        if plan.serving is not None:
            fields["serial"] = f"{plan.serving.serial_number:x}"
            fields["not_after"] = plan.serving.not_valid_after_utc.isoformat()
        log.info("updated the TLS secret", extra={"fields": fields})

    def _where(self) -> str:
        return f"{self.namespace}/{self.secret}"

    def _fields(self) -> dict[str, object]:
        return {"secret": self._where()}

    def _warn(self, message: str, exc: ApiError, **fields: object) -> None:
        log.warning(
            message,
            extra={"fields": {**self._fields(), **fields, "status": exc.status, "error": str(exc)}},
        )


@dataclass(slots=True)
class _Written:
    """Whether a reconcile wrote anything, also when an error ended it halfway."""

    anything: bool = False


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None

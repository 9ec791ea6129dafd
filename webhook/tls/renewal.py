"""What the TLS Secret should hold at a given time: which CA and serving pair are due, and when
the previous CA leaves the bundle.

A serving pair is renewed from the same CA, so ``caBundle`` does not change. A new CA is first
published next to the old one (bundle ``[new, old]``) while the pair signed by the old CA keeps
serving; a pair from the new CA is issued only once the webhook configurations show that
bundle, and the old CA leaves it once the new pair has been in the Secret for
:data:`PROPAGATION`. :meth:`Renewal.plan` is that rule as a function of the Secret's data and
the time, with no client and no clock, so every step of a rotation can be read and tested
apart from the reads and writes :class:`~webhook.tls.rotation.CertificateRotator` makes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from webhook.tls.certificates import (
    _CLOCK_SKEW,
    _MAX_COMMON_NAME,
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    CertificateError,
    KeyPair,
    _parse_pair,
    issue_serving,
    new_ca,
)

__all__ = ["PROPAGATION", "Renewal", "RenewalPlan", "issued_by", "load_serving"]

# How long a pair written to the Secret may take to be served by every replica: the kubelet
# syncs a pod about once a minute and serves Secret volumes from a cache with a TTL of about a
# minute, and the reloader polls every few seconds. Ten minutes leaves room for a slow node.
PROPAGATION: Final = timedelta(minutes=10)

_IssuerKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True, slots=True)
class RenewalPlan:
    """What the Secret should hold, the changes that make it so, and the serving certificate."""

    data: dict[str, bytes]
    changes: tuple[str, ...]
    serving: x509.Certificate | None


@dataclass(frozen=True, slots=True)
class Renewal:
    """When the CA and the serving pair of one Service are renewed, and for how long."""

    service: str
    namespace: str
    dns_names: tuple[str, ...]
    ca_days: int
    serving_days: int
    rotate_before: timedelta
    ca_rotate_before: timedelta

    def fresh(self, now: datetime) -> dict[str, bytes]:
        """A first Secret's data: a new CA and the serving pair it signed."""
        ca = new_ca(self.ca_name(now), now=now, days=self.ca_days)
        serving = issue_serving(ca, dns_names=self.dns_names, now=now, days=self.serving_days)
        return {
            TLS_CERT: serving.cert_pem,
            TLS_KEY: serving.key_pem,
            CA_CERT: ca.cert_pem,
            CA_KEY: ca.key_pem,
        }

    def plan(self, data: Mapping[str, bytes], now: datetime, *, published: bool) -> RenewalPlan:
        """What the Secret should hold at ``now``; ``published``: the configurations already
        show its current bundle, so the API server trusts every CA in it."""
        changes: list[str] = []
        found = parse_bundle(data.get(CA_CERT, b""))
        bundle = [ca for ca in found if ca.not_valid_after_utc > now]
        if len(bundle) < len(found):
            changes.append("dropped expired CAs")
        ca = load_ca(found[0] if found else None, data.get(CA_KEY))
        ca_key_pem = data.get(CA_KEY, b"")
        pair = (data.get(TLS_CERT, b""), data.get(TLS_KEY, b""))
        serving = load_serving(*pair)
        signer = self._signer(serving, bundle, now)

        if ca is None or ca.cert.not_valid_after_utc - now <= self.ca_rotate_before:
            # Published next to the CAs already trusted; the pair they signed keeps serving.
            ca = new_ca(self.ca_name(now), now=now, days=self.ca_days)
            ca_key_pem = ca.key_pem
            bundle = [ca.cert, *bundle]
            changes.append("new CA, published next to the previous one")
            renew = signer is None
        elif signer is None:
            renew = True
        elif signer != ca.cert:
            # The pair is from the previous CA: switch once the API server trusts the new one.
            renew = published
        else:
            renew = serving is not None and serving.not_valid_after_utc - now <= self.rotate_before
        if renew:
            issued = issue_serving(ca, dns_names=self.dns_names, now=now, days=self.serving_days)
            pair, serving = (issued.cert_pem, issued.key_pem), issued.cert
            changes.append("new serving pair")

        if (
            len(bundle) > 1
            and serving is not None
            and issued_by(serving, ca.cert)
            and serving.not_valid_before_utc + _CLOCK_SKEW + PROPAGATION <= now
        ):
            bundle = bundle[:1]
            changes.append("dropped the previous CA")
        planned = {
            **data,
            TLS_CERT: pair[0],
            TLS_KEY: pair[1],
            CA_CERT: b"".join(c.public_bytes(serialization.Encoding.PEM) for c in bundle),
            CA_KEY: ca_key_pem,
        }
        return RenewalPlan(planned, tuple(changes), serving)

    def _signer(
        self, serving: x509.Certificate | None, bundle: Sequence[x509.Certificate], now: datetime
    ) -> x509.Certificate | None:
        """The CA in ``bundle`` that signed a current pair for our names, or None."""
        if serving is None or serving.not_valid_after_utc <= now:
            return None
        try:
            san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return None
        if set(san.get_values_for_type(x509.DNSName)) != set(self.dns_names):
            return None
        return next((ca for ca in bundle if issued_by(serving, ca)), None)

    def ca_name(self, now: datetime) -> str:
        """The common name of a CA created at ``now``."""
        # A timestamp keeps two CAs of one bundle apart by subject as well as by key.
        stamp = f"{now:%Y%m%dT%H%M%SZ}"
        for name in (f"{self.service}.{self.namespace} CA {stamp}", f"{self.service} CA {stamp}"):
            if len(name) <= _MAX_COMMON_NAME:
                return name
        return f"webhook CA {stamp}"


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def parse_bundle(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def load_ca(cert: x509.Certificate | None, key_pem: bytes | None) -> KeyPair | None:
    """The current CA when ``key_pem`` is its key and it may issue certificates."""
    if cert is None or key_pem is None:
        return None
    try:
        if not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            return None
        _, key = _parse_pair(
            cert.public_bytes(serialization.Encoding.PEM),
            key_pem,
            cert_source=CA_CERT,
            key_source=CA_KEY,
        )
    except (x509.ExtensionNotFound, CertificateError):
        return None
    return KeyPair(cert, key) if isinstance(key, _IssuerKey) else None


def load_serving(cert_pem: bytes, key_pem: bytes) -> x509.Certificate | None:
    """The serving certificate when ``key_pem`` is its key."""
    try:
        cert, _ = _parse_pair(cert_pem, key_pem, cert_source=TLS_CERT, key_source=TLS_KEY)
    except CertificateError:
        return None
    return cert

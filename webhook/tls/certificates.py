"""Serving certificates: a small self-signed CA, the pair it issues, and reading them back.

The API server calls an admission webhook over TLS and trusts it through the ``caBundle`` of the
webhook configuration, so a deployment without cert-manager needs its own CA. :func:`generate`
writes the files under the names a mounted ``kubernetes.io/tls`` Secret uses (``tls.crt``,
``tls.key``, ``ca.crt``) and keeps ``ca.key`` beside them, so that running it again rotates only
the serving pair while the ``caBundle`` already registered stays valid. Every file is replaced
atomically, because a server polling the directory must never read half a key.

Over 400 lines, and kept whole: issuing a pair and reading one back are one format (file names,
key types, extensions, validity) and share the helpers that spell it.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "TLS_CERT",
    "TLS_KEY",
    "Bundle",
    "CertificateError",
    "CertificateInfo",
    "KeyPair",
    "certificate_info",
    "check_pair",
    "generate",
    "issue_serving",
    "new_ca",
    "read_certificate",
]

# The keys of a kubernetes.io/tls Secret (plus ca.crt, which cert-manager adds), as mounted files.
TLS_CERT: Final = "tls.crt"
TLS_KEY: Final = "tls.key"
CA_CERT: Final = "ca.crt"
CA_KEY: Final = "ca.key"

# Certificates start a little in the past so that a node whose clock lags ours still accepts them.
_CLOCK_SKEW: Final = timedelta(minutes=5)
# RFC 5280 upper bound for a commonName (ub-common-name); longer names live in the SAN alone.
_MAX_COMMON_NAME: Final = 64

_IssuerKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class CertificateError(Exception):
    """A certificate or key cannot be made, read or used; the message names the file and why."""


@dataclass(frozen=True, slots=True)
class Bundle:
    """What :func:`generate` wrote: the paths a server and its clients load."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    serial: int
    not_after: datetime


@dataclass(frozen=True, slots=True)
class CertificateInfo:
    """The facts about a certificate that logs, metrics and tests look at."""

    serial: int
    not_after: datetime
    dns_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, in memory."""

    cert: x509.Certificate
    key: _IssuerKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)


def new_ca(common_name: str, *, now: datetime, days: int) -> KeyPair:
    """A self-signed ECDSA P-256 CA valid for ``days`` from ``now``, issuing end entities only."""
    if days < 1:
        raise CertificateError("validity must be at least one day")
    start = _whole_seconds(now)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _subject(common_name) or x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, "webhook CA")]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - _CLOCK_SKEW)
        .not_valid_after(start + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def issue_serving(
    ca: KeyPair,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address] = (),
    now: datetime,
    days: int,
) -> KeyPair:
    """An ECDSA P-256 serving pair for ``dns_names`` and ``ip_addresses`` signed by ``ca``; it
    never outlives ``ca``."""
    if not dns_names and not ip_addresses:
        raise CertificateError("a serving certificate needs at least one DNS name or IP address")
    if days < 1:
        raise CertificateError("validity must be at least one day")
    start = _whole_seconds(now)
    if ca.cert.not_valid_after_utc <= start:
        raise CertificateError(f"the CA expired on {ca.cert.not_valid_after_utc:%Y-%m-%d}")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _subject(dns_names[0] if dns_names else str(ip_addresses[0]))
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(address) for address in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - _CLOCK_SKEW)
        .not_valid_after(min(start + timedelta(days=days), ca.cert.not_valid_after_utc))
        # RFC 5280 4.2.1.6: with an empty subject the SAN extension must be critical.
        .add_extension(x509.SubjectAlternativeName(sans), critical=not subject)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_identifier(ca.cert), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def _whole_seconds(now: datetime) -> datetime:
    if now.tzinfo is None:
        raise CertificateError(f"now={now.isoformat()} has no timezone")
    # X.509 times have whole seconds; dropping the fraction keeps comparisons exact.
    return now.astimezone(UTC).replace(microsecond=0)


def generate(
    out_dir: Path,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    valid_days: int = 365,
    ca_valid_days: int = 3650,
    now: datetime | None = None,
) -> Bundle:
    """Issue a serving pair for ``dns_names`` and ``ip_addresses`` from the CA in ``out_dir``.

    The CA (``ca.crt``, ``ca.key``) is created when absent and reused when present. The serving
    certificate never outlives its CA.
    """
    names = _dns_names(dns_names)
    addresses = _ip_addresses(ip_addresses)
    if not names and not addresses:
        raise CertificateError("a serving certificate needs at least one DNS name or IP address")
    if valid_days < 1 or ca_valid_days < 1:
        raise CertificateError("validity must be at least one day")
    start = _utc_now(now)

    out_dir.mkdir(parents=True, exist_ok=True)
    ca = _load_or_create_ca(
        out_dir, common_name=f"{(names or addresses)[0]} CA", start=start, days=ca_valid_days
    )
    if ca.cert.not_valid_after_utc <= start:
        raise CertificateError(
            f"{out_dir / CA_CERT}: the CA expired on {ca.cert.not_valid_after_utc:%Y-%m-%d}; "
            f"remove {CA_CERT} and {CA_KEY} to create a new one"
        )
    serving = issue_serving(ca, dns_names=names, ip_addresses=addresses, now=start, days=valid_days)
    cert = serving.cert
    key_file, cert_file = out_dir / TLS_KEY, out_dir / TLS_CERT
    _write_atomically(key_file, serving.key_pem, mode=0o600)
    _write_atomically(cert_file, serving.cert_pem, mode=0o644)
    return Bundle(
        cert_file=cert_file,
        key_file=key_file,
        ca_file=out_dir / CA_CERT,
        serial=cert.serial_number,
        not_after=cert.not_valid_after_utc,
    )


def read_certificate(path: Path) -> x509.Certificate:
    """The first certificate in the PEM file at ``path``."""
    return _parse_certificate(_read(path), source=str(path))


def certificate_info(pem_bytes: bytes, *, source: str = "certificate") -> CertificateInfo:
    """Serial, expiry and DNS names of the first certificate in ``pem_bytes``."""
    return _info(_parse_certificate(pem_bytes, source=source))


def check_pair(
    cert_pem: bytes, key_pem: bytes, *, cert_source: str, key_source: str
) -> CertificateInfo:
    """Check that ``key_pem`` is the unencrypted private key of the certificate in ``cert_pem``."""
    cert, _ = _parse_pair(cert_pem, key_pem, cert_source=cert_source, key_source=key_source)
    return _info(cert)


def _load_or_create_ca(out_dir: Path, *, common_name: str, start: datetime, days: int) -> KeyPair:
    cert_file, key_file = out_dir / CA_CERT, out_dir / CA_KEY
    if cert_file.exists() or key_file.exists():
        return KeyPair(*_load_ca(cert_file, key_file))
    ca = new_ca(common_name, now=start, days=days)
    # The key first: a ca.crt without its ca.key could never issue again.
    _write_atomically(key_file, ca.key_pem, mode=0o600)
    _write_atomically(cert_file, ca.cert_pem, mode=0o644)
    return ca


def _load_ca(cert_file: Path, key_file: Path) -> tuple[x509.Certificate, _IssuerKey]:
    for present, absent in ((cert_file, key_file), (key_file, cert_file)):
        if not absent.exists():
            raise CertificateError(
                f"{absent}: missing beside {present}; restore it, or remove both to create a new CA"
            )
    cert, key = _parse_pair(
        _read(cert_file), _read(key_file), cert_source=str(cert_file), key_source=str(key_file)
    )
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CertificateError(
            f"{cert_file}: not a CA certificate (BasicConstraints CA is not set)"
        )
    if not isinstance(key, _IssuerKey):
        raise CertificateError(f"{key_file}: a CA key must be EC or RSA")
    return cert, key


def _dns_names(names: Sequence[str]) -> list[str]:
    for name in names:
        if not name or not name.isascii() or any(c.isspace() for c in name):
            raise CertificateError(f"{name!r} is not a DNS name (use the ASCII A-label form)")
    return list(names)


def _ip_addresses(
    addresses: Sequence[str],
) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    parsed = []
    for address in addresses:
        try:
            parsed.append(ipaddress.ip_address(address))
        except ValueError:
            raise CertificateError(f"{address!r} is not an IP address") from None
    return parsed


def _utc_now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC).replace(microsecond=0)
    if now.tzinfo is None:
        raise CertificateError(f"now={now.isoformat()} has no timezone")
    # X.509 times have whole seconds; dropping the fraction keeps not_after as written.
    return now.astimezone(UTC).replace(microsecond=0)


def _subject(common_name: str) -> x509.Name:
    if len(common_name) > _MAX_COMMON_NAME:
        return x509.Name([])
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(
    *, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _authority_key_identifier(ca_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    # A reused CA may have been made elsewhere: echo its own SKI rather than recompute one.
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(_issuer_public_key(ca_cert))
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _issuer_public_key(
    cert: x509.Certificate,
) -> ec.EllipticCurvePublicKey | rsa.RSAPublicKey:
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise CertificateError("a CA key must be EC or RSA")
    return key


def _key_pem(key: _IssuerKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _parse_pair(
    cert_pem: bytes, key_pem: bytes, *, cert_source: str, key_source: str
) -> tuple[x509.Certificate, PrivateKeyTypes]:
    cert = _parse_certificate(cert_pem, source=cert_source)
    key = _parse_private_key(key_pem, source=key_source)
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise CertificateError(
            f"{key_source}: the key does not match the certificate in {cert_source}"
        )
    return cert, key


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CertificateError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _parse_certificate(pem: bytes, *, source: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise CertificateError(f"{source}: not a PEM certificate") from None


def _parse_private_key(pem: bytes, *, source: str) -> PrivateKeyTypes:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise CertificateError(f"{source}: the private key is encrypted") from None
    except UnsupportedAlgorithm:
        raise CertificateError(f"{source}: unsupported private key algorithm") from None
    except ValueError:
        raise CertificateError(f"{source}: not a PEM private key") from None
    return key


def _info(cert: x509.Certificate) -> CertificateInfo:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns_names = tuple(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns_names = ()
    return CertificateInfo(
        serial=cert.serial_number, not_after=cert.not_valid_after_utc, dns_names=dns_names
    )


def _write_atomically(path: Path, content: bytes, *, mode: int) -> None:
    """Write a sibling temporary file, then rename it over ``path``: readers see old or new."""
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "wb") as stream:
            os.fchmod(stream.fileno(), mode)
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise

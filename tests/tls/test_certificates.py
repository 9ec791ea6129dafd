"""generate() writes a CA and a serving pair a kubernetes.io/tls Secret could hold, and reuses the
CA so that rotating the pair never breaks the caBundle clients already trust."""

import ipaddress
import stat
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from webhook.tls.certificates import (
    Bundle,
    CertificateError,
    certificate_info,
    check_pair,
    generate,
    read_certificate,
)

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
SERVICE = "reservation-webhook.cozy-system.svc"


T = TypeVar("T", bound=x509.ExtensionType)


def issue(
    directory: Path,
    *,
    dns_names: Sequence[str] = (SERVICE, "localhost"),
    ip_addresses: Sequence[str] = ("127.0.0.1", "::1"),
    valid_days: int = 365,
    ca_valid_days: int = 3650,
    now: datetime = NOW,
) -> Bundle:
    """generate() with a service name, loopback addresses and a fixed clock."""
    return generate(
        directory,
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        valid_days=valid_days,
        ca_valid_days=ca_valid_days,
        now=now,
    )


def extension(cert: x509.Certificate, kind: type[T]) -> x509.Extension[T]:
    return cert.extensions.get_extension_for_class(kind)


def test_writes_the_files_of_a_tls_secret_plus_the_ca_key(tmp_path: Path) -> None:
    bundle = issue(tmp_path)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert (bundle.cert_file, bundle.key_file, bundle.ca_file) == (
        tmp_path / "tls.crt",
        tmp_path / "tls.key",
        tmp_path / "ca.crt",
    )


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        pytest.param("tls.key", 0o600, id="serving-key-is-private"),
        pytest.param("ca.key", 0o600, id="ca-key-is-private"),
        pytest.param("tls.crt", 0o644, id="serving-certificate-is-readable"),
        pytest.param("ca.crt", 0o644, id="ca-certificate-is-readable"),
    ],
)
def test_file_modes(tmp_path: Path, name: str, mode: int) -> None:
    issue(tmp_path)

    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode


def test_keys_are_pkcs8_ecdsa_p256(tmp_path: Path) -> None:
    issue(tmp_path)

    for name in ("tls.key", "ca.key"):
        pem = (tmp_path / name).read_bytes()
        assert pem.startswith(b"-----BEGIN PRIVATE KEY-----\n"), name
        key = serialization.load_pem_private_key(pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey), name
        assert isinstance(key.curve, ec.SECP256R1), name


def test_serving_certificate_is_issued_by_the_ca(tmp_path: Path) -> None:
    bundle = issue(tmp_path)
    cert, ca = read_certificate(bundle.cert_file), read_certificate(bundle.ca_file)

    cert.verify_directly_issued_by(ca)
    assert (
        extension(cert, x509.AuthorityKeyIdentifier).value.key_identifier
        == extension(ca, x509.SubjectKeyIdentifier).value.digest
    )


def test_serving_certificate_names_the_service_and_serves_only(tmp_path: Path) -> None:
    bundle = issue(tmp_path)
    cert = read_certificate(bundle.cert_file)

    san = extension(cert, x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [SERVICE, "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert list(extension(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    constraints = extension(cert, x509.BasicConstraints)
    assert constraints.critical
    assert not constraints.value.ca
    usage = extension(cert, x509.KeyUsage).value
    assert usage.digital_signature
    assert not usage.key_cert_sign
    assert extension(cert, x509.SubjectKeyIdentifier).value.digest


def test_ca_signs_certificates_and_nothing_below_them(tmp_path: Path) -> None:
    bundle = issue(tmp_path)
    ca = read_certificate(bundle.ca_file)

    constraints = extension(ca, x509.BasicConstraints)
    assert constraints.critical
    assert (constraints.value.ca, constraints.value.path_length) == (True, 0)
    usage = extension(ca, x509.KeyUsage).value
    assert (usage.key_cert_sign, usage.crl_sign, usage.digital_signature) == (True, True, False)
    ca.verify_directly_issued_by(ca)


def test_bundle_reports_the_serving_serial_and_expiry(tmp_path: Path) -> None:
    bundle = issue(tmp_path, valid_days=90)
    cert = read_certificate(bundle.cert_file)

    assert bundle.serial == cert.serial_number
    assert bundle.not_after == cert.not_valid_after_utc == NOW + timedelta(days=90)
    assert cert.not_valid_before_utc < NOW


def test_serving_certificate_never_outlives_its_ca(tmp_path: Path) -> None:
    bundle = issue(tmp_path, valid_days=365, ca_valid_days=30)

    assert bundle.not_after == read_certificate(bundle.ca_file).not_valid_after_utc


def test_rerun_keeps_the_ca_and_issues_a_new_serial(tmp_path: Path) -> None:
    first = issue(tmp_path)
    ca_pem, ca_key = (tmp_path / "ca.crt").read_bytes(), (tmp_path / "ca.key").read_bytes()

    second = issue(tmp_path, now=NOW + timedelta(days=300))

    assert (tmp_path / "ca.crt").read_bytes() == ca_pem
    assert (tmp_path / "ca.key").read_bytes() == ca_key
    assert second.serial != first.serial
    assert second.not_after == NOW + timedelta(days=300 + 365)
    read_certificate(second.cert_file).verify_directly_issued_by(read_certificate(second.ca_file))


def test_rerun_replaces_files_so_open_readers_keep_the_old_content(tmp_path: Path) -> None:
    issue(tmp_path)
    old = (tmp_path / "tls.crt").read_bytes()

    with (tmp_path / "tls.crt").open("rb") as reader:
        issue(tmp_path)
        assert reader.read() == old

    assert (tmp_path / "tls.crt").read_bytes() != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]


def test_a_name_too_long_for_a_common_name_lives_in_the_san_alone(tmp_path: Path) -> None:
    long_name = ".".join(["a" * 40, "b" * 40, "svc"])
    bundle = issue(tmp_path, dns_names=[long_name], ip_addresses=[])
    cert = read_certificate(bundle.cert_file)

    assert len(cert.subject) == 0
    san = extension(cert, x509.SubjectAlternativeName)
    assert san.critical
    assert san.value.get_values_for_type(x509.DNSName) == [long_name]


def test_an_ip_address_alone_is_enough(tmp_path: Path) -> None:
    bundle = issue(tmp_path, dns_names=[], ip_addresses=["10.0.0.7"])

    san = extension(read_certificate(bundle.cert_file), x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]


def test_certificate_info_reads_serial_expiry_and_names(tmp_path: Path) -> None:
    bundle = issue(tmp_path)

    info = certificate_info(bundle.cert_file.read_bytes())

    assert (info.serial, info.not_after) == (bundle.serial, bundle.not_after)
    assert info.dns_names == (SERVICE, "localhost")


def test_check_pair_accepts_a_certificate_and_its_own_key(tmp_path: Path) -> None:
    bundle = issue(tmp_path)

    info = check_pair(
        bundle.cert_file.read_bytes(),
        bundle.key_file.read_bytes(),
        cert_source="tls.crt",
        key_source="tls.key",
    )

    assert info.serial == bundle.serial


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            {"dns_names": [], "ip_addresses": []},
            "at least one DNS name or IP address",
            id="no-names",
        ),
        pytest.param(
            {"ip_addresses": ["300.1.2.3"]}, "'300.1.2.3' is not an IP address", id="bad-ip"
        ),
        pytest.param({"ip_addresses": ["localhost"]}, "'localhost' is not an IP", id="name-as-ip"),
        pytest.param({"dns_names": [""]}, "'' is not a DNS name", id="empty-dns-name"),
        pytest.param({"dns_names": ["a b"]}, "'a b' is not a DNS name", id="dns-name-with-space"),
        pytest.param({"dns_names": ["bücher.de"]}, "A-label", id="dns-name-not-idna-encoded"),
        pytest.param({"valid_days": 0}, "at least one day", id="zero-validity"),
        pytest.param({"ca_valid_days": -1}, "at least one day", id="negative-ca-validity"),
        pytest.param({"now": datetime(2030, 1, 1)}, "no timezone", id="naive-now"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(CertificateError, match=message):
        issue(tmp_path / "out", **overrides)

    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(
            lambda d: (d / "ca.key").unlink(),
            r"ca\.key: missing beside .*ca\.crt",
            id="ca-certificate-without-its-key",
        ),
        pytest.param(
            lambda d: (d / "ca.crt").unlink(),
            r"ca\.crt: missing beside .*ca\.key",
            id="ca-key-without-its-certificate",
        ),
        pytest.param(
            lambda d: (d / "ca.crt").write_bytes(b"not a certificate\n"),
            r"ca\.crt: not a PEM certificate",
            id="garbage-ca-certificate",
        ),
        pytest.param(
            lambda d: (d / "ca.key").write_bytes((d / "tls.key").read_bytes()),
            r"ca\.key: the key does not match the certificate in .*ca\.crt",
            id="ca-key-of-another-certificate",
        ),
        pytest.param(
            lambda d: [
                (d / "ca.crt").write_bytes((d / "tls.crt").read_bytes()),
                (d / "ca.key").write_bytes((d / "tls.key").read_bytes()),
            ],
            r"ca\.crt: not a CA certificate",
            id="serving-pair-posing-as-the-ca",
        ),
    ],
)
def test_a_damaged_ca_is_refused_not_replaced(
    tmp_path: Path, damage: Callable[[Path], object], message: str
) -> None:
    issue(tmp_path)
    damage(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    with pytest.raises(CertificateError, match=message):
        issue(tmp_path)

    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_expired_ca_is_refused(tmp_path: Path) -> None:
    issue(tmp_path, ca_valid_days=10)

    with pytest.raises(CertificateError, match=r"ca\.crt: the CA expired on 2030-01-12"):
        issue(tmp_path, now=NOW + timedelta(days=11))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"", "not a PEM certificate", id="empty-file"),
        pytest.param(b"garbage\n", "not a PEM certificate", id="garbage"),
        pytest.param(
            b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            "not a PEM certificate",
            id="truncated-certificate",
        ),
    ],
)
def test_read_certificate_names_the_file_and_why(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "tls.crt"
    path.write_bytes(content)

    with pytest.raises(CertificateError, match=f"{path}: {message}"):
        read_certificate(path)
    with pytest.raises(CertificateError, match=f"tls.crt: {message}"):
        certificate_info(content, source="tls.crt")


def test_read_certificate_of_a_missing_file_says_it_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(CertificateError, match=r"absent\.crt: cannot read \(No such file"):
        read_certificate(tmp_path / "absent.crt")


@pytest.mark.parametrize(
    ("key_of", "message"),
    [
        pytest.param(
            "other",
            r"tls\.key: the key does not match the certificate in tls\.crt",
            id="mismatched",
        ),
        pytest.param("garbage", r"tls\.key: not a PEM private key", id="garbage-key"),
        pytest.param("certificate", r"tls\.key: not a PEM private key", id="certificate-as-key"),
        pytest.param("encrypted", r"tls\.key: the private key is encrypted", id="encrypted-key"),
    ],
)
def test_check_pair_names_the_file_and_why(tmp_path: Path, key_of: str, message: str) -> None:
    bundle = issue(tmp_path / "a")
    other = issue(tmp_path / "b")
    key = serialization.load_pem_private_key(bundle.key_file.read_bytes(), password=None)
    keys = {
        "other": other.key_file.read_bytes(),
        "garbage": b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        "certificate": bundle.cert_file.read_bytes(),
        "encrypted": key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        ),
    }

    with pytest.raises(CertificateError, match=message):
        check_pair(
            bundle.cert_file.read_bytes(), keys[key_of], cert_source="tls.crt", key_source="tls.key"
        )

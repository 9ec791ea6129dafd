"""Server and client contexts speak TLS 1.2+ and check client certificates, and the reloader
swaps a rotated pair into the live context while refusing broken ones. Every check here is a
real TLS handshake on 127.0.0.1."""

import asyncio
import contextlib
import logging
import os
import re
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.tls.certificates import Bundle, CertificateError, generate
from webhook.tls.contexts import CertificateReloader, client_context, server_context

TIMEOUT = 5.0


@dataclass(frozen=True)
class Peer:
    serial: int
    version: str


class Refused(Exception):
    """The connection did not complete a TLS round trip."""


@contextlib.asynccontextmanager
async def serving(context: ssl.SSLContext) -> AsyncIterator[int]:
    """A TLS server on 127.0.0.1 that greets each client with ``ok``; yields its port."""

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        with contextlib.suppress(OSError):
            await writer.drain()
            writer.close()
            await writer.wait_closed()

    server = await asyncio.start_server(greet, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def connect(port: int, context: ssl.SSLContext) -> Peer:
    """Handshake, read the greeting, and report the certificate the server presented.

    Reading matters: under TLS 1.3 the client finishes its handshake before the server has
    looked at the client certificate, so a refusal only shows on the first read.
    """
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost"),
            TIMEOUT,
        )
    except (OSError, asyncio.IncompleteReadError) as exc:
        raise Refused(repr(exc)) from exc
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True)
        version = ssl_object.version()
        greeting = await asyncio.wait_for(reader.read(), TIMEOUT)
    except OSError as exc:
        raise Refused(repr(exc)) from exc
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if greeting != b"ok":
        raise Refused(f"the server closed the connection after the handshake: {greeting!r}")
    return Peer(serial=x509.load_der_x509_certificate(der).serial_number, version=version)


async def round_trip(server: ssl.SSLContext, client: ssl.SSLContext) -> Peer:
    async with serving(server) as port:
        return await connect(port, client)


def issue(directory: Path) -> Bundle:
    return generate(directory, dns_names=["localhost"], ip_addresses=["127.0.0.1"])


def issue_client_certificate(ca_dir: Path, out_dir: Path) -> tuple[Path, Path]:
    """A client certificate (EKU clientAuth) signed by the CA that generate() left in ca_dir."""
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = out_dir / "client.crt", out_dir / "client.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def legacy_client(ca_file: Path, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that offers only ``version``, at the security level old protocols need."""
    context = client_context(ca_file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = version
        context.maximum_version = version
    # OpenSSL 3 refuses TLS < 1.2 at security level 1 and above, on either side.
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


class SecretVolume:
    """A directory laid out as the kubelet projects a Secret, updated the way it does it.

    Files live in a timestamped directory; ``..data`` links to it; each visible name links to
    ``..data/<name>``. An update writes a new timestamped directory and renames a fresh
    ``..data_tmp`` link over ``..data``, so readers see either the old set or the new one.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir()
        self._generation = 0

    @property
    def cert_file(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.root / "tls.key"

    def publish(self, files: Mapping[str, bytes]) -> None:
        self._generation += 1
        stamp = f"..2030_01_01_00_00_{self._generation:02d}.{os.getpid()}"
        (self.root / stamp).mkdir()
        for name, content in files.items():
            (self.root / stamp / name).write_bytes(content)
        data = self.root / "..data"
        previous = os.readlink(data) if data.is_symlink() else None
        os.symlink(stamp, self.root / "..data_tmp")
        os.replace(self.root / "..data_tmp", data)
        for name in files:
            if not (self.root / name).is_symlink():
                os.symlink(f"..data/{name}", self.root / name)
        if previous is not None:
            for old in (self.root / previous).iterdir():
                old.unlink()
            (self.root / previous).rmdir()

    def publish_bundle(self, bundle: Bundle) -> None:
        self.publish(files(bundle))


def files(bundle: Bundle) -> dict[str, bytes]:
    """The serving pair of a bundle as the keys of a kubernetes.io/tls Secret."""
    return {"tls.crt": bundle.cert_file.read_bytes(), "tls.key": bundle.key_file.read_bytes()}


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    return issue(tmp_path / "issuer")


# server_context


@pytest.mark.parametrize(
    ("version", "name"),
    [
        pytest.param(ssl.TLSVersion.TLSv1_2, "TLSv1.2", id="accepts-tls-1.2"),
        pytest.param(ssl.TLSVersion.TLSv1_3, "TLSv1.3", id="accepts-tls-1.3"),
    ],
)
async def test_server_speaks_modern_tls(bundle: Bundle, version: ssl.TLSVersion, name: str) -> None:
    client = client_context(bundle.ca_file)
    client.minimum_version = client.maximum_version = version

    peer = await round_trip(server_context(bundle.cert_file, bundle.key_file), client)

    assert peer == Peer(serial=bundle.serial, version=name)


async def test_server_refuses_tls_1_1(bundle: Bundle) -> None:
    server = server_context(bundle.cert_file, bundle.key_file)
    legacy = legacy_client(bundle.ca_file, ssl.TLSVersion.TLSv1_1)

    assert server.minimum_version is ssl.TLSVersion.TLSv1_2
    with pytest.raises(Refused):
        await round_trip(server, legacy)


async def test_the_tls_1_1_client_is_able_to_connect_where_allowed(bundle: Bundle) -> None:
    """The control for the test above: its refusal is the server's doing, not the client's."""
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        permissive.minimum_version = ssl.TLSVersion.TLSv1_1
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    permissive.load_cert_chain(bundle.cert_file, bundle.key_file)

    try:
        peer = await round_trip(permissive, legacy_client(bundle.ca_file, ssl.TLSVersion.TLSv1_1))
    except Refused as exc:
        pytest.skip(f"this OpenSSL does not speak TLS 1.1 at all: {exc}")

    assert peer.version == "TLSv1.1"


async def test_client_refuses_a_server_its_ca_did_not_issue(tmp_path: Path, bundle: Bundle) -> None:
    stranger = issue(tmp_path / "stranger")

    with pytest.raises(Refused, match="CERTIFICATE_VERIFY_FAILED"):
        await round_trip(
            server_context(stranger.cert_file, stranger.key_file), client_context(bundle.ca_file)
        )


@pytest.mark.parametrize(
    ("client", "accepted"),
    [
        pytest.param("issued-by-the-client-ca", True, id="client-certificate-from-the-ca-accepted"),
        pytest.param("none", False, id="client-without-certificate-refused"),
        pytest.param(
            "issued-by-another-ca", False, id="client-certificate-from-another-ca-refused"
        ),
    ],
)
async def test_client_certificate_required_when_client_ca_given(
    tmp_path: Path, bundle: Bundle, client: str, accepted: bool
) -> None:
    client_ca_dir, other_ca_dir = tmp_path / "client-ca", tmp_path / "other-ca"
    issue(client_ca_dir)
    issue(other_ca_dir)
    server = server_context(bundle.cert_file, bundle.key_file, client_ca=client_ca_dir / "ca.crt")
    if client == "none":
        context = client_context(bundle.ca_file)
    else:
        ca_dir = client_ca_dir if client == "issued-by-the-client-ca" else other_ca_dir
        cert_file, key_file = issue_client_certificate(ca_dir, tmp_path / "client")
        context = client_context(bundle.ca_file, cert_file=cert_file, key_file=key_file)

    assert server.verify_mode is ssl.CERT_REQUIRED
    if accepted:
        assert (await round_trip(server, context)).serial == bundle.serial
    else:
        with pytest.raises(Refused):
            await round_trip(server, context)


def test_no_client_certificate_is_asked_for_without_client_ca(bundle: Bundle) -> None:
    assert server_context(bundle.cert_file, bundle.key_file).verify_mode is ssl.CERT_NONE


@pytest.mark.parametrize(
    ("arrange", "message"),
    [
        pytest.param(
            lambda b, other: (b.cert_file, other.key_file),
            r"other/tls\.key: the key does not match the certificate in .*issuer/tls\.crt",
            id="mismatched-pair",
        ),
        pytest.param(
            lambda b, other: (b.cert_file, b.cert_file.with_name("absent.key")),
            r"absent\.key: cannot read \(No such file",
            id="unreadable-key",
        ),
        pytest.param(
            lambda b, other: (b.ca_file.with_name("ca.key"), b.key_file),
            r"ca\.key: not a PEM certificate",
            id="key-given-as-certificate",
        ),
    ],
)
def test_server_context_names_the_broken_file(
    tmp_path: Path,
    bundle: Bundle,
    arrange: Callable[[Bundle, Bundle], tuple[Path, Path]],
    message: str,
) -> None:
    cert_file, key_file = arrange(bundle, issue(tmp_path / "other"))

    with pytest.raises(CertificateError, match=message):
        server_context(cert_file, key_file)


def test_a_garbage_client_ca_is_named(tmp_path: Path, bundle: Bundle) -> None:
    (tmp_path / "garbage.crt").write_bytes(b"garbage\n")

    with pytest.raises(CertificateError, match=r"garbage\.crt: not a PEM CA certificate"):
        server_context(bundle.cert_file, bundle.key_file, client_ca=tmp_path / "garbage.crt")


def test_a_client_certificate_needs_its_key(bundle: Bundle) -> None:
    with pytest.raises(CertificateError, match="both cert_file and key_file"):
        client_context(bundle.ca_file, cert_file=bundle.cert_file)


# CertificateReloader


async def test_reloader_swaps_a_rotated_pair_into_the_live_context(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    issuer, volume = tmp_path / "issuer", SecretVolume(tmp_path / "secret")
    first = issue(issuer)
    volume.publish_bundle(first)
    reloader = CertificateReloader(volume.cert_file, volume.key_file)
    context = reloader.context
    client = client_context(first.ca_file)

    async with serving(reloader.context) as port:
        assert (await connect(port, client)).serial == first.serial == reloader.serial
        assert not reloader.check()
        assert reloader.reloads == 0

        second = issue(issuer)
        volume.publish_bundle(second)
        assert reloader.check()
        assert (await connect(port, client)).serial == second.serial != first.serial
        assert (reloader.serial, reloader.not_after) == (second.serial, second.not_after)
        assert reloader.reloads == 1
        assert reloader.last_error is None

        volume.publish({"tls.crt": second.cert_file.read_bytes(), "tls.key": b"garbage\n"})
        with caplog.at_level(logging.WARNING, logger="webhook.tls.contexts"):
            assert not reloader.check()
        assert reloader.serial == second.serial
        assert reloader.last_error is not None
        assert f"{volume.key_file}: not a PEM private key" in reloader.last_error
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        assert (await connect(port, client)).serial == second.serial

        third = issue(issuer)
        volume.publish_bundle(third)
        assert reloader.check()
        assert (await connect(port, client)).serial == third.serial
        assert reloader.reloads == 2
        assert reloader.last_error is None

    assert reloader.context is context


@pytest.mark.parametrize(
    ("publish", "message"),
    [
        pytest.param(
            lambda good, other: {"tls.crt": good["tls.crt"], "tls.key": other["tls.key"]},
            r"tls\.key: the key does not match the certificate in .*tls\.crt",
            id="key-of-another-certificate",
        ),
        pytest.param(
            lambda good, other: {"tls.crt": other["tls.crt"][:200], "tls.key": other["tls.key"]},
            r"tls\.crt: not a PEM certificate",
            id="half-written-certificate",
        ),
        pytest.param(
            lambda good, other: {"tls.crt": other["tls.crt"], "tls.key": b""},
            r"tls\.key: not a PEM private key",
            id="empty-key",
        ),
        pytest.param(
            lambda good, other: {"tls.crt": other["tls.crt"]},
            r"tls\.key: cannot read \(No such file",
            id="key-missing-from-the-secret",
        ),
    ],
)
async def test_reloader_keeps_the_last_good_pair_when_the_new_one_is_broken(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    publish: Callable[[Mapping[str, bytes], Mapping[str, bytes]], Mapping[str, bytes]],
    message: str,
) -> None:
    issuer, volume = tmp_path / "issuer", SecretVolume(tmp_path / "secret")
    good = issue(issuer)
    good_files = files(good)
    volume.publish(good_files)
    reloader = CertificateReloader(volume.cert_file, volume.key_file)
    other_files = files(issue(issuer))

    volume.publish(publish(good_files, other_files))
    with caplog.at_level(logging.WARNING, logger="webhook.tls.contexts"):
        assert not reloader.check()
        assert not reloader.check()

    assert reloader.last_error is not None
    assert re.match(f"{re.escape(str(volume.root))}/{message}", reloader.last_error)
    assert len(caplog.records) == 1, "the same error is logged once, not on every check"
    assert (reloader.serial, reloader.reloads) == (good.serial, 0)
    assert (await round_trip(reloader.context, client_context(good.ca_file))).serial == good.serial


async def test_reloader_clears_the_error_when_the_good_pair_returns(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "secret")
    good = issue(tmp_path / "issuer")
    volume.publish_bundle(good)
    reloader = CertificateReloader(volume.cert_file, volume.key_file)

    volume.publish({"tls.crt": b"garbage\n", "tls.key": good.key_file.read_bytes()})
    assert not reloader.check()
    assert reloader.last_error is not None
    volume.publish_bundle(good)

    assert not reloader.check()
    assert reloader.last_error is None
    assert reloader.reloads == 0


def test_reloader_refuses_to_start_without_a_good_pair(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "secret")
    good = issue(tmp_path / "issuer")
    volume.publish({"tls.crt": good.cert_file.read_bytes(), "tls.key": b"garbage\n"})

    with pytest.raises(CertificateError, match=r"secret/tls\.key: not a PEM private key"):
        CertificateReloader(volume.cert_file, volume.key_file)


async def test_reloader_context_requires_client_certificates_when_client_ca_given(
    bundle: Bundle,
) -> None:
    reloader = CertificateReloader(bundle.cert_file, bundle.key_file, client_ca=bundle.ca_file)

    with pytest.raises(Refused):
        await round_trip(reloader.context, client_context(bundle.ca_file))

    assert reloader.context.verify_mode is ssl.CERT_REQUIRED


async def test_run_picks_up_a_rotation_within_a_few_intervals(tmp_path: Path) -> None:
    issuer, volume = tmp_path / "issuer", SecretVolume(tmp_path / "secret")
    volume.publish_bundle(issue(issuer))
    reloader = CertificateReloader(volume.cert_file, volume.key_file)
    stop = asyncio.Event()
    task = asyncio.create_task(reloader.run(0.05, stop))

    try:
        rotated = issue(issuer)
        volume.publish_bundle(rotated)
        started = time.monotonic()
        async with asyncio.timeout(TIMEOUT):
            while reloader.serial != rotated.serial:
                await asyncio.sleep(0.01)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)

    assert elapsed < 1.0
    assert reloader.reloads == 1


async def test_run_returns_promptly_when_stop_is_set(bundle: Bundle) -> None:
    reloader = CertificateReloader(bundle.cert_file, bundle.key_file)
    stop = asyncio.Event()
    task = asyncio.create_task(reloader.run(3600, stop))
    await asyncio.sleep(0)

    stop.set()

    await asyncio.wait_for(task, 1.0)


async def test_run_keeps_polling_after_an_unexpected_error(
    bundle: Bundle, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reloader = CertificateReloader(bundle.cert_file, bundle.key_file)
    calls = 0

    def check() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("surprise")
        return False

    monkeypatch.setattr(reloader, "check", check)
    stop = asyncio.Event()
    task = asyncio.create_task(reloader.run(0.01, stop))
    try:
        async with asyncio.timeout(TIMEOUT):
            while calls < 3:
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)

    assert [r.getMessage() for r in caplog.records] == ["certificate check failed"]

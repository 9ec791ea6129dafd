"""Self-managed certificates: the leader creates the TLS Secret, renews the serving pair from the
same CA, and replaces the CA in steps during which every pair a replica may still serve verifies
against every caBundle the API server may still hold; every replica copies the Secret into a
writable certificate directory.

Everything runs against the emulated API server with an injected clock. Clocks are set so that
the last step of each test falls at or before the real time, so the certificates issued are
valid for the real TLS handshakes (on 127.0.0.1) made next to every chain verification.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import logging
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.verification import PolicyBuilder, Store

from tests.apiserver.server import EmulatedAPIServer
from webhook.kube.client import KubeClient
from webhook.server import LiveServices
from webhook.settings import Settings
from webhook.tls.certificates import KeyPair, issue_serving, new_ca
from webhook.tls.contexts import CertificateReloader, server_context
from webhook.tls.rotation import (
    MUTATING_WEBHOOKS,
    PROPAGATION,
    VALIDATING_WEBHOOKS,
    CertificateRotator,
)

NAMESPACE = "cozy-reservation"
SECRET = "reservation-webhook-tls"
SERVICE = "reservation-webhook"
HOSTNAME = "reservation-webhook.cozy-reservation.svc"
DNS_NAMES = {
    HOSTNAME,
    "reservation-webhook.cozy-reservation.svc.cluster.local",
    "reservation-webhook",
    "reservation-webhook.cozy-reservation",
}
GROUP = "admissionregistration.k8s.io"
CONFIGURATIONS = {
    "mutating": ("mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
    "validating": ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration"),
}
DAY = timedelta(days=1)
YEAR = timedelta(days=365)  # the default ca_rotate_before
TIMEOUT = 5.0


class Clock:
    """The rotator's clock, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


def real_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@dataclass
class Cluster:
    server: EmulatedAPIServer
    client: KubeClient
    tmp_path: Path

    def rotator(self, clock: Clock) -> CertificateRotator:
        return CertificateRotator(
            self.client,
            namespace=NAMESPACE,
            secret=SECRET,
            service=SERVICE,
            webhooks=[(MUTATING_WEBHOOKS, SERVICE), (VALIDATING_WEBHOOKS, SERVICE)],
            clock=clock,
        )

    def writes(self, since: int) -> list[tuple[str, str]]:
        return [
            (r.method, r.path)
            for r in self.server.requests[since:]
            if r.method in ("POST", "PUT", "PATCH", "DELETE")
        ]


def webhook_configuration(kind: str, webhook: str, path: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": kind,
        "metadata": {"name": SERVICE},
        "webhooks": [
            {
                "name": webhook,
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "service": {"name": SERVICE, "namespace": NAMESPACE, "path": path},
                    "caBundle": "",
                },
                "sideEffects": "None",
            }
        ],
    }


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    server = EmulatedAPIServer()
    server.resource("", "v1", "secrets", "Secret")
    for plural, kind in CONFIGURATIONS.values():
        server.resource(GROUP, "v1", plural, kind, namespaced=False)
    server.create(
        webhook_configuration(
            "MutatingWebhookConfiguration", "charge.reservation.cozystack.io", "/mutate"
        )
    )
    server.create(
        webhook_configuration(
            "ValidatingWebhookConfiguration", "reservation.cozystack.io", "/validate"
        )
    )
    async with server:
        client = KubeClient.from_kubeconfig(str(server.kubeconfig(tmp_path / "k")))
        try:
            yield Cluster(server, client, tmp_path)
        finally:
            await client.close()


# --- what the cluster holds --------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """The Secret and both configurations' caBundle, with their resourceVersions."""

    secret: dict[str, bytes]
    secret_type: str
    bundles: dict[str, bytes]
    versions: dict[str, str]

    @property
    def pair(self) -> tuple[bytes, bytes]:
        return self.secret["tls.crt"], self.secret["tls.key"]

    @property
    def serving(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.secret["tls.crt"])

    @property
    def cas(self) -> list[x509.Certificate]:
        return x509.load_pem_x509_certificates(self.secret["ca.crt"])

    @property
    def ca(self) -> KeyPair:
        key = serialization.load_pem_private_key(self.secret["ca.key"], password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return KeyPair(self.cas[0], key)


def snapshot(server: EmulatedAPIServer) -> Snapshot:
    secret = server.get("", "secrets", NAMESPACE, SECRET)
    assert secret is not None
    bundles, versions = {}, {"secret": secret["metadata"]["resourceVersion"]}
    for name, (plural, _) in CONFIGURATIONS.items():
        configuration = server.get(GROUP, plural, None, SERVICE)
        assert configuration is not None
        (webhook,) = configuration["webhooks"]
        bundles[name] = base64.b64decode(webhook["clientConfig"].get("caBundle", ""))
        versions[name] = configuration["metadata"]["resourceVersion"]
    return Snapshot(
        secret={k: base64.b64decode(v) for k, v in secret["data"].items()},
        secret_type=secret["type"],
        bundles=bundles,
        versions=versions,
    )


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


def verify(cert: x509.Certificate, bundle: bytes, at: datetime) -> None:
    """Chain verification as a strict TLS client does it (names, usages, validity at ``at``)."""
    store = Store(x509.load_pem_x509_certificates(bundle))
    verifier = PolicyBuilder().store(store).time(at).build_server_verifier(x509.DNSName(HOSTNAME))
    verifier.verify(cert, [])


async def handshake(directory: Path, pair: tuple[bytes, bytes], bundle: bytes) -> int:
    """Serve ``pair`` on 127.0.0.1, connect as the API server would (trusting ``bundle``,
    dialling the service name) and return the serial the server presented."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_file = Path(tempfile.mkstemp(dir=directory, suffix=".crt")[1])
    key_file = Path(tempfile.mkstemp(dir=directory, suffix=".key")[1])
    cert_file.write_bytes(pair[0])
    key_file.write_bytes(pair[1])

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        with contextlib.suppress(OSError):
            await writer.drain()
            writer.close()
            await writer.wait_closed()

    client = ssl.create_default_context(cadata=bundle.decode("ascii"))
    server = await asyncio.start_server(
        greet, "127.0.0.1", 0, ssl=server_context(cert_file, key_file)
    )
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=HOSTNAME),
            TIMEOUT,
        )
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            assert await asyncio.wait_for(reader.read(), TIMEOUT) == b"ok"
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


async def assert_no_handshake_can_fail(
    cluster: Cluster, clock: Clock, *snapshots: Snapshot
) -> None:
    """Every pair in ``snapshots`` (a replica may still serve the previous one) verifies against
    every caBundle in them (the API server may still hold the previous one), in both
    configurations: by chain verification at the rotator's time and by a real handshake."""
    pairs = dict.fromkeys(s.pair for s in snapshots)
    bundles = dict.fromkeys(b for s in snapshots for b in s.bundles.values())
    for pair in pairs:
        serving = x509.load_pem_x509_certificate(pair[0])
        for bundle in bundles:
            verify(serving, bundle, clock.now)
            served = await handshake(cluster.tmp_path / "handshakes", pair, bundle)
            assert served == serving.serial_number


def fields(records: Iterable[logging.LogRecord]) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in records]


# --- creation and idempotence ------------------------------------------------------------------


async def test_the_first_reconcile_creates_the_secret_and_fills_both_ca_bundles(
    cluster: Cluster,
) -> None:
    clock = Clock(real_now())

    assert await cluster.rotator(clock).reconcile()

    created = snapshot(cluster.server)
    assert created.secret_type == "kubernetes.io/tls"
    assert set(created.secret) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert len(created.cas) == 1
    assert created.bundles == {
        "mutating": created.secret["ca.crt"],
        "validating": created.secret["ca.crt"],
    }
    assert issued_by(created.serving, created.ca.cert)
    san = created.serving.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert set(san.value.get_values_for_type(x509.DNSName)) == DNS_NAMES
    await assert_no_handshake_can_fail(cluster, clock, created)


async def test_a_second_reconcile_at_the_same_time_changes_nothing(cluster: Cluster) -> None:
    clock = Clock(real_now())
    rotator = cluster.rotator(clock)
    await rotator.reconcile()
    before, mark = snapshot(cluster.server), len(cluster.server.requests)

    assert not await rotator.reconcile()

    assert snapshot(cluster.server) == before
    assert cluster.writes(mark) == []


# --- serving rotation --------------------------------------------------------------------------


async def test_a_serving_pair_near_its_expiry_is_renewed_from_the_same_ca(
    cluster: Cluster,
) -> None:
    clock = Clock(real_now() - 61 * DAY)
    rotator = cluster.rotator(clock)
    await rotator.reconcile()
    before = snapshot(cluster.server)

    clock.advance(59 * DAY)  # 31 days left: more than rotate_before
    assert not await rotator.reconcile()
    clock.advance(2 * DAY)  # 29 days left
    assert await rotator.reconcile()

    after = snapshot(cluster.server)
    assert after.serving.serial_number != before.serving.serial_number
    assert issued_by(after.serving, before.ca.cert)
    assert after.secret["ca.crt"] == before.secret["ca.crt"]
    assert after.secret["ca.key"] == before.secret["ca.key"]
    assert (after.versions["mutating"], after.versions["validating"]) == (
        before.versions["mutating"],
        before.versions["validating"],
    )
    await assert_no_handshake_can_fail(cluster, clock, before, after)


def other_names(data: dict[str, bytes], ca: KeyPair, now: datetime) -> dict[str, bytes]:
    pair = issue_serving(ca, dns_names=["other.example"], now=now, days=90)
    return {**data, "tls.crt": pair.cert_pem, "tls.key": pair.key_pem}


def other_ca(data: dict[str, bytes], ca: KeyPair, now: datetime) -> dict[str, bytes]:
    stranger = new_ca("stranger CA", now=now, days=3650)
    pair = issue_serving(stranger, dns_names=sorted(DNS_NAMES), now=now, days=90)
    return {**data, "tls.crt": pair.cert_pem, "tls.key": pair.key_pem}


def other_key(data: dict[str, bytes], ca: KeyPair, now: datetime) -> dict[str, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    return {**data, "tls.key": KeyPair(ca.cert, key).key_pem}


def no_pair(data: dict[str, bytes], ca: KeyPair, now: datetime) -> dict[str, bytes]:
    return {k: v for k, v in data.items() if k not in ("tls.crt", "tls.key")}


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(other_names, id="names-do-not-match-the-service"),
        pytest.param(other_ca, id="signed-by-a-ca-not-in-the-bundle"),
        pytest.param(other_key, id="key-does-not-belong-to-the-certificate"),
        pytest.param(no_pair, id="pair-missing"),
    ],
)
async def test_a_pair_that_cannot_serve_is_reissued_at_once_from_the_same_ca(
    cluster: Cluster,
    tamper: Callable[[dict[str, bytes], KeyPair, datetime], dict[str, bytes]],
) -> None:
    clock = Clock(real_now())
    rotator = cluster.rotator(clock)
    await rotator.reconcile()
    good = snapshot(cluster.server)
    secret = cluster.server.get("", "secrets", NAMESPACE, SECRET)
    assert secret is not None
    data = tamper(good.secret, good.ca, clock.now)
    secret["data"] = {k: base64.b64encode(v).decode() for k, v in data.items()}
    cluster.server.update(secret)

    assert await rotator.reconcile()

    repaired = snapshot(cluster.server)
    assert repaired.serving.serial_number != good.serving.serial_number
    assert issued_by(repaired.serving, good.ca.cert)
    assert repaired.secret["ca.crt"] == good.secret["ca.crt"]
    assert repaired.versions["validating"] == good.versions["validating"]
    await assert_no_handshake_can_fail(cluster, clock, repaired)


# --- CA rotation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rotation:
    rotator: CertificateRotator
    clock: Clock
    settled: Snapshot  # the old CA alone, with a current pair it signed
    published: Snapshot  # after the first step: bundle [new, old], still the old pair


async def publish_a_new_ca(cluster: Cluster) -> Rotation:
    """Run up to the first step of a CA rotation, an hour before the real time."""
    now = real_now()
    # The CA then expires a year and an hour after the first step.
    clock = Clock(now - timedelta(days=3650) + YEAR - 2 * timedelta(hours=1))
    rotator = cluster.rotator(clock)
    assert await rotator.reconcile()
    old_ca = snapshot(cluster.server).ca.cert

    # The pair of the first day expired long ago; a year and an hour before the CA expires,
    # only the pair is renewed.
    clock.now = old_ca.not_valid_after_utc - YEAR - timedelta(hours=1)
    assert await rotator.reconcile()
    settled = snapshot(cluster.server)
    assert settled.cas == [old_ca]
    assert issued_by(settled.serving, old_ca)

    clock.now = old_ca.not_valid_after_utc - YEAR + timedelta(hours=1)
    assert clock.now <= now
    assert await rotator.reconcile()
    return Rotation(rotator, clock, settled, snapshot(cluster.server))


async def test_a_ca_near_its_expiry_is_replaced_without_a_handshake_that_can_fail(
    cluster: Cluster,
) -> None:
    rotation = await publish_a_new_ca(cluster)
    rotator, clock, settled, published = (
        rotation.rotator,
        rotation.clock,
        rotation.settled,
        rotation.published,
    )
    old_ca, new_ca = settled.ca.cert, published.ca.cert

    # Step 1: the new CA is trusted next to the old one; the old pair keeps serving.
    assert new_ca != old_ca
    assert published.cas == [new_ca, old_ca]
    assert published.bundles == {
        "mutating": published.secret["ca.crt"],
        "validating": published.secret["ca.crt"],
    }
    assert published.pair == settled.pair
    await assert_no_handshake_can_fail(cluster, clock, settled, published)

    # Step 2, a round later: the configurations already show both CAs, so the pair is issued
    # from the new CA; the bundle stays as it is.
    clock.advance(timedelta(minutes=10))
    assert await rotator.reconcile()
    switched = snapshot(cluster.server)
    assert issued_by(switched.serving, new_ca)
    assert switched.cas == [new_ca, old_ca]
    assert switched.bundles == published.bundles
    await assert_no_handshake_can_fail(cluster, clock, published, switched)

    # Replicas may still serve the old pair until the new one has propagated.
    clock.advance(PROPAGATION - timedelta(seconds=1))
    assert not await rotator.reconcile()

    # Step 3: the old CA leaves the bundle.
    clock.advance(timedelta(seconds=1))
    assert await rotator.reconcile()
    dropped = snapshot(cluster.server)
    assert dropped.cas == [new_ca]
    assert dropped.pair == switched.pair
    assert dropped.bundles == {
        "mutating": dropped.secret["ca.crt"],
        "validating": dropped.secret["ca.crt"],
    }
    await assert_no_handshake_can_fail(cluster, clock, switched, dropped)

    assert not await rotator.reconcile()


async def test_the_new_ca_signs_no_pair_while_a_configuration_does_not_trust_it(
    cluster: Cluster,
) -> None:
    rotation = await publish_a_new_ca(cluster)
    # Someone puts the old bundle back into one configuration.
    configuration = cluster.server.get(GROUP, "validatingwebhookconfigurations", None, SERVICE)
    assert configuration is not None
    old_bundle = base64.b64encode(rotation.settled.secret["ca.crt"]).decode()
    configuration["webhooks"][0]["clientConfig"]["caBundle"] = old_bundle
    cluster.server.update(configuration)
    reverted = snapshot(cluster.server)

    rotation.clock.advance(timedelta(minutes=10))
    assert await rotation.rotator.reconcile()
    republished = snapshot(cluster.server)
    assert republished.pair == rotation.settled.pair
    assert republished.bundles["validating"] == rotation.published.secret["ca.crt"]
    await assert_no_handshake_can_fail(cluster, rotation.clock, reverted, republished)

    rotation.clock.advance(timedelta(minutes=10))
    assert await rotation.rotator.reconcile()
    assert issued_by(snapshot(cluster.server).serving, rotation.published.ca.cert)


async def test_a_lost_ca_key_brings_a_new_ca_published_next_to_the_old_one(
    cluster: Cluster,
) -> None:
    clock = Clock(real_now())
    rotator = cluster.rotator(clock)
    await rotator.reconcile()
    before = snapshot(cluster.server)
    secret = cluster.server.get("", "secrets", NAMESPACE, SECRET)
    assert secret is not None
    del secret["data"]["ca.key"]
    cluster.server.update(secret)

    assert await rotator.reconcile()

    after = snapshot(cluster.server)
    assert after.cas[1:] == before.cas
    assert after.pair == before.pair
    await assert_no_handshake_can_fail(cluster, clock, before, after)


# --- API faults --------------------------------------------------------------------------------


async def test_a_conflict_on_a_webhook_configuration_is_retried_with_a_fresh_read(
    cluster: Cluster,
) -> None:
    clock = Clock(real_now())
    rotator = cluster.rotator(clock)
    await rotator.reconcile()
    for plural, _ in CONFIGURATIONS.values():
        configuration = cluster.server.get(GROUP, plural, None, SERVICE)
        assert configuration is not None
        configuration["webhooks"][0]["clientConfig"]["caBundle"] = ""
        cluster.server.update(configuration)
    mark = len(cluster.server.requests)
    cluster.server.fail_next(2, 409, method="PUT")

    assert await rotator.reconcile()

    after = snapshot(cluster.server)
    assert after.bundles == {
        "mutating": after.secret["ca.crt"],
        "validating": after.secret["ca.crt"],
    }
    mutating = MUTATING_WEBHOOKS.path(name=SERVICE)
    assert [path for _, path in cluster.writes(mark)] == [mutating] * 3 + [
        VALIDATING_WEBHOOKS.path(name=SERVICE)
    ]


async def test_a_configuration_still_conflicting_after_three_retries_waits_for_the_next_round(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(real_now())
    rotator = cluster.rotator(clock)
    await rotator.reconcile()
    configuration = cluster.server.get(GROUP, "mutatingwebhookconfigurations", None, SERVICE)
    assert configuration is not None
    configuration["webhooks"][0]["clientConfig"]["caBundle"] = ""
    cluster.server.update(configuration)
    cluster.server.fail_next(4, 409, method="PUT")

    with caplog.at_level(logging.WARNING, logger="webhook.tls.rotation"):
        assert not await rotator.reconcile()
    (logged,) = fields(caplog.records)
    assert logged == {
        "secret": f"{NAMESPACE}/{SECRET}",
        "configuration": f"mutatingwebhookconfigurations/{SERVICE}",
        "status": 409,
        "error": logged["error"],
    }
    assert logged["error"].startswith("409 Conflict")

    assert await rotator.reconcile()
    after = snapshot(cluster.server)
    assert after.bundles["mutating"] == after.secret["ca.crt"]


async def test_a_failed_secret_read_changes_nothing_and_raises_nothing(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(real_now() - 61 * DAY)
    rotator = cluster.rotator(clock)
    await rotator.reconcile()
    before = snapshot(cluster.server)
    clock.advance(61 * DAY)  # a renewal is due
    cluster.server.fail_next(1, 500, method="GET")

    with caplog.at_level(logging.WARNING, logger="webhook.tls.rotation"):
        assert not await rotator.reconcile()

    assert snapshot(cluster.server) == before
    assert [
        (r.levelno, f["status"])
        for r, f in zip(caplog.records, fields(caplog.records), strict=True)
    ] == [(logging.WARNING, 500)]
    assert await rotator.reconcile()


async def test_a_conflict_on_the_secret_is_left_to_the_next_round(cluster: Cluster) -> None:
    clock = Clock(real_now() - 61 * DAY)
    rotator = cluster.rotator(clock)
    await rotator.reconcile()
    before = snapshot(cluster.server)
    clock.advance(61 * DAY)
    cluster.server.fail_next(1, 409, method="PUT")

    assert not await rotator.reconcile()
    assert snapshot(cluster.server) == before

    assert await rotator.reconcile()
    assert snapshot(cluster.server).serving.serial_number != before.serving.serial_number


# --- every replica -----------------------------------------------------------------------------


async def test_sync_files_writes_the_secret_and_the_reloader_serves_the_rotated_pair(
    cluster: Cluster, tmp_path: Path
) -> None:
    clock = Clock(real_now() - 61 * DAY)
    rotator = cluster.rotator(clock)
    cert_dir = tmp_path / "certs"
    await rotator.reconcile()

    assert await rotator.sync_files(cert_dir)
    first = snapshot(cluster.server)
    assert {p.name: p.read_bytes() for p in cert_dir.iterdir()} == {
        name: first.secret[name] for name in ("tls.crt", "tls.key", "ca.crt")
    }
    assert (cert_dir / "tls.key").stat().st_mode & 0o777 == 0o600
    assert not await rotator.sync_files(cert_dir)
    reloader = CertificateReloader(cert_dir / "tls.crt", cert_dir / "tls.key")
    assert reloader.serial == first.serving.serial_number

    clock.advance(61 * DAY)
    assert await rotator.reconcile()
    assert await rotator.sync_files(cert_dir)
    assert reloader.check()

    assert (
        reloader.serial
        == snapshot(cluster.server).serving.serial_number
        != first.serving.serial_number
    )


async def test_sync_files_leaves_a_read_only_directory_to_the_kubelet(
    cluster: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    mkstemp = tempfile.mkstemp

    def read_only(*args: Any, **kwargs: Any) -> tuple[int, str]:
        if Path(kwargs.get("dir", "")) == volume:
            raise OSError(errno.EROFS, "Read-only file system")
        return mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    rotator = cluster.rotator(Clock(real_now()))
    await rotator.reconcile()

    with caplog.at_level(logging.INFO, logger="webhook.tls.rotation"):
        assert not await rotator.sync_files(volume)
        mark = len(cluster.server.requests)
        assert not await rotator.sync_files(volume)

    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "not writable" in caplog.records[0].getMessage()
    assert cluster.server.requests[mark:] == []
    assert list(volume.iterdir()) == []


# --- wiring ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "managed"),
    [
        pytest.param(None, True, id="self-managed-by-default"),
        pytest.param("self", True, id="self-managed-when-asked"),
        pytest.param("cert-manager", False, id="left-to-cert-manager"),
    ],
)
async def test_a_replica_manages_certificates_unless_cert_manager_does(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, mode: str | None, managed: bool
) -> None:
    if mode is None:
        monkeypatch.delenv("WEBHOOK_CERTS", raising=False)
    else:
        monkeypatch.setenv("WEBHOOK_CERTS", mode)
    monkeypatch.setenv("WEBHOOK_TLS_SECRET", "custom-tls")

    services = LiveServices(cluster.client, Settings(namespace=NAMESPACE))

    rotator = services.rotator
    assert (rotator is not None) == managed
    if rotator is not None:
        assert (rotator.namespace, rotator.secret, rotator.service) == (
            NAMESPACE,
            "custom-tls",
            SERVICE,
        )
        assert rotator.webhooks == ((MUTATING_WEBHOOKS, SERVICE), (VALIDATING_WEBHOOKS, SERVICE))
        assert rotator.dns_names[0] == HOSTNAME


async def test_bootstrap_creates_the_secret_and_writes_a_pair_before_serving(
    tmp_path: Path,
) -> None:
    server = EmulatedAPIServer()
    server.resource("", "v1", "secrets", "Secret")
    async with server:
        client = KubeClient.from_kubeconfig(str(server.kubeconfig(tmp_path / "k")))
        try:
            first = CertificateRotator(
                client,
                namespace="cozy-reservation",
                secret="reservation-webhook-tls",
                service="reservation-webhook",
                webhooks=(),
            )
            second = CertificateRotator(
                client,
                namespace="cozy-reservation",
                secret="reservation-webhook-tls",
                service="reservation-webhook",
                webhooks=(),
            )
            async with asyncio.timeout(10):
                await asyncio.gather(
                    first.bootstrap(tmp_path / "a"), second.bootstrap(tmp_path / "b")
                )
        finally:
            await client.close()
        secrets = server.objects("", "secrets")
    assert len(secrets) == 1  # two replicas racing create one Secret
    for directory in ("a", "b"):
        assert (tmp_path / directory / "tls.crt").read_bytes() == (
            tmp_path / "a" / "tls.crt"
        ).read_bytes()
        assert not (tmp_path / directory / "ca.key").exists()  # the CA key stays in the Secret

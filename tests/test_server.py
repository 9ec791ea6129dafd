"""The webhook server over real TLS on 127.0.0.1: answers, rotation, client certs, shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from tests.builders import FIXTURES, ROOT, free_port
from tests.waiting import eventually_async
from webhook.commands.cli import main as cli
from webhook.server import WebhookServer
from webhook.settings import Settings
from webhook.state.manifests import load_state
from webhook.tls.certificates import generate

SAMPLE = FIXTURES / "reviews" / "create-vm-u1-micro.json"
STATE = (str(FIXTURES / "cozystack"), str(FIXTURES / "tenants"))


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    out = tmp_path / "certs"
    generate(out, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    return out


@pytest.fixture
async def server(certs: Path) -> AsyncIterator[WebhookServer]:
    settings = Settings(
        state=STATE, cert_dir=str(certs), listen_port=0, metrics_port=0, cert_reload_seconds=0.05
    )
    running = WebhookServer(load_state(settings.state), settings)
    await running.start()
    yield running
    running.stop()
    await running.wait()


def client_context(certs: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs / "ca.crt"))


async def post(server: WebhookServer, certs: Path, body: Any) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"https://localhost:{server.port}/validate", json=body, ssl=client_context(certs)
        ) as response,
    ):
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        return answer


async def peer_serial(port: int, certs: Path) -> int:
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_context(certs), server_hostname="localhost"
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


async def test_the_server_answers_what_the_review_command_prints(
    server: WebhookServer, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await post(server, certs, json.loads(SAMPLE.read_text()))
    assert cli(["review", "--state", STATE[0], "--state", STATE[1], str(SAMPLE)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert answer == printed
    assert answer["response"]["allowed"] is True


async def test_ready_once_serving_tls(server: WebhookServer, certs: Path) -> None:
    async with aiohttp.ClientSession() as session:
        url = f"https://localhost:{server.port}/readyz"
        async with session.get(url, ssl=client_context(certs)) as response:
            assert response.status == 200


async def test_metrics_are_served_on_their_own_plain_port_only(
    server: WebhookServer, certs: Path
) -> None:
    assert server.metrics_port not in (0, server.port)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{server.metrics_port}/metrics") as response:
            assert response.status == 200
            assert "reservation_state_ready 1.0" in await response.text()
        url = f"https://localhost:{server.port}/metrics"
        async with session.get(url, ssl=client_context(certs)) as response:
            assert response.status == 404


async def test_rotated_certificate_files_serve_the_new_serial(
    server: WebhookServer, certs: Path
) -> None:
    before = await peer_serial(server.port, certs)
    rotated = generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])

    async def rotated_in() -> bool:
        return await peer_serial(server.port, certs) != before

    await eventually_async(rotated_in, 5)
    assert await peer_serial(server.port, certs) == rotated.serial


async def test_client_certificates_are_required_with_a_client_ca(
    certs: Path, tmp_path: Path
) -> None:
    settings = Settings(
        state=STATE,
        cert_dir=str(certs),
        listen_port=0,
        metrics_port=0,
        client_ca=str(certs / "ca.crt"),
    )
    running = WebhookServer(load_state(settings.state), settings)
    await running.start()
    try:
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            await post(running, certs, json.loads(SAMPLE.read_text()))
    finally:
        running.stop()
        await running.wait()


def test_sigterm_stops_the_server_and_exits_zero(certs: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook",
            "serve",
            "--state",
            STATE[0],
            "--state",
            STATE[1],
            "--cert-dir",
            str(certs),
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stderr is not None
        for _ in range(100):
            line = process.stderr.readline()
            if '"message":"serving"' in line:
                break
        else:
            pytest.fail("the server did not report serving")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        _, rest = process.communicate(timeout=5)
        assert '"message":"stopped"' in rest
    finally:
        if process.poll() is None:
            process.kill()


async def test_a_client_sending_half_a_header_is_disconnected(certs: Path) -> None:
    settings = Settings(state=STATE, cert_dir=str(certs), listen_port=0, metrics_port=0)
    running = WebhookServer(load_state(settings.state), settings, idle_seconds=0.3)
    await running.start()
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", running.port, ssl=client_context(certs), server_hostname="localhost"
        )
        writer.write(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-")
        await writer.drain()
        # the server closes the connection: read() returns end of stream, not a hang
        assert await asyncio.wait_for(reader.read(), timeout=30) == b""
        writer.close()
        # and it still answers everyone else
        answer = await post(running, certs, json.loads(SAMPLE.read_text()))
        assert answer["response"]["allowed"]
    finally:
        running.stop()
        await running.wait()


async def test_a_replica_told_to_stop_answers_while_not_ready_for_its_delay(certs: Path) -> None:
    """Told to stop, the replica says it is not ready and keeps answering for its delay (an
    endpoint's removal reaches every node's proxy late: a call refused meanwhile fails its
    write), then closes its listener."""
    settings = Settings(
        state=STATE, cert_dir=str(certs), listen_port=0, metrics_port=0, shutdown_delay_seconds=1
    )
    running = WebhookServer(load_state(settings.state), settings)
    await running.start()
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        url = f"https://localhost:{running.port}"
        running.stop()
        stopping = asyncio.create_task(running.wait())
        await asyncio.sleep(0.2)
        async with session.get(f"{url}/readyz") as answer:
            assert answer.status == 503, "not ready"
        async with session.get(f"{url}/livez") as answer:
            assert answer.status == 200, "still answering"
        await stopping
        with pytest.raises(aiohttp.ClientError):
            await session.get(f"{url}/livez")

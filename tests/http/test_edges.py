"""Rejections at the HTTP and TLS edges are logged once each, with the peer and the reason."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.builders import FIXTURES
from webhook.http.edges import EdgeLog
from webhook.server import WebhookServer
from webhook.settings import Settings
from webhook.state.manifests import load_state
from webhook.tls.certificates import generate

STATE = (str(FIXTURES / "cozystack"), str(FIXTURES / "tenants"))


def edge_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "webhook.edges"
    ]


def test_a_flood_of_one_reason_logs_once_per_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    edges = EdgeLog(interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="webhook.edges"):
        logged = [edges.rejected("http", "10.0.0.1:5", "400 empty body") for _ in range(50)]
        edges.rejected("http", "10.0.0.1:5", "413 too large")  # another reason: its own line
        now[0] = 10.5
        edges.rejected("http", "10.0.0.2:6", "400 empty body")
    assert logged == [True] + [False] * 49
    records = edge_records(caplog)
    assert [r["reason"] for r in records] == ["400 empty body", "413 too large", "400 empty body"]
    assert records[2]["suppressed"] == 49
    assert records[2]["peer"] == "10.0.0.2:6"


async def first_answer(reader: asyncio.StreamReader) -> bytes:
    answer = await reader.read()
    if not answer:
        raise ConnectionError("closed without an answer")
    return answer


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[WebhookServer, Path]]:
    certs = tmp_path / "certs"
    generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    settings = Settings(state=STATE, cert_dir=str(certs), listen_port=0, metrics_port=0)
    running = WebhookServer(load_state(settings.state), settings)
    await running.start()
    yield running, certs
    running.stop()
    await running.wait()


async def test_plain_http_on_the_tls_port_is_logged_with_the_peer(
    server: tuple[WebhookServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    running, _ = server
    with caplog.at_level(logging.WARNING, logger="webhook.edges"):
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        writer.write(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await writer.drain()
        await reader.read()  # the server closes the connection
        local = writer.get_extra_info("sockname")
        writer.close()
        await asyncio.sleep(0.05)
    records = edge_records(caplog)
    assert records == [
        {"edge": "tls", "peer": f"127.0.0.1:{local[1]}", "reason": "plain HTTP on the TLS port"}
    ]


async def test_a_client_without_the_required_certificate_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    certs = tmp_path / "certs"
    generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
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
        with caplog.at_level(logging.WARNING, logger="webhook.edges"):
            context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", running.port, ssl=context, server_hostname="localhost"
            )
            # TLS 1.3: the refusal reaches the client on its first read
            writer.write(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await first_answer(reader)
            writer.close()
            await asyncio.sleep(0.05)
    finally:
        running.stop()
        await running.wait()
    records = edge_records(caplog)
    assert len(records) == 1
    assert records[0]["edge"] == "tls"
    assert records[0]["reason"] == "no client certificate"
    assert str(records[0]["peer"]).startswith("127.0.0.1:")


async def test_a_bad_request_is_answered_400_and_logged_with_its_reason(
    server: tuple[WebhookServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    running, certs = server
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    with caplog.at_level(logging.WARNING, logger="webhook.edges"):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"https://localhost:{running.port}/validate",
                data=b"{}",
                headers={"Content-Type": "text/plain"},
                ssl=context,
            ) as response,
        ):
            assert response.status == 400
    records = edge_records(caplog)
    assert len(records) == 1
    assert records[0]["edge"] == "http"
    assert str(records[0]["reason"]).startswith("400 content type must be application/json")
    assert str(records[0]["peer"]).startswith("127.0.0.1")

"""The key that signs charge records: a Secret shared by the replicas, or a file offline."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from tests.cluster import cluster, kube_client
from webhook.core.records import RecordKeys
from webhook.record_keys import (
    RECORD_KEY_SECRET,
    SECRETS,
    RecordKeyError,
    RecordKeySecret,
    keys_from_file,
)

NAMESPACE = "cozy-reservation"


def test_a_key_file_holds_the_current_key_then_previous_keys(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"\n" + b"c" * 40 + b"\n" + b"p" * 32 + b"\n")
    assert keys_from_file(path) == RecordKeys(b"c" * 40, (b"p" * 32,))


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"", "no record key"), (b"short\n", "line 1 is shorter than 32 bytes")],
)
def test_a_bad_key_file_is_refused_naming_the_file(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    with pytest.raises(RecordKeyError, match=why):
        keys_from_file(path)
    with pytest.raises(RecordKeyError, match="cannot read"):
        keys_from_file(tmp_path / "missing")


async def test_racing_replicas_create_one_secret_and_share_its_key(tmp_path: Path) -> None:
    async with (
        cluster(tmp_path, load=False) as (server, kubeconfig),
        kube_client(kubeconfig) as first,
        kube_client(kubeconfig) as second,
    ):
        stop = asyncio.Event()
        keys = await asyncio.gather(
            RecordKeySecret(first, namespace=NAMESPACE).bootstrap(stop),
            RecordKeySecret(second, namespace=NAMESPACE).bootstrap(stop),
        )
        assert keys[0] is not None
        assert keys[0] == keys[1]
        assert len(keys[0].current) >= 32
        (secret,) = server.objects("", "secrets")
        assert secret["metadata"]["name"] == RECORD_KEY_SECRET
        # An operator rotates: the old key becomes previous, a new one signs.
        secret["data"] = {
            "current": base64.b64encode(b"n" * 32).decode(),
            "previous": secret["data"]["current"],
        }
        await first.replace(SECRETS, secret)
        rotated = await RecordKeySecret(first, namespace=NAMESPACE).read()
        assert rotated == RecordKeys(b"n" * 32, (keys[0].current,))


async def test_an_unusable_secret_is_logged_and_not_used(tmp_path: Path) -> None:
    async with cluster(tmp_path, load=False) as (server, kubeconfig):
        server.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": RECORD_KEY_SECRET, "namespace": NAMESPACE},
                "data": {"current": base64.b64encode(b"short").decode()},
            }
        )
        async with kube_client(kubeconfig) as client:
            assert await RecordKeySecret(client, namespace=NAMESPACE).read() is None
            stop = asyncio.Event()
            stop.set()
            assert await RecordKeySecret(client, namespace=NAMESPACE).bootstrap(stop) is None

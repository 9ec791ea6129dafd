"""The key that signs charge records: a Secret shared by the replicas, or a file offline."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import os
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from tests.apiserver.server import EmulatedAPIServer
from tests.builders import ROOT
from tests.cluster import cluster, kube_client
from tests.realkube import kubectl, real_apiserver
from webhook.core.tenancy.records import RecordKeys
from webhook.tenancy.record_keys import (
    MAX_RETIRED,
    RECORD_KEY_SECRET,
    RETIRED_TIME,
    SECRETS,
    RecordKeyError,
    RecordKeySecret,
    keys_from_file,
    keys_from_secret,
    retired_at,
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


def _secret(**data: bytes) -> dict[str, object]:
    return {"data": {k.replace("_", "-"): base64.b64encode(v).decode() for k, v in data.items()}}


def test_a_previous_key_is_accepted_until_its_window_ends_then_counts_for_marks_only() -> None:
    from webhook.tenancy.record_keys import keys_from_secret

    secret = _secret(current=b"c" * 32, previous=b"p" * 32, previous_until=b"2026-12-01T10:00:00Z")
    during = keys_from_secret(secret, "s", now=1_764_579_600.0)  # 2025: long before
    assert during.previous == (b"p" * 32,)
    after = keys_from_secret(secret, "s", now=1_900_000_000.0)
    assert after.previous == ()
    assert after.retired == (b"p" * 32,)


def test_a_previous_key_without_a_window_gets_the_default_one_from_first_sight() -> None:
    from webhook.tenancy.record_keys import DEFAULT_WINDOW_SECONDS, keys_from_secret

    seen: dict[bytes, float] = {}
    secret = _secret(current=b"c" * 32, previous=b"p" * 32)
    assert keys_from_secret(secret, "s", now=1000.0, first_seen=seen).previous == (b"p" * 32,)
    later = 1000.0 + DEFAULT_WINDOW_SECONDS + 1
    assert keys_from_secret(secret, "s", now=later, first_seen=seen).previous == ()


def test_a_published_key_verifies_and_never_signs() -> None:
    from webhook.core.tenancy.records import sign
    from webhook.tenancy.record_keys import keys_from_secret

    keys = keys_from_secret(_secret(current=b"c" * 32, next=b"n" * 32), "s")
    assert keys.published == (b"n" * 32,)
    record = sign(keys, ("Thing", "ns", "t"), "sha256:v", {}, "sha256:d")
    assert record.kid == keys.current_id
    assert keys.knows(RecordKeys(b"n" * 32).current_id)


def test_a_window_that_is_not_a_time_is_refused_naming_the_field() -> None:
    from webhook.tenancy.record_keys import keys_from_secret

    secret = _secret(current=b"c" * 32, previous=b"p" * 32, previous_until=b"soon")
    with pytest.raises(RecordKeyError, match="previous-until is not an RFC 3339 time"):
        keys_from_secret(secret, "s")


async def test_publish_then_promote_rotates_and_retires_the_key_before(tmp_path: Path) -> None:
    async with cluster(tmp_path, load=False) as (server, kubeconfig), kube_client(kubeconfig) as c:
        secret = RecordKeySecret(c, namespace=NAMESPACE)
        first = await secret.bootstrap(asyncio.Event())
        assert first is not None
        published = await secret.publish()
        assert await secret.publish() == published  # publishing twice keeps the one published
        keys = await secret.read()
        assert keys is not None
        assert keys.current == first.current
        assert keys.knows(published)
        assert await secret.promote() == published
        keys = await secret.read()
        assert keys is not None
        assert keys.current_id == published
        assert keys.previous == (first.current,)
        await secret.publish()
        await secret.promote(window_seconds=-1)  # the window is over at once
        keys = await secret.read()
        assert keys is not None
        assert keys.previous == ()
        # Both keys before it now count for the volume marks they signed, and nothing else.
        assert first.current in keys.retired
        assert len(keys.retired) == 2
        with pytest.raises(RecordKeyError, match="no published key"):
            await secret.promote()
        del server


async def test_an_unknown_key_id_is_reread_at_most_once_a_second(tmp_path: Path) -> None:
    async with cluster(tmp_path, load=False) as (server, kubeconfig), kube_client(kubeconfig) as c:
        secret = RecordKeySecret(c, namespace=NAMESPACE)
        keys = await secret.bootstrap(asyncio.Event())
        assert keys is not None
        before = len(server.requests)
        results = await asyncio.gather(*(secret.reread_for("f" * 16, keys) for _ in range(20)))
        reads = [r for r in server.requests[before:] if r[0] == "GET"]
        assert len(reads) == 1  # twenty requests meeting one unknown id: one read
        assert results == [None] * 20  # nothing new in the Secret
        assert await secret.reread_for(keys.current_id, keys) is None  # known: no read
        assert len([r for r in server.requests[before:] if r[0] == "GET"]) == 1


def _retired(server: EmulatedAPIServer) -> dict[str, bytes]:
    (secret,) = server.objects("", "secrets")
    data = secret["data"]
    return {k: base64.b64decode(v) for k, v in data.items() if k.startswith("retired-")}


async def test_a_rotation_drops_the_oldest_retired_key_never_the_one_it_retires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight retired keys are kept. Named by their id (a hash) and pruned by name, a rotation
    dropped whichever sorted first, often not the oldest and at times the key it had just
    retired. Named by when they were retired, the oldest goes, read back from the Secret."""
    made = itertools.count()  # keys in a fixed order, so a run is repeatable
    monkeypatch.setattr(
        secrets,
        "token_bytes",
        lambda n: (hashlib.sha256(b"key %d" % next(made)).digest() * 2)[:n],
    )
    async with cluster(tmp_path, load=False) as (server, kubeconfig), kube_client(kubeconfig) as c:
        secret = RecordKeySecret(c, namespace=NAMESPACE)
        first = await secret.bootstrap(asyncio.Event())
        assert first is not None
        signing, previous = first.current, None
        retired: list[bytes] = []  # oldest first
        start = 1_800_000_000.0
        for rotation in range(14):
            published = await secret.publish()
            await secret.promote(window_seconds=-1, now=start + 60 * rotation)
            if previous is not None:
                retired.append(previous)
            previous = signing
            keys = await secret.read()
            assert keys is not None
            assert keys.current_id == published
            signing = keys.current
            held = _retired(server)
            assert sorted(held.values()) == sorted(retired[-MAX_RETIRED:])
            if retired:  # the name says when: the one just retired is the newest
                newest = max(held, key=retired_at)
                assert held[newest] == retired[-1]
                moment = time.gmtime(start + 60 * rotation)
                assert retired_at(newest) == time.strftime(RETIRED_TIME, moment)
        # Rotations within one second: the key retired is kept whatever its id.
        for _ in range(10):
            await secret.publish()
            await secret.promote(window_seconds=-1, now=start + 3600)
            held = _retired(server)
            assert previous in held.values()
            assert len(held) == MAX_RETIRED
            keys = await secret.read()
            assert keys is not None
            previous, signing = signing, keys.current


def _documented_rotation() -> str:
    """The shell commands docs/operators/install.md gives for rotating the record key."""
    text = (ROOT / "docs" / "operators" / "install.md").read_text()
    blocks: list[str] = re.findall(r"```sh\n(.*?)```", text, re.S)
    (block,) = [b for b in blocks if RECORD_KEY_SECRET in b and "Promote" in b]
    return block


@pytest.mark.kube
def test_the_documented_rotation_never_overwrites_a_retired_key(tmp_path: Path) -> None:
    """Run as written, three times, against a real API server: every key that ever signed is
    still in the Secret (previous, or retired under a name saying when), none overwritten, and
    the webhook reads each retired one back. The step it replaces copied ``previous`` to one
    fixed name, overwriting the key retired the rotation before."""
    with real_apiserver(tmp_path / "kube") as kubeconfig:
        kubectl(kubeconfig, "create", "namespace", NAMESPACE)
        first = base64.b64encode(b"f" * 32).decode()
        kubectl(
            kubeconfig,
            *("-n", NAMESPACE, "create", "secret", "generic", RECORD_KEY_SECRET),
            f"--from-literal=current={'f' * 32}",
        )
        signed = [first]
        for rotation in range(3):
            if rotation:
                time.sleep(1.1)  # the docs wait 35 s between rotations; names are per second
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", _documented_rotation()],
                env={
                    "KUBECONFIG": str(kubeconfig),
                    "HOME": str(tmp_path),
                    "PATH": os.environ.get("PATH", os.defpath),
                },
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            found = json.loads(
                kubectl(kubeconfig, "-n", NAMESPACE, "get", "secret", RECORD_KEY_SECRET, "-ojson")
            )
            signed.append(found["data"]["current"])
        data = found["data"]
        assert data["previous"] == signed[-2]
        retired = {k: v for k, v in data.items() if k.startswith("retired-")}
        assert sorted(retired.values()) == sorted(signed[:-2])  # both kept, none overwritten
        assert all(retired_at(name) for name in retired)
        oldest = min(retired, key=retired_at)
        assert retired[oldest] == signed[0]
        keys = keys_from_secret(found, "the documented rotation")
        assert {base64.b64encode(k).decode() for k in keys.retired} >= set(signed[:-2])

"""The API server's managedFields of a pool's object stay small whatever its maps hold.

An update of the status subresource records, per field manager, every field it set: a map
the schema does not mark atomic is listed key by key, at every level. At the status maps'
bounds (caps, slices, summaries, released kinds, a want) that was some 390 KB beside an
object bounded at 1 MiB, under etcd's 1.5 MiB request limit: the margin the object's bound
was chosen for. The shipped schema marks each map atomic: each is listed once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.admission.test_ledger import POOL, Clock
from tests.admission.test_ledger_writes import Live
from tests.realkube import reservations_on_real_apiserver
from webhook.admission.ledger import LedgerSettings
from webhook.admission.ledger.book import Book
from webhook.admission.ledger.entries import TENANT_RESERVATIONS

pytestmark = pytest.mark.kube

EXPIRES = "2030-01-01T00:00:00.000000Z"


def _keys(count: int, prefix: str) -> dict[str, str]:
    return {f"{prefix}-{index:03d}.example.com/" + "k" * 40: "1" for index in range(count)}


def _wide_status() -> dict[str, object]:
    """A status with every map wide: the keys managedFields would list one by one."""
    summary = _keys(64, "budget")
    cap = {
        "digest": "d" * 64,
        "declared": _keys(8, "d"),
        "counted": _keys(8, "c"),
        "expires": EXPIRES,
    }
    record = {
        "holder": "replica-a",
        "kinds": ["VMInstance"],
        "granted": _keys(8, "g"),
        "folded": _keys(8, "f"),
        "returned": _keys(8, "r"),
        "expires": EXPIRES,
    }
    return {
        "budget": summary,
        "reserved": summary,
        "overcommitted": summary,
        "committed": summary,
        "discount": summary,
        "released": {f"Kind{index:03d}": index for index in range(200)},
        "capped": {f"tenant-{index:03d}-" + "n" * 50: cap for index in range(150)},
        "slices": {f"replica-{index:02d}.abcdef012345": record for index in range(32)},
        "wanted": {"room": _keys(64, "w"), "expires": EXPIRES},
    }


async def test_a_pools_wide_status_maps_add_no_per_key_managed_fields(tmp_path: Path) -> None:
    async with reservations_on_real_apiserver(tmp_path / "kube", POOL) as client:
        book = Book(client, Live(), LedgerSettings(replica="a"), clock=Clock())
        current = await book.ensure(POOL)
        status = _wide_status()
        await book.write(POOL, current, status)
        stored = await client.get(TENANT_RESERVATIONS, POOL, POOL)
        for key, value in status.items():
            assert stored["status"][key] == value, f"{key} is kept as written"
        managed = json.dumps(stored["metadata"].get("managedFields") or [])
        whole = len(json.dumps(stored))
        assert len(managed) < 4_096, f"managedFields {len(managed)} bytes of {whole}"

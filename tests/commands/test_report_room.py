"""``webhook report`` shows where each pool's room is, from its TenantReservation: observed
usage, pending entries, each replica's escrowed slice (holder, incarnation, expiry), departed
room and what is free."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import state
from tests.commands.test_cli import STATE, run
from webhook.admission.ledger.entries import expiry
from webhook.admission.report import build_report
from webhook.admission.room_report import add_room, render_room

NOW = 1_800_000_000.0
GI = 1024**3


def _reservation(pool: str, *, expires: float, past: float = NOW - 60) -> dict[str, Any]:
    """A pool's object as the ledger writes it: one pending entry and two replicas' slices."""
    return {
        "apiVersion": "reservation.cozystack.io/v1alpha1",
        "kind": "TenantReservation",
        "metadata": {"name": pool, "namespace": pool, "resourceVersion": "42"},
        "status": {
            "pending": [
                {
                    "uid": "u1",
                    "application": f"VMInstance/{pool}/vm-new",
                    "charge": {"memory": "1Gi", "cpu": "1"},
                    "expires": expiry(expires),
                    "replica": "webhook-a",
                },
                {  # expired: holds nothing
                    "uid": "u0",
                    "application": f"VMInstance/{pool}/vm-old",
                    "charge": {"memory": "8Gi"},
                    "expires": expiry(past),
                    "replica": "webhook-a",
                },
            ],
            "slices": {
                "webhook-a.0a1b2c": {
                    "holder": "webhook-a",
                    "kinds": ["VMInstance"],
                    "granted": {"memory": "3Gi", "cpu": "3"},
                    "folded": {"memory": "1Gi", "cpu": "1"},
                    "returned": {},
                    "expires": expiry(expires),
                },
                "webhook-b.3d4e5f": {
                    "holder": "webhook-b",
                    "kinds": ["VMInstance"],
                    "granted": {"memory": "2Gi"},
                    "folded": {},
                    "returned": {"memory": "1Gi"},
                    "expires": expiry(past + 55),
                },
            },
            "removals": 1,
        },
    }


def test_the_room_of_a_pool_is_split_into_observed_pending_slices_and_free() -> None:
    current = state({"tenant-acme": {"memory": "16Gi", "cpu": "16"}})
    report = add_room(
        build_report(current), current, [_reservation("tenant-acme", expires=NOW + 30)], now=NOW
    )
    (pool,) = report["room"]
    assert pool["pool"] == "tenant-acme"
    memory = pool["keys"]["memory"]
    assert memory["budget"] == "16Gi"
    assert memory["pending"] == "1Gi", "the expired entry holds nothing"
    assert memory["slices"] == "3Gi", "a's 3Gi - 1Gi folded, b's 2Gi - 1Gi returned"
    assert memory["departed"] == "1Gi"
    assert memory["free"] == "12Gi"
    holders = {s["holder"]: s for s in pool["slices"]}
    assert holders["webhook-a"]["incarnation"] == "webhook-a.0a1b2c"
    assert holders["webhook-a"]["outstanding"] == {"cpu": "2", "memory": "2Gi"}
    assert not holders["webhook-a"]["expired"]
    assert holders["webhook-b"]["expired"]
    text = "\n".join(render_room(report["room"]))
    assert "Where each pool's room is" in text
    assert "webhook-a.0a1b2c" in text
    assert "(expired)" in text


def test_a_record_written_by_hand_with_garbage_is_reported_not_a_crash() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}})
    planted = _reservation("tenant-acme", expires=NOW + 30)
    planted["status"]["slices"]["junk"] = {"holder": 7, "granted": "lots", "expires": "soon"}
    planted["status"]["slices"]["worse"] = "a string"
    report = add_room(build_report(current), current, [planted], now=NOW)
    (pool,) = report["room"]
    junk = {s["incarnation"]: s for s in pool["slices"]}["junk"]
    assert junk["outstanding"] == {}
    assert junk["expired"]
    assert pool["keys"]["memory"]["slices"] == "3Gi"


def test_webhook_report_reads_tenant_reservations_from_the_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "reservation.yaml").write_text(
        yaml.safe_dump(_reservation("tenant-acme", expires=4_000_000_000, past=1_000_000_000))
    )
    status, out, _ = run(capsys, "report", *STATE, "--state", str(tmp_path), "-o", "json")
    assert status == 0
    (pool,) = json.loads(out)["room"]
    assert pool["keys"]["memory"]["budget"] == "16Gi"
    assert pool["keys"]["memory"]["observed"] == "4Gi"
    assert pool["keys"]["memory"]["free"] == "8Gi"  # 16 - 4 observed - 1 pending - 3 slices
    _, out, _ = run(capsys, "report", *STATE, "--state", str(tmp_path))
    assert "webhook-b.3d4e5f" in out
    assert "(expired)" in out
    _, out, _ = run(capsys, "report", *STATE)
    assert "Where each pool's room is" not in out, "no TenantReservation: no room section"


def test_a_namespace_report_shows_only_the_room_of_pools_in_its_scope() -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}, "tenant-beta": {"memory": "4Gi"}})
    reservations = [_reservation(p, expires=NOW + 30) for p in ("tenant-acme", "tenant-beta")]
    report = add_room(
        build_report(current, namespace="tenant-beta"), current, reservations, now=NOW
    )
    assert [pool["pool"] for pool in report["room"]] == ["tenant-beta"]

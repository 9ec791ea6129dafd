"""A label storm on a heavy application: events that change nothing the state reads are
restamped (their version moves on), never reduced, decoded and priced again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cluster import app, cluster, tenant
from tests.state.test_live import live_of
from tests.test_live import Caller, replica, wait_ready
from tests.waiting import eventually
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, Application
from webhook.state.live import LiveState

VMS = ("apps.cozystack.io", "vminstances")
GiB = 1024**3
HEAVY: dict[str, Any] = {
    "instanceType": "u1.micro",
    "cloudInitSeed": {f"key{i:05d}": f"value-{i}" for i in range(2_000)},
}
LABEL_PATCHES = 20


def memory(live: LiveState) -> Any:
    node = live.state.tree.get("tenant-acme")
    return node.usage.get("memory") if node else None


def held_version(live: LiveState, name: str) -> int:
    return live._held["VMInstance"][("tenant-acme", name)][2]


async def test_a_label_storm_on_a_heavy_application_is_not_priced_again(
    tmp_path: Path, certs: Path, caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "100Gi"}))
        server.create(app("VMInstance", "tenant-acme", "heavy", HEAVY))
        async with replica(kubeconfig, certs) as webhook:
            await wait_ready(caller, webhook.port)
            live = live_of(webhook)
            assert memory(live) == 1 * GiB
            priced: list[Application] = []
            observe = live.state.observe

            def counted(application: Application) -> None:
                priced.append(application)
                observe(application)

            monkeypatch.setattr(live.state, "observe", counted)
            before = live.unchanged_events
            for index in range(LABEL_PATCHES):
                stored = server.patch(
                    *VMS, "tenant-acme", "heavy", {"metadata": {"labels": {"storm": str(index)}}}
                )
            last = int(stored["metadata"]["resourceVersion"])
            await eventually(lambda: held_version(live, "heavy") == last, 10)
            assert priced == []
            assert live.unchanged_events - before == LABEL_PATCHES
            record = live.state.record(("VMInstance", "tenant-acme", "heavy"))
            assert record is not None
            assert record.version == last
            assert memory(live) == 1 * GiB
            # A change the reservation reads is priced as ever.
            server.patch(*VMS, "tenant-acme", "heavy", {"spec": {"instanceType": "u1.small"}})
            await eventually(lambda: memory(live) == 2 * GiB, 10)
            assert [a.name for a in priced] == ["heavy"]
            # So is one of its charge annotation alone (a record that does not verify here).
            note = {CHARGE_ANNOTATION: "v2;not-a-record"}
            server.patch(*VMS, "tenant-acme", "heavy", {"metadata": {"annotations": note}})
            await eventually(lambda: len(priced) == 2, 10)
            assert live.unchanged_events - before == LABEL_PATCHES

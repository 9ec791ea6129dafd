"""Escrow on live state (``--escrow on``): a replica that has been granted a slice answers a burst
from it, and still exactly what fits is admitted. The emulated API server; servers bind
127.0.0.1 only; every wait is bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.builders import review
from tests.cluster import cluster, tenant
from tests.test_live import MICRO, Caller, replica, wait_ready
from tests.test_live import caller as caller  # the fixtures, shared
from tests.test_live import certs as certs
from tests.waiting import eventually


async def test_a_burst_answered_from_a_slice_still_admits_exactly_what_fits(
    tmp_path: Path, certs: Path, caller: Caller
) -> None:
    room = 40
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": f"{room}Gi"}))
        async with replica(kubeconfig, certs, escrow=True) as webhook:
            await wait_ready(caller, webhook.port)
            first = [
                review("VMInstance", "tenant-acme", f"warm{i}", MICRO, uid=f"w{i}")
                for i in range(4)
            ]
            for body in first:  # one at a time: the pool's rate, by the exact path
                assert (await caller.validate(webhook.port, body))["allowed"]

            def sliced() -> bool:
                tres = server.get(
                    "reservation.cozystack.io", "tenantreservations", "tenant-acme", "tenant-acme"
                )
                return bool(((tres or {}).get("status") or {}).get("slices"))

            await eventually(sliced)  # granted off the admission path
            services = webhook.services
            assert services is not None
            bodies = [
                review("VMInstance", "tenant-acme", f"vm{i}", MICRO, uid=f"u{i}")
                for i in range(100)
            ]
            answers = await asyncio.gather(*(caller.validate(webhook.port, b) for b in bodies))
            reasons = sorted({str(a["status"].get("message")) for a in answers if not a["allowed"]})
            assert sum(a["allowed"] for a in answers) == room - len(first), reasons
            assert services.ledger.spends > 0, "some of the burst was answered from the slice"

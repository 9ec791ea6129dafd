"""Escrow behind the real cozystack-api: two replicas with ``--escrow on`` admit a burst from
slices of the pool's room, and exactly what fits is stored.

cozystack-api stores an application as a HelmRelease, without a resourceVersion precondition on
updates, and answers its watches from its own cache: the slices' counting, folding and reclaim
ride on those watches here, not on the emulated server's.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from tests.cozystack_api.conftest import CozystackAPI, vm

pytestmark = pytest.mark.cozystack_api

DENIED = 'admission webhook "reservation.cozystack.io" denied the request: exceeded tenant quota'
ROOM = 40  # GiB; u1.micro VMs of 1Gi
WARM = 6  # admitted one at a time first: the replicas learn the pool's rate and take slices


@pytest.fixture(scope="module")
def env(cozystack_api: CozystackAPI) -> CozystackAPI:
    cozystack_api.tenant("slices", {"memory": f"{ROOM}Gi"})
    cozystack_api.start_replicas(2, WEBHOOK_ESCROW="on")
    cozystack_api.wait_pool("tenant-slices", 120)
    cozystack_api.point_webhooks(cozystack_api.entry_port)
    return cozystack_api


def create(env: CozystackAPI, name: str) -> subprocess.CompletedProcess[str]:
    """One create as a client makes it: a "try again" (a replica catching up, a busy ledger) is
    retried; an "exceeded" is final."""
    body = yaml.safe_dump(vm(name, "tenant-slices"))
    for _ in range(6):
        done = env.kubectl("create", "-f", "-", stdin=body, check=False)
        if done.returncode == 0 or "try again" not in done.stderr:
            return done
        time.sleep(0.5)
    return done


def slices(env: CozystackAPI) -> dict[str, object]:
    reservation = env.get("tenantreservations", "-n", "tenant-slices", "tenant-slices")
    found: dict[str, object] = (reservation.get("status") or {}).get("slices") or {}
    return found


def test_two_replicas_answering_from_slices_store_exactly_what_fits(env: CozystackAPI) -> None:
    for i in range(WARM):
        assert create(env, f"warm{i}").returncode == 0
    deadline = time.monotonic() + 20
    while not slices(env):  # granted off the admission path, from the rate just seen
        assert time.monotonic() < deadline, "no replica took a slice of a busy pool"
        time.sleep(0.25)
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda i: create(env, f"vm{i}"), range(ROOM)))
    stored = len(env.get("vminstances", "-n", "tenant-slices")["items"])
    assert stored == ROOM, f"{stored} stored of a {ROOM}Gi pool"
    assert sum(a.returncode == 0 for a in answers) == ROOM - WARM
    refused = [a.stderr for a in answers if a.returncode != 0]
    assert all(DENIED in text for text in refused), refused

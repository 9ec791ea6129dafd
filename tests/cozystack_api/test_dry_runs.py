"""Dry runs behind the real cozystack-api, which stores them: concurrent ``kubectl create
--dry-run=server`` at a pool's edge store no more than the budget allows, through one replica and
through two (cozystack-api passes ``dryRun`` to the webhook but drops it on its HelmRelease write,
so every dry run the webhook allows becomes an object)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from tests.cozystack_api.conftest import CozystackAPI, vm

pytestmark = pytest.mark.cozystack_api


@pytest.fixture(scope="module")
def env(cozystack_api: CozystackAPI) -> CozystackAPI:
    cozystack_api.tenant("drya", {"memory": "4Gi"})
    cozystack_api.tenant("dryb", {"memory": "4Gi"})
    cozystack_api.start_replicas(2)
    for namespace in ("tenant-drya", "tenant-dryb"):  # the first watches lag (see test_e2e)
        cozystack_api.wait_pool(namespace, 120)
    return cozystack_api


RETRIES = 6


def burst(env: CozystackAPI, namespace: str, count: int) -> list[tuple[int, str, str]]:
    def one(i: int) -> tuple[int, str, str]:
        body = yaml.safe_dump(vm(f"vm{i}", namespace))
        # A refusal that says "try again" (a replica still catching up, a busy ledger) is
        # retried as a client would; whatever the retries, the pool must not overshoot.
        for _ in range(RETRIES):
            done = env.kubectl("create", "--dry-run=server", "-f", "-", stdin=body, check=False)
            if done.returncode == 0 or "try again" not in done.stderr:
                break
            time.sleep(0.5)
        return done.returncode, done.stdout, done.stderr

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def stored(env: CozystackAPI, namespace: str) -> list[str]:
    items = env.get("vminstances.apps.cozystack.io", "-n", namespace)["items"]
    return sorted(item["metadata"]["name"] for item in items)


@pytest.mark.parametrize(("replicas", "namespace"), [(1, "tenant-drya"), (2, "tenant-dryb")])
def test_concurrent_dry_runs_at_the_pool_edge_store_no_more_than_the_budget(
    env: CozystackAPI, replicas: int, namespace: str
) -> None:
    env.point_webhooks(env.replicas[0][1] if replicas == 1 else env.entry_port)
    before = list(env.proxy.connections) if env.proxy else []
    answers = burst(env, namespace, 12)
    created = [out for code, out, _ in answers if code == 0]
    assert all("created (server dry run)" in out for out in created)
    denied = [err for code, _, err in answers if code != 0]
    assert all("exceeded tenant quota" in err for err in denied), denied
    names = stored(env, namespace)
    assert len(names) <= 4, f"cozystack-api stored {names} in a 4Gi pool of 1Gi VMs"
    assert len(created) == len(names), "every dry run allowed was stored, none other"
    assert len(created) == 4, "the pool fills to its edge, not short of it"
    if replicas == 2:
        assert env.proxy is not None
        calls = [after - b for after, b in zip(env.proxy.connections, before, strict=True)]
        assert all(calls), f"both replicas were called: {calls}"
    # The dry runs were charged as what they are: stored writes. The pool is full.
    body = yaml.safe_dump(vm("late", namespace))
    late = env.kubectl("create", "-f", "-", stdin=body, check=False)
    assert late.returncode != 0
    assert "exceeded tenant quota" in late.stderr

"""Applications at Kubernetes' own limits behind the real cozystack-api.

cozystack-api stores an application as a HelmRelease, its annotations each under
``apps.cozystack.io-`` (18 bytes more per key), its values inside a HelmRelease spec: the limits
a tenant meets are the HelmRelease's. An application in the webhook's own namespace (which both
configurations skip) shows what cozystack-api stores without the webhook.
"""

from __future__ import annotations

import json

import pytest

from tests.cozystack_api.conftest import NAMESPACE, CozystackAPI, vm
from webhook.core.base.kube_limits import ANNOTATIONS_LIMIT_BYTES
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, USER_PREFIX

pytestmark = pytest.mark.cozystack_api

TENANT = "limits"


@pytest.fixture(scope="module")
def env(cozystack_api: CozystackAPI) -> CozystackAPI:
    cozystack_api.tenant(TENANT, {"cpu": "8", "memory": "8Gi"})
    cozystack_api.start_replicas(1)
    cozystack_api.wait_pool(f"tenant-{TENANT}", 120)
    cozystack_api.point_webhooks(cozystack_api.entry_port)
    return cozystack_api


def released_notes(total: int) -> dict[str, str]:
    """Annotations taking exactly ``total`` bytes on the HelmRelease, each key prefixed."""
    notes: dict[str, str] = {}
    index = 0
    while total > 0:
        key = f"example.com/note-{index:05d}"
        value = "x" * max(0, min(250, total) - len(USER_PREFIX) - len(key))
        notes[key] = value
        total -= len(USER_PREFIX) + len(key) + len(value)
        index += 1
    return notes


def create(env: CozystackAPI, body: dict[str, object]) -> tuple[int, str]:
    done = env.kubectl("create", "-f", "-", stdin=json.dumps(body), check=False)
    return done.returncode, done.stderr


def test_a_vm_whose_helmrelease_leaves_no_room_for_the_charge_record_is_told_so_by_the_webhook(
    env: CozystackAPI,
) -> None:
    notes = released_notes(ANNOTATIONS_LIMIT_BYTES - 10)  # ten bytes short on the HelmRelease
    full = vm("full", NAMESPACE)
    full["metadata"]["annotations"] = notes
    code, err = create(env, full)  # cozystack-api stores it where the webhook is not called
    assert code == 0, err[-600:]
    # A tenant writing it was refused by cozystack-api: "failed to create HelmRelease: ...
    # metadata.annotations: Too long", for annotations it had kept within the limit, and the
    # charge was held for an object never stored. The webhook says what does not fit.
    full["metadata"]["namespace"] = f"tenant-{TENANT}"
    code, err = create(env, full)
    assert code != 0
    assert "tenant reservations:" in err, err[-600:]
    assert "charge record" in err, err[-600:]
    assert "HelmRelease" in err, err[-600:]
    # With room for the record on the HelmRelease, the same tenant's VM is stored, recorded.
    roomy = vm("roomy", f"tenant-{TENANT}")
    roomy["metadata"]["annotations"] = released_notes(ANNOTATIONS_LIMIT_BYTES - 2_000)
    code, err = create(env, roomy)
    assert code == 0, err[-600:]
    stored = env.get("vminstance", "roomy", "-n", f"tenant-{TENANT}")
    assert CHARGE_ANNOTATION in stored["metadata"]["annotations"]


def test_a_vm_too_large_for_etcd_is_refused_by_the_webhook_behind_cozystack_api(
    env: CozystackAPI,
) -> None:
    big = vm("too-large", f"tenant-{TENANT}")
    big["spec"]["cloudInit"] = "x" * 1_600_000
    code, err = create(env, big)
    assert code != 0
    assert "tenant reservations:" in err, err[-600:]
    assert "1572864" in err, err[-600:]

"""The budget key rules agree with a real kube-apiserver.

For every key, the Tenant budget ``{key: value}`` is rendered into ``tenant-quota`` as
Cozystack's chart does, and the ResourceQuota is created with ``dryRun=All`` on a real
kube-apiserver (``../shared/kube``): the webhook refuses a key exactly when Kubernetes refuses
what the chart renders from it, apart from the webhook's own two rules (a count of a plural the
platform does not define, or of another group, is a budget nothing counts; and the maximum
number of keys). Skipped, with the reason, where the server is not available.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from tests.builders import platform
from tests.realkube import real_apiserver
from webhook.core.base.quantities import format_quantity, parse_quantity
from webhook.core.capacity.guard import render_tenant_quota
from webhook.core.tenancy.counts import key_problem

pytestmark = pytest.mark.kube

KEYS = [
    ("cpu", "4"),
    ("memory", "16Gi"),
    ("ephemeral-storage", "10Gi"),
    ("storage", "100Gi"),
    ("pods", "10"),
    ("services.loadbalancers", "2"),
    ("services.nodeports", "2"),
    ("configmaps", "5"),
    ("persistentvolumeclaims", "5"),
    ("resourcequotas", "1"),
    ("nvidia.com/GA102GL_A10", "2"),
    ("count/vminstances.apps.cozystack.io", "10"),
    ("count/tenants.apps.cozystack.io", "5"),
    ("services.clusterip", "1"),
    ("hugepages-2Mi", "1Gi"),
    ("gpu", "1"),
    ("$\\x$", "1"),
    ("mémoire", "1"),
    ("a" * 64, "1"),
    ("example.com/" + "a" * 64, "1"),
    ("a" * 250 + ".io/gpu", "1"),
    ("a/b/c", "1"),
    ("Example.com/gpu", "1"),
    ("pods", "1500m"),
    ("nvidia.com/gpu", "0.5"),
    ("count/vminstances.apps.cozystack.io", "500m"),
]
# The webhook's own rules, beyond Kubernetes': counts of what nobody counts.
OURS = [("count/deployments.apps", "1"), ("count/vminstance.apps.cozystack.io", "1")]


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    work = tmp_path_factory.mktemp("kube")
    with real_apiserver(work) as kubeconfig:
        config = yaml.safe_load(kubeconfig.read_text())
        token = config["users"][0]["user"]["token"]
        yield config["clusters"][0]["cluster"]["server"], token, work / "pki" / "ca.crt"


def accepted(apiserver: tuple[str, str, Path], hard: dict[str, Decimal]) -> tuple[bool, str]:
    """Whether the API server accepts a ResourceQuota with this ``hard`` (dry run)."""
    url, token, ca = apiserver
    body = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "tenant-quota"},
        "spec": {"hard": {k: format_quantity(v) for k, v in hard.items()}},
    }
    request = urllib.request.Request(
        f"{url}/api/v1/namespaces/default/resourcequotas?dryRun=All",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status == 201, ""
    except urllib.error.HTTPError as error:
        if error.code != 422:
            raise
        return False, json.loads(error.read())["message"][:300]


@pytest.mark.parametrize(("key", "value"), KEYS, ids=[f"{k[:40]}={v}" for k, v in KEYS])
def test_the_webhook_refuses_a_key_exactly_when_kubernetes_refuses_its_rendering(
    apiserver: tuple[str, str, Path], key: str, value: str
) -> None:
    quantity = parse_quantity(value)
    ours = key_problem(key, quantity, platform().plurals())
    theirs, why = accepted(apiserver, render_tenant_quota({key: quantity}))
    assert (ours == "") == theirs, (
        f"webhook: {ours or 'accepted'}; kube-apiserver: {why or 'accepted'}"
    )


@pytest.mark.parametrize(("key", "value"), OURS, ids=[k for k, _ in OURS])
def test_a_count_nothing_counts_is_refused_though_kubernetes_accepts_its_rendering(
    apiserver: tuple[str, str, Path], key: str, value: str
) -> None:
    quantity = parse_quantity(value)
    assert key_problem(key, quantity, platform().plurals())
    assert accepted(apiserver, render_tenant_quota({key: quantity}))[0]

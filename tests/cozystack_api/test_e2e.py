"""End to end behind the real cozystack-api, through kubectl as a tenant would use it.

Two replicas on the shipped RBAC (a ServiceAccount token), the shipped webhook configurations
pointed at them by URL; each scenario has its own tenant, and the tenant's user is a
ServiceAccount of its namespace with a Role on ``apps.cozystack.io`` there (cozystack-api
authorizes it with SubjectAccessReviews against kube-apiserver).
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cozystack_api.conftest import CozystackAPI, vm
from webhook.core.tenancy.applications import CHARGE_ANNOTATION

pytestmark = pytest.mark.cozystack_api

HELM_PREFIX = "apps.cozystack.io-"  # how cozystack-api stores metadata on the HelmRelease
DENIED = 'admission webhook "reservation.cozystack.io" denied the request: exceeded tenant quota'


# Every tenant the module uses, made before the replicas start: a new replica's first watch
# events through cozystack-api can take tens of seconds (see the README's "Behind
# cozystack-api"), and a Tenant not yet seen charges its namespace to no pool.
TENANTS = {
    "kvminstance": {"memory": "1Gi"},
    "kvmdisk": {"storage": "5Gi"},
    "kpostgres": {"storage": "20Gi"},
    "kkubernetes": {"memory": "46592Mi"},
    "ktenant": {"memory": "1Gi"},
    "grow": {"memory": "2Gi"},
    "carve": {"memory": "4Gi"},
    # 3Gi: the write refused by cozystack-api after admission below holds 1Gi until its grace
    # passes (its object, the preview's, is older than its admission and settles nothing).
    "warn": {"memory": "3Gi"},
    "record": {"memory": "4Gi"},
    "race": {"memory": "5Gi"},
    "live": {"memory": "1Gi"},
}


@pytest.fixture(scope="module")
def env(cozystack_api: CozystackAPI) -> CozystackAPI:
    for name, quota in TENANTS.items():
        cozystack_api.tenant(name, quota)
    cozystack_api.start_replicas(2)
    for name in TENANTS:  # the replicas' first lists and watches through cozystack-api lag
        cozystack_api.wait_pool(f"tenant-{name}", 120)
    cozystack_api.point_webhooks(cozystack_api.entry_port)
    return cozystack_api


def user(env: CozystackAPI, namespace: str) -> Path:
    """A tenant user of ``namespace``: a ServiceAccount with a Role on its applications."""
    env.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "alice", "namespace": namespace},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "apps", "namespace": namespace},
                "rules": [{"apiGroups": ["apps.cozystack.io"], "resources": ["*"], "verbs": ["*"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "alice-apps", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "apps",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": namespace}],
            },
        ]
    )
    token = env.kubectl("create", "token", "alice", "-n", namespace).stdout.strip()
    admin = yaml.safe_load(env.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cz", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "alice", "user": {"token": token}}],
        "contexts": [
            {"name": "cz", "context": {"cluster": "cz", "user": "alice", "namespace": namespace}}
        ],
        "current-context": "cz",
    }
    path = env.base / f"alice-{namespace}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def app(kind: str, name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def create(
    env: CozystackAPI, kubeconfig: Path, obj: dict[str, Any], *more: str
) -> subprocess.CompletedProcess[str]:
    return env.kubectl(
        "create", *more, "-f", "-", stdin=yaml.safe_dump(obj), kubeconfig=kubeconfig, check=False
    )


def until(check: Any, timeout: float = 10.0) -> Any:
    """``check()`` until it returns something true (the replicas' watches lag a little)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


# One object of each kind and the budget it fills exactly (figures from `webhook evaluate`).
KINDS = [
    pytest.param("VMInstance", {"instanceType": "u1.micro"}, {"memory": "1Gi"}, id="vminstance"),
    pytest.param("VMDisk", {}, {"storage": "5Gi"}, id="vmdisk"),
    pytest.param("Postgres", {}, {"storage": "20Gi"}, id="postgres"),
    pytest.param("Kubernetes", {}, {"memory": "46592Mi"}, id="kubernetes"),
    pytest.param("Tenant", {"resourceQuotas": {"memory": "1Gi"}}, {"memory": "1Gi"}, id="tenant"),
]


@pytest.mark.parametrize(("kind", "spec", "budget"), KINDS)
def test_a_create_that_fits_is_stored_and_the_next_is_denied_as_kubectl_prints_it(
    env: CozystackAPI, kind: str, spec: dict[str, Any], budget: dict[str, str]
) -> None:
    name = f"k{kind.lower()}"
    namespace = env.tenant(name, budget)
    alice = user(env, namespace)
    first = create(env, alice, app(kind, "one", namespace, spec))
    assert first.returncode == 0, first.stderr
    assert f"{kind.lower()}.apps.cozystack.io/one created" in first.stdout
    second = create(env, alice, app(kind, "two", namespace, spec))
    assert second.returncode == 1
    (key, limit), *_ = budget.items()
    if kind == "Tenant":
        # cozystack-api's own gate runs before any admission webhook for a Tenant's quota,
        # and answers 422 first (the webhook decides what the gate lets through).
        assert second.stderr.startswith(f'The Tenant "two" is invalid: spec.resourceQuotas[{key}]')
        assert "exceeds the parent tenant's remaining" in second.stderr
    else:
        assert second.stderr.startswith("Error from server (Forbidden): error when creating")
        assert DENIED in second.stderr
        assert f"pool {namespace}" in second.stderr
        assert f"limited: {key}={limit}" in second.stderr
    items = env.get(f"{kind.lower()}.apps.cozystack.io", "-n", namespace)["items"]
    assert [i["metadata"]["name"] for i in items] == ["one"]


def test_an_update_that_grows_is_checked_and_one_that_shrinks_passes(env: CozystackAPI) -> None:
    namespace = env.tenant("grow", {"memory": "2Gi"})
    alice = user(env, namespace)
    assert create(env, alice, vm("a", namespace)).returncode == 0  # u1.micro: 1Gi
    grown = env.kubectl(
        "patch", "vminstance", "a", "--type=merge", "-p", '{"spec":{"instanceType":"u1.small"}}',
        kubeconfig=alice, check=False,
    )  # fmt: skip
    assert grown.returncode == 0, grown.stderr  # u1.small: 2Gi, the whole pool
    denied = create(env, alice, vm("b", namespace))
    assert DENIED in denied.stderr
    too_big = env.kubectl(
        "patch", "vminstance", "a", "--type=merge", "-p", '{"spec":{"instanceType":"u1.medium"}}',
        kubeconfig=alice, check=False,
    )  # fmt: skip
    assert DENIED in too_big.stderr, "a grow past the budget is denied"
    assert "requested: memory=2Gi" in too_big.stderr, "only the delta is requested"
    shrunk = env.kubectl(
        "patch", "vminstance", "a", "--type=merge", "-p", '{"spec":{"instanceType":"u1.micro"}}',
        kubeconfig=alice, check=False,
    )  # fmt: skip
    assert shrunk.returncode == 0, shrunk.stderr
    counter = iter(range(100))
    allowed = until(lambda: create(env, alice, vm(f"b{next(counter)}", namespace)).returncode == 0)
    assert allowed, "the shrink made room once observed"


def test_a_sub_tenant_carve_out_occupies_its_quota_in_the_parent_pool(env: CozystackAPI) -> None:
    parent = env.tenant("carve", {"memory": "4Gi"})
    alice = user(env, parent)
    child = app("Tenant", "kid", parent, {"resourceQuotas": {"memory": "3Gi"}})
    assert create(env, alice, child).returncode == 0
    env.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": f"{parent}-kid",
                "labels": {f"tenant.cozystack.io/{ns}": "" for ns in (parent, f"{parent}-kid")},
            },
        }
    )
    assert DENIED in create(env, alice, vm("big", parent, "u1.small")).stderr  # 3 + 2 > 4
    assert create(env, alice, vm("small", parent)).returncode == 0  # 3 + 1 = 4
    too_much = create(
        env, alice, app("Tenant", "kid2", parent, {"resourceQuotas": {"memory": "1Gi"}})
    )
    assert DENIED in too_much.stderr
    kid = user(env, f"{parent}-kid")
    env.wait_pool(f"{parent}-kid", timeout=90)  # the new Tenant, through cozystack-api's watch
    answers = [create(env, kid, vm(f"v{i}", f"{parent}-kid")) for i in range(3)]
    assert all(a.returncode == 0 for a in answers), "the child's own 3Gi is its to use"
    assert DENIED in create(env, kid, vm("v3", f"{parent}-kid")).stderr


def test_warnings_reach_kubectl_and_a_dry_run_says_it_is_held(env: CozystackAPI) -> None:
    namespace = env.tenant("warn", TENANTS["warn"])
    alice = user(env, namespace)
    dry = create(env, alice, vm("preview", namespace), "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    assert "vminstance.apps.cozystack.io/preview created (server dry run)" in dry.stdout
    assert "Warning: dry run: held like a write for up to 65s" in dry.stderr
    # cozystack-api stored it all the same, so the same write for real is refused as a
    # duplicate: by the webhook once its state shows the preview (409, before anything is
    # held), else by cozystack-api's HelmRelease create after admission (a 500, not 409).
    again = create(env, alice, vm("preview", namespace))
    assert again.returncode == 1
    assert (
        "Error from server (AlreadyExists)" in again.stderr
        and "VMInstance preview already exists in tenant-warn" in again.stderr
    ) or (
        'failed to create HelmRelease: helmreleases.helm.toolkit.fluxcd.io "vm-instance-preview" '
        "already exists" in again.stderr
    ), again.stderr
    typo = {"instanceType": "u1.micro", "runStrategi": "Halted"}
    unknown = create(env, alice, app("VMInstance", "typo", namespace, typo))
    assert unknown.returncode == 0, unknown.stderr
    assert "Warning: " in unknown.stderr, unknown.stderr
    assert "runStrategi" in unknown.stderr


def test_signed_charge_records_survive_the_helmrelease_round_trip(env: CozystackAPI) -> None:
    namespace = env.tenant("record", {"memory": "4Gi"})
    alice = user(env, namespace)
    assert create(env, alice, vm("r", namespace)).returncode == 0
    stored = env.get("vminstance", "-n", namespace, "r")
    record = json.loads(stored["metadata"]["annotations"][CHARGE_ANNOTATION])
    assert record["charge"] == {"cpu": "1", "memory": "1Gi"}
    assert record["mac"].startswith("hmac-sha256:")
    release = env.get("helmreleases.helm.toolkit.fluxcd.io", "-n", namespace, "vm-instance-r")
    on_release = release["metadata"]["annotations"][HELM_PREFIX + CHARGE_ANNOTATION]
    assert on_release == stored["metadata"]["annotations"][CHARGE_ANNOTATION]
    # An update keeping the record is decided against it (a record that did not verify would
    # be refused as forged): the grow is charged the delta from the recorded 1Gi.
    grown = env.kubectl(
        "patch", "vminstance", "r", "--type=merge", "-p", '{"spec":{"instanceType":"u1.small"}}',
        kubeconfig=alice, check=False,
    )  # fmt: skip
    assert grown.returncode == 0, grown.stderr
    again = env.get("vminstance", "-n", namespace, "r")
    assert json.loads(again["metadata"]["annotations"][CHARGE_ANNOTATION])["charge"] == {
        "cpu": "1",
        "memory": "2Gi",
    }


def test_exactly_k_of_n_concurrent_creates_are_stored(env: CozystackAPI) -> None:
    namespace = env.tenant("race", {"memory": "5Gi"})
    alice = user(env, namespace)

    def one(i: int) -> subprocess.CompletedProcess[str]:
        # A refusal that says "try again" (a replica catching up, a busy ledger) is retried as
        # a client would; whatever the retries, exactly what fits is stored.
        for _ in range(6):
            done = create(env, alice, vm(f"vm{i}", namespace))
            if done.returncode == 0 or "try again" not in done.stderr:
                break
            time.sleep(0.5)
        return done

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, range(12)))
    assert sum(a.returncode == 0 for a in answers) == 5
    refused = [a.stderr for a in answers if a.returncode != 0]
    assert all(DENIED in text for text in refused), refused
    assert len(env.get("vminstances", "-n", namespace)["items"]) == 5


def test_the_live_state_reads_applications_through_the_aggregated_api(env: CozystackAPI) -> None:
    """An application the webhook never admitted (a HelmRelease written directly, as Cozystack's
    modules appear) is counted once cozystack-api serves it."""
    namespace = env.tenant("live", {"memory": "1Gi"})
    alice = user(env, namespace)
    env.apply(
        {
            "apiVersion": "helm.toolkit.fluxcd.io/v2",
            "kind": "HelmRelease",
            "metadata": {
                "name": "vm-instance-pre",
                "namespace": namespace,
                "labels": {
                    "apps.cozystack.io/application.kind": "VMInstance",
                    "apps.cozystack.io/application.group": "apps.cozystack.io",
                    "apps.cozystack.io/application.name": "pre",
                },
            },
            "spec": {
                "chartRef": {
                    "kind": "ExternalArtifact",
                    "name": "cozystack-vm-instance-application-kubevirt-vm-instance",
                    "namespace": "cozy-system",
                },
                "interval": "5m0s",
                "values": {"instanceType": "u1.micro"},
            },
        }
    )
    served = until(
        lambda: (
            env.kubectl("get", "vminstance", "-n", namespace, "pre", check=False).returncode == 0
        )
    )
    assert served
    # Every replica counts pre's 1Gi in the pool (its watch through the aggregation layer
    # delivered it), not merely once cozystack-api serves it.
    env.wait_pool(namespace, 60, reserved={"memory": "1Gi"})
    denied = create(env, alice, vm("after", namespace))
    assert DENIED in denied.stderr, "pre's 1Gi is counted, read through the aggregated API"
    assert "used: memory=1Gi" in denied.stderr

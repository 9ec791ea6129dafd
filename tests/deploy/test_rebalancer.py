"""deploy/overlays/rebalancer: its own Deployment and least-privilege RBAC, nothing else."""

from __future__ import annotations

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from tests.deploy.test_manifests import KUBERNETES_VERSION, render

OVERLAY = "deploy/overlays/rebalancer"
# (apiGroup, resource, verb) for every call `webhook rebalance` makes;
# tests/capacity/test_rebalance.py checks the calls it makes against the emulated API server are
# among these.
CALLS = {
    *(("", r, v) for r in ("nodes", "pods") for v in ("get", "list", "watch")),
    *(("kubevirt.io", "virtualmachineinstances", v) for v in ("get", "list", "watch")),
    *(
        ("kubevirt.io", "virtualmachineinstancemigrations", v)
        for v in ("create", "get", "list", "watch")
    ),
    ("", "events", "create"),
}


def test_the_overlay_is_valid_and_touches_nothing_of_the_webhook() -> None:
    manifests = render(OVERLAY)
    kinds = sorted((m["kind"], m["metadata"]["name"]) for m in manifests)
    assert kinds == [
        ("ClusterRole", "reservation-rebalancer"),
        ("ClusterRoleBinding", "reservation-rebalancer"),
        ("Deployment", "reservation-rebalancer"),
        ("ServiceAccount", "reservation-rebalancer"),
    ]
    for manifest in manifests:
        try:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:  # pragma: no cover - a failure
            pytest.fail(f"{manifest['kind']}: {'.'.join(map(str, error.path))}: {error.message}")


def test_rbac_grants_exactly_the_rebalancers_calls() -> None:
    role = next(m for m in render(OVERLAY) if m["kind"] == "ClusterRole")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == CALLS


def test_it_starts_as_a_dry_run_of_one_replica() -> None:
    deployment = next(m for m in render(OVERLAY) if m["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "rebalance"
    assert "--apply" not in container["args"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    binding = next(m for m in render(OVERLAY) if m["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == deployment["metadata"]["namespace"]


def test_it_runs_the_webhooks_image() -> None:
    deployment = next(m for m in render(OVERLAY) if m["kind"] == "Deployment")
    webhook = next(
        m
        for m in render("deploy")
        if m["kind"] == "Deployment" and m["metadata"]["name"] == "reservation-webhook"
    )
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == webhook["spec"]["template"]["spec"]["containers"][0]["image"]

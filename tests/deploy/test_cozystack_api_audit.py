"""deploy/cozystack-api-audit: what turns on cozystack-api's own audit log, applied to the
Deployment Cozystack's chart renders (patched locally by kubectl, no server needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from tests.builders import ROOT

HERE = ROOT / "tests" / "deploy"
AUDIT = ROOT / "deploy" / "cozystack-api-audit"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def kubectl(*args: str) -> str:
    return subprocess.run(
        ["kubectl", *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def patched() -> dict[str, Any]:
    out = kubectl(
        "patch",
        "--local",
        "-f",
        str(HERE / "cozystack-api-deployment.yaml"),
        "--patch-file",
        str(AUDIT / "deployment-patch.yaml"),
        "-o",
        "yaml",
    )
    deployment: dict[str, Any] = yaml.safe_load(out)
    return deployment


def flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value


def test_the_policy_configmap_logs_applications_with_their_bodies() -> None:
    (configmap,) = list(yaml.safe_load_all(kubectl("kustomize", str(AUDIT))))
    assert (configmap["kind"], configmap["metadata"]["namespace"]) == ("ConfigMap", "cozy-system")
    policy = yaml.safe_load(configmap["data"]["policy.yaml"])
    assert policy["kind"] == "Policy"
    apps = [r for r in policy["rules"] if {"group": "apps.cozystack.io"} in r.get("resources", [])]
    assert [r["level"] for r in apps] == ["RequestResponse"]
    assert policy["rules"].index(apps[0]) < len(policy["rules"]) - 1, "before the catch-all"


def test_the_patch_keeps_the_charts_flags_and_mounts_the_policy_and_the_log() -> None:
    deployment = patched()
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = container["args"]
    assert args[:2] == [
        "--tls-cert-file=/tmp/cozystack-api-certs/tls.crt",
        "--tls-private-key-file=/tmp/cozystack-api-certs/tls.key",
    ]
    assert flag(args, "audit-log-format") == "json"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["/tmp/cozystack-api-certs"] == "cozystack-api-certs", "the chart's kept"
    policy = PurePosixPath(flag(args, "audit-policy-file"))
    source = volumes[mounts[str(policy.parent)]]["configMap"]
    (configmap,) = list(yaml.safe_load_all(kubectl("kustomize", str(AUDIT))))
    assert source["name"] == configmap["metadata"]["name"]
    assert policy.name in configmap["data"]
    log = PurePosixPath(flag(args, "audit-log-path"))
    assert "hostPath" in volumes[mounts[str(log.parent)]]


def test_the_helmrelease_patch_makes_flux_apply_the_same_patch() -> None:
    release = yaml.safe_load((AUDIT / "helmrelease-patch.yaml").read_text())
    (renderer,) = release["spec"]["postRenderers"]
    (patch,) = renderer["kustomize"]["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "cozystack-api"}
    embedded = yaml.safe_load(patch["patch"])
    assert embedded["spec"] == yaml.safe_load((AUDIT / "deployment-patch.yaml").read_text())["spec"]

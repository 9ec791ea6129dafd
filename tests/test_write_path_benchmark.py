"""The write-path benchmark's set-up: shipped configurations pointed by URL, clean absence."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import write_path
from tests.builders import ROOT


def rendered() -> list[dict[str, Any]]:
    text = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy")], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.mark.skipif(
    subprocess.run(["which", "kubectl"], capture_output=True).returncode != 0,
    reason="kubectl renders the shipped configurations",
)
def test_the_shipped_configurations_are_pointed_at_two_urls_with_the_ca_and_kept_otherwise() -> (
    None
):
    deploy = rendered()
    found = write_path.webhook_configurations(deploy, b"CA", 1111, 2222)
    assert sorted(d["kind"] for d in found) == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]
    shipped = {d["kind"]: d for d in deploy}
    for document in found:
        original = shipped[document["kind"]]
        for ours, theirs in zip(document["webhooks"], original["webhooks"], strict=True):
            port = 1111 if theirs["clientConfig"]["service"]["path"] == "/mutate" else 2222
            path = theirs["clientConfig"]["service"]["path"]
            assert ours["clientConfig"] == {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(b"CA").decode(),
            }
            assert {k: v for k, v in ours.items() if k != "clientConfig"} == {
                k: v for k, v in theirs.items() if k != "clientConfig"
            }


def test_every_application_definition_gets_a_crd_standing_in_for_its_kind() -> None:
    documents = write_path.cluster_documents([])
    plurals = {
        d["spec"]["names"]["plural"] for d in documents if d["spec"]["group"] == "apps.cozystack.io"
    }
    definitions = [
        d for d in write_path.platform_documents() if d["kind"] == "ApplicationDefinition"
    ]
    assert plurals == {d["spec"]["application"]["plural"] for d in definitions}
    assert "vminstances" in plurals


def test_without_the_real_api_server_the_benchmark_says_so_and_exits_cleanly(
    tmp_path: Path,
) -> None:
    script = (
        "import sys, pathlib; from benchmarks import write_path as w; "
        f"w.UP = pathlib.Path({str(tmp_path / 'absent' / 'up.sh')!r}); sys.argv = ['w']; w.main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "no real kube-apiserver here" in result.stdout
    assert "absent" in result.stdout


def test_a_failed_create_is_counted_by_the_reason_the_api_server_gave() -> None:
    status = {
        "kind": "Status",
        "status": "Failure",
        "message": 'admission webhook "validate.example" denied the request: tenant reservations: '
        "this replica has not yet seen every application the ledger of pool tenant-t0 "
        "accounted for; try again",
        "code": 503,
    }
    reason = write_path.failure_reason(json.dumps(status).encode())
    assert reason.startswith('admission webhook "validate.example" denied')
    assert len(reason) == 160
    assert write_path.failure_reason(b"upstream connect error") == "upstream connect error"

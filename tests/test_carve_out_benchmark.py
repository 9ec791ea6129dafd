"""The carve-out benchmark's Tenants and table, without starting a server."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import carve_out, write_path
from tests.builders import ROOT


def test_the_carve_out_bounds_only_cpu_under_a_parent_bounding_only_memory() -> None:
    documents = carve_out.tenant_documents()
    tenants = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]
        for d in documents
        if d["kind"] == "Tenant"
    }
    assert tenants == {
        ("tenant-root", "p"): {"resourceQuotas": {"memory": f"{carve_out.AMPLE}Gi"}},
        ("tenant-p", "burst"): {"resourceQuotas": {"cpu": carve_out.AMPLE}},
        ("tenant-p", "plain"): {},
        ("tenant-p", "victim"): {},
    }
    namespaces = {d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"}
    for setup in carve_out.SETUPS:
        assert carve_out.burst_namespace(setup) in namespaces
    assert carve_out.VICTIM in namespaces
    assert carve_out.burst_namespace("carve-out") != carve_out.burst_namespace("one-pool")


def test_the_ratio_is_taken_round_by_round_and_judged_against_the_goal() -> None:
    def rows(victim: list[float]) -> list[dict[str, float]]:
        return [{"victim p50 ms": v, "burst creates/s": 100.0} for v in victim]

    args = argparse.Namespace(tree=None, clients=16, rounds=3, seconds=8.0)
    met = carve_out.report(
        {"carve-out": rows([50, 60, 200]), "one-pool": rows([50, 50, 100])}, args, 1.0
    )
    assert "victim p50 carve-out / one-pool  1.2 [1-2]   goal <= 1.2  met" in met
    missed = carve_out.report(
        {"carve-out": rows([130, 135, 140]), "one-pool": rows([45, 45, 45])}, args, 1.0
    )
    assert "3 [2.89-3.11]   goal <= 1.2  NOT met" in missed
    assert "burst creates/s" in missed


def test_a_tree_without_its_venv_is_refused_before_a_cluster_starts(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="absent"):
        carve_out.webhook_program(tmp_path)
    assert carve_out.webhook_program(None)[1:] == ["-m", "webhook"]


def test_without_the_real_api_server_the_benchmark_says_so_and_exits_cleanly(
    tmp_path: Path,
) -> None:
    script = (
        "import sys, pathlib; from benchmarks import carve_out as c; "
        f"c.UP = pathlib.Path({str(tmp_path / 'absent' / 'up.sh')!r}); sys.argv = ['c']; c.main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "no real kube-apiserver here" in result.stdout


def test_a_u1_micro_charges_both_keys_the_two_pools_bound() -> None:
    # The carve-out's write is two pools' only if the instance type charges cpu and memory.
    micro = next(
        d
        for d in write_path.platform_documents()
        if d["kind"] == "VirtualMachineClusterInstancetype" and d["metadata"]["name"] == "u1.micro"
    )
    assert micro["spec"]["cpu"]["guest"]
    assert micro["spec"]["memory"]["guest"]

"""``webhook plan``: the seed's story from a snapshot file, and migrations kubectl accepts."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.apiserver.server import EmulatedAPIServer
from tests.builders import FIXTURES
from tests.capacity.objects import hostile_mixed_cluster
from webhook.commands.cli import main

SEED = str(FIXTURES / "capacity" / "seed-snapshot.yaml")
LLAMA = "tenant-demo/rhel7-red-llama"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_the_seed_needs_one_migration_off_the_node_the_vm_will_use(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "plan", "--snapshot", SEED, "--for", LLAMA, "-o", "json")
    plan = json.loads(out)
    assert status == 0
    assert plan["feasible"] is True
    assert len(plan["moves"]) == 1
    move = plan["moves"][0]
    assert move["from"] == plan["target"] != move["to"]
    # The launcher's request as scheduled: 8Gi guest + 284Mi KubeVirt overhead.
    assert move["memory"] == "8476Mi"


def test_the_yaml_is_one_pinned_migration_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "plan", "--snapshot", SEED, "--for", LLAMA, "-o", "yaml")
    docs = list(yaml.safe_load_all(out))
    assert status == 0
    assert [d["kind"] for d in docs] == ["VirtualMachineInstanceMigration"]
    assert docs[0]["apiVersion"] == "kubevirt.io/v1"
    assert docs[0]["metadata"]["namespace"] == "tenant-demo"
    assert set(docs[0]["spec"]) == {"vmiName", "addedNodeSelector"}
    assert docs[0]["spec"]["addedNodeSelector"]["kubernetes.io/hostname"].startswith("worker-")


def test_draining_a_seed_worker_moves_both_of_its_vms(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "plan", "--snapshot", SEED, "--drain", "worker-green.shift.toca.local"
    )
    assert status == 0
    assert "2 live migrations" in out
    assert "Run the steps in order" in out


def test_no_plan_within_the_cap_exits_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "plan", "--snapshot", SEED, "--for", LLAMA, "--max-moves", "0", "-o", "json"
    )
    assert status == 1
    assert json.loads(out)["reason"] == "every eligible node needs more than 0 VMs moved off it"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--for", "no-slash"], "is not NAMESPACE/NAME", id="bad-vmi-name"),
        pytest.param(["--for", LLAMA, "--max-moves", "9"], "not between 0 and 5", id="cap"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, _, err = run(capsys, "plan", "--snapshot", SEED, *argv)
    assert status == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("items: [", "not YAML", id="broken-yaml"),
        pytest.param("- 1\n- 2\n", "not an object", id="not-objects"),
        pytest.param(
            "kind: Node\nmetadata: {name: n}\nstatus: {allocatable: {memory: lots}}\n",
            "Node n: status.allocatable.memory",
            id="bad-quantity",
        ),
    ],
)
def test_a_hostile_snapshot_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "snapshot.yaml"
    path.write_text(content)
    status, _, err = run(capsys, "plan", "--snapshot", str(path), "--for", LLAMA)
    assert status == 2
    assert message in err


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_accepts_the_migrations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # kubectl's client-side dry run still needs discovery to map the kind, so it talks to the
    # emulated API server, which serves kubevirt.io/v1 like a cluster with KubeVirt installed.
    status, manifest, _ = run(capsys, "plan", "--snapshot", SEED, "--for", LLAMA, "-o", "yaml")
    assert status == 0
    # kubectl sends no bearer token over plain HTTP, so this server asks for none.
    async with EmulatedAPIServer(token=None) as api:
        api.resource(
            "kubevirt.io",
            "v1",
            "virtualmachineinstancemigrations",
            "VirtualMachineInstanceMigration",
        )
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        process = await asyncio.create_subprocess_exec(
            "kubectl",
            "--kubeconfig",
            str(kubeconfig),
            "apply",
            "--dry-run=client",
            "--validate=false",
            "-f",
            "-",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(manifest.encode()), 60)
        assert process.returncode == 0, stderr.decode()
        assert "virtualmachineinstancemigration.kubevirt.io/make-room-1-" in stdout.decode()
        assert "created (dry run)" in stdout.decode()
        # A client dry run writes nothing.
        assert api.objects("kubevirt.io", "virtualmachineinstancemigrations") == []


async def test_without_a_snapshot_it_reads_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.capacity.test_rebalance import register, seed_objects

    async with EmulatedAPIServer() as api:
        register(api)
        for obj in seed_objects():
            api.create(obj)
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        argv = ["plan", "--kubeconfig", kubeconfig, "--for", LLAMA, "-o", "json"]
        status = await asyncio.to_thread(main, argv)
    plan = json.loads(capsys.readouterr().out)
    assert status == 0
    assert len(plan["moves"]) == 1


def hostile_snapshot_file(tmp_path: Path) -> str:
    path = tmp_path / "snapshot.yaml"
    items = hostile_mixed_cluster()
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return str(path)


def test_a_vm_short_of_memory_and_cpu_among_mixed_vms_gets_its_answer_in_bounded_time(
    tmp_path: Path,
) -> None:
    # 8 nodes x 70 mixed VMs, --max-moves 5: this searched for minutes before every candidate
    # weighed was counted; now the default bound answers in seconds, saying what it searched.
    # The time limit is set far off: on a busy machine it, not the bound, would end the search.
    snapshot = hostile_snapshot_file(tmp_path)
    argv = ["--snapshot", snapshot, "--for", "tenant-evil/pending", "--max-moves", "5"]
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "plan", *argv, "--plan-seconds", "3600", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    plan = json.loads(done.stdout)
    assert plan["feasible"] is False
    assert plan["reason"].startswith(
        "no plan within the bound: stopped at its bound of 1000000 candidates; "
        "no plan of 4 moves or fewer exists"
    )


def test_plan_seconds_ends_the_search_in_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = hostile_snapshot_file(tmp_path)
    argv = ["--snapshot", snapshot, "--for", "tenant-evil/pending", "--max-moves", "5"]
    status, out, _ = run(
        capsys, "plan", *argv, "--max-candidates", "1000000000", "--plan-seconds", "0.5"
    )
    assert status == 1
    # Far short of the billion candidates allowed: the time limit ended the search.
    considered = re.search(r"stopped at the time limit after considering ([\d,]+) candidates", out)
    assert considered is not None, out
    assert int(considered[1].replace(",", "")) < 1_000_000_000
    assert "no plan: no plan within the bound:" in out
    status, _, err = run(capsys, "plan", *argv, "--max-candidates", "0")
    assert status == 2
    assert "--max-candidates must be at least 1" in err

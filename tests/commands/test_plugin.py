"""kubectl reservation: report and explain, from manifest directories and from a cluster."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import yaml

from tests.builders import FIXTURES, THING_DEFINITION
from tests.cluster import app, cluster, tenant
from webhook.commands.plugin import main

STATE = [
    "--state",
    str(FIXTURES / "cozystack"),
    "--state",
    str(FIXTURES / "tenants"),
    "--state",
    str(FIXTURES / "applications"),
]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_report_from_manifests_adds_carve_outs_and_charges(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "report", "--json", *STATE)
    acme = json.loads(out)["pools"][0]
    assert status == 0
    # ci carves 4 cpu / 4Gi; web1's recorded 2 / 8Gi; db is 3 x t1.micro (500m, 256Mi)
    assert acme["reserved"]["cpu"] == "7500m"
    assert acme["reserved"]["memory"] == "13056Mi"


def test_report_for_a_namespace_shows_its_pool_the_pools_below_and_its_ceiling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run(capsys, "report", "--json", "-n", "tenant-acme-dev", *STATE)
    report = json.loads(out)
    # tenant-acme-dev is in tenant-acme's pool; tenant-acme-dev-ci below it has its own
    assert [p["pool"] for p in report["pools"]] == ["tenant-acme", "tenant-acme-dev-ci"]
    assert report["namespace"]["pool"] == "tenant-acme"
    # 16Gi budget minus what the rest of the pool holds (ci's 4Gi carve-out, web1's 8Gi);
    # db's 768Mi is tenant-acme-dev's own: 16Gi - 12Gi = 4Gi
    assert report["namespace"]["ceiling"]["memory"] == "4Gi"


def test_report_for_the_root_shows_the_pools_below_it(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "report", "-n", "tenant-root", *STATE)
    assert status == 0
    assert "tenant-acme " in out
    assert "tenant-acme-dev-ci" in out
    assert "no tenant declares a quota" not in out


def test_report_for_an_unknown_namespace_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "report", "-n", "tenant-nope", *STATE)
    assert status == 0
    assert "namespace tenant-nope is unknown" in out


def test_report_tables_show_human_quantities_and_json_exact_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, table, _ = run(capsys, "report", *STATE)
    _, data, _ = run(capsys, "report", "-o", "yaml", *STATE)
    memory = next(line for line in table.splitlines() if line.split()[:1] == ["memory"])
    assert memory.split() == ["memory", "16Gi", "12.75Gi", "3.25Gi", "-"]
    assert "13056Mi" not in table
    assert "memory: 13056Mi" in data


def test_explain_shows_terms_and_the_drift_from_the_recorded_charge(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "explain", "vminstance/web1", "-n", "tenant-acme", *STATE)
    assert status == 0
    assert "vm    -     1      instance type u1.large  cpu=2,memory=8Gi" in out
    assert "contract drift" in out


def test_explain_names_what_it_cannot_find(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "explain", "vminstance/nope", "-n", "tenant-acme", *STATE)
    assert status == 2
    assert "VMInstance/nope not found in namespace tenant-acme" in err
    status, _, err = run(capsys, "explain", "widget/x", "-n", "tenant-acme", *STATE)
    assert "widget: no ApplicationDefinition declares this kind" in err


async def test_report_and_explain_against_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "16Gi"}))
        server.create(app("Postgres", "tenant-acme", "db", {"replicas": 3}))
        status = await asyncio.to_thread(
            main, ["report", "--json", "--kubeconfig", str(kubeconfig)]
        )
        report = json.loads(capsys.readouterr().out)
        assert status == 0
        assert report["pools"][0]["reserved"] == {"memory": "768Mi"}
        status = await asyncio.to_thread(
            main,
            [
                "explain",
                "postgreses/db",
                "-n",
                "tenant-acme",
                "--json",
                "--kubeconfig",
                str(kubeconfig),
            ],
        )
        explained = json.loads(capsys.readouterr().out)
        assert status == 0
        assert explained["terms"][0]["source"] == "preset t1.micro"
        assert explained["recorded"] is None


async def test_report_for_a_namespace_reads_only_that_namespace_and_the_pool_record_above(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "16Gi"}))
        server.create(tenant("tenant-acme", "dev"))
        server.create(app("Postgres", "tenant-acme-dev", "db", {"replicas": 3}))
        server.create(tenant("tenant-root", "other", {"memory": "4Gi"}))
        server.create(app("Postgres", "tenant-other", "db", {"replicas": 1}))
        record = server.create(
            {
                "apiVersion": "reservation.cozystack.io/v1alpha1",
                "kind": "TenantReservation",
                "metadata": {"name": "tenant-acme", "namespace": "tenant-acme"},
                "spec": {},
            }
        )
        record["status"] = {"budget": {"memory": "16Gi"}, "reserved": {"memory": "768Mi"}}
        server.update_status(record)
        server.requests.clear()
        argv = ["report", "-n", "tenant-acme-dev", "-o", "json", "--kubeconfig", str(kubeconfig)]
        status = await asyncio.to_thread(main, argv)
        report = json.loads(capsys.readouterr().out)
    assert status == 0
    paths = [r.path for r in server.requests]
    apps = [p for p in paths if p.startswith("/apis/apps.cozystack.io/")]
    # every application read is namespaced, and none is outside tenant-acme-dev's subtree
    assert all("/namespaces/tenant-acme-dev/" in p for p in apps if "/tenants/" not in p)
    assert not [p for p in paths if "tenant-other" in p]
    assert not [r for r in server.requests if r.query.get("watch")]  # nothing that can hang
    assert report["namespace"]["pool"] == "tenant-acme"
    assert report["poolAbove"]["reserved"] == {"memory": "768Mi"}


async def test_the_first_forbidden_read_names_the_missing_permission(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.fail_next(1, 403, method="GET")
        status = await asyncio.to_thread(main, ["report", "--kubeconfig", str(kubeconfig)])
        err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1
    assert "forbidden: this needs RBAC verb 'list' on applicationdefinitions.cozystack.io" in err
    assert "cluster-wide" in err


async def test_explain_finds_a_kind_by_its_short_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(app("VMInstance", "tenant-acme", "web1", {"instanceType": "u1.large"}))
        argv = ["explain", "vm/web1", "-n", "tenant-acme", "-o", "json"]
        status = await asyncio.to_thread(main, [*argv, "--kubeconfig", str(kubeconfig)])
        explained = json.loads(capsys.readouterr().out)
    assert status == 0
    assert explained["charge"] == {"cpu": "2", "memory": "8Gi"}


def test_fail_on_unknown_exits_1_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    unknown = ["--state", str(FIXTURES / "samples" / "unknown")]
    status, _, err = run(capsys, "report", "--fail-on", "unknown", *STATE, *unknown)
    assert status == 1
    assert "--fail-on: 1 application(s) with an unknown or unevaluable reservation" in err
    status, _, _ = run(capsys, "report", "--fail-on", "overcommitted,drift", *STATE, *unknown)
    assert status == 0


async def test_a_kind_the_api_does_not_serve_is_a_note_not_the_end_of_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(THING_DEFINITION)  # declared, but no "things" served by the API
        server.create(tenant("tenant-root", "acme", {"memory": "16Gi"}))
        status = await asyncio.to_thread(main, ["report", "-A", "--kubeconfig", str(kubeconfig)])
        out, err = capsys.readouterr()
    assert status == 0
    assert "note: not served by the API (404), so not counted: Thing" in err
    assert "tenant-acme" in out


async def test_a_kubeconfig_split_over_several_files_resolves_as_kubectl_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "16Gi"}))
        whole = yaml.safe_load(kubeconfig.read_text())
        first, second = tmp_path / "first", tmp_path / "second"
        first.write_text(yaml.safe_dump({**whole, "contexts": [], "current-context": ""}))
        second.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [],
                    "users": [],
                    "contexts": [{**whole["contexts"][0], "name": "split"}],
                    "current-context": "",
                }
            )
        )
        monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
        argv = ["report", "-o", "json", "--context", "split"]
        status = await asyncio.to_thread(main, argv)
        out, err = capsys.readouterr()
    assert status == 0, err
    assert [p["pool"] for p in json.loads(out)["pools"]] == ["tenant-acme"]


async def test_guard_against_a_cluster_reads_the_namespaces_quotas_and_fails_on_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "16Gi", "cpu": "16"}))
        server.create(tenant("tenant-root", "other", {"memory": "4Gi"}))
        for index in range(13):
            server.create(
                app("VMInstance", "tenant-acme", f"vm{index}", {"instanceType": "u1.micro"})
            )
        hard = {"requests.memory": "16Gi", "limits.memory": "16Gi", "requests.cpu": "1600m"}
        server.create(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "tenant-quota", "namespace": "tenant-acme"},
                "spec": {"hard": hard},
            }
        )
        server.requests.clear()
        argv = ["guard", "-n", "tenant-acme", "-o", "json", "--fail-on", "short"]
        status = await asyncio.to_thread(main, [*argv, "--kubeconfig", str(kubeconfig)])
        report = json.loads(capsys.readouterr().out)
    assert status == 1
    (row,) = report["namespaces"]
    # 13 x (1Gi + 270Mi) = 16822Mi against 16Gi: 438Mi short.
    assert row["namespace"] == "tenant-acme"
    assert row["guard"] == "observed"
    assert row["short"] == {"requests.memory": "438Mi"}
    assert row["smallestFactor"] == "1.03"
    assert not [r for r in server.requests if "tenant-other" in r.path]


def test_explain_shows_a_volume_held_at_its_high_mark(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A VMDisk lowered from 100Gi to 1Gi: its record keeps the 100Gi mark, and explain says
    the storage is held there, and why."""
    from tests.builders import signed_marks

    spec = {"storage": "1Gi"}
    disk = {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMDisk",
        "metadata": {
            "name": "data",
            "namespace": "tenant-acme",
            "annotations": {
                "reservation.cozystack.io/charge": signed_marks(
                    "VMDisk", "tenant-acme", "data", spec, {"storage": "100Gi"}, {"disk#1": "100Gi"}
                )
            },
        },
        "spec": spec,
    }
    (tmp_path / "disk.yaml").write_text(yaml.safe_dump(disk))
    state = ["--state", str(FIXTURES / "cozystack"), "--state", str(tmp_path)]
    status, out, _ = run(capsys, "explain", "vmdisk/data", "-n", "tenant-acme", *state)
    assert status == 0
    assert "VMDisk reserves storage=100Gi" in out
    assert "storage held at its high mark 100Gi" in out
    assert "its values alone say storage=1Gi" in out
    status, out, _ = run(
        capsys, "explain", "vmdisk/data", "-n", "tenant-acme", "-o", "json", *state
    )
    term = json.loads(out)["terms"][0]
    assert (term["volume"], term["heldAt"]) == ("kept", "100Gi")


async def test_report_against_a_cluster_shows_where_each_pools_room_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "16Gi"}))
        record = server.create(
            {
                "apiVersion": "reservation.cozystack.io/v1alpha1",
                "kind": "TenantReservation",
                "metadata": {"name": "tenant-acme", "namespace": "tenant-acme"},
                "spec": {},
            }
        )
        record["status"] = {
            "slices": {
                "webhook-a.0a1b2c": {
                    "holder": "webhook-a",
                    "kinds": ["Postgres"],
                    "granted": {"memory": "2Gi"},
                    "folded": {"memory": "512Mi"},
                    "returned": {},
                    "expires": "2096-01-01T00:00:00.000000Z",
                }
            }
        }
        server.update_status(record)
        for argv in (["report"], ["report", "-n", "tenant-acme"]):
            command = [*argv, "-o", "json", "--kubeconfig", str(kubeconfig)]
            status = await asyncio.to_thread(main, command)
            report = json.loads(capsys.readouterr().out)
            assert status == 0
            (pool,) = report["room"]
            assert pool["keys"]["memory"]["slices"] == "1536Mi"
            assert pool["slices"][0]["holder"] == "webhook-a"

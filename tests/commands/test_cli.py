"""The command line, end to end on the fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import FIXTURES, review
from webhook.commands.cli import main

STATE = ["--state", str(FIXTURES / "cozystack"), "--state", str(FIXTURES / "tenants")]
MISLABELLED = FIXTURES / "samples" / "mislabelled"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def responses(out: str) -> list[dict[str, Any]]:
    return [json.loads(line)["response"] for line in out.splitlines()]


def write(tmp_path: Path, name: str, body: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return str(path)


def test_evaluate_prints_the_charge_as_sorted_canonical_quantities(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(
        capsys,
        "evaluate",
        "--state",
        str(FIXTURES / "cozystack"),
        "--object",
        str(FIXTURES / "samples" / "kubernetes-default.yaml"),
    )
    assert status == 0
    # control plane 2 x (c1.medium 2/2Gi + 3 x t1.micro 500m/256Mi) = 7 cpu, 5.5Gi, 16Gi eph
    # md0: 10 x u1.medium (1 vCPU, 4Gi) = 10 cpu, 40Gi; 10 x 20Gi disks = 200Gi
    assert json.loads(out) == {
        "cpu": "17",
        "ephemeral-storage": "16Gi",
        "memory": "46592Mi",
        "storage": "200Gi",
    }


def test_evaluate_explains_each_term(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys,
        "evaluate",
        "--state",
        str(FIXTURES / "cozystack"),
        "--explain",
        "--object",
        str(FIXTURES / "samples" / "vm-u1-large.yaml"),
    )
    explained = json.loads(out)
    assert status == 0
    assert explained["charge"] == {"cpu": "2", "memory": "8Gi", "services.loadbalancers": "1"}
    assert explained["terms"][0]["source"] == "instance type u1.large"


def test_evaluate_fails_with_the_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    values = write(tmp_path, "v.json", {"nodeGroups": {"gpu": {"instanceType": "u9.huge"}}})
    status, out, err = run(
        capsys,
        "evaluate",
        "--state",
        str(FIXTURES / "cozystack"),
        "--kind",
        "Kubernetes",
        "--values",
        values,
    )
    assert status == 2
    assert out == ""
    assert 'Kubernetes: nodeGroups.gpu.instanceType: unknown instance type "u9.huge"' in err


def test_review_admits_sixteen_1gi_vms_and_denies_the_seventeenth(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # tenant-acme's memory quota is 16Gi and tenant-acme-dev-ci carves 4Gi out of it: 12 left.
    files = [
        write(
            tmp_path,
            f"{i}.json",
            review(
                "VMInstance", "tenant-acme", f"vm{i}", {"instanceType": "u1.micro"}, uid=f"u{i}"
            ),
        )
        for i in range(13)
    ]
    status, out, _ = run(capsys, "review", *STATE, *files)
    answers = responses(out)
    assert status == 0
    assert [a["allowed"] for a in answers] == [True] * 12 + [False]
    assert [a["uid"] for a in answers] == [f"u{i}" for i in range(13)]
    assert answers[-1]["status"]["message"] == (
        "exceeded tenant quota: pool tenant-acme, requested: memory=1Gi, used: memory=16Gi, "
        "limited: memory=16Gi"
    )


def test_review_charges_an_update_its_delta_and_a_dry_run_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    micro, large = {"instanceType": "u1.micro"}, {"instanceType": "u1.large"}
    files = [
        write(tmp_path, "a.json", review("VMInstance", "tenant-acme", "vm", micro)),
        write(tmp_path, "b.json", review("VMInstance", "tenant-acme", "x", large, dry_run=True)),
        write(
            tmp_path,
            "c.json",
            review("VMInstance", "tenant-acme", "vm", large, operation="UPDATE", old_spec=micro),
        ),
    ]
    status, out, _ = run(capsys, "review", *STATE, *files)
    _, dry, grown = responses(out)
    assert status == 0
    assert dry["allowed"]
    assert "dry run: nothing was reserved" in dry["warnings"]
    # 4Gi carved out by ci + 1Gi: the dry run reserved nothing, so the update starts from 5Gi.
    assert json.loads(grown["auditAnnotations"]["delta"]) == {"cpu": "1", "memory": "7Gi"}
    assert json.loads(grown["auditAnnotations"]["reserved-after"])["memory"] == "12Gi"


def test_review_charges_a_carve_out_through_an_unbounded_tenant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    quota = {"resourceQuotas": {"memory": "13Gi"}}
    body = review("Tenant", "tenant-acme-dev", "qa", quota)
    _, out, _ = run(capsys, "review", *STATE, write(tmp_path, "t.json", body))
    (answer,) = responses(out)
    assert not answer["allowed"]
    assert answer["status"]["message"].startswith(
        "exceeded tenant quota: pool tenant-acme (via tenant-acme-dev)"
    )


def test_review_denies_an_unevaluable_object_with_its_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    body = review("Postgres", "tenant-acme", "db", {"resourcesPreset": "t9.giant"})
    _, out, _ = run(capsys, "review", *STATE, write(tmp_path, "p.json", body))
    (answer,) = responses(out)
    assert answer["status"]["code"] == 422
    assert answer["status"]["details"]["causes"][0]["field"] == "spec.resourcesPreset"


def test_review_reports_a_malformed_review_and_goes_on(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    good = write(tmp_path, "good.json", review("VMInstance", "tenant-acme", "vm", {}))
    bad = write(tmp_path, "bad.json", {"kind": "AdmissionReview"})
    status, out, err = run(capsys, "review", *STATE, bad, good)
    assert status == 2
    assert "bad.json: not an AdmissionReview admission.k8s.io/v1" in err
    assert len(responses(out)) == 1


def test_report_prints_pools_as_a_table_a_wide_table_and_as_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "report", *STATE)
    assert status == 0
    header = ["POOL", "RESOURCE", "BUDGET", "RESERVED", "AVAILABLE", "OVERCOMMITTED", "MEMBERS"]
    assert out.splitlines()[0].split() == header
    # a row per pool and resource: narrow whatever keys a budget sets
    assert out.splitlines()[1].split() == ["tenant-acme", "cpu", "32", "4", "28", "-", "2"]
    assert out.splitlines()[2].split() == ["memory", "16Gi", "4Gi", "12Gi", "-"]
    status, out, _ = run(capsys, "report", "-o", "wide", *STATE)
    assert out.splitlines()[0].split() == [*header, "CARVE-OUTS"]
    assert out.splitlines()[1].split()[-2:] == ["tenant-acme,tenant-acme-dev", "tenant-acme-dev-ci"]
    status, out, _ = run(capsys, "report", "--json", *STATE)
    acme = json.loads(out)["pools"][0]
    assert acme["pool"] == "tenant-acme"
    assert acme["reserved"]["memory"] == "4Gi"
    assert acme["carveOuts"] == ["tenant-acme-dev-ci"]
    assert acme["members"] == ["tenant-acme", "tenant-acme-dev"]


def test_review_admits_sixteen_u1_micro_vms_in_16gi_and_denies_the_seventeenth(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tenants = tmp_path / "state"
    tenants.mkdir()
    (tenants / "tenant.yaml").write_text(
        "apiVersion: apps.cozystack.io/v1alpha1\nkind: Tenant\n"
        "metadata: {name: solo, namespace: tenant-root}\n"
        "spec: {resourceQuotas: {memory: 16Gi}}\n"
    )
    files = [
        write(
            tmp_path,
            f"{i}.json",
            review(
                "VMInstance", "tenant-solo", f"vm{i}", {"instanceType": "u1.micro"}, uid=f"u{i}"
            ),
        )
        for i in range(17)
    ]
    status, out, _ = run(
        capsys, "review", "--state", str(FIXTURES / "cozystack"), "--state", str(tenants), *files
    )
    answers = responses(out)
    assert status == 0
    # declared units: 1Gi per VM, whatever virt-launcher pods would request on top
    assert [a["allowed"] for a in answers] == [True] * 16 + [False]
    assert "used: memory=16Gi, limited: memory=16Gi" in answers[-1]["status"]["message"]


# -- offline paths: the namespace is the request's, a name is created once ---------------------


def test_review_refuses_a_request_without_a_namespace_and_charges_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    body = review("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.micro"})
    body["request"]["namespace"] = ""
    follow = review("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.micro"}, uid="u2")
    _, out, _ = run(
        capsys, "review", *STATE, write(tmp_path, "a.json", body), write(tmp_path, "b.json", follow)
    )
    refused, created = responses(out)
    assert not refused["allowed"]
    assert refused["status"]["code"] == 400
    assert "names no namespace" in refused["status"]["message"]
    assert created["allowed"]  # the refused one was not stored under the object's namespace


def test_review_refuses_an_object_claiming_another_namespace_in_every_mode(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    body = review("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.micro"})
    body["request"]["namespace"] = "tenant-other"
    for mode in ("enforce", "warn", "off"):
        _, out, _ = run(capsys, "review", *STATE, "--mode", mode, write(tmp_path, "a.json", body))
        (answer,) = responses(out)
        assert not answer["allowed"], mode
        assert "differs from the request's namespace 'tenant-other'" in answer["status"]["message"]


def test_a_second_create_of_an_existing_name_is_a_conflict_that_changes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    small = review("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.micro"}, uid="u1")
    big = review("VMInstance", "tenant-acme", "vm", {"instanceType": "u1.large"}, uid="u2")
    grow = review(
        "VMInstance",
        "tenant-acme",
        "other",
        {"instanceType": "u1.micro"},
        uid="u3",
    )
    files = [write(tmp_path, f"{i}.json", b) for i, b in enumerate((small, big, grow))]
    _, out, _ = run(capsys, "review", *STATE, *files)
    first, second, third = responses(out)
    assert first["allowed"]
    assert not second["allowed"]
    assert second["status"]["code"] == 409
    assert "already exists" in second["status"]["message"]
    # the pool still holds the first VM (1Gi) only: 4Gi carved out by ci + 1Gi + 1Gi
    assert json.loads(third["auditAnnotations"]["reserved-after"])["memory"] == "6Gi"


def test_review_of_100k_level_nested_json_is_a_clean_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    status, out, err = run(capsys, "review", *STATE, str(path))
    assert status == 2
    assert out == ""
    assert "nested too deeply" in err
    assert "Traceback" not in err


def test_evaluate_explains_a_volume_held_at_its_high_mark(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tests.builders import signed_marks

    spec = {"storage": "1Gi"}
    record = signed_marks(
        "VMDisk", "tenant-acme", "d", spec, {"storage": "100Gi"}, {"disk#1": "100Gi"}
    )
    disk = {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMDisk",
        "metadata": {
            "name": "d",
            "namespace": "tenant-acme",
            "annotations": {"reservation.cozystack.io/charge": record},
        },
        "spec": spec,
    }
    path = write(tmp_path, "disk.json", disk)
    state = ["--state", str(FIXTURES / "cozystack")]
    status, out, _ = run(capsys, "evaluate", *state, "--object", path, "--explain", "-o", "json")
    assert status == 0
    explained = json.loads(out)
    assert explained["charge"] == {"storage": "100Gi"}
    assert explained["evaluated"] == {"storage": "1Gi"}
    assert explained["terms"][0]["heldAt"] == "100Gi"


# -- the attacks past the budget, through `webhook review` (the validating side alone) --------

ADMIN_USER: dict[str, Any] = {"user": "ops", "groups": ["cozystack-cluster-admin"]}
OVERCOMMIT = "reservation.cozystack.io/overcommit"
CHARGE = "reservation.cozystack.io/charge"


def test_review_prices_a_shrunk_vm_disk_at_its_high_mark_and_denies_the_refill(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """tenant-acme: storage 500Gi. A 500Gi VMDisk lowered to 1Gi keeps its PVC at 500Gi."""
    big, small = {"storage": "500Gi"}, {"storage": "1Gi"}
    files = [
        write(tmp_path, "a.json", review("VMDisk", "tenant-acme", "d1", big)),
        write(
            tmp_path,
            "b.json",
            review("VMDisk", "tenant-acme", "d1", small, operation="UPDATE", old_spec=big),
        ),
        write(tmp_path, "c.json", review("VMDisk", "tenant-acme", "d2", {"storage": "499Gi"})),
    ]
    _, out, _ = run(capsys, "review", *STATE, *files)
    created, shrunk, refill = responses(out)
    assert created["allowed"]
    assert shrunk["allowed"]
    assert json.loads(shrunk["auditAnnotations"]["charge"]) == {"storage": "500Gi"}
    assert not refill["allowed"]


def test_review_never_makes_a_planted_factor_real_when_an_admin_resize_carries_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    micro, large = {"instanceType": "u1.micro"}, {"instanceType": "u1.large"}
    planted = {OVERCOMMIT: "memory=1.1"}
    files = [
        write(tmp_path, "a.json", review("VMInstance", "tenant-acme", "vm", micro)),
        write(
            tmp_path,
            "b.json",
            review(
                "VMInstance",
                "tenant-acme",
                "vm",
                large,
                operation="UPDATE",
                old_spec=micro,
                annotations=planted,
                old_annotations=planted,
                **ADMIN_USER,
            ),
        ),
    ]
    _, out, _ = run(capsys, "review", *STATE, *files)
    _, resized = responses(out)
    assert resized["allowed"]
    assert json.loads(resized["auditAnnotations"]["charge"]) == {"cpu": "2", "memory": "8Gi"}
    assert "overcommit" not in resized["auditAnnotations"]


def test_review_refuses_a_replayed_record_that_carries_a_revoked_factor(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The record an admin's factor was signed into, put back after the factor was removed."""
    from tests.builders import request as build
    from webhook.core.admission.decisions import Policy, mutate
    from webhook.core.tenancy.records import RecordKeys
    from webhook.state.manifests import load_state

    key = tmp_path / "record.key"
    key.write_text("r" * 40 + "\n")
    large = {"instanceType": "u1.large"}
    granted = review(
        "VMInstance",
        "tenant-acme",
        "vm",
        large,
        annotations={OVERCOMMIT: "memory=1.1"},
        **ADMIN_USER,
    )
    # What the mutating webhook signed for that write (it holds the same key).
    scratch = load_state(STATE[1::2], keys=RecordKeys(b"r" * 40))
    (operation,) = [
        op
        for op in mutate(
            build(
                "VMInstance",
                "tenant-acme",
                "vm",
                large,
                annotations={OVERCOMMIT: "memory=1.1"},
                **ADMIN_USER,
            ),
            scratch,
            Policy(),
        ).patch
        if "charge" in str(op["path"])
    ]
    old_record = str(operation["value"])
    granted["request"]["object"]["metadata"]["annotations"][CHARGE] = old_record
    revoked = review(
        "VMInstance",
        "tenant-acme",
        "vm",
        large,
        operation="UPDATE",
        old_spec=large,
        old_annotations={OVERCOMMIT: "memory=1.1", CHARGE: old_record},
        **ADMIN_USER,
    )
    replayed = review(
        "VMInstance",
        "tenant-acme",
        "vm",
        large,
        operation="UPDATE",
        old_spec=large,
        annotations={CHARGE: old_record},
    )
    files = [write(tmp_path, f"{i}.json", b) for i, b in enumerate([granted, revoked, replayed])]
    _, out, _ = run(capsys, "review", *STATE, "--record-key-file", str(key), *files)
    first, second, replay = responses(out)
    assert first["allowed"], first
    assert second["allowed"], second
    assert not replay["allowed"]
    assert replay["status"]["code"] == 403
    assert "only the record of this very write" in replay["status"]["message"]


def test_review_refuses_filling_a_sub_tenant_namespace_before_its_tenant_is_seen(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Sub-Tenant qa of acme was just created; no state shows it yet. Charged to acme's pool (or
    # to none), its VMs would pass qa's own budget: refused until qa is seen, in enforce mode.
    vm = {"instanceType": "u1.micro"}
    body = review("VMInstance", "tenant-acme-qa", "vm", vm)
    _, out, _ = run(capsys, "review", *STATE, write(tmp_path, "vm.json", body))
    (answer,) = responses(out)
    assert not answer["allowed"]
    assert answer["status"]["code"] == 503
    assert "tenant-acme-qa is not known yet" in answer["status"]["message"]
    known = review("VMInstance", "tenant-acme-dev", "vm", vm)
    _, out, _ = run(capsys, "review", *STATE, write(tmp_path, "known.json", known))
    assert responses(out)[0]["allowed"]


def test_report_names_a_helmrelease_labelled_with_another_requests_name_and_its_removal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """cozystack-api serves and the webhook charges VMInstance m4, stored as HelmRelease
    vm-instance-m4 labelled m0, but its DELETE answers 404: the report, as a table, as JSON and
    as the policy reports the leader writes, says which HelmRelease to delete."""
    state = ["--state", str(FIXTURES / "cozystack"), "--state", str(MISLABELLED)]
    removal = "kubectl -n tenant-test delete helmrelease vm-instance-m4"
    status, out, _ = run(capsys, "report", *state)
    assert status == 0
    assert "HelmReleases labelled with another application's name" in out
    assert removal in out
    _, out, _ = run(capsys, "report", *state, "-o", "json")
    (found,) = json.loads(out)["mislabelled"]
    assert found["application"] == "VMInstance/m4"
    assert (found["helmRelease"], found["nameLabel"]) == ("vm-instance-m4", "m0")
    _, out, _ = run(capsys, "report", *state, "-o", "openreports")
    reports = {r["metadata"]["namespace"]: r for r in yaml.safe_load_all(out)}
    results = {r["resources"][0]["name"]: r for r in reports["tenant-test"]["results"]}
    assert results["m0"]["result"] == "pass"
    assert results["m4"]["result"] == "fail"
    assert results["m4"]["rule"] == "mislabelled-release"
    assert removal in results["m4"]["message"]

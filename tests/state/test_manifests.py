"""Manifest directories: read recursively, every error names the file and where in it."""

import json
from decimal import Decimal
from pathlib import Path

import pytest

from tests.builders import FIXTURES
from webhook.admission.report import build_report, render_report
from webhook.core.base.errors import ContractError, ManifestError
from webhook.core.tenancy.applications import APPS_API_VERSION, CHARGE_ANNOTATION
from webhook.state.manifests import load_platform, load_state, read_manifests


def test_the_fixtures_hold_every_kind_and_instance_type() -> None:
    platform = load_platform([FIXTURES / "cozystack"])
    assert len(platform.kinds) == 31
    assert platform.kinds["Kubernetes"].plural == "kuberneteses"
    medium = platform.catalog.instance_type("u1.medium")
    assert medium is not None
    assert (medium.cpu, medium.memory) == (Decimal(1), Decimal(4 * 1024**3))


def test_multi_document_files_and_lists_are_unpacked(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "two.yaml").write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n"
        "apiVersion: v1\nkind: List\n"
        "items:\n- {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n"
    )
    (tmp_path / "one.json").write_text('{"apiVersion": "v1", "kind": "Namespace"}')
    sources = [m.source for m in read_manifests([tmp_path])]
    assert sources == [
        f"{tmp_path}/one.json",
        f"{tmp_path}/sub/two.yaml#0",
        f"{tmp_path}/sub/two.yaml#1 items[0]",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("a: [1, 2\n", "line 2: not YAML", id="broken-yaml"),
        pytest.param("- 1\n- 2\n", "a manifest must be a mapping", id="not-a-mapping"),
        pytest.param("kind: Namespace\n", "apiVersion: missing", id="no-api-version"),
    ],
)
def test_a_bad_manifest_names_the_file_and_why(tmp_path: Path, text: str, message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ManifestError) as caught:
        read_manifests([tmp_path])
    assert str(caught.value).startswith(str(bad))
    assert message in str(caught.value)


def test_a_broken_instance_type_names_its_field(tmp_path: Path) -> None:
    (tmp_path / "it.yaml").write_text(
        "apiVersion: instancetype.kubevirt.io/v1beta1\nkind: VirtualMachineClusterInstancetype\n"
        "metadata: {name: odd}\nspec: {cpu: {guest: 2}, memory: {guest: lots}}\n"
    )
    with pytest.raises(ManifestError, match=r'it.yaml: odd: spec.memory.guest: "lots" is not a'):
        load_platform([tmp_path])


def test_a_broken_contract_manifest_names_the_file_and_path(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        "apiVersion: reservation.cozystack.io/v1alpha1\nkind: ReservationContract\n"
        "metadata: {name: x}\nspec: {kind: X, terms: [{name: a, count: $.n, storage: 1Zi}]}\n"
    )
    with pytest.raises(ContractError, match=r"c.yaml \(x\): spec.terms\[0\].storage: "):
        load_platform([tmp_path])


def test_a_contract_manifest_replaces_the_shipped_one(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        "apiVersion: reservation.cozystack.io/v1alpha1\nkind: ReservationContract\n"
        "metadata: {name: vm-disk}\nspec: {kind: VMDisk, terms: [{name: d, storage: 1Ti}]}\n"
    )
    platform = load_platform([FIXTURES / "cozystack", tmp_path])
    assert platform.charge("VMDisk", {}).as_strings() == {"storage": "1Ti"}


def test_a_preset_configmap_replaces_the_table(tmp_path: Path) -> None:
    (tmp_path / "presets.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: reservation-resource-presets}\n"
        "data:\n  presets.yaml: |\n    presets:\n      t1.nano: {cpu: '1', memory: 1Gi}\n"
    )
    platform = load_platform([FIXTURES / "cozystack", tmp_path])
    assert platform.catalog.preset("t1.nano").resources == {"cpu": 1, "memory": 1024**3}  # type: ignore[union-attr]
    assert platform.catalog.preset("t1.micro") is None


def test_a_missing_directory_is_an_error() -> None:
    with pytest.raises(ManifestError, match="no such file or directory"):
        read_manifests(["/nonexistent/state"])


def test_applications_load_in_both_forms() -> None:
    current = load_state([FIXTURES / "cozystack", FIXTURES / "tenants"])
    namespaces = [pool.namespace for pool in current.tree.pools()]
    assert namespaces == ["tenant-acme", "tenant-acme-dev-ci"]
    assert current.tree.get("tenant-root") is not None


def nested(depth: int) -> object:
    value: object = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def write_app(directory: Path, spec: object, annotations: object = None) -> None:
    metadata: dict[str, object] = {"name": "bad", "namespace": "tenant-acme"}
    if annotations is not None:
        metadata["annotations"] = annotations
    body = {"apiVersion": APPS_API_VERSION, "kind": "VMDisk", "metadata": metadata, "spec": spec}
    (directory / "bad.json").write_text(json.dumps(body))


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"storage": "9" * 60 + ".5"}, id="sixty-digit-storage"),
        pytest.param({"storage": "1e" + "0" * 4301}, id="exponent-of-4301-digits"),
        pytest.param({"storage": "1Gi", "x": nested(500)}, id="values-nested-500-deep"),
    ],
)
def test_one_poisoned_application_is_recorded_unknown_and_reported_first(
    tmp_path: Path, spec: object
) -> None:
    write_app(tmp_path, spec)
    state = load_state([FIXTURES / "cozystack", FIXTURES / "tenants", tmp_path])
    assert ("VMDisk", "tenant-acme", "bad") in state.unknown()
    report = build_report(state)
    assert next(iter(report)) == "unknown"
    lines = render_report(report).splitlines()
    assert lines[0].startswith("Unknown reservations")
    assert lines[1].startswith("  tenant-acme VMDisk/bad: ")


@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param(
            {CHARGE_ANNOTATION: '{"charge":{"storage":"1e' + "0" * 4301 + '"},"digest":"x"}'},
            id="annotation-of-4301-digits",
        ),
        pytest.param({CHARGE_ANNOTATION: "[" * 100_000}, id="annotation-nested-100k-deep"),
        pytest.param(["not", "a", "map"], id="annotations-that-are-a-list"),
    ],
)
def test_an_unreadable_charge_annotation_is_not_believed_and_the_spec_is_charged(
    tmp_path: Path, annotations: object
) -> None:
    write_app(tmp_path, {"storage": "3Gi"}, annotations)
    state = load_state([FIXTURES / "cozystack", FIXTURES / "tenants", tmp_path])
    record = state.record(("VMDisk", "tenant-acme", "bad"))
    assert record is not None
    assert record.resources == {"storage": Decimal(3 * 1024**3)}


def test_a_platform_manifest_whose_kind_is_escaped_is_still_read_before_pricing(
    tmp_path: Path,
) -> None:
    # "\x54" is "T": the file's text never names the instance type group or kind literally.
    (tmp_path / "apps.yaml").write_text(
        "apiVersion: apps.cozystack.io/v1alpha1\nkind: VMInstance\n"
        "metadata: {name: vm, namespace: tenant-acme}\nspec: {instanceType: huge}\n---\n"
        'apiVersion: "ins\\x74ancetype.kubevirt.io/v1beta1"\n'
        'kind: "VirtualMachineClusterInstance\\x74ype"\n'
        "metadata: {name: huge}\nspec: {cpu: {guest: 8}, memory: {guest: 64Gi}}\n"
    )
    state = load_state([FIXTURES / "cozystack", tmp_path])
    record = state.record(("VMInstance", "tenant-acme", "vm"))
    assert record is not None
    assert record.resources["memory"] == 64 * 1024**3


def test_applications_in_files_without_platform_manifests_are_priced_against_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "a-apps.yaml").write_text(
        "apiVersion: apps.cozystack.io/v1alpha1\nkind: VMInstance\n"
        "metadata: {name: vm, namespace: tenant-acme}\nspec: {instanceType: mine}\n"
    )
    (tmp_path / "z-types.yaml").write_text(  # read after the application, by name order
        "apiVersion: instancetype.kubevirt.io/v1beta1\nkind: VirtualMachineClusterInstancetype\n"
        "metadata: {name: mine}\nspec: {cpu: {guest: 2}, memory: {guest: 3Gi}}\n"
    )
    state = load_state([FIXTURES / "cozystack", tmp_path])
    record = state.record(("VMInstance", "tenant-acme", "vm"))
    assert record is not None
    assert record.resources["memory"] == 3 * 1024**3


def test_a_second_object_of_the_same_name_fails_the_load_naming_both_files(
    tmp_path: Path,
) -> None:
    for name in ("a.json", "b.json"):
        manifest = {
            "apiVersion": APPS_API_VERSION,
            "kind": "VMDisk",
            "metadata": {"name": "disk", "namespace": "tenant-acme"},
            "spec": {"storage": "1Gi" if name == "a.json" else "100Gi"},
        }
        (tmp_path / name).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError) as raised:
        load_state([FIXTURES / "cozystack", tmp_path])
    assert raised.value.source == f"{tmp_path}/b.json"
    assert f"VMDisk tenant-acme/disk is already defined in {tmp_path}/a.json" in str(raised.value)


def test_a_helmrelease_labelled_with_another_requests_name_loads_as_it_is_served() -> None:
    """``vm-instance-m4`` labelled ``m0`` beside the real ``m0`` (as cozystack-api stored them
    under concurrent creates): read by its label it was a second ``m0`` and the load failed;
    it is VMInstance ``m4``, as cozystack-api serves it, charged, and noted for removal."""
    current = load_state([FIXTURES / "cozystack", FIXTURES / "samples" / "mislabelled"])
    m0, m4 = ("VMInstance", "tenant-test", "m0"), ("VMInstance", "tenant-test", "m4")
    assert current.record(m0) is not None
    assert current.record(m4) is not None
    pool = current.tree.get("tenant-test")
    assert pool is not None
    assert pool.usage["memory"] == 2 * 1024**3
    noted = {key: (found.release, found.label) for key, found in current.mislabelled().items()}
    assert noted == {m4: ("vm-instance-m4", "m0")}
    current.forget(m4)  # its HelmRelease removed: nothing left to name
    assert current.mislabelled() == {}

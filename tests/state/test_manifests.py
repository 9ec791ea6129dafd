"""Manifest directories: read recursively, every error names the file and where in it."""

from decimal import Decimal
from pathlib import Path

import pytest

from tests.builders import FIXTURES
from webhook.core.errors import ContractError, ManifestError
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

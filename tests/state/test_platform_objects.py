"""What the live state keeps of each platform object, and the platform it builds from them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from webhook.state.platform_objects import (
    STORES,
    build_platform,
    reduce_definition,
    reduce_instance_type,
    uid_of,
)

ROOT = Path(__file__).resolve().parent.parent.parent
BUCKET: dict[str, Any] = yaml.safe_load(
    (ROOT / "fixtures" / "cozystack" / "applicationdefinitions" / "bucket.yaml").read_text()
)


def stores(**held: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    objects: dict[str, dict[str, dict[str, Any]]] = {store: {} for store in STORES}
    for store, items in held.items():
        objects[store.replace("_", "-")] = {uid_of(obj): obj for obj in items}
    return objects


def test_a_definition_is_reduced_to_what_charges_depend_on() -> None:
    relabelled = copy.deepcopy(BUCKET)
    relabelled["metadata"]["labels"] = {"team": "storage"}
    relabelled["spec"]["dashboard"] = {"category": "anything at all"}
    relabelled["spec"]["release"]["chartRef"] = {"name": "another-chart"}
    assert reduce_definition(relabelled) == reduce_definition(BUCKET)
    assert reduce_definition(BUCKET)["spec"]["release"] == {"prefix": "bucket-"}
    assert set(reduce_definition(BUCKET)["spec"]) == {"application", "release"}


def test_an_instance_type_keeps_only_guest_sizes_and_gpu_names() -> None:
    shaped = {
        "apiVersion": "instancetype.kubevirt.io/v1beta1",
        "kind": "VirtualMachineClusterInstancetype",
        "metadata": {"name": "u1.micro", "labels": {"x": "y"}},
        "spec": {
            "cpu": {"guest": 1, "model": "host-passthrough"},
            "memory": {"guest": "1Gi", "hugepages": {"pageSize": "2Mi"}},
            "gpus": [{"name": "gpu1", "deviceName": "nvidia.com/A100"}],
        },
    }
    assert reduce_instance_type(shaped)["spec"] == {
        "cpu": {"guest": 1},
        "memory": {"guest": "1Gi"},
        "gpus": [{"deviceName": "nvidia.com/A100"}],
    }


def test_a_definition_that_breaks_keeps_its_last_good_version_until_it_is_deleted() -> None:
    good = reduce_definition(BUCKET)
    last_good: dict[tuple[str, str], dict[str, Any]] = {}
    platform, inputs = build_platform(stores(definitions=[good]), last_good)
    assert platform.kind("Bucket") is not None
    assert platform.problems == ()

    broken = copy.deepcopy(good)
    del broken["spec"]["application"]["plural"]
    platform, again = build_platform(stores(definitions=[broken]), last_good)
    assert platform.kind("Bucket") is not None  # the last good version stands in
    assert again == inputs  # same content: nothing to re-price
    assert len(platform.problems) == 1
    assert "its last good version is kept" in platform.problems[0]

    platform, _ = build_platform(stores(), last_good)  # deleted
    assert platform.kind("Bucket") is None
    assert last_good == {}
    platform, _ = build_platform(stores(definitions=[broken]), last_good)
    assert platform.kind("Bucket") is None  # no last good version to fall back on any more
    assert "left out" in platform.problems[0]

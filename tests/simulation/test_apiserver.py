"""The simulated API server keeps the real one's storage rules."""

from __future__ import annotations

import pytest

from tests.simulation.apiserver import SimAPI
from webhook.kube.client import ApiError


def app(name: str, spec: dict[str, str]) -> dict[str, object]:
    return {"kind": "Thing", "metadata": {"name": name, "namespace": "tenant-a"}, "spec": spec}


def test_every_write_takes_the_next_resource_version_and_is_logged_in_order() -> None:
    api = SimAPI({"things"}, lambda _: None)
    first = api.create("things", app("x", {"memory": "1Gi"}))
    second = api.create("things", app("y", {"memory": "1Gi"}))
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    assert [event for _, event, _ in api.logs["things"]] == ["ADDED", "ADDED"]


def test_an_update_on_a_stale_resource_version_conflicts() -> None:
    api = SimAPI({"things"}, lambda _: None)
    stored = api.create("things", app("x", {"memory": "1Gi"}))
    api.replace("things", {**stored, "spec": {"memory": "2Gi"}})
    with pytest.raises(ApiError) as raised:
        api.replace("things", {**stored, "spec": {"memory": "3Gi"}})
    assert raised.value.status == 409


def test_a_create_of_an_existing_name_is_already_exists() -> None:
    api = SimAPI({"things"}, lambda _: None)
    api.create("things", app("x", {"memory": "1Gi"}))
    with pytest.raises(ApiError) as raised:
        api.create("things", app("x", {"memory": "2Gi"}))
    assert (raised.value.status, raised.value.reason) == (409, "AlreadyExists")


def test_a_watch_resumes_after_the_resource_version_it_was_given() -> None:
    api = SimAPI({"things"}, lambda _: None)
    first = api.create("things", app("x", {"memory": "1Gi"}))
    api.create("things", app("y", {"memory": "1Gi"}))
    stream = api.open("r1", "things", first["metadata"]["resourceVersion"])
    assert api.pending(stream) == 1

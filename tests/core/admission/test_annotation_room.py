"""The charge record never takes an object's annotations past the 256 KiB Kubernetes stores.

The API server checks the size of all annotations after the mutating webhooks: a patch that
took them past it had the tenant's write refused as ``metadata.annotations: Too long``, for
annotations the tenant had kept within the limit (``tests/test_kubernetes_limits.py`` shows it
through the real API server). The property: the mutating side either answers a patch that
leaves the annotations within the limit, or denies, naming the bytes to remove.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import request, state
from webhook.core.admission.annotation_room import (
    ANNOTATIONS_LIMIT_BYTES,
    annotation_bytes,
    beyond_annotation_limit,
)
from webhook.core.admission.decisions import Policy, mutate
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, USER_PREFIX

VM = {"instanceType": "u1.micro"}
CURRENT = state({"tenant-acme": {"memory": "64Gi"}})


def patched(obj: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The annotations once the answer's patch is applied."""
    notes = dict(obj["metadata"].get("annotations") or {})
    for operation in json.loads(base64.b64decode(body["patch"])) if "patch" in body else []:
        if operation["path"] == "/metadata/annotations":
            notes = dict(operation["value"])
        else:
            key = operation["path"].rsplit("/", 1)[1].replace("~1", "/").replace("~0", "~")
            if operation["op"] == "remove":
                notes.pop(key, None)
            else:
                notes[key] = operation["value"]
    return notes


def released(notes: Mapping[str, Any]) -> int:
    """The annotations' bytes on the HelmRelease cozystack-api stores, each key prefixed."""
    return annotation_bytes({USER_PREFIX + key: value for key, value in notes.items()})


def filled(total: int, text: str = "x") -> dict[str, str]:
    """Annotations taking exactly ``total`` bytes, of one character ``text`` repeated."""
    notes: dict[str, str] = {}
    index = 0
    width = len(text.encode())
    while total > 0:
        key = f"n{index}"
        room = min(total, 4_000) - len(key)
        notes[key] = text * (room // width) + "y" * (room % width)
        total -= len(key) + annotation_bytes({"": notes[key]})
        index += 1
    return notes


@settings(max_examples=60, deadline=None)
@given(
    short=st.integers(min_value=0, max_value=3_000),
    text=st.sampled_from(["x", "é", "€", "😀"]),
)
def test_a_vm_whose_annotations_come_within_the_record_of_the_limit_is_denied_or_fits(
    short: int, text: str
) -> None:
    notes = filled(ANNOTATIONS_LIMIT_BYTES - short, text)
    assert annotation_bytes(notes) == ANNOTATIONS_LIMIT_BYTES - short
    review = request("VMInstance", "tenant-acme", "vm", VM, annotations=notes)
    decision = mutate(review, CURRENT, Policy())
    body = decision.response()
    bare = request("VMInstance", "tenant-acme", "vm", VM)  # the same record, room to spare
    after = {**notes, **patched(bare.object or {}, mutate(bare, CURRENT, Policy()).response())}
    if decision.allowed:
        assert after == patched(review.object or {}, body)
        assert CHARGE_ANNOTATION in after
        assert annotation_bytes(after) <= ANNOTATIONS_LIMIT_BYTES
        # ... and on the HelmRelease, unless cozystack-api refuses it for the tenant's own.
        assert (
            released(notes) > ANNOTATIONS_LIMIT_BYTES or released(after) <= ANNOTATIONS_LIMIT_BYTES
        )
    else:
        assert body["status"]["code"] == 422
        assert "patch" not in body
        message = body["status"]["message"]
        plain, release = annotation_bytes(after), released(after)
        if plain > ANNOTATIONS_LIMIT_BYTES:  # past Kubernetes' limit on the object itself
            assert f"they take {ANNOTATIONS_LIMIT_BYTES - short} bytes" in message, message
            assert f"remove at least {plain - ANNOTATIONS_LIMIT_BYTES} bytes" in message
        else:  # past it on the HelmRelease only
            assert "HelmRelease" in message, message
            assert f"remove at least {release - ANNOTATIONS_LIMIT_BYTES} bytes" in message


def test_a_vm_whose_annotations_are_already_past_the_limit_is_left_to_the_api_server() -> None:
    notes = filled(ANNOTATIONS_LIMIT_BYTES + 1)
    review = request("VMInstance", "tenant-acme", "vm", VM, annotations=notes)
    decision = mutate(review, CURRENT, Policy())
    assert decision.allowed  # the API server refuses it for what the tenant wrote


def test_a_record_replacing_a_longer_one_is_measured_by_what_it_leaves() -> None:
    obj = {"metadata": {"annotations": {**filled(ANNOTATIONS_LIMIT_BYTES - 100), "a": "z" * 99}}}
    operations = [{"op": "add", "path": "/metadata/annotations/a", "value": "z" * 50}]
    assert beyond_annotation_limit(obj, operations) is None
    grown = [{"op": "add", "path": "/metadata/annotations/a~1b", "value": "z" * 100}]
    denied = beyond_annotation_limit(obj, grown)
    assert denied is not None
    assert "remove at least 103 bytes" in denied.message


def test_in_warn_mode_a_vm_without_room_for_the_record_is_stored_without_it_and_warned() -> None:
    # warn blocks nothing: the write goes on as the tenant wrote it, told what enforce answers.
    notes = filled(ANNOTATIONS_LIMIT_BYTES - 10)
    review = request("VMInstance", "tenant-acme", "vm", VM, annotations=notes)
    decision = mutate(review, CURRENT, Policy(mode="warn"))
    assert decision.allowed
    assert decision.outcome == "warned"
    (warning,) = decision.warnings
    assert warning.startswith("would be denied: tenant reservations: the charge record")
    assert patched(review.object or {}, decision.response()) == notes  # no record written
    assert not mutate(review, CURRENT, Policy()).allowed  # what enforce answers


def test_a_record_past_the_limit_on_its_own_asks_for_shorter_item_names_not_fewer_notes() -> None:
    obj = {"metadata": {"annotations": {"note": "x"}}}
    operations = [{"op": "add", "path": "/metadata/annotations/r", "value": "m" * 300_000}]
    denied = beyond_annotation_limit(obj, operations)
    assert denied is not None
    assert "remove at least" not in denied.message
    assert "shorten the names of the values' items" in denied.message

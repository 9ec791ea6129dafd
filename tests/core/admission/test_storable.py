"""A write etcd could not store is denied before anything is held, and nothing else is.

Through the real API server (``tests/test_kubernetes_limits.py``) such a create was admitted
twice, once more when kube-apiserver retried it without managedFields, and held twice.
"""

from __future__ import annotations

import json

import pytest

from tests.builders import request, state
from webhook.admission.admit import Admission
from webhook.core.admission.decisions import Policy
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.storable import unstorable
from webhook.core.base.json_codec import encode_json
from webhook.core.base.kube_limits import ETCD_MAX_REQUEST_BYTES


def sized(total: int, *, dry_run: bool = False) -> AdmissionRequest:
    """A VMInstance review whose object takes exactly ``total`` bytes as compact JSON."""
    empty = request("VMInstance", "tenant-acme", "vm", {"cloudInit": ""}, dry_run=dry_run)
    assert empty.object is not None
    padding = total - len(encode_json(empty.object))
    spec = {"cloudInit": "x" * padding}
    return request("VMInstance", "tenant-acme", "vm", spec, dry_run=dry_run)


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_vm_one_byte_past_what_etcd_stores_is_denied_naming_both_sizes(dry_run: bool) -> None:
    at_limit = sized(ETCD_MAX_REQUEST_BYTES, dry_run=dry_run)
    assert unstorable(at_limit) is None
    past = unstorable(sized(ETCD_MAX_REQUEST_BYTES + 1, dry_run=dry_run))
    assert past is not None
    assert not past.allowed
    assert past.code == 413
    assert f"takes {ETCD_MAX_REQUEST_BYTES + 1} bytes" in past.message
    assert f"more than the {ETCD_MAX_REQUEST_BYTES}" in past.message


async def test_a_vm_too_large_to_store_reserves_nothing_and_the_pool_stays_whole() -> None:
    current = state({"tenant-acme": {"memory": "1Gi"}})
    admission = Admission(current, Policy())
    big = request(
        "VMInstance", "tenant-acme", "big", {"instanceType": "u1.micro", "cloudInit": "x" * 2**21}
    )
    denied = await admission.validate(big)
    assert not denied.allowed
    assert denied.kind == "VMInstance"
    small = request("VMInstance", "tenant-acme", "small", {"instanceType": "u1.micro"})
    assert (await admission.validate(small)).allowed  # the 1Gi pool held nothing for it


async def test_in_off_mode_a_vm_too_large_to_store_is_left_to_the_api_server() -> None:
    admission = Admission(state({"tenant-acme": {"memory": "1Gi"}}), Policy(mode="off"))
    big = request("VMInstance", "tenant-acme", "big", {"cloudInit": "x" * 2**21})
    assert (await admission.validate(big)).allowed


def test_the_api_server_never_writes_an_object_shorter_than_it_is_measured() -> None:
    # What Go's encoder writes longer: "<", ">" and "&" escaped, exponents signed and padded.
    value = {"a": "<&>", "b": 1.5e-7, "c": 1e21, "d": "ü"}
    go_like = '{"a":"\\u003c\\u0026\\u003e","b":1.5e-07,"c":1e+21,"d":"ü"}'
    assert json.loads(go_like) == value
    assert len(encode_json(value)) <= len(go_like.encode())


async def test_in_warn_mode_a_vm_too_large_to_store_is_allowed_warned_and_holds_nothing() -> None:
    admission = Admission(state({"tenant-acme": {"memory": "1Gi"}}), Policy(mode="warn"))
    big = request(
        "VMInstance", "tenant-acme", "big", {"instanceType": "u1.micro", "cloudInit": "x" * 2**21}
    )
    warned = await admission.validate(big)
    assert warned.allowed  # warn blocks nothing: the API server refuses it for its size
    assert warned.outcome == "warned"
    assert warned.warnings[0].startswith("would be denied: tenant reservations: this VMInstance")
    small = request("VMInstance", "tenant-acme", "small", {"instanceType": "u1.micro"})
    fits = await admission.validate(small)
    assert fits.allowed
    assert fits.outcome == "allowed"  # not "warned": the pool counted nothing for the big one

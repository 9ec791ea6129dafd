"""Attacks on reusing a decision's price at commit (``decisions.decide_again``).

A request is priced once before it queues; at commit the price is reused while nothing it read
has changed. A tenant that can change what the price read between the two (its stored object
deleted and created again under the same name, a dry run's record stored, a record signed with
a key since retired, an ancestor's overcommit factor) must never get the old price: whatever
happens in between, deciding again must answer exactly what deciding afresh answers.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from decimal import Decimal
from functools import cache
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import FIXTURES, KEYS, THING_DEFINITION, tenant
from tests.builders import request as build_request
from webhook.core.admission.carveouts import Cap
from webhook.core.admission.decisions import Policy, decide, decide_again, decide_prepared
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.pricing.platform import Platform, PlatformBuilder
from webhook.core.tenancy.applications import Application
from webhook.core.tenancy.record_keys import RecordKeys
from webhook.core.tenancy.records import parse_recorded_charge, record_annotation, sign
from webhook.defaults import default_contracts, default_presets
from webhook.state.manifests import read_manifests

POOL = "tenant-acme"
RETIRED = RecordKeys(b"tests-retired-key-0123456789abcdef")
# A kind whose storage is persistent volumes the operator deletes with the unit: its charge is
# held at the volumes' high mark, which its record keeps.
DISK_DEFINITION = copy.deepcopy(THING_DEFINITION)
DISK_DEFINITION["metadata"]["name"] = "disk"
DISK_DEFINITION["spec"]["application"] = {"kind": "Disk", "plural": "disks", "openAPISchema": "{}"}
DISK_DEFINITION["spec"]["reservation"]["terms"] = [
    {"name": "unit", "size": {"resources": {"memory": {"path": "$.memory", "default": 0}}}},
    {
        "name": "disk",
        "volume": "released",
        "size": {"resources": {"storage": {"path": "$.storage", "default": 0}}},
    },
]


@cache
def _platform() -> Platform:
    builder = PlatformBuilder(default_contracts(), default_presets())
    for manifest in read_manifests([FIXTURES / "cozystack"]):
        builder.add(manifest.body, source=manifest.source)
    builder.add(THING_DEFINITION, source="tests/builders.py")
    builder.add(DISK_DEFINITION, source=__file__)
    built = builder.build()
    assert built.kind("Disk") is not None, built.problems
    return built


def _state() -> ReservationState:
    state = ReservationState(_platform(), keys=KEYS)
    state.observe(tenant(POOL, {"memory": "8Gi", "storage": "8Gi"}))
    return state


def _disk(name: str, memory: str, storage: str = "1Gi") -> Application:
    return Application("Disk", POOL, name, {"memory": memory, "storage": storage})


GI = Decimal(1024**3)


def _tenant_at(budget: str, factor: str | None = None) -> Application:
    spec = {"resourceQuotas": {"memory": budget, "storage": "8Gi"}}
    app = Application("Tenant", "tenant-root", "acme", spec)
    if factor is None:
        return app
    values = ReservationState(_platform(), keys=KEYS).values_digest("Tenant", spec)
    record = sign(KEYS, app.key, values, {}, "sha256:t", own={"memory": Decimal(factor)})
    return dataclasses.replace(app, recorded=parse_recorded_charge(record_annotation(record)))


def _signed(app: Application, keys: RecordKeys = KEYS, **extra: Any) -> Application:
    values = ReservationState(_platform(), keys=keys).values_digest(app.kind, app.spec)
    charge = _platform().charge(app.kind, app.spec, namespace=POOL)
    record = sign(keys, app.key, values, charge.resources, charge.digest, **extra)
    return dataclasses.replace(app, recorded=parse_recorded_charge(record_annotation(record)))


X = ("Disk", POOL, "x")
MARKS = {"disk": 6 * GI}

Step = Callable[[ReservationState], None]


def _recreate(state: ReservationState, app: Application) -> None:
    """The stored object deleted and another created under its name (a new uid)."""
    state.forget(app.key)
    state.observe(app)


STEPS: dict[str, Step] = {
    "other application observed": lambda s: s.observe(_disk("y", "3Gi")),
    "other application deleted": lambda s: s.forget(("Disk", POOL, "y")),
    "own object deleted": lambda s: s.forget(X),
    "own object deleted and created again under its name": lambda s: _recreate(
        s, _disk("x", "1Gi")
    ),
    "own object created again with a volume high mark": lambda s: _recreate(
        s, _signed(_disk("x", "1Gi"), marks=MARKS)
    ),
    "own object stored bigger": lambda s: s.observe(_disk("x", "5Gi")),
    "own object stored unevaluable": lambda s: s.observe(_disk("x", "lots")),
    "own object stored with a signed record": lambda s: s.observe(_signed(_disk("x", "1Gi"))),
    "own object stored with a volume high mark": lambda s: s.observe(
        _signed(_disk("x", "1Gi"), marks=MARKS)
    ),
    "own object stored with a dry run's record": lambda s: s.observe(
        _signed(_disk("x", "1Gi"), marks=MARKS, dry=True)
    ),
    "own object stored with a retired key's high mark": lambda s: s.observe(
        _signed(_disk("x", "1Gi"), RETIRED, marks=MARKS)
    ),
    "own object stored with its own factor": lambda s: s.observe(
        _signed(_disk("x", "1Gi"), own={"memory": Decimal(2)})
    ),
    "unknown object stored in the pool": lambda s: s.observe(_disk("z", "lots")),
    "record keys rotated, the old one retired": lambda s: setattr(
        s, "keys", RecordKeys(b"tests-rotated-key-0123456789abcdef", retired=(KEYS.current,))
    ),
    "record keys retiring the marks' key": lambda s: setattr(
        s, "keys", RecordKeys(KEYS.current, retired=(RETIRED.current,))
    ),
    "ancestor factor set": lambda s: s.observe(_tenant_at("8Gi", "2")),
    "ancestor factor withdrawn": lambda s: s.observe(_tenant_at("8Gi")),
    "tenant budget cut": lambda s: s.observe(_tenant_at("2Gi")),
    "tenant deleted": lambda s: s.forget(("Tenant", "tenant-root", "acme")),
    "carve-out cap listed": lambda s: s.set_caps(
        "tenant-root", {POOL: Cap("sha256:none", {"memory": 8 * GI}, {"memory": GI})}
    ),
    "platform rebuilt without the kind": lambda s: setattr(
        s, "platform", dataclasses.replace(s.platform, kinds={})
    ),
    "state out of sync": lambda s: setattr(s, "synced", False),
}


STORED: dict[str, Callable[[], Application] | None] = {
    "absent": None,
    "plain": lambda: _disk("x", "1Gi"),
    "unknown": lambda: _disk("x", "lots"),
    "with a volume high mark": lambda: _signed(_disk("x", "1Gi"), marks=MARKS),
    "with its own factor": lambda: _signed(_disk("x", "1Gi"), own={"memory": Decimal(2)}),
}


def _update(new: dict[str, str], old: dict[str, str], **more: Any) -> AdmissionRequest:
    return build_request("Disk", POOL, "x", new, operation="UPDATE", old_spec=old, **more)


REQUESTS: dict[str, Callable[[], AdmissionRequest]] = {
    "create": lambda: build_request("Disk", POOL, "x", {"memory": "2Gi", "storage": "1Gi"}),
    "grow": lambda: _update(
        {"memory": "4Gi", "storage": "1Gi"}, {"memory": "1Gi", "storage": "1Gi"}
    ),
    "grow volume": lambda: _update(
        {"memory": "1Gi", "storage": "2Gi"}, {"memory": "1Gi", "storage": "1Gi"}
    ),
    "dry-run grow": lambda: _update(
        {"memory": "3Gi", "storage": "1Gi"}, {"memory": "1Gi", "storage": "1Gi"}, dry_run=True
    ),
}


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(REQUESTS)),
    st.sampled_from(sorted(STORED)),
    st.lists(st.sampled_from(sorted(STEPS)), max_size=4),
    st.booleans(),
    st.booleans(),
)
def test_whatever_a_tenant_changes_between_pricing_and_commit_the_commit_decides_as_afresh(
    written: str, stored: str, steps: list[str], warn: bool, factored: bool
) -> None:
    state = _state()
    if factored:  # the pool's Tenant overcommits memory 2x: its deletion re-prices beneath it
        state.observe(_tenant_at("8Gi", "2"))
    state.observe(_disk("y", "1Gi"))
    make = STORED[stored]
    if make is not None:
        state.observe(make())
    policy = Policy(mode="warn" if warn else "enforce")
    request = REQUESTS[written]()
    prepared = decide_prepared(request, state, policy).prepared
    for step in steps:
        STEPS[step](state)
    assert decide_again(request, state, policy, prepared) == decide(request, state, policy)

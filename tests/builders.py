"""Tiny builders for states, applications and admission requests, shared by the tests."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from webhook.core.admission.reviews import AdmissionRequest, parse_review
from webhook.core.admission.state import ReservationState
from webhook.core.pricing.platform import Platform, PlatformBuilder
from webhook.core.tenancy.applications import Application
from webhook.core.tenancy.records import (
    RecordedCharge,
    RecordKeys,
    parse_recorded_charge,
    record_annotation,
    sign,
)
from webhook.defaults import default_contracts, default_presets
from webhook.state.manifests import read_manifests

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

# A test-only kind that reserves exactly the cpu, memory and storage its spec names.
THING_DEFINITION: dict[str, Any] = {
    "apiVersion": "cozystack.io/v1alpha1",
    "kind": "ApplicationDefinition",
    "metadata": {"name": "thing"},
    "spec": {
        "application": {"kind": "Thing", "plural": "things", "openAPISchema": "{}"},
        "reservation": {
            "terms": [
                {
                    "name": "thing",
                    "size": {
                        "resources": {
                            key: {"path": f"$.{key}", "default": 0}
                            for key in ("cpu", "memory", "storage")
                        }
                    },
                }
            ]
        },
    },
}


@cache
def platform() -> Platform:
    """The real Cozystack platform from fixtures/cozystack, plus the test kind ``Thing``."""
    builder = PlatformBuilder(default_contracts(), default_presets())
    for manifest in read_manifests([FIXTURES / "cozystack"]):
        builder.add(manifest.body, source=manifest.source)
    builder.add(THING_DEFINITION, source="tests/builders.py")
    return builder.build()


def tenant(owned: str, budget: Mapping[str, str] | None = None) -> Application:
    """The Tenant application that owns namespace ``owned``."""
    parent, _, name = owned.rpartition("-")
    if parent == "tenant":
        parent = "tenant-root"
    spec = {"resourceQuotas": dict(budget)} if budget else {}
    return Application("Tenant", parent, name, spec)


def thing(namespace: str, name: str = "thing", **resources: str) -> Application:
    return Application("Thing", namespace, name, dict(resources))


def state(
    tenants: Mapping[str, Mapping[str, str] | None],
    *apps: Application,
) -> ReservationState:
    """A synced state with these tenants (owned namespace -> budget) and applications."""
    result = ReservationState(platform(), keys=KEYS)
    for owned, budget in tenants.items():
        result.observe(tenant(owned, budget))
    for app in apps:
        result.observe(app)
    return result


# A platform administrator, as Cozystack's Keycloak group maps one.
ADMIN: dict[str, Any] = {
    "user": "ops",
    "groups": ["cozystack-cluster-admin", "system:authenticated"],
}
# The record key of every state the tests build: tests sign records as the webhook would.
KEYS = RecordKeys(b"tests-record-key-0123456789abcdef")


def signed(
    kind: str,
    namespace: str,
    name: str,
    spec: Any,
    charge: Mapping[str, Any],
    digest: str,
    *,
    factor: Mapping[str, Any] | None = None,
    keys: RecordKeys = KEYS,
) -> str:
    """The charge annotation the webhook would write (signed with ``keys``) for these values."""
    from decimal import Decimal

    from webhook.core.base.quantities import parse_quantity

    values = ReservationState(platform(), keys=keys).values_digest(kind, spec)
    resources = {k: v if isinstance(v, Decimal) else parse_quantity(v) for k, v in charge.items()}
    factors = {k: Decimal(str(v)) for k, v in (factor or {}).items()}
    record = sign(keys, (kind, namespace, name), values, resources, digest, factors)
    return record_annotation(record)


def signed_marks(
    kind: str,
    namespace: str,
    name: str,
    spec: Any,
    charge: Mapping[str, str],
    marks: Mapping[str, str],
    *,
    keys: RecordKeys = KEYS,
) -> str:
    """A record carrying volume high marks, as the webhook writes one after a shrink."""
    from webhook.core.base.quantities import parse_quantity

    values = ReservationState(platform(), keys=keys).values_digest(kind, spec)
    resources = {k: parse_quantity(v) for k, v in charge.items()}
    held = {k: parse_quantity(v) for k, v in marks.items()}
    record = sign(keys, (kind, namespace, name), values, resources, "sha256:x", marks=held)
    return record_annotation(record)


def signed_record(
    kind: str, namespace: str, name: str, spec: Any, charge: Mapping[str, Any], digest: str
) -> RecordedCharge:
    """The record :func:`signed` writes, as the state reads it back."""
    record = parse_recorded_charge(signed(kind, namespace, name, spec, charge, digest))
    assert record is not None
    return record


def review(
    kind: str,
    namespace: str,
    name: str,
    spec: Any,
    *,
    operation: str = "CREATE",
    old_spec: Any = None,
    dry_run: bool = False,
    annotations: Mapping[str, str] | None = None,
    old_annotations: Mapping[str, str] | None = None,
    uid: str = "uid-1",
    user: str = "alice",
    groups: list[str] | None = None,
) -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` AdmissionReview for an apps.cozystack.io application."""

    def body(spec_value: Any, notes: Mapping[str, str] | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if notes:
            metadata["annotations"] = dict(notes)
        return {
            "apiVersion": "apps.cozystack.io/v1alpha1",
            "kind": kind,
            "metadata": metadata,
            "spec": spec_value,
        }

    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": kind},
        "resource": {
            "group": "apps.cozystack.io",
            "version": "v1alpha1",
            "resource": kind.lower() + "s",
        },
        "namespace": namespace,
        "name": name,
        "operation": operation,
        "userInfo": {"username": user, "groups": groups or ["system:authenticated"]},
        "dryRun": dry_run,
        "object": None if operation == "DELETE" else body(spec, annotations),
        "oldObject": body(old_spec, old_annotations) if operation != "CREATE" else None,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def request(*args: Any, **kwargs: Any) -> AdmissionRequest:
    return parse_review(review(*args, **kwargs))


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server started in another process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

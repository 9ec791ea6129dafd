"""Rebuilding what a write did (RFC 7386 merge patches, as the API server applies them), and
which writes the webhook must have decided."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.builders import platform
from webhook.core.admission.state import ReservationState
from webhook.core.audit.events import AuditWrite
from webhook.core.audit.history import History, merge_patch

scalars = st.one_of(st.booleans(), st.integers(), st.text(max_size=5))
documents = st.recursive(
    scalars,
    lambda children: st.dictionaries(st.sampled_from("abcde"), children, max_size=4),
    max_leaves=12,
)
patches = st.recursive(
    st.one_of(scalars, st.none()),
    lambda children: st.dictionaries(st.sampled_from("abcde"), children, max_size=4),
    max_leaves=12,
)


@given(documents, patches)
def test_a_merge_patch_leaves_its_target_untouched(target: Any, patch: Any) -> None:
    before = copy.deepcopy(target)
    merge_patch(target, patch)
    assert target == before


@given(documents, patches)
def test_applying_a_merge_patch_twice_is_applying_it_once(target: Any, patch: Any) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once


def test_null_removes_and_objects_merge() -> None:
    old = {"spec": {"replicas": 2, "size": "10Gi", "version": "v17"}}
    patch = {"spec": {"replicas": 3, "size": "15Gi", "version": None}}
    assert merge_patch(old, patch) == {"spec": {"replicas": 3, "size": "15Gi"}}


def _update(spec: dict[str, Any]) -> AuditWrite:
    stored = {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "Postgres",
        "metadata": {"name": "db", "namespace": "tenant-acme"},
        "spec": spec,
    }
    return AuditWrite(
        audit_id="a1",
        time=datetime(2026, 1, 1, tzinfo=UTC),
        timestamp="2026-01-01T00:00:00Z",
        verb="update",
        namespace="tenant-acme",
        resource="postgreses",
        name="db",
        kind="Postgres",
        user="alice",
        code=200,
        message="",
        dry_run=False,
        level="RequestResponse",
        rbac_forbidden=False,
        webhook={},
        mutated=None,
        mutation_patch=None,
        response_object=stored,
    )


def test_a_bypass_writing_true_over_a_stored_1_is_not_taken_for_a_label_only_update() -> None:
    past = History(ReservationState(platform()))
    past.objects[("Postgres", "tenant-acme", "db")] = _update({"replicas": 1}).response_object
    assert past.reaches_webhook(_update({"replicas": True}))  # decided, so a bypass without one
    assert not past.reaches_webhook(_update({"replicas": 1}))  # the stored spec: not decided

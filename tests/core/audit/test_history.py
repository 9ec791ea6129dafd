"""Rebuilding what a PATCH did: RFC 7386 merge patches, as the API server applies them."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from webhook.core.audit.history import merge_patch

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

"""What the live state holds of each application: a stored spec nested past what the JSON
encoder recurses (admitted in warn or off, where the values bound only warns) is held as an
application that cannot be evaluated, never raised out of the list that carries it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.builders import state
from webhook.core.base.errors import EvaluationError
from webhook.core.pricing.bounds import check_values
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.state.held_applications import held_application, held_from_object, holds_same


def nested(levels: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"instanceType": "u1.micro"}
    for _ in range(levels - 1):
        spec = {"x": spec}
    return spec


def test_a_spec_nested_1000_levels_is_held_unevaluable_rather_than_stopping_the_list() -> None:
    # A list page carrying it would raise RecursionError out of the reflector, which then
    # stops for good: the kind, listed before, is never synced again and every write of every
    # tenant is refused "state not synced".
    annotations = {"reservation.cozystack.io/charge": '{"charge":{},"digest":""}'}
    obj = {
        "metadata": {"name": "deep", "namespace": "tenant-acme", "annotations": annotations},
        "spec": nested(1000),
    }
    reduced = held_from_object("VMInstance", obj)
    assert reduced is not None
    (namespace, name), held = reduced
    assert (namespace, name) == ("tenant-acme", "deep")
    assert held[1] == annotations["reservation.cozystack.io/charge"]  # the record is kept
    app = held_application("VMInstance", namespace, name, held)
    with pytest.raises(EvaluationError, match="nest deeper than 64 levels"):
        check_values(app.spec)
    live = state({"tenant-acme": {"memory": "2Gi"}})
    live.observe(app)  # held, unevaluable: counted as unknown, nothing raised
    assert ("VMInstance", "tenant-acme", "deep") in set(live.unknown())


def test_a_spec_the_encoder_writes_is_held_as_it_is() -> None:
    obj = {"metadata": {"name": "vm", "namespace": "tenant-acme"}, "spec": nested(100)}
    reduced = held_from_object("VMInstance", obj)
    assert reduced is not None
    assert held_application("VMInstance", "tenant-acme", "vm", reduced[1]).spec == nested(100)


# -- telling an unchanged object without reducing it again ---------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=20,
)
NOTES = st.none() | st.sampled_from(["", "a", "b", '{"charge":{}}'])


def stored(spec: Any, note: str | None, version: int = 7) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "vm", "namespace": "tenant-acme"}
    metadata["resourceVersion"] = str(version)
    if note is not None:
        metadata["annotations"] = {CHARGE_ANNOTATION: note}
    return {"metadata": metadata, "spec": spec}


@settings(max_examples=400, deadline=None)
@given(first=JSON_VALUES, second=JSON_VALUES, notes=st.tuples(NOTES, NOTES))
def test_an_object_is_told_unchanged_only_when_what_is_held_of_it_is_the_same(
    first: Any, second: Any, notes: tuple[str | None, str | None]
) -> None:
    held = held_from_object("VMInstance", stored(first, notes[0]))
    again = held_from_object("VMInstance", stored(second, notes[1], version=8))
    assert held is not None
    assert again is not None
    if holds_same(held[1], stored(second, notes[1], version=8)):
        assert again[1][:2] == held[1][:2]


@settings(max_examples=200, deadline=None)
@given(spec=JSON_VALUES, note=NOTES)
def test_an_ascii_spec_of_strings_and_small_integers_is_told_unchanged(
    spec: Any, note: str | None
) -> None:
    text = json.dumps(spec)
    assume(text.isascii() and "." not in text and "e" not in text.lower() and "\\u" not in text)
    assume(all(abs(int(n)) < 2**63 for n in re.findall(r"-?\d{15,}", text)))
    held = held_from_object("VMInstance", stored(spec, note))
    assert held is not None
    assert holds_same(held[1], stored(spec, note, version=9))


def test_a_label_is_unchanged_and_a_spec_or_charge_annotation_is_not() -> None:
    spec = {"instanceType": "u1.micro", "disks": [{"name": "a"}]}
    held = held_from_object("VMInstance", stored(spec, "x"))
    assert held is not None
    labelled = stored(spec, "x")
    labelled["metadata"]["labels"] = {"storm": "1"}
    assert holds_same(held[1], labelled)
    assert not holds_same(held[1], stored({**spec, "instanceType": "u1.small"}, "x"))
    assert not holds_same(held[1], stored(spec, "y"))
    assert not holds_same(held[1], stored(spec, None))
    # Where the encoders differ (the canonical text escapes it as \\u00e9), the answer is no:
    # the object is reduced as before, at its old cost.
    accented = held_from_object("VMInstance", stored({**spec, "name": "é"}, "x"))
    assert accented is not None
    assert not holds_same(accented[1], stored({**spec, "name": "é"}, "x"))

"""What the live state holds of each application: a stored spec nested past what the JSON
encoder recurses (admitted in warn or off, where the values bound only warns) is held as an
application that cannot be evaluated, never raised out of the list that carries it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import state
from webhook.core.base.errors import EvaluationError
from webhook.core.pricing.bounds import check_values
from webhook.state.held_applications import held_application, held_from_object


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

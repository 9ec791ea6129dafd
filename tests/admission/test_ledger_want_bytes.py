"""A refusal's want (``status.wanted``) at its widest on a ledger full at every other bound.

The attack: a tenant whose pool's budget has 64 keys of the longest names fills the pool's
ledger (entries, caps, summary, slices at their bounds) and then sends a request refused for
the room other replicas' slices hold: the refusing replica writes a want of every budget key.
Counted in no part of ``MAX_OBJECT_BYTES``, the want let the whole pass the object bound, and
every later write of the pool (every tenant's in it) was refused before it was sent, for as
long as the want lasted. It has a bound of its own now, within the sum.
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from webhook.admission.ledger.bounds import (
    MAX_CAPS_BYTES,
    MAX_OBJECT_BYTES,
    MAX_PENDING_BYTES,
    MAX_SLICES_BYTES,
    MAX_SUMMARY_BYTES,
    MAX_WANT_BYTES,
)
from webhook.admission.ledger.wants import want_json
from webhook.core.base.json_codec import encode_json
from webhook.core.base.quantities import MAX_QUANTITY
from webhook.core.tenancy.counts import MAX_BUDGET_KEYS, MAX_KEY_CHARS

REST = 40_960  # metadata and the removal counts by kind, as the bounds' sum counts them


def widest_want() -> int:
    """The bytes ``"wanted": {...},`` takes for a want of every key of the widest budget, each
    at the largest quantity Kubernetes holds."""
    room = {
        f"{index:02d}{'k' * (MAX_KEY_CHARS - 2)}": Decimal(MAX_QUANTITY)
        for index in range(MAX_BUDGET_KEYS)
    }
    return len(encode_json({"wanted": want_json(room, time.time())}))


def test_the_widest_want_is_bounded_by_the_budget_it_is_masked_to() -> None:
    # A want is the refused request's increase masked to the pool's budget (Ledger), so its
    # keys are at most the budget's: about 22 KB, not unbounded.
    assert 20_000 < widest_want() <= MAX_WANT_BYTES


def test_a_want_of_the_widest_budget_on_a_ledger_full_at_every_bound_fits_the_object_bound() -> (
    None
):
    parts = MAX_PENDING_BYTES + MAX_CAPS_BYTES + MAX_SUMMARY_BYTES + MAX_SLICES_BYTES + REST
    assert parts + MAX_WANT_BYTES <= MAX_OBJECT_BYTES
    assert widest_want() <= MAX_WANT_BYTES


async def test_a_want_past_its_byte_bound_is_not_asked_and_the_answer_is_exceeded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bound holds by construction (a want's keys are the budget's); should it not, the
    # want is not written: no write of the pool past its share, and no promise of room.
    from tests.admission.test_ledger import POOL, Clock, create
    from tests.admission.test_ledger_escrow import held_by_a
    from webhook.admission.ledger import bounds

    clock = Clock()
    cluster, _, b = await held_by_a(clock)
    monkeypatch.setattr(bounds, "MAX_WANT_BYTES", 40)
    before = cluster.written.get(POOL, 0)
    refused = await b.admit(create("big", "2Gi"))
    assert (refused.allowed, refused.reason) == (False, "exceeded"), refused.message
    assert cluster.written.get(POOL, 0) == before, "no want written"
    assert "wanted" not in (cluster.objects[POOL].get("status") or {})

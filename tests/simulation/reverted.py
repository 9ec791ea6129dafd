"""The settle rule the ledger must not use, put back on purpose to show the simulation finds it.

The ledger settles a pending entry only on an observation of the application *newer* than the
admission that wrote it (issue 9, item 4): a copy of the object that merely shows the expected
figures may predate the admission, and settling on it forgets an increase that is still coming.
:func:`reverted_settle_rule` puts back the old rule, "a value that matches settles", by making
every observation count as newer than every admission, in both places a settle is decided:
:meth:`PendingCharges.settle` (an observation arriving) and ``ReservationState._shows`` (an
entry arriving that the state may already show).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from webhook.core.admission.pending import Hold, PendingCharges
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import AppKey


@contextlib.contextmanager
def reverted_settle_rule(enabled: bool = True) -> Iterator[None]:
    """Within the block, a stale copy that shows the expected figures settles an entry."""
    if not enabled:
        yield
        return
    settle = PendingCharges.settle
    shows = getattr(ReservationState, "_shows")  # noqa: B009

    def settle_on_any_copy(
        self: PendingCharges, key: AppKey, charge: Mapping[str, Decimal] | None, version: int
    ) -> Any:
        return settle(self, key, charge, sys.maxsize)

    def shows_on_any_copy(self: ReservationState, hold: Hold) -> Any:
        return shows(self, dataclasses.replace(hold, after=-1))

    PendingCharges.settle = settle_on_any_copy  # type: ignore[method-assign]
    setattr(ReservationState, "_shows", shows_on_any_copy)  # noqa: B010
    try:
        yield
    finally:
        PendingCharges.settle = settle  # type: ignore[method-assign]
        setattr(ReservationState, "_shows", shows)  # noqa: B010

"""Rules the ledger must not use, put back on purpose to show the simulation finds them.

The ledger settles a pending entry only on an observation of the application *newer* than the
admission that wrote it (issue 9, item 4): a copy of the object that merely shows the expected
figures may predate the admission, and settling on it forgets an increase that is still coming.
:func:`reverted_settle_rule` puts back the old rule, "a value that matches settles", by making
every observation count as newer than every admission, in both places a settle is decided:
:meth:`PendingCharges.settle` (an observation arriving) and ``ReservationState._shows`` (an
entry arriving that the state may already show).

:func:`reverted_stale_write_rule` puts back "an update replaces its oldObject": an update that
changes nothing the reservation reads is skipped unheld, and a decrease frees room as soon as it
is observed (no floor is kept for the writes of the application that may still be stored).

:func:`reverted_grace_rule` puts back the old grace period, twice the webhook timeout plus 5 s
(25 s): shorter than the 60 s within which kube-apiserver may still store a request the webhook
admitted, so an entry dropped unobserved can be followed by its write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from webhook.core.admission import decisions
from webhook.core.admission.answers import Decision, skipped
from webhook.core.admission.floors import Floors
from webhook.core.admission.modes import Mode
from webhook.core.admission.pending import Hold, PendingCharges
from webhook.core.admission.resolve import unchanged
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import AppKey


@contextlib.contextmanager
def reverted_grace_rule(enabled: bool = True) -> Iterator[None]:
    """Within the block, new replicas drop an unobserved entry after 25 s."""
    from tests.simulation import replica

    if not enabled:
        yield
        return
    shipped = replica.GRACE_SECONDS
    replica.GRACE_SECONDS = 25.0
    try:
        yield
    finally:
        replica.GRACE_SECONDS = shipped


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


@contextlib.contextmanager
def reverted_stale_write_rule(enabled: bool = True) -> Iterator[None]:
    """Within the block, an update is taken to replace its oldObject (the rule before
    "any admitted write may become the stored version")."""
    if not enabled:
        yield
        return
    screen: Callable[[AdmissionRequest, ReservationState, Mode], Decision | None]
    screen = getattr(decisions, "screen")  # noqa: B009
    refloor = Floors.refloor
    floor = Floors.floor

    def screen_skipping_unchanged(
        request: AdmissionRequest, state: ReservationState, mode: Mode
    ) -> Decision | None:
        early = screen(request, state, mode)
        if early is None and unchanged(request):
            return skipped("nothing the reservation reads changed", mode=mode, kind=request.kind)
        return early

    def no_floor(self: Floors, key: AppKey) -> Mapping[str, Decimal]:
        return {}

    def no_refloor(self: Floors, key: AppKey) -> bool:
        return False

    setattr(decisions, "screen", screen_skipping_unchanged)  # noqa: B010
    Floors.floor = no_floor  # type: ignore[method-assign]
    Floors.refloor = no_refloor  # type: ignore[method-assign]
    try:
        yield
    finally:
        setattr(decisions, "screen", screen)  # noqa: B010
        Floors.floor = floor  # type: ignore[method-assign]
        Floors.refloor = refloor  # type: ignore[method-assign]

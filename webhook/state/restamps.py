"""Events that change nothing the state reads: a new version, applied without pricing again.

Labels, status and most metadata are not what a reservation reads, and the webhooks' own
``matchConditions`` let a write that changes only them through undecided, so a tenant can
patch a label of one heavy application as often as the API server lets it. Every replica
then receives each event whole; reducing it as a new object (the spec encoded canonically,
decoded and priced again: some 30 ms for a spec of 28,000 keys) would spend the shared loop
on one tenant's labels. An event whose spec and charge annotation are exactly what is held
(:func:`~webhook.state.held_applications.holds_same`, about 1 ms there) only moves the held
version on and settles what that version settles
(:meth:`~webhook.core.admission.state.ReservationState.restamp`). Part of :class:`LiveState`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from webhook.state.consistent_reads import version_of
from webhook.state.held_applications import Held, held_application, holds_same

if TYPE_CHECKING:
    from webhook.core.admission.state import ReservationState
    from webhook.core.tenancy.applications import AppKey

__all__ = ["Restamps"]

Obj = dict[str, Any]


class Restamps:
    """Unchanged events of :class:`~webhook.state.live.LiveState` (a mixin)."""

    state: ReservationState
    _held: dict[str, dict[tuple[str, str], Held]]
    _dirty: set[AppKey] | None
    # Events applied as a new version only, since start: what a label storm costs shows here.
    unchanged_events: int = 0

    def restamped(self, kind: str, obj: Obj) -> bool:
        """Whether ``obj`` (an ADDED or MODIFIED event's) was taken care of as carrying nothing
        new but its version: applied as such, or ignored as older than what is held."""
        found = version_of(obj)
        if found is None:
            return False
        (namespace, name), version = found
        held_now = self._held.get(kind, {})
        held = held_now.get((namespace, name))
        if held is None or not holds_same(held, obj):
            return False
        if version < held[2]:
            return True  # older than what is held (a repair ran ahead): ignored, as before
        fresh = (held[0], held[1], version)
        held_now[(namespace, name)] = fresh
        key = (kind, namespace, name)
        if self._dirty is not None:
            self._dirty.add(key)
        state = self.state
        if state.platform.kind(kind) is not None and not state.restamp(key, version):
            state.observe(held_application(kind, namespace, name, fresh))
        self.unchanged_events += 1
        return True

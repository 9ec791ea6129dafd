"""Readiness kept as an answer, dropped the moment anything it was read from changes.

Every admission asks whether the state may be trusted and whether its kind can be decided, at
least twice; walking every reflector (the platform's four and one per application kind, over
thirty on Cozystack) each time spends the event loop on an answer that changes only when a
list or a watch does. So the walk is made once and its answer kept until something it read
changes: any assignment to a reflector's ``listed``, ``watching``, ``list_error``,
``first_sync_seconds`` or ``last_activity`` (made by the reflector's own code: a 410 and
relist, a failed list, a 404, a dropped watch, an event) drops it, as do a kind's watch
started or stopped and the first sync. The only change with no assignment is time: a watch
silent past its read timeout stops being synced. For that the answer also keeps, per read
timeout and clock, the synced reflector heard from longest ago, the first of them to go
silent; once it is no longer synced the answer is walked again. A reflector that stops being
synced is therefore seen by the very next request: readiness fails closed at once, never on a
timer. (Clocks are monotonic, so a reflector unsynced by silence stays so until it hears
something, which is an assignment.)

One assignment keeps the answer: a reflector that hears something (an event: its
``last_activity`` moves forward) while it is synced, and is not among the answer's sentinels,
stays synced, and does not become the first to go silent; nothing the answer says changes.
Without that, every event of a busy kind would drop the answer and the next request walk again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from webhook.kube.reflector import Reflector

__all__ = [
    "Readiness",
    "WatchedReflector",
    "first_to_go_silent",
    "patience_ends",
    "relisting_long",
    "relisting_since",
    "why_not_synced",
]

# What of a reflector readiness reads (with the clock, through :attr:`Reflector.synced`).
READ: frozenset[str] = frozenset(
    {"listed", "watching", "list_error", "first_sync_seconds", "last_activity", "listing_since"}
)


class WatchedReflector(Reflector):
    """A :class:`Reflector` that calls ``changed`` whenever something readiness reads of it
    is assigned (but news while it is synced and not a sentinel of the ``kept`` answer)."""

    _changed: Callable[[], None]
    _kept: Callable[[], Readiness | None]

    def __init__(
        self,
        *args: Any,
        changed: Callable[[], None],
        kept: Callable[[], Readiness | None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        object.__setattr__(self, "_changed", changed)
        object.__setattr__(self, "_kept", kept)
        super().__init__(*args, **kwargs)

    def __setattr__(self, name: str, value: object) -> None:
        quiet = name == "last_activity" and self._news_keeps_answer(value)
        object.__setattr__(self, name, value)
        if name in READ and not quiet:
            self._changed()

    def _news_keeps_answer(self, heard: object) -> bool:
        """Whether hearing something at ``heard`` leaves the kept answer true: synced before
        (so after: heard later), and not the sentinel whose silence ends the answer."""
        kept = self._kept()
        if kept is None or any(self is sentinel for sentinel in kept.sentinels):
            return False
        try:
            return isinstance(heard, int | float) and heard >= self.last_activity and self.synced
        except AttributeError:  # still being built: nothing is kept of it
            return False


@dataclass(frozen=True)
class Readiness:
    """One walk's answer: whether the reflectors let the state be trusted (the required
    checks and the platform's first build aside, asked every time), why each unavailable
    kind is, and the reflectors whose silence ends it first."""

    reflectors_synced: bool
    unavailable: dict[str, str]
    sentinels: tuple[Reflector, ...]
    # (clock, instant): the answer ends once a clock reaches its instant (a relist running
    # past its patience then excuses its kind, which only time changes).
    until: tuple[tuple[Callable[[], float], float], ...] = ()

    def current(self) -> bool:
        """Whether this answer still holds (asked while no assignment has dropped it)."""
        return all(s.synced for s in self.sentinels) and all(
            clock() < instant for clock, instant in self.until
        )


def first_to_go_silent(reflectors: Iterable[Reflector]) -> tuple[Reflector, ...]:
    """Of the synced reflectors, per read timeout and clock, the one heard from longest ago:
    while it is synced so are the others (``now - last < timeout`` holds for every later
    ``last`` once it holds for the earliest)."""
    first: dict[tuple[float, Callable[[], float]], Reflector] = {}
    for reflector in reflectors:
        if not reflector.synced:
            continue
        key = (reflector.read_timeout, reflector.clock)
        kept = first.get(key)
        if kept is None or reflector.last_activity < kept.last_activity:
            first[key] = reflector
    return tuple(first.values())


def relisting_since(reflector: Reflector) -> float | None:
    """When ``reflector``, synced before, began listing again (None: it is not)."""
    if reflector.synced or reflector.first_sync_seconds is None:
        return None
    return reflector.listing_since


def patience_ends(
    reflectors: Iterable[Reflector], patience: float
) -> tuple[tuple[Callable[[], float], float], ...]:
    """When each relisting reflector's ``patience`` ends, by its clock: a kept answer ends
    then, as the kind is excused from then on."""
    return tuple(
        (reflector.clock, since + patience)
        for reflector in reflectors
        if (since := relisting_since(reflector)) is not None
    )


def relisting_long(reflector: Reflector, patience: float) -> float:
    """For how long ``reflector`` has been listing again, once that is past ``patience`` (a
    request's deadline; 0: not). A list used to end, or fail, within it; cozystack-api's
    whole-kind list, streamed, may run for minutes (a tenant's fat applications make it
    longer), and past that only its own kind waits, as a kind that cannot be listed does."""
    since = relisting_since(reflector)
    if since is None:
        return 0.0
    running = reflector.clock() - since
    return running if running >= patience else 0.0


def why_not_synced(reflector: Reflector) -> str:
    """Why ``reflector`` is not synced, in readiness's words."""
    if reflector.list_error:
        return f"cannot be listed ({reflector.list_error}); retrying with backoff"
    if not reflector.listed:
        return "not listed yet"
    if reflector.last_error:
        return f"watch not live ({reflector.last_error})"
    return "watch silent past its read timeout"

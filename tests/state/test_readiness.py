"""Readiness kept between changes answers exactly as walking every reflector does, at every
step of any sequence of what reflectors go through (lists failing and succeeding, 410 relists,
watches dropped and reopened, silence past the read timeout, kinds coming and going), and a
reflector that stops being synced is seen by the very next request."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.pricing.platform import Platform
from webhook.core.tenancy.tenants import TENANT_KIND
from webhook.kube.client import KubeClient
from webhook.kube.reflector import Reflector
from webhook.state.live import LiveSettings, LiveState

READ_TIMEOUT = 1.0
KINDS = (("tenants", TENANT_KIND), ("buckets", "Bucket"), ("vminstances", "VMInstance"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def live_state(clock: Clock) -> LiveState:
    client = cast(KubeClient, object())  # never asked: no reflector runs here
    return LiveState(client, LiveSettings(read_timeout=READ_TIMEOUT), clock=clock)


def platform_of(plurals: tuple[str, ...]) -> Platform:
    kinds = {kind: SimpleNamespace(plural=plural, kind=kind) for plural, kind in KINDS}
    wanted = {kind: k for kind, k in kinds.items() if k.plural in plurals}
    return cast(Platform, SimpleNamespace(kinds=wanted))


def walked_synced(live: LiveState) -> bool:
    """Readiness as it was asked before it was kept: every reflector walked."""
    if live.platform_generation == 0:
        return False
    if not all(r.synced for r in live._platform_reflectors):
        return False
    if not all(check() for check in live.required.values()):
        return False
    for watch in live._apps.values():
        reflector = watch.reflector
        if reflector.synced:
            continue
        if watch.kind == TENANT_KIND:
            return False
        if reflector.list_error:
            continue
        if not (live._first_synced and reflector.first_sync_seconds is None):
            return False
    return True


def walked_unavailable(live: LiveState, kind: str) -> str:
    for watch in live._apps.values():
        if watch.kind != kind or watch.reflector.synced:
            continue
        reflector = watch.reflector
        if reflector.list_error:
            return f"cannot be listed ({reflector.list_error})"
        if reflector.first_sync_seconds is None and live._first_synced:
            return "not listed yet"
    return ""


def synced_reflector(reflector: Reflector) -> None:
    """What a reflector's run does on a good list and an opened watch."""
    reflector.listed = True
    reflector.list_error = ""
    reflector.last_activity = reflector.clock()
    reflector.watching = True
    if reflector.first_sync_seconds is None:
        reflector.first_sync_seconds = 0.5


# One step of what reflectors go through, as their own code assigns it.
STEPS = st.one_of(
    st.tuples(st.just("list"), st.integers(0, 20)),  # a good list and a watch opened
    st.tuples(st.just("relist"), st.integers(0, 20)),  # 410: listed again from scratch
    st.tuples(st.just("list-error"), st.integers(0, 20)),  # a list failed (404, 403, ...)
    st.tuples(st.just("watch-error"), st.integers(0, 20)),  # a watch broke
    st.tuples(st.just("event"), st.integers(0, 20)),  # an event or bookmark heard
    st.tuples(st.just("tick"), st.sampled_from((0.0, 0.25, 0.5, 1.0, 2.0))),
    st.tuples(st.just("kinds"), st.sets(st.sampled_from([p for p, _ in KINDS]))),
    st.tuples(st.just("add-kinds"), st.sets(st.sampled_from([p for p, _ in KINDS]))),
    st.tuples(st.just("drop-kind"), st.integers(0, 20)),  # its definition deleted
    st.tuples(st.just("all-listed"), st.none()),  # every reflector synced
    st.tuples(st.just("generation"), st.integers(0, 2)),
    st.tuples(st.just("required"), st.booleans()),
    st.tuples(st.just("first-sync"), st.none()),
)


def step(live: LiveState, clock: Clock, required: list[bool], move: tuple[str, Any]) -> None:
    what, arg = move
    reflectors = [*live._platform_reflectors, *(w.reflector for w in live._apps.values())]
    reflector = reflectors[arg % len(reflectors)] if isinstance(arg, int) else None
    if what == "list" and reflector is not None:
        synced_reflector(reflector)
    elif what == "relist" and reflector is not None:
        reflector.listed = False
    elif what == "list-error" and reflector is not None:
        reflector.watching = False
        if not reflector.listed:
            reflector.list_error = f"GET /apis/x/{arg}: 404 NotFound"
        else:
            reflector.listed = False
    elif what == "watch-error" and reflector is not None:
        reflector.watching = False
    elif what == "event" and reflector is not None:
        reflector.last_activity = clock()
    elif what == "tick":
        clock.now += arg
    elif what in ("kinds", "add-kinds"):
        live._sync_app_watches(platform_of(tuple(arg)), stop=what == "kinds")
    elif what == "drop-kind" and live._apps:
        plurals = sorted(live._apps)
        plurals.remove(plurals[arg % len(plurals)])
        live._sync_app_watches(platform_of(tuple(plurals)))
    elif what == "all-listed":
        for each in reflectors:
            synced_reflector(each)
    elif what == "generation":
        live.platform_generation += arg
    elif what == "required":
        required[0] = arg
    elif what == "first-sync":
        with mock.patch("webhook.state.live.settle_memory"):
            live._note_first_sync()


@settings(max_examples=800, deadline=None)
@given(st.lists(STEPS, max_size=60))
def test_kept_readiness_equals_walking_every_reflector_at_every_step(
    steps: list[tuple[str, Any]],
) -> None:
    async def scenario() -> None:
        clock = Clock()
        live = live_state(clock)
        required = [True]
        live.required["ledger"] = lambda: required[0]
        try:
            check_every_step(live, clock, required, steps)
        finally:
            for watch in live._apps.values():
                watch.task.cancel()

    asyncio.run(scenario())


def check_every_step(
    live: LiveState, clock: Clock, required: list[bool], steps: list[tuple[str, Any]]
) -> None:
    for move in steps:
        step(live, clock, required, move)
        # Asked twice, as an admission does: the second answer is the kept one.
        for _ in range(2):
            assert live.synced == walked_synced(live), move
            assert live.state.synced == walked_synced(live), move
            for _, kind in KINDS:
                assert live.kind_unavailable(kind) == walked_unavailable(live, kind), move
            expected = {
                w.kind: walked_unavailable(live, w.kind)
                for w in live._apps.values()
                if walked_unavailable(live, w.kind)
            }
            assert live.unavailable_kinds() == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 8), min_size=7, max_size=7),
    st.lists(st.integers(0, 4), max_size=12),
)
def test_kept_readiness_ends_when_the_first_watch_goes_silent_not_the_last(
    heard: list[int], ticks: list[int]
) -> None:
    """Every reflector synced, each last heard from at its own time: as the clock runs, the
    kept answer turns when the walk's does, whichever reflector goes silent first."""

    async def scenario() -> None:
        clock = Clock()
        live = await synced_live(clock, ("tenants", "buckets", "vminstances"))
        try:
            reflectors = [*live._platform_reflectors, *(w.reflector for w in live._apps.values())]
            start = clock() + 1.0
            clock.now = start + 0.875  # every one heard from within its read timeout
            for reflector, at in zip(reflectors, heard, strict=True):
                reflector.last_activity = start + at * 0.125
            assert live.state.synced
            for tick in ticks:
                assert live.state.synced == walked_synced(live)
                clock.now += tick * 0.125
                assert live.state.synced == walked_synced(live), (clock.now, heard)
                for _, kind in KINDS:
                    assert live.kind_unavailable(kind) == walked_unavailable(live, kind)
        finally:
            for watch in live._apps.values():
                watch.task.cancel()

    asyncio.run(scenario())


async def synced_live(clock: Clock, plurals: tuple[str, ...] = ("tenants", "buckets")) -> LiveState:
    """A live state synced on a platform of these kinds, its readiness asked (kept)."""
    live = live_state(clock)
    live.platform_generation = 1
    live._sync_app_watches(platform_of(plurals))
    for reflector in [*live._platform_reflectors, *(w.reflector for w in live._apps.values())]:
        synced_reflector(reflector)
    with mock.patch("webhook.state.live.settle_memory"):
        live._note_first_sync()
    assert live.state.synced
    assert live.state.kind_unavailable("Bucket") == ""
    return live


def app_reflector(live: LiveState, plural: str) -> Reflector:
    return live._apps[plural].reflector


async def test_a_kind_that_stops_listing_is_refused_on_the_next_request_not_later() -> None:
    clock = Clock()
    live = await synced_live(clock)
    buckets = app_reflector(live, "buckets")
    # The watch gets 410 Gone, and the relist is refused (the kind is no longer served): the
    # reflector's own code assigns these, and nothing else happens before the next request.
    buckets.listed = False
    buckets.watching = False
    buckets.list_error = "GET /apis/apps.cozystack.io/v1alpha1/buckets: 404 NotFound"
    assert live.state.kind_unavailable("Bucket").startswith("cannot be listed")
    assert live.state.synced  # that kind only
    for watch in live._apps.values():
        watch.task.cancel()


async def test_a_relisting_kind_stops_admission_on_the_next_request_not_later() -> None:
    clock = Clock()
    live = await synced_live(clock)
    app_reflector(live, "buckets").listed = False  # 410: listing again, its state stale
    assert not live.state.synced
    app_reflector(live, "buckets").listed = True
    assert live.state.synced
    app_reflector(live, "tenants").watching = False  # the tenants' watch broke
    assert not live.state.synced
    for watch in live._apps.values():
        watch.task.cancel()


async def test_a_watch_silent_past_its_read_timeout_stops_admission_with_no_event() -> None:
    clock = Clock()
    live = await synced_live(clock)
    for reflector in [*live._platform_reflectors, *(w.reflector for w in live._apps.values())]:
        clock.now += 0.1
        reflector.last_activity = clock()  # each heard from, the first one longest ago
    clock.now += READ_TIMEOUT - 0.5
    assert live.state.synced
    clock.now += 0.5  # the first one heard from is now silent past its read timeout
    assert not live.state.synced
    for watch in live._apps.values():
        watch.task.cancel()


async def test_a_tenants_stream_of_events_does_not_walk_every_reflector_per_event() -> None:
    """Each object a tenant creates is an event on its kind's watch: heard while that watch is
    synced (and not the first to go silent), the kept answer stays, and requests between
    events ask it in constant time; the sentinel's own news still drops it."""
    clock = Clock()
    live = await synced_live(clock, ("tenants", "buckets", "vminstances"))
    try:
        reflectors = [*live._platform_reflectors, *(w.reflector for w in live._apps.values())]
        tenants = app_reflector(live, "tenants")
        for index, reflector in enumerate(reflectors):
            reflector.last_activity = clock() + (index + 1) * 0.01
        tenants.last_activity = clock()  # the tenants' watch: heard from longest ago
        clock.now += 0.1
        assert live.state.synced
        vms = app_reflector(live, "vminstances")
        walks = 0
        walk = live._walk_readiness

        def counted() -> Any:
            nonlocal walks
            walks += 1
            return walk()

        with mock.patch.object(live, "_walk_readiness", counted):
            for _ in range(200):
                clock.now += 0.001
                vms.last_activity = clock()  # an event of the busy kind
                assert live.state.synced
                assert live.state.kind_unavailable("VMInstance") == ""
            assert walks == 0
            assert live._readiness_now().sentinels == (tenants,)
            tenants.last_activity = clock()  # the oldest heard again: another is now oldest
            assert live.state.synced
            assert walks == 1
            assert live._readiness_now().sentinels != (tenants,)
        oldest = min(reflectors, key=lambda r: r.last_activity)
        clock.now = oldest.last_activity + READ_TIMEOUT + 0.001  # it alone has gone silent
        assert not walked_synced(live)
        assert not live.state.synced  # fails closed on the very next request
    finally:
        for watch in live._apps.values():
            watch.task.cancel()

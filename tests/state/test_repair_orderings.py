"""Whatever a tenant does to one name (creates, changes, deletes, creates again), whichever of
those events the watch loses or delivers late, and whatever a repair's GET answers (current, or
older than the read, as cozystack-api's cache can be, or overtaken by the watch while in
flight), once the watch has delivered what it did not lose, a consistent read and its repairs
leave the state holding exactly what is stored: never an object hidden for good (a budget
bypass), and nothing a read still finds lost (a kind kept unconfirmed); and a watch that lost
nothing never leaves a read unproven, whatever the tenant wrote after it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.state.live import APPS_GROUP, APPS_VERSION, AppWatch, LiveSettings, LiveState

KIND, PLURAL = "VMInstance", "vminstances"
KEY = ("tenant-acme", "vm")
Obj = dict[str, Any]


def stored(version: int, size: int) -> Obj:
    metadata = {"namespace": KEY[0], "name": KEY[1], "resourceVersion": str(version)}
    return {"metadata": metadata, "spec": {"size": size}}


@dataclass
class Name:
    """The stored history of one name: what it is after each revision (``None``: absent)."""

    history: list[Obj | None] = field(default_factory=lambda: [None])
    events: list[tuple[str, Obj]] = field(default_factory=list)  # the watch's, in order

    @property
    def revision(self) -> int:
        return len(self.history) - 1

    def at(self, revision: int) -> Obj | None:
        return self.history[revision]

    def write(self, delete: bool) -> None:
        now, version = self.history[-1], len(self.history)
        if delete and now is not None:
            self.history.append(None)
            self.events.append(("DELETED", {**now, "metadata": stored(version, 0)["metadata"]}))
        else:
            written = stored(version, version)
            self.history.append(written)
            self.events.append(("MODIFIED" if now is not None else "ADDED", written))


class Client:
    """Answers a repair's GET at a revision the test chooses, after letting the watch deliver
    what the test says it delivered while the GET was in flight."""

    def __init__(self) -> None:
        self.answer: Any = None

    async def request(self, method: str, path: str, **_: Any) -> Obj:
        assert method == "GET", method
        assert path.endswith(f"/{PLURAL}/{KEY[1]}"), path
        return cast(Obj, self.answer())


def live_watch(client: Client) -> tuple[LiveState, AppWatch]:
    live = LiveState(cast(KubeClient, client), LiveSettings())
    reflector = live._app_reflector(ResourceRef(APPS_GROUP, APPS_VERSION, PLURAL), KIND)
    reflector.listed = True
    watch = AppWatch(KIND, reflector, cast("asyncio.Task[None]", None))
    live._apps[PLURAL] = watch
    return live, watch


STEP = st.one_of(
    st.tuples(st.just("write"), st.booleans()),
    st.tuples(st.just("deliver"), st.just(False)),
    st.tuples(st.just("repair"), st.booleans()),
    st.tuples(st.just("check"), st.booleans()),
)


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(st.booleans(), min_size=1, max_size=6),
    st.lists(STEP, max_size=12),
    st.data(),
)
def test_no_ordering_of_events_and_repairs_hides_an_object_or_keeps_a_kind_unconfirmed(
    lost: list[bool], steps: list[tuple[str, bool]], data: st.DataObject
) -> None:
    asyncio.run(orderings(lost, steps, data))


async def orderings(lost: list[bool], steps: list[tuple[str, bool]], data: st.DataObject) -> None:
    name, client = Name(), Client()
    live, watch = live_watch(client)
    delivered = 0  # how many of the name's events the watch has got to, lost ones included

    def deliver(count: int) -> None:
        nonlocal delivered
        for _ in range(count):
            if delivered >= len(name.events):
                return
            if not (lost[delivered] if delivered < len(lost) else False):
                watch.reflector.on_event(*name.events[delivered])
            delivered += 1

    async def read(lagging: bool, final: bool = False) -> None:
        revision = name.revision
        now = name.at(revision)
        items = [(KEY, revision_of(now))] if now is not None else []
        behind, gone = live.lost(KIND, items, revision)
        if not behind and not gone:
            return
        # The GET is answered at ``seen`` (the read's revision, or older: a lagging cache);
        # while its answer travels, the tenant may write and the watch deliver.
        seen = data.draw(st.integers(0, revision)) if lagging else revision
        writes = data.draw(st.lists(st.booleans(), max_size=2)) if not final else []
        during = data.draw(st.integers(0, 3)) if not final else 0

        def answer() -> Obj:
            for delete in writes:
                name.write(delete)
            deliver(during)
            found = name.at(seen)
            if found is None:
                raise ApiError(404, "NotFound", f"{PLURAL} {KEY[1]!r} not found")
            return found

        client.answer = answer
        await live.repair(KIND, watch, [*behind, *gone], revision, set(behind))

    def check(delete: bool) -> None:
        """A read lists the name; the tenant writes again and the watch delivers it all before
        the read is compared: without a loss, the read finds nothing lost."""
        revision = name.revision
        now = name.at(revision)
        items = [(KEY, revision_of(now))] if now is not None else []
        name.write(delete)
        deliver(len(name.events))
        if not any(lost[: len(name.events)]):
            assert live.lost(KIND, items, revision) == ({}, []), "a read proves a kind complete"

    for step, flag in steps:
        if step == "write":
            name.write(delete=flag)
        elif step == "deliver":
            deliver(1)
        elif step == "check":
            check(delete=flag)
        else:
            await read(lagging=flag)
    deliver(len(name.events))  # the watch delivers all it did not lose
    await read(lagging=False, final=True)  # a current read and GET put everything right
    truth = name.at(name.revision)
    held = live._held.get(KIND, {}).get(KEY)
    assert (held[2] if held else None) == (revision_of(truth) if truth else None), (held, truth)
    items = [(KEY, revision_of(truth))] if truth is not None else []
    assert live.lost(KIND, items, name.revision) == ({}, []), "the read proves the kind complete"


def revision_of(obj: Obj) -> int:
    return int(obj["metadata"]["resourceVersion"])

"""The virtual-time loop: time moves only when the simulator says, timers fire in order."""

from __future__ import annotations

import asyncio

from tests.simulation.loop import VirtualLoop


def test_time_stands_still_until_advanced_and_timers_fire_at_their_instants() -> None:
    loop = VirtualLoop()
    fired: list[tuple[str, float]] = []
    try:
        loop.call_later(5.0, lambda: fired.append(("late", loop.time())))
        loop.call_later(1.0, lambda: fired.append(("early", loop.time())))
        loop.run_until_idle()
        assert fired == []
        assert loop.time() == 0.0
        loop.advance(3.0)
        assert fired == [("early", 1.0)]
        assert loop.time() == 3.0
        loop.advance(10.0)
        assert fired == [("early", 1.0), ("late", 5.0)]
        assert loop.time() == 13.0
    finally:
        loop.close()


def test_a_sleeping_task_wakes_only_when_its_time_has_come() -> None:
    loop = VirtualLoop()
    woke: list[float] = []

    async def sleeper() -> None:
        await asyncio.sleep(90.0)
        woke.append(loop.time())

    try:
        task = loop.create_task(sleeper())
        loop.run_until_idle()
        loop.advance(89.0)
        assert not task.done()
        loop.advance(2.0)
        assert task.done()
        assert woke == [90.0]
    finally:
        loop.close()

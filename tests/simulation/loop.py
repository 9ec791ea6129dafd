"""An asyncio event loop on virtual time, so the simulator alone decides when time passes.

The production code sleeps, debounces and times out through the running loop (``asyncio.sleep``,
``wait_for``, ``call_later``). On this loop those timers fire only when the simulator advances
the clock: :meth:`VirtualLoop.run_until_idle` runs every callback that is ready *now* and
returns as soon as the loop would otherwise wait; :meth:`VirtualLoop.advance` moves the clock
forward, firing each timer at its own instant, in order. Callbacks run in asyncio's FIFO order,
so one seed always gives one interleaving. No socket is ever used.

The seam is the selector: the loop asks it to wait ``timeout`` seconds whenever nothing is
ready; instead of waiting, it moves virtual time to the next timer (while that is within the
target) or stops the loop (the loop is idle).
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _IdleSelector(selectors.BaseSelector):
    """A selector that never waits: it advances the virtual clock or stops the loop."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()  # for the loop's own self-pipe only
        self.loop: VirtualLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        assert loop is not None
        if timeout is None or timeout > 0:
            if timeout is not None and loop.now + timeout <= loop.target:
                loop.now += timeout  # the next timer is due within the step: jump to it
            else:
                loop.stop()  # idle until the simulator moves time on
        # Nothing to poll: no socket is registered, and the self-pipe only wakes a loop that
        # waits for another thread (whose call_soon_threadsafe callback is queued already). A
        # system call per iteration, some 1,100 a seed, is saved.
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose :meth:`time` is virtual and moves only when told to."""

    def __init__(self) -> None:
        selector = _IdleSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0
        self.target = 0.0

    def time(self) -> float:
        return self.now

    def run_until_idle(self) -> None:
        """Run everything ready at the current instant, without moving time."""
        self.target = self.now
        self.run_forever()

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer due on the way, in order."""
        end = self.now + seconds
        self.target = end
        self.run_forever()
        self.now = max(self.now, end)
        self.run_until_idle()

"""Waiting for a condition in an asynchronous test, robust to a stalled event loop.

A shared test machine (or a full garbage collection in a long test process) can stall the
event loop for seconds. ``async with asyncio.timeout(t)`` around a polling loop then fails a
test whose condition came true during the stall: the timeout and the poll's wake-up fall due
together, and the cancellation wins. These helpers check the condition once more at the
deadline, so they fail only when it really did not hold in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["eventually", "eventually_async", "loop_gaps"]


@contextlib.asynccontextmanager
async def loop_gaps(every: float = 0.0) -> AsyncIterator[list[float]]:
    """The gaps between a ticker's turns of the event loop (each asking to wake ``every``
    seconds later) while the block runs: how long whatever ran meanwhile held the loop."""
    gaps: list[float] = []

    async def tick() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(every)
            now = loop.time()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        yield gaps
    finally:
        ticker.cancel()


async def eventually(
    condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02
) -> None:
    """Return once ``condition()`` is truthy; ``TimeoutError`` if it is not at ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() >= deadline:
            raise TimeoutError(f"condition not met within {timeout:g}s")
        await asyncio.sleep(interval)


async def eventually_async(
    condition: Callable[[], Awaitable[object]], timeout: float = 10.0, interval: float = 0.05
) -> None:
    """:func:`eventually` for a condition that must be awaited (one call at a time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if loop.time() >= deadline:
            raise TimeoutError(f"condition not met within {timeout:g}s")
        await asyncio.sleep(interval)

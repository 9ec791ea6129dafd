"""Waiting that a shutdown cuts short: every background loop sleeps through here."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["sleep_unless_stopped", "sleep_unless_woken"]


async def sleep_unless_stopped(seconds: float, stop: asyncio.Event) -> bool:
    """Sleep ``seconds``, or less when ``stop`` is set meanwhile; returns whether it is set."""
    # asyncio.timeout, not wait_for: no task of its own for each sleep of each loop.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()


async def sleep_unless_woken(
    seconds: float, stop: asyncio.Event, wake: asyncio.Event, *, soonest: float
) -> bool:
    """Sleep ``seconds``, or less when ``wake`` is set meanwhile, but never less than
    ``soonest`` (a loop woken early never runs more often than that); clears ``wake`` and
    returns whether ``stop`` is set. Only ``wake`` is waited for: ``stop`` is seen at the end
    of the period, as it is while the loop's own round runs, and a loop that runs four times a
    second makes one timer a sleep and no task (waiting for both took a quarter of a simulated
    replica's time)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    if not wake.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await wake.wait()
    left = soonest - (loop.time() - started)
    if left > 0:
        await sleep_unless_stopped(left, stop)
    wake.clear()
    return stop.is_set()

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
    """Sleep ``seconds``, or less when ``stop`` is set or, once ``soonest`` has passed, when
    ``wake`` is (a loop woken early never runs more often than every ``soonest``); clears
    ``wake`` and returns whether ``stop`` is set."""
    if await sleep_unless_stopped(soonest, stop):
        return True
    waits = [asyncio.ensure_future(event.wait()) for event in (stop, wake)]
    try:
        await asyncio.wait(
            waits, timeout=max(0.0, seconds - soonest), return_when="FIRST_COMPLETED"
        )
    finally:
        for wait in waits:
            wait.cancel()
    wake.clear()
    return stop.is_set()

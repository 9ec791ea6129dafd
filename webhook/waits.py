"""Waiting that a shutdown cuts short: every background loop sleeps through here."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["sleep_unless_stopped"]


async def sleep_unless_stopped(seconds: float, stop: asyncio.Event) -> bool:
    """Sleep ``seconds``, or less when ``stop`` is set meanwhile; returns whether it is set."""
    # asyncio.timeout, not wait_for: no task of its own for each sleep of each loop.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()

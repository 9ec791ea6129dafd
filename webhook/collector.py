"""The cyclic garbage collector paused for a while, by any thread, without undoing another's pause.

Python's collector is one switch for the process. A review's decision step and a ``--state``
load in its thread both pause it (a collection every 700 new containers walks every young object
and, often, much of the heap: for a review decoding a few hundred thousand containers, several
times the decode's own cost). Toggled directly, one would turn it back on in the middle of the
other's pause, or, reading it off while the other had paused it, leave it off for good. Here
pauses nest: the first turns it off, the last turns it back on, and only if it was on before
the first.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["pause", "resume"]

_lock = threading.Lock()
_paused = 0  # pauses under way, in every thread
_was_on = False  # whether the collector was on when the first of them began


def pause() -> None:
    """Begin a pause (end it with :func:`resume`, in a ``finally``)."""
    global _paused, _was_on
    with _lock:
        if _paused == 0:
            _was_on = gc.isenabled()
            gc.disable()
        _paused += 1


def resume() -> bool:
    """End a pause; whether the collector is on again (the last pause ended, and it was on)."""
    global _paused
    with _lock:
        _paused -= 1
        if _paused or not _was_on:
            return False
        gc.enable()
        return True

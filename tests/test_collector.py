"""Pauses of the garbage collector nest, across threads, and never leave it off for good."""

from __future__ import annotations

import gc
import threading

from webhook import collector


def test_the_collector_is_on_again_only_when_the_last_pause_ends() -> None:
    assert gc.isenabled()
    collector.pause()  # a --state load in its thread
    collector.pause()  # a review's step on the loop, meanwhile
    assert not collector.resume(), "the load's pause goes on"
    assert not gc.isenabled()
    assert collector.resume()
    assert gc.isenabled()


def test_a_pause_begun_while_the_collector_was_off_leaves_it_off() -> None:
    gc.disable()
    try:
        collector.pause()
        assert not collector.resume()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_pauses_racing_in_two_threads_never_leave_the_collector_off() -> None:
    def pausing() -> None:
        for _ in range(20_000):
            collector.pause()
            collector.resume()

    threads = [threading.Thread(target=pausing) for _ in range(2)]
    for thread in threads:
        thread.start()
    pausing()
    for thread in threads:
        thread.join()
    assert gc.isenabled()

"""Command-line options of the test suite, how its tests are spread over parallel workers, and
what each test leaves behind for the next."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _thaw_frozen_heap() -> Iterator[None]:
    """Undo a replica's ``gc.freeze()`` after each test.

    A live state freezes the heap once it is built, as it should in a process of its own. In
    the test process that would freeze everything every earlier test left, and the next
    ``gc.unfreeze()`` + full collection would walk it all at once, stalling the event loop
    of a later test for seconds (its watches then fall silent past their read timeout).
    """
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simulation", "deterministic simulation of the ledger")
    group.addoption(
        "--seeds",
        type=int,
        default=None,
        help="how many seeded schedules the simulation explores (default 5000; "
        "env SIMULATION_SEEDS)",
    )
    group.addoption(
        "--seed-start",
        type=int,
        default=None,
        help="the first seed the simulation explores (default 0; env SIMULATION_SEED_START)",
    )


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker more than the cores. Much of the suite waits on servers in other
    processes (API servers starting, replicas answering), so a core would otherwise sit idle
    while its worker waits. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return len(os.sched_getaffinity(0)) + 1


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n`` with the default distribution: :class:`tests.parallel.SharedServerScheduling`."""
    if config.getvalue("dist") != "load":
        return None
    from tests.parallel import SharedServerScheduling

    return SharedServerScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` first (the order is otherwise kept): started early on a
    parallel run, none of them is left alone at its end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)

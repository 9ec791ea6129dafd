"""Command-line options of the test suite, and what each test leaves behind for the next."""

from __future__ import annotations

import gc
from collections.abc import Iterator

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

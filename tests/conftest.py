"""Command-line options of the test suite."""

from __future__ import annotations

import pytest


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

"""Escrowed room under every interleaving the seeds draw: slices, crashes, lost writes, leases.

Each seed is one schedule (``tests/simulation/escrow/simulator.py``); a failure prints the
seed's whole trace and the one command that replays it. Every property the judge checks is
also shown failing: each rule of :mod:`tests.simulation.escrow.broken`, broken on its own, is
found within :data:`BROKEN_SEEDS` seeds by the property it would violate, on a seed that
passes on the real rules.
"""

from __future__ import annotations

import functools

import pytest

from tests.simulation import simulator as ledger_simulation
from tests.simulation.escrow import explore, replay_command, run
from tests.simulation.escrow.broken import broken
from tests.simulation.test_simulation import CHUNK, parametrize_seeds
from webhook.admission.ledger.slices import Slices

BROKEN_SEEDS = 3000


# The ledger's own simulation with the replicas admitting from slices: seeds, in chunks.
LIVE_SEEDS = 750
LIVE_UNCOUNTED_SEEDS = 600


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_seeds(metafunc, CHUNK * 4)  # a run is several times cheaper than the ledger's
    if "live_seeds" in metafunc.fixturenames:
        chunks = [range(first, first + CHUNK) for first in range(0, LIVE_SEEDS, CHUNK)]
        ids = [f"{c.start}-{c.stop - 1}" for c in chunks]
        metafunc.parametrize("live_seeds", chunks, ids=ids)


def test_no_schedule_commits_past_a_budget_or_spends_a_slice_twice(seeds: range) -> None:
    summary = explore(seeds)
    failure = summary.failure
    assert failure is None, failure.report(replay_command(failure.seed))
    assert summary.seeds == len(seeds)
    # The schedules really admit from slices, and by the exact path near the bound.
    assert summary.paths["from slices"] > summary.seeds // 2
    assert summary.paths["by the exact path"] > summary.seeds // 2


@pytest.mark.parametrize(
    ("rule", "found"),
    [
        ("grant-ignores-others", "committed room past the budget"),
        ("reclaim-at-expiry", "is committed"),  # a replica counts less than is committed
        ("never-reclaim", "a dead life's slice"),
        ("release-at-once", "is committed"),
        ("adopt-old-life", "spent twice"),
        ("spend-past-deadline", "past its lease"),
        ("ignore-lowered-budget", "lowered budget"),
        ("forget-unknown-write", "spent twice|is committed"),
    ],
)
def test_each_broken_rule_is_found_by_the_property_it_violates(rule: str, found: str) -> None:
    with broken(rule):
        summary = explore(range(BROKEN_SEEDS))
    failure = summary.failure
    assert failure is not None, f"{BROKEN_SEEDS} seeds missed the broken rule {rule}"
    reported = failure.report(replay_command(failure.seed, rule))
    assert any(text in failure.problem for text in found.split("|")), reported
    assert run(failure.seed).ok  # the schedule passes on the real rules


def test_a_seed_replays_exactly() -> None:
    first, second = run(11), run(11)
    assert first.trace == second.trace
    assert len(first.trace) > 50


@pytest.mark.slow
def test_the_ledger_admitting_from_slices_never_pushes_a_pool_past_its_budget(
    live_seeds: range,
) -> None:
    # The ledger's own simulation (real replicas, the real ledger) with LedgerSettings.escrow
    # on: bursts of creates through one replica give it a rate, a slice and spends from it.
    summary = ledger_simulation.explore(live_seeds, simulate=functools.partial(_live, True))
    failure = summary.failure
    command = f"{ledger_simulation.replay_command(failure.seed)} --live-escrow" if failure else ""
    assert failure is None, failure.report(command)


@pytest.mark.slow
def test_slices_nobody_counts_are_found_as_an_overshoot(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same simulation with the counting of slices taken out of the live ledger: the holder
    # spends, nobody else (nor the holder's own exact path) counts what it holds. The records
    # are still read (a dead life's is still reclaimed): only what they hold is not counted.
    monkeypatch.setattr(Slices, "_mirror", lambda *_: None)
    summary = ledger_simulation.explore(
        range(LIVE_UNCOUNTED_SEEDS), simulate=functools.partial(_live, True)
    )
    failure = summary.failure
    assert failure is not None, f"{LIVE_UNCOUNTED_SEEDS} seeds missed uncounted slices"
    assert failure.problem.startswith("pool over budget"), failure.problem
    monkeypatch.undo()
    assert _live(True, failure.seed).ok


def _live(escrow: bool, seed: int) -> ledger_simulation.Outcome:
    return ledger_simulation.run(seed, escrow=escrow)

"""Run the simulation from the command line: a soak over many seeds, or one seed's trace.

python -m tests.simulation --seeds 100000            # seeds 0..99999, stop at the first failure
python -m tests.simulation --seeds 5000 --start 7000  # seeds 7000..11999
python -m tests.simulation --seed 1234               # replay one seed, print its whole trace
python -m tests.simulation --seed 1234 --revert-settle  # the same, on the reverted settle rule
python -m tests.simulation --seed 1234 --revert-stale-write  # on "an update replaces its oldObject"
python -m tests.simulation --escrow --seeds 5000     # the escrow simulation: replicas hold slices
python -m tests.simulation --seed 12 --broken reclaim-at-expiry  # escrow, one rule broken
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

from tests.simulation import escrow
from tests.simulation.escrow.broken import PATCHES, broken
from tests.simulation.reverted import (
    reverted_grace_rule,
    reverted_settle_rule,
    reverted_stale_write_rule,
)
from tests.simulation.simulator import explore, replay_command, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__)
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to explore")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="replay this one seed and print its trace")
    parser.add_argument(
        "--revert-settle",
        action="store_true",
        help="settle ledger entries on a merely matching value (the old, wrong rule)",
    )
    parser.add_argument(
        "--revert-stale-write",
        action="store_true",
        help="skip unchanged updates unheld and free a decrease at once (the old, wrong rule)",
    )
    parser.add_argument(
        "--revert-grace",
        action="store_true",
        help="drop unobserved entries after 25 s, before their requests can no longer be stored",
    )
    parser.add_argument(
        "--escrow", action="store_true", help="run the escrow simulation (replicas hold slices)"
    )
    parser.add_argument(
        "--broken", choices=sorted(PATCHES), default="", help="escrow, with this rule broken"
    )
    parser.add_argument(
        "--live-escrow", action="store_true", help="the ledger's replicas admit from slices"
    )
    args = parser.parse_args(argv)
    if args.escrow or args.broken:
        return _escrow(args)
    with (
        reverted_settle_rule(args.revert_settle),
        reverted_stale_write_rule(args.revert_stale_write),
        reverted_grace_rule(args.revert_grace),
    ):
        if args.seed is not None:
            outcome = run(args.seed, escrow=args.live_escrow)
            print("\n".join(outcome.trace))
            print(f"seed {args.seed}: {'ok' if outcome.ok else outcome.problem}")
            return 0 if outcome.ok else 1
        began = time.perf_counter()
        summary = explore(
            range(args.start, args.start + args.seeds),
            simulate=functools.partial(run, escrow=True) if args.live_escrow else None,
        )
        elapsed = time.perf_counter() - began
    print(summary.describe(elapsed))
    if summary.failure is not None:
        command = replay_command(summary.failure.seed, args.revert_settle)
        if args.revert_stale_write:
            command += " --revert-stale-write"
        if args.revert_grace:
            command += " --revert-grace"
        if args.live_escrow:
            command += " --live-escrow"
        print(summary.failure.report(command))
        return 1
    return 0


def _escrow(args: argparse.Namespace) -> int:
    with broken(args.broken):
        if args.seed is not None:
            outcome = escrow.run(args.seed)
            print("\n".join(outcome.trace))
            print(f"seed {args.seed}: {'ok' if outcome.ok else outcome.problem}")
            return 0 if outcome.ok else 1
        began = time.perf_counter()
        summary = escrow.explore(range(args.start, args.start + args.seeds))
        elapsed = time.perf_counter() - began
    print(summary.describe(elapsed))
    if summary.failure is not None:
        print(summary.failure.report(escrow.replay_command(summary.failure.seed, args.broken)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

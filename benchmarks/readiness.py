"""What one admission spends asking readiness on a live state, by the number of kinds.

Every admission on a live cluster asks whether the state may be trusted and whether its kind
can be decided, each at least twice (``benchmarks.server`` serves a fixed state, where neither
question walks anything, so it cannot show this). This builds a :class:`LiveState` with every
reflector synced and N application kinds (no server: nothing runs, only the answers are
asked) and times the four asks of one admission, the best of seven repeats.

Run: .venv/bin/python -m benchmarks.readiness [--kinds N ...] [--asks N]
"""

from __future__ import annotations

import argparse
import asyncio
import timeit
from types import SimpleNamespace
from typing import cast
from unittest import mock

from webhook.core.pricing.platform import Platform
from webhook.kube.client import KubeClient
from webhook.state.live import LiveSettings, LiveState


async def per_admission(kinds: int, asks: int) -> float:
    """Microseconds one admission's readiness asks take with ``kinds`` application kinds."""
    live = LiveState(cast(KubeClient, object()), LiveSettings())
    live.required["ledger"] = lambda: True
    live.platform_generation = 1
    wanted = {
        f"Kind{i}": SimpleNamespace(plural=f"kind{i}s", kind=f"Kind{i}") for i in range(kinds)
    }
    live._sync_app_watches(cast(Platform, SimpleNamespace(kinds=wanted)))
    try:
        for reflector in [*live._platform_reflectors, *(w.reflector for w in live._apps.values())]:
            reflector.listed = True
            reflector.watching = True
            reflector.last_activity = reflector.clock()
            reflector.first_sync_seconds = 1.0
        with mock.patch("webhook.state.live.settle_memory"):  # no gc.freeze in a benchmark
            live._note_first_sync()
        state = live.state
        kind = f"Kind{kinds // 2}"

        def admission() -> None:
            for _ in range(2):  # once per decision
                if state.synced:
                    state.kind_unavailable(kind)

        assert state.synced
        return min(timeit.repeat(admission, number=asks, repeat=7)) / asks * 1e6
    finally:
        for watch in live._apps.values():
            watch.task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", type=int, nargs="+", default=[30, 100])
    parser.add_argument("--asks", type=int, default=20_000)
    args = parser.parse_args()
    for kinds in args.kinds:
        micros = asyncio.run(per_admission(kinds, args.asks))
        print(f"{kinds:>4} kinds: {micros:6.2f} us per admission's readiness asks")


if __name__ == "__main__":
    main()

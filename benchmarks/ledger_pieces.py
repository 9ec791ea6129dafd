"""The ledger's and the watches' pieces of one admission, each timed alone, in one or more trees.

``benchmarks.ledger`` measures the whole path, and on a shared machine its run-to-run spread
hides a change of a few percent; this times each piece the ledger and the watches spend on an
admission (CPU time, the best of seven repeats), so a change to one of them is seen at its own
size: a PUT body encoded, its answer decoded, a watch line decoded, an application event held,
an expiry formatted, a batch's holders counted (and, where the tree has it, the room its
entries take: by tenant, in entries and bytes), and readiness asked after an event on a busy
kind (31 kinds, as the benchmark's platform has). With ``--tree DIR`` (repeatable) each piece
is timed in each checkout, with its own ``.venv``, alternating, and the ratio to the first is
printed: the same inputs before and after a change, in one run.

Run: .venv/bin/python -m benchmarks.ledger_pieces [--tree DIR --tree DIR] [--runs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent

ENTRY = {
    "application": "VMInstance/tenant-t0/r0p1-1-12345",
    "charge": {"cpu": "1", "memory": "1Gi", "count/vminstances.apps.cozystack.io": "1"},
    "expires": "2026-12-01T17:09:20.123456Z",
    "replica": "bench",
    "revision": "123456",
}
LEDGER: dict[str, Any] = {
    "apiVersion": "reservation.cozystack.io/v1alpha1",
    "kind": "TenantReservation",
    "metadata": {
        "name": "tenant-t0",
        "namespace": "tenant-t0",
        "resourceVersion": "1234567",
        "uid": "5f0c3a52-0d8e-4b8e-9a51-8f7e1c2d3b4a",
        "creationTimestamp": "2026-12-01T17:00:00Z",
        "generation": 1,
    },
    "spec": {"pool": "tenant-t0"},
    "status": {
        "pending": [
            {"id": f"8c1b7e0e-1f2a-4a4c-9d53-0b4c3e0a6f{index:02d}", **ENTRY} for index in range(15)
        ],
        "budget": {"cpu": "10000000", "memory": "10000000Gi"},
        "conditions": [
            {
                "type": "Overcommitted",
                "status": "False",
                "reason": "WithinBudget",
                "message": "reserved is within the budget",
                "lastTransitionTime": "2026-12-01T17:00:00Z",
            }
        ],
    },
}
APPLICATION: dict[str, Any] = {
    "apiVersion": "apps.cozystack.io/v1alpha1",
    "kind": "VMInstance",
    "metadata": {
        "name": "r0p1-1-12345",
        "namespace": "tenant-t0",
        "resourceVersion": "1234568",
        "uid": "0b4c3e0a-6f00-4a4c-9d53-8c1b7e0e1f2a",
        "creationTimestamp": "2026-12-01T17:00:00Z",
    },
    "spec": {"instanceType": "u1.micro"},
}
KINDS = 31


def best(piece: Callable[[], object], repeat: int) -> float:
    """The least CPU time one call took, in us, over seven runs of ``repeat`` calls."""
    runs = []
    for _ in range(7):
        start = time.process_time()
        for _ in range(repeat):
            piece()
        runs.append((time.process_time() - start) / repeat * 1e6)
    return min(runs)


def measure() -> dict[str, float]:
    """Every piece, timed in the tree this runs in (its code as it is there)."""
    import webhook.kube.client as client
    from webhook.admission.ledger.entries import expiry
    from webhook.admission.ledger.shares import holders
    from webhook.state.held_applications import held_application, held_from_object

    encode: Callable[[object], bytes] = getattr(
        client, "encode_json", lambda body: json.dumps(body, separators=(",", ":")).encode()
    )
    decode: Callable[[bytes], Any] = getattr(client, "decode_json", json.loads)
    line = json.dumps({"type": "MODIFIED", "object": LEDGER}).encode()
    added = json.dumps({"type": "ADDED", "object": APPLICATION}).encode()
    now = time.time()

    def held() -> None:
        reduced = held_from_object("VMInstance", APPLICATION)
        assert reduced is not None
        (namespace, name), kept = reduced
        held_application("VMInstance", namespace, name, kept)

    figures = {
        "PUT body encoded (a 15-entry TenantReservation)": best(lambda: encode(LEDGER), 3000),
        "PUT answer or watch echo decoded (the same)": best(lambda: decode(line), 3000),
        "watch line decoded (a VMInstance ADDED)": best(lambda: decode(added), 5000),
        "application event held (reduced, then read back)": best(held, 5000),
        "one expiry formatted": best(lambda: expiry(now + 25.0), 20000),
        "holders of 15 listed entries (a batch)": best(
            lambda: holders("tenant-t0", LEDGER["status"]["pending"]), 5000
        ),
    }
    for count in (15, 1000):
        figures[f"a batch's room counted, {count} listed entries"] = best(_room(count), 20)
    figures[f"readiness: an event, then two asks ({KINDS} kinds)"] = asyncio.run(_readiness())
    return figures


def _room(count: int) -> Callable[[], object]:
    """What a batch counts of ``count`` listed entries before it decides: the room they take
    (by tenant, in entries and in bytes; each measured in an earlier batch, as a busy pool's
    are), or, in a tree without it, their holders."""
    from webhook.admission.ledger import shares
    from webhook.admission.ledger.bounds import LedgerSettings

    pending = [{**ENTRY, "id": f"8c1b7e0e-1f2a-4a4c-9d53-{index:012d}"} for index in range(count)]
    room = getattr(shares, "Room", None)
    if room is None:
        return lambda: shares.holders("tenant-t0", pending)
    settings = LedgerSettings(replica="bench")
    known = room("tenant-t0", pending, settings).sizes
    return lambda: room("tenant-t0", pending, settings, known)


async def _readiness() -> float:
    from webhook.kube.client import KubeClient
    from webhook.state.live import LiveSettings, LiveState

    clock = SimpleNamespace(now=100.0)

    def now() -> float:
        return float(clock.now)

    live = LiveState(cast(KubeClient, object()), LiveSettings(), clock=now)
    kinds = {f"K{i}": SimpleNamespace(plural=f"k{i}s", kind=f"K{i}") for i in range(KINDS)}
    live._sync_app_watches(cast(Any, SimpleNamespace(kinds=kinds)))
    live.platform_generation = 1
    for reflector in [*live._platform_reflectors, *(w.reflector for w in live._apps.values())]:
        reflector.listed = True
        reflector.list_error = ""
        reflector.last_activity = now()
        reflector.watching = True
        reflector.first_sync_seconds = 0.5
    with mock.patch("webhook.state.live.settle_memory"):
        live._note_first_sync()
    busy = live._apps["k3s"].reflector

    def event_then_asks() -> None:
        clock.now += 1e-6
        busy.last_activity = now()  # an event of the busy kind
        assert live.state.synced
        live.state.kind_unavailable("K3")

    try:
        return best(event_then_asks, 5000)
    finally:
        for watch in live._apps.values():
            watch.task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, action="append", help="a checkout (repeatable)")
    parser.add_argument("--runs", type=int, default=2, help="runs per tree, alternating")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    trees: list[Path] = args.tree or [ROOT]
    seen: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    for _ in range(args.runs):
        for tree in trees:
            python = tree / ".venv" / "bin" / "python"
            answer = subprocess.run(
                [
                    str(python if python.exists() else sys.executable),
                    str(Path(__file__)),
                    "--measure",
                ],
                cwd=tree,
                capture_output=True,
                text=True,
                check=True,
                env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
            )
            seen[tree].append(json.loads(answer.stdout.splitlines()[-1]))
    print(f"ledger pieces: us of CPU per call, median [min-max] of {args.runs} run(s) per tree")
    first = trees[0]
    for piece in seen[first][0]:
        cells = []
        for tree in trees:
            values = [run[piece] for run in seen[tree]]
            cell = f"{statistics.median(values):.3g} [{min(values):.3g}-{max(values):.3g}]"
            if tree != first:
                base = statistics.median(run[piece] for run in seen[first])
                cell += f" ({statistics.median(values) / base:.2f}x)"
            cells.append(f"{tree.name}: {cell}")
        print(f"  {piece:<52} " + "   ".join(cells))


if __name__ == "__main__":
    main()

"""``webhook audit summary`` against the README's old ``jq`` one-liner, on a large log.

Generates a log of 1,000,000 events shaped like the real one in ``fixtures/audit``: 95% of the
events are of other groups (the real log's other events, as a real cluster is dominated by
them), 5% are ``apps.cozystack.io`` events at ``RequestResponse`` (the real log's, with fresh
audit IDs). Then times, as whole processes (start-up included), over several interleaved
rounds: the summary, and the ``jq`` filter the README used to recommend. Prints events per
second for the summary, both times, their ratio (goal: summary at least 3x faster), and the
summary's peak RSS (goal: under 200 MiB), read from the kernel's accounting of that process.

Run: .venv/bin/python -m benchmarks.audit [--events N] [--rounds R] [--keep FILE]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "fixtures" / "audit" / "sample-day.log"
JQ_FILTER = (
    'select(.annotations["reservation.cozystack.io/would-deny"]) '
    "| {user: .user.username, ns: .objectRef.namespace, name: .objectRef.name, "
    'why: .annotations["reservation.cozystack.io/would-deny"]}'
)
APPS_SHARE = 0.05


def generate(target: Path, events: int, seed: int = 11) -> int:
    """Write ``events`` lines to ``target``; return its size in bytes."""
    lines = REAL.read_bytes().splitlines()
    apps = [line for line in lines if b'"apiGroup":"apps.cozystack.io"' in line]
    others = [line for line in lines if b'"apiGroup":"apps.cozystack.io"' not in line]
    rng = random.Random(seed)
    with target.open("wb", buffering=1 << 20) as out:
        for number in range(events):
            line = rng.choice(apps) if rng.random() < APPS_SHARE else rng.choice(others)
            start = line.index(b'"auditID":"') + 11
            fresh = f"{number:08x}-0000-4000-8000-{rng.getrandbits(48):012x}".encode()
            out.write(line[:start] + fresh + line[start + 36 :] + b"\n")
    return target.stat().st_size


def timed(argv: list[str]) -> tuple[float, float, int]:
    """Wall time and CPU time (user + system) of one process, and its peak RSS in KiB, from
    the kernel's accounting of that child alone. CPU time is what a loaded machine distorts
    least."""
    started = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1):
        error = process.stderr.read().decode() if process.stderr else ""
        raise SystemExit(f"{argv[0]} failed ({process.returncode}): {error[-500:]}")
    if process.stderr:
        process.stderr.close()
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", metavar="FILE", help="write the log here and keep it")
    args = parser.parse_args()
    jq = shutil.which("jq")
    if jq is None:
        raise SystemExit("jq is not installed (apt-get install jq)")
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(args.keep) if args.keep else Path(scratch) / "audit.log"
        started = time.perf_counter()
        size = generate(log, args.events)
        print(
            f"generated {args.events:,} events, {size / 2**20:,.0f} MiB, "
            f"{APPS_SHARE:.0%} apps.cozystack.io, in {time.perf_counter() - started:.1f} s"
        )
        summary = [sys.executable, "-m", "webhook", "audit", "summary", str(log)]
        summary += ["-o", "json", "--no-progress"]
        jq_line = [jq, "-c", JQ_FILTER, str(log)]
        ours: list[float] = []
        theirs: list[float] = []
        cpu: dict[str, list[float]] = {"summary": [], "jq": []}
        peak = 0
        for round_number in range(1, args.rounds + 1):
            # interleaved, alternating who goes first, so neither always meets a warm cache
            order = [(summary, ours), (jq_line, theirs)]
            if round_number % 2 == 0:
                order.reverse()
            for argv, times in order:
                elapsed, seconds, rss = timed(argv)
                times.append(elapsed)
                cpu["summary" if argv is summary else "jq"].append(seconds)
                if argv is summary:
                    peak = max(peak, rss)
            print(f"round {round_number}: summary {ours[-1]:.2f} s, jq {theirs[-1]:.2f} s")
    ours_median, theirs_median = statistics.median(ours), statistics.median(theirs)
    print()
    ours_cpu, theirs_cpu = statistics.median(cpu["summary"]), statistics.median(cpu["jq"])
    print(f"{'':24}{'wall s':>10}{'events/s':>14}{'cpu s':>10}")
    print(
        f"{'webhook audit summary':24}{ours_median:>10.2f}"
        f"{args.events / ours_median:>14,.0f}{ours_cpu:>10.2f}"
    )
    print(
        f"{'jq one-liner':24}{theirs_median:>10.2f}"
        f"{args.events / theirs_median:>14,.0f}{theirs_cpu:>10.2f}"
    )
    print(
        f"summary is {theirs_median / ours_median:.1f}x faster than jq in wall time, "
        f"{theirs_cpu / ours_cpu:.1f}x in CPU time (goal: >= 3x)"
    )
    print(f"summary peak RSS: {peak / 1024:.0f} MiB (goal: < 200 MiB)")


if __name__ == "__main__":
    main()

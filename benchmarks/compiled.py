"""The core compiled with mypyc against the same core in pure Python, side by side in one run.

The pure core (``webhook/core``) is mypy strict, which is what mypyc needs to compile it to C
extension modules. Whether shipping it compiled is worth a build step, a C compiler in the
image build and a second test run is a question of figures, and this script produces them: it
copies the tree twice into a temporary directory, compiles every module of one copy's core with
mypyc (a few minutes on a shared machine; ``--build-dir`` keeps and reuses it), checks that
one copy imports only compiled core modules and the other none, and then runs the in-process
benchmarks in both copies, one child process each, alternating which copy goes first in each
round, so a noisy neighbour slows both alike:

* ``benchmarks.stages``: microseconds per request of each in-process stage, VMInstance and
  Kubernetes, the charge cache missed (``decide (cache miss)``) and hit (``decide (cache
  hit)``, timed here: 100 bodies decided once, then again, the state frozen out of the
  collector's way as ``serve`` freezes it);
* ``benchmarks.decide``: decide() p50 on one CREATE as the state grows, and the seconds to
  build each state (``ReservationState.observe`` per application);
* ``benchmarks.state_load``: ``--state`` load of 100,000 VMInstances, and the p99 of 10,000
  CREATEs decided and applied against 1,000 and 200,000 applications.

Printed per figure: the median over the rounds, min-max, for pure and compiled, and the ratio
pure/compiled (above 1: compiled is faster). The machine is shared: compare the figures of one
run, not across runs. Nothing here is asserted by the tests.

Run: .venv/bin/python -m benchmarks.compiled [--rounds N] [--build-dir DIR] [--skip NAME]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = "webhook/core"
VARIANTS = ("pure", "compiled")


def core_modules(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in (tree / CORE).rglob("*.py"))


def copy_tree(tree: Path) -> None:
    """The project's code, benchmarks, tests and data, as they are now."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "build")
    tree.mkdir(parents=True, exist_ok=True)
    for name in ("webhook", "benchmarks", "tests", "fixtures"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore, dirs_exist_ok=True)
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "docs", tree / "docs", dirs_exist_ok=True)
    shutil.copytree(ROOT / "deploy", tree / "deploy", dirs_exist_ok=True)


def compile_core(tree: Path) -> float:
    """Compile every core module of ``tree`` in place; the seconds it took."""
    started = time.perf_counter()
    # The project's mypy configuration (strict on webhook.*), as setup.py compiles; it also
    # names the tests and benchmarks, which mypyc does not read.
    done = subprocess.run(
        [sys.executable, "-m", "mypyc", "--no-warn-unused-configs", *core_modules(tree)],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"mypyc failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return time.perf_counter() - started


PROBE = """
import importlib, pkgutil, webhook.core as core
names = [m.name for m in pkgutil.walk_packages(core.__path__, "webhook.core.")]
print(sum(importlib.import_module(n).__file__.endswith(".so") for n in names), len(names))
"""


def check(tree: Path, compiled: bool) -> str:
    """Fail unless ``tree`` imports all of its core compiled (or none of it)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tree, check=True, capture_output=True, text=True
    ).stdout.split()
    native, total = int(out[0]), int(out[1])
    if native != (total if compiled else 0):
        sys.exit(f"{tree}: {native} of {total} core modules compiled, expected the other")
    return f"{native}/{total} core modules compiled"


def run(tree: Path, *arguments: str) -> str:
    return subprocess.run(
        [sys.executable, *arguments], cwd=tree, check=True, capture_output=True, text=True
    ).stdout


# A figure is (benchmark, label): microseconds or seconds, lower is better.
Figures = dict[tuple[str, str], float]

HIT = """
import gc, statistics, time
from benchmarks.server import kubernetes_review, vm_review
from benchmarks.stages import ROOT
from webhook.core.admission.decisions import Policy, decide
from webhook.core.admission.reviews import parse_review
from webhook.state.manifests import load_state
state = load_state([ROOT / "fixtures" / "cozystack", ROOT / "fixtures" / "tenants"])
policy = Policy()
for name, make in (("VMInstance", vm_review), ("Kubernetes", kubernetes_review)):
    requests = [parse_review(make(i)) for i in range(100)]  # within the cache's entries
    for r in requests:
        decide(r, state, policy)
    gc.collect()
    gc.freeze()  # as the stages benchmark and serve do: the long-lived objects out of the way
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(10):
            for r in requests:
                decide(r, state, policy)
        rounds.append((time.perf_counter() - started) / 1000 * 1e6)
    print(name, statistics.median(rounds))
"""


def stages(tree: Path, requests: int) -> Figures:
    out = run(tree, "-m", "benchmarks.stages", "--rounds", "3", "--requests", str(requests))
    figures: Figures = {}
    for line in out.splitlines():
        found = re.match(r"(\S.*?)\s+([\d.]+) \(\s*[\d.]+-\s*[\d.]+\)\s+([\d.]+) \(", line)
        if found:
            figures[("stages VMInstance us", found[1])] = float(found[2])
            figures[("stages Kubernetes us", found[1])] = float(found[3])
        elif line.startswith("total"):
            vm, kubernetes = line.split()[1:3]
            figures[("stages VMInstance us", "total")] = float(vm)
            figures[("stages Kubernetes us", "total")] = float(kubernetes)
    for line in run(tree, "-c", HIT).splitlines():
        name, value = line.split()
        figures[(f"stages {name} us", "decide (cache hit)")] = float(value)
    return figures


def decide(tree: Path) -> Figures:
    figures: Figures = {}
    for line in run(tree, "-m", "benchmarks.decide").splitlines():
        found = re.match(r"\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", line)
        if found:
            figures[("decide p50 us", f"{found[1]} applications")] = float(found[2])
            figures[("decide: build state s", f"{found[1]} applications")] = float(found[4])
    return figures


def state_load(tree: Path, directory: str) -> Figures:
    load = json.loads(run(tree, "-m", "benchmarks.state_load", "--load", directory))
    figures: Figures = {
        ("state_load --state", "100,000 VMInstances, s"): load["seconds"],
        ("state_load --state", "100,000 VMInstances, CPU s"): load["cpu"],
    }
    for size in (1_000, 200_000):
        creates = json.loads(run(tree, "-m", "benchmarks.state_load", "--creates", str(size)))
        label = f"{size:,} applications, frozen"
        figures[("state_load CREATE p99 us", label)] = creates["p99_us_True_False"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1000, help="per stage, stages benchmark")
    parser.add_argument("--build-dir", type=Path, help="keep the two trees here (reused)")
    parser.add_argument(
        "--skip", action="append", default=[], choices=["stages", "decide", "state_load"]
    )
    parser.add_argument("--build-only", action="store_true", help="build and check, no runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        base = args.build_dir or Path(scratch)
        trees = {variant: base / variant for variant in VARIANTS}
        if not (trees["compiled"] / CORE / "base" / "__init__.py").exists() or not list(
            (trees["compiled"] / CORE).rglob("*.so")
        ):
            for tree in trees.values():
                copy_tree(tree)
            print(f"mypyc: {len(core_modules(trees['compiled']))} modules", flush=True)
            print(f"compiled in {compile_core(trees['compiled']):.0f} s", flush=True)
        for variant, tree in trees.items():
            print(f"{variant}: {tree} ({check(tree, variant == 'compiled')})", flush=True)
        if args.build_only:
            return
        state_dir = Path(scratch) / "state"
        if "state_load" not in args.skip:
            state_dir.mkdir()
            run(
                trees["pure"],
                "-c",
                "import sys; from pathlib import Path; from benchmarks.state_load import "
                "write_state, LOAD_APPLICATIONS; write_state(Path(sys.argv[1]), LOAD_APPLICATIONS)",
                str(state_dir),
            )
        samples: dict[str, dict[tuple[str, str], list[float]]] = {v: {} for v in VARIANTS}
        for index in range(args.rounds):
            order = VARIANTS if index % 2 == 0 else VARIANTS[::-1]
            for benchmark in ("stages", "decide", "state_load"):
                if benchmark in args.skip:
                    continue
                for variant in order:
                    tree = trees[variant]
                    if benchmark == "stages":
                        figures = stages(tree, args.requests)
                    elif benchmark == "decide":
                        figures = decide(tree)
                    else:
                        figures = state_load(tree, str(state_dir))
                    for key, value in figures.items():
                        samples[variant].setdefault(key, []).append(value)
            print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        report(samples, args.rounds)


def report(samples: dict[str, dict[tuple[str, str], list[float]]], rounds: int) -> None:
    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):9.1f} ({min(values):.1f}-{max(values):.1f})"

    print(f"\npure Python against mypyc-compiled core, median (min-max) of {rounds} rounds")
    print(f"{'figure':62s}{'pure':>24s}{'compiled':>24s}{'ratio':>7s}")
    groups = list(dict.fromkeys(group for group, _ in samples["pure"]))
    for group in groups:
        print(group)
        for key, pure in samples["pure"].items():
            compiled = samples["compiled"].get(key)
            if key[0] != group or not compiled:
                continue
            ratio = statistics.median(pure) / statistics.median(compiled)
            print(f"  {key[1]:60s}{cell(pure):>24s}{cell(compiled):>24s}{ratio:7.2f}")


if __name__ == "__main__":
    main()

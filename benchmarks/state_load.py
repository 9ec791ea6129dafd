"""``--state`` load time and memory, and CREATE latency as the state grows, with the goals.

1. Load: a directory of 100,000 applications of twelve kinds, drawn from the real platform data
   with varied sizes, values and metadata, most with the charge record the webhook signs, over
   900 tenants three levels deep (:mod:`benchmarks.varied_state`; 100 YAML files of 1,000
   documents, as ``kubectl get -o yaml`` writes them), plus the real platform data, loaded by
   ``load_state`` (with the record key) in a fresh process. Printed: wall and CPU seconds
   (median, min, max), resident memory (``VmRSS``, not traced allocations) after load minus
   before, per application, and a profile of one more load: the functions that take the most
   time. Goals: under 5 s, at most 1 KiB per application. The same objects as JSON Lists (what
   ``kubectl get -o json`` writes) are loaded too, interleaved, for comparison.
2. CREATE tail: in a fresh process per size, a state of 1,000 and of 200,000 applications,
   then 10,000 non-dry-run CREATEs decided and applied one after another (the state grows, as
   a server's does). Full collections are what a large heap adds to the tail, and a bounded
   run may or may not happen to meet one; so besides the natural run, a second run charges a
   full collection (``gc.collect()``) to one request in 50, past the p99 boundary. Both with the
   state frozen out of the collector's way (``gc.freeze()``, what ``serve`` does after load)
   and without. Each request is timed in CPU time: on a shared machine wall time measures the
   scheduler more than the request. Sizes alternate over three rounds; medians are printed.
   Goal: p99 at 200,000 within 1.5x of p99 at 1,000.

With ``--before TREE`` (a checkout of an earlier version with its own ``.venv``), the loads of
that tree run too, alternating with this one's in every round on the same files, and the
ratios are printed: before and after in one run, on one machine's conditions.

Run: .venv/bin/python -m benchmarks.state_load [--load-only] [--before TREE]
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
LOAD_APPLICATIONS = 100_000
PER_FILE = 1_000
CREATE_SIZES = (1_000, 200_000)
CREATES = 10_000
ROUNDS = 3


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# -- 1. load ----------------------------------------------------------------------------------


def write_state(directory: Path, applications: int, *, as_json: bool = False) -> None:
    """A cluster dump as ``kubectl get -o yaml`` writes one (block style, keys sorted), or with
    ``as_json`` the same objects as ``kubectl get -o json`` Lists: :func:`varied_objects`."""
    from benchmarks.varied_state import varied_objects

    tenants, apps = varied_objects(applications)
    dump = _json_text if as_json else _yaml_text
    suffix = "json" if as_json else "yaml"
    (directory / f"tenants.{suffix}").write_text(dump(tenants))
    for start in range(0, len(apps), PER_FILE):
        chunk = apps[start : start + PER_FILE]
        (directory / f"apps-{start // PER_FILE:03d}.{suffix}").write_text(dump(chunk))


def _yaml_text(objects: list[dict[str, Any]]) -> str:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump_all(objects, Dumper=dumper, default_flow_style=False, explicit_start=True)


def _json_text(objects: list[dict[str, Any]]) -> str:
    return json_list(objects)


def json_list(items: list[Any]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=4)


def measure_load(directory: str) -> dict[str, Any]:
    from benchmarks.varied_state import RECORD_KEY
    from webhook.core.tenancy.records import RecordKeys
    from webhook.state.manifests import load_state

    gc.collect()
    before = rss()
    started, cpu = time.perf_counter(), time.process_time()
    state = load_state([ROOT / "fixtures" / "cozystack", directory], keys=RecordKeys(RECORD_KEY))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    gc.collect()
    return {
        "seconds": seconds,
        "cpu": cpu,
        "applications": len(state),
        "unknown": len(state.unknown()),
        "grown": rss() - before,
    }


def measure_observe(directory: str) -> dict[str, Any]:
    """CPU µs per ``observe`` of an application seen before with the same values, what every
    watch event of an unchanged spec (a status change, a resync) costs: the first file's
    1,000 applications observed once, then again seven times (median, min, max)."""
    from benchmarks.varied_state import RECORD_KEY
    from webhook.core.admission.state import ReservationState
    from webhook.core.tenancy.applications import application_from_object
    from webhook.core.tenancy.records import RecordKeys
    from webhook.state.manifests import load_platform

    first = sorted(Path(directory).glob("apps-*.json"))[0]
    apps = [application_from_object(item) for item in json.loads(first.read_text())["items"]]
    state = ReservationState(load_platform([ROOT / "fixtures" / "cozystack"]))
    state.keys = RecordKeys(RECORD_KEY)
    for app in apps:
        state.observe(app)
    runs = []
    for _ in range(7):
        cpu = time.process_time()
        for app in apps:
            state.observe(app)
        runs.append((time.process_time() - cpu) / len(apps) * 1e6)
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs)}


def profile_load(directory: str, top: int = 25) -> str:
    """Where one load's time goes: the functions with the most time of their own."""
    import cProfile
    import io
    import pstats

    from benchmarks.varied_state import RECORD_KEY
    from webhook.core.tenancy.records import RecordKeys
    from webhook.state.manifests import iter_manifests, load_state

    cpu = time.process_time()
    documents = sum(1 for _ in iter_manifests([directory]))
    parse = time.process_time() - cpu
    profiler = cProfile.Profile()
    profiler.enable()
    load_state([ROOT / "fixtures" / "cozystack", directory], keys=RecordKeys(RECORD_KEY))
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    table = "\n".join(line.replace(str(ROOT) + "/", "") for line in lines[start:] if line)
    return (
        f"reading and parsing alone, unprofiled: {parse:.2f} s CPU for {documents:,} "
        f"documents\n{table}"
    )


# -- 2. CREATE tail -----------------------------------------------------------------------


def measure_creates(size: int) -> dict[str, Any]:
    from benchmarks.decide import build
    from webhook.admission.admit import apply_admitted
    from webhook.core.admission.decisions import Policy, decide
    from webhook.core.admission.reviews import parse_review
    from webhook.state.manifests import load_platform

    platform = load_platform([ROOT / "fixtures" / "cozystack"])
    state = build(platform, size)
    policy = Policy()
    results: dict[str, Any] = {}
    serial = 0
    for frozen in (False, True):
        gc.collect()
        if frozen:
            gc.freeze()
        collection = time.perf_counter()
        gc.collect()
        results[f"full_gc_ms_{frozen}"] = (time.perf_counter() - collection) * 1000
        for forced in (False, True):
            samples = []
            for index in range(CREATES):
                serial += 1
                request = parse_review(create(serial))
                started = time.process_time_ns()
                decision = decide(request, state, policy)
                apply_admitted(state, request, decision)
                if forced and index % 50 == 49:
                    gc.collect()
                samples.append(time.process_time_ns() - started)
                assert decision.allowed, decision.message
            samples.sort()
            results[f"p99_us_{frozen}_{forced}"] = samples[int(len(samples) * 0.99)] / 1000
        gc.unfreeze()
    return results


def create(serial: int) -> dict[str, Any]:
    namespace, name = f"tenant-t{serial % 100}-c{serial % 99}", f"new-{serial:07d}"
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"u{serial}",
            "operation": "CREATE",
            "namespace": namespace,
            "name": name,
            "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": "VMInstance"},
            "resource": {
                "group": "apps.cozystack.io",
                "version": "v1alpha1",
                "resource": "vminstances",
            },
            "object": {
                "apiVersion": "apps.cozystack.io/v1alpha1",
                "kind": "VMInstance",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"instanceType": "u1.micro", "disks": [{"name": f"{name}-system"}]},
            },
        },
    }


# -- driver ----------------------------------------------------------------------------------


def _before() -> Path | None:
    if "--before" not in sys.argv:
        return None
    tree = Path(sys.argv[sys.argv.index("--before") + 1]).resolve()
    if not (tree / ".venv" / "bin" / "python").exists():
        raise SystemExit(f"--before {tree}: no .venv/bin/python there")
    return tree


def child(*arguments: str, tree: Path = ROOT) -> dict[str, Any]:
    """One measurement in a fresh process: this module's code measuring ``tree``'s webhook
    (another tree runs with its own interpreter and its packages first on the path)."""
    command = [sys.executable, "-m", "benchmarks.state_load", *arguments]
    environment = None
    if tree != ROOT:
        python = str(tree / ".venv" / "bin" / "python")
        command = [python, str(Path(__file__).resolve()), *arguments]
        environment = {**os.environ, "PYTHONPATH": str(tree)}
    output = subprocess.run(
        command,
        cwd=tree,
        env=environment,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


def main() -> None:
    with tempfile.TemporaryDirectory() as directory, tempfile.TemporaryDirectory() as other:
        write_state(Path(directory), LOAD_APPLICATIONS)
        write_state(Path(other), LOAD_APPLICATIONS, as_json=True)
        before = _before()
        loads, json_loads = [], []
        old_loads: list[dict[str, Any]] = []
        old_json: list[dict[str, Any]] = []
        for _ in range(ROUNDS):  # interleaved: both formats (and trees) see the same machine
            loads.append(child("--load", directory))
            if before is not None:
                old_loads.append(child("--load", directory, tree=before))
            json_loads.append(child("--load", other))
            if before is not None:
                old_json.append(child("--load", other, tree=before))
        observes: list[dict[str, Any]] = []
        old_observes: list[dict[str, Any]] = []
        for _ in range(ROUNDS):
            observes.append(child("--observe", other))
            if before is not None:
                old_observes.append(child("--observe", other, tree=before))
        profile = child("--profile", directory)["profile"]
    seconds = statistics.median(r["seconds"] for r in loads)
    per_app = statistics.median(r["grown"] / r["applications"] for r in loads)
    applications = loads[0]["applications"]
    print(
        f"--state load: {applications:,} applications ({LOAD_APPLICATIONS:,} of twelve kinds "
        f"and their tenants; {loads[0]['unknown']} cannot be priced), {ROUNDS} runs, median"
    )
    print(
        f"  load time   {seconds:6.2f} s      goal < 5 s        "
        f"{'met' if seconds < 5 else 'NOT met'}  (min {min(r['seconds'] for r in loads):.2f},"
        f" max {max(r['seconds'] for r in loads):.2f})"
    )
    cpu = statistics.median(r["cpu"] for r in loads)
    print(
        f"  CPU time    {cpu:6.2f} s      goal < 5 s        {'met' if cpu < 5 else 'NOT met'}"
        f"  (min {min(r['cpu'] for r in loads):.2f}, max {max(r['cpu'] for r in loads):.2f};"
        f" the machine is shared: the steadier figure; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    json_seconds = statistics.median(r["seconds"] for r in json_loads)
    json_cpu = statistics.median(r["cpu"] for r in json_loads)
    print(
        f"  as JSON     {json_seconds:6.2f} s      CPU {json_cpu:.2f} s (the same objects as "
        f"kubectl get -o json Lists; min {min(r['seconds'] for r in json_loads):.2f}, "
        f"max {max(r['seconds'] for r in json_loads):.2f})"
    )
    print(
        f"  RSS growth  {per_app:6,.0f} B/app  goal <= 1,024 B  "
        f"{'met' if per_app <= 1024 else 'NOT met'}"
    )
    seen = statistics.median(r["median"] for r in observes)
    print(
        f"  observe     {seen:6.1f} us     an application seen again with the same values "
        f"(a watch event), CPU, median of {ROUNDS} processes"
    )
    if before is not None:
        print(f"  before ({before}), the same files, alternating with the loads above:")
        for label, new_runs, old_runs in (
            ("YAML", loads, old_loads),
            ("JSON", json_loads, old_json),
        ):
            for key in ("seconds", "cpu"):
                now = statistics.median(r[key] for r in new_runs)
                then = statistics.median(r[key] for r in old_runs)
                print(
                    f"    {label} {'wall' if key == 'seconds' else 'CPU '}  before {then:6.2f} s"
                    f"  after {now:6.2f} s  ratio {now / then:.2f}  (before min "
                    f"{min(r[key] for r in old_runs):.2f}, max {max(r[key] for r in old_runs):.2f})"
                )
        then_rss = statistics.median(r["grown"] / r["applications"] for r in old_loads)
        print(f"    RSS growth  before {then_rss:,.0f} B/app  after {per_app:,.0f} B/app")
        then_seen = statistics.median(r["median"] for r in old_observes)
        print(
            f"    observe     before {then_seen:6.1f} us  after {seen:6.1f} us  "
            f"ratio {seen / then_seen:.2f}"
        )
    print("\nprofile of one YAML load (cProfile: its overhead inflates the total), by own time")
    print(profile)

    if "--load-only" in sys.argv:
        return
    runs: dict[int, list[dict[str, Any]]] = {size: [] for size in CREATE_SIZES}
    for _ in range(ROUNDS):
        for size in CREATE_SIZES:
            runs[size].append(child("--creates", str(size)))

    def figure(size: int, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[size]))

    small, large = CREATE_SIZES
    print(f"\nCREATE decided and applied, {CREATES:,} per run, {ROUNDS} rounds, median p99 (us)")
    print(f"{'':34}{small:>12,} {large:>12,} {'ratio':>7}   goal <= 1.5")
    for frozen in (False, True):
        for forced in (False, True):
            key = f"p99_us_{frozen}_{forced}"
            label = ("frozen" if frozen else "not frozen") + (
                ", full GC on 2%" if forced else ", natural GC"
            )
            ratio = figure(large, key) / figure(small, key)
            verdict = ("met" if ratio <= 1.5 else "NOT met") if frozen else ""
            print(
                f"  {label:32}{figure(small, key):>12.0f} {figure(large, key):>12.0f} "
                f"{ratio:>7.2f}   {verdict}"
            )
    for frozen in (False, True):
        key = f"full_gc_ms_{frozen}"
        label = "full collection, " + ("frozen" if frozen else "not frozen") + " (ms)"
        print(f"  {label:32}{figure(small, key):>12.1f} {figure(large, key):>12.1f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--load"]:
        print(json.dumps(measure_load(sys.argv[2])))
    elif sys.argv[1:2] == ["--observe"]:
        print(json.dumps(measure_observe(sys.argv[2])))
    elif sys.argv[1:2] == ["--profile"]:
        print(json.dumps({"profile": profile_load(sys.argv[2])}))
    elif sys.argv[1:2] == ["--creates"]:
        print(json.dumps(measure_creates(int(sys.argv[2]))))
    else:
        main()

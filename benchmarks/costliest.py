"""The costliest single decisions the bounds allow: CPU per review, in process, before and after.

A fair queue makes one tenant's reviews wait behind its own, but a review already being decided
holds the one event loop until it is done: how long that can be is what any other tenant may
still wait. Each case is a body a tenant can make the API server send (values at their bound of
entries, the longest keys, large strings, deep nesting, and what the values bound never sees:
managedFields), decoded, parsed, decided and answered as ``/validate`` does (in its turn of the
fair queue, where the tree has one); the figure is the median CPU time of three, each with one
number changed so no memo hits, the collector's work included. Beside them the process keeps
``--heap`` applications' worth of live objects out of the collector's frozen generation, as a
replica's state is after a day of churn (objects made since its last full sync), so a
collection set off by a review walks what it would walk on the cluster.

``--before DIR`` runs the same cases with another checkout's code (its ``.venv``'s Python, the
checkout first on the path) in the same rounds, alternating, and prints both side by side.

Run: .venv/bin/python -m benchmarks.costliest [--rounds N] [--heap N] [--before DIR]
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _review(spec: Any, *, managed: Any = None, old: Any = None, kind: str = "VMInstance") -> bytes:
    from tests.builders import review

    operation = "UPDATE" if old is not None else "CREATE"
    body = review(
        kind, "tenant-acme-dev", "vm", spec, dry_run=True, operation=operation, old_spec=old
    )
    if managed is not None:
        body["request"]["object"]["metadata"]["managedFields"] = [{"fieldsV1": managed}]
    return json.dumps(body).encode()


def _keys(count: int, width: int = 5) -> dict[str, Any]:
    return {f"x{key:0{width}d}": key for key in range(count)}


def cases() -> dict[str, Callable[[int], bytes]]:
    vm = {"instanceType": "u1.micro"}
    return {
        "45,000 made-up keys (the heavy-values flood)": lambda i: _review(
            {**vm, "m": i, **_keys(45_000)}
        ),
        "19,990 made-up keys": lambda i: _review({**vm, "m": i, **_keys(19_990)}),
        "49,990 made-up keys": lambda i: _review({**vm, "m": i, **_keys(49_990)}),
        "19,990 keys of 100 characters": lambda i: _review({**vm, "m": i, **_keys(19_990, 100)}),
        "49,990 keys of 100 characters": lambda i: _review({**vm, "m": i, **_keys(49_990, 100)}),
        "19,990 floats": lambda i: _review({**vm, "m": i, "x": [k + 0.5 for k in range(19_990)]}),
        "a 6 MiB string": lambda i: _review({**vm, "m": i, "x": "a" * (6 << 20)}),
        "a 6 MiB string of colons": lambda i: _review({**vm, "m": i, "x": ":" * (6 << 20)}),
        "UPDATE, 9,995 keys old and new": lambda i: _review(
            {**vm, "m": i, **_keys(9_995)}, old={**vm, "m": -i, **_keys(9_995)}
        ),
        "19,000 empty node groups (schema defaults)": lambda i: _review(
            {"m": i, "nodeGroups": {f"g{k}": {} for k in range(19_000)}}, kind="Kubernetes"
        ),
        "1,800 lists nested 10 deep": lambda i: _review(
            {**vm, "m": i, "x": [[[[[[[[[[k]]]]]]]]] for k in range(1_800)]}
        ),
        "119,000 empty lists in managedFields": lambda i: _review(
            {**vm, "m": i}, managed=[[]] * 59_000
        ),
        "199,000 empty lists in managedFields": lambda i: _review(
            {**vm, "m": i}, managed=[[]] * 99_000
        ),
        "399,000 strings of a comma (the count's costliest)": lambda i: _review(
            {**vm, "m": i, "x": [","] * 399_000}
        ),
        "UPDATE, 150,000 commas in cloud-init strings": lambda i: _review(
            {**vm, "m": i, "cloudInit": json.dumps([k % 10 for k in range(75_000)])},
            old={**vm, "m": -i, "cloudInit": json.dumps([k % 10 for k in range(75_000)])},
        ),
        "7 MiB of empty lists in managedFields": lambda i: _review(
            {**vm, "m": i}, managed=[[]] * 1_700_000
        ),
    }


def measure(names: list[str], heap: int = 0) -> dict[str, float]:
    """CPU milliseconds per case (median of three), with this interpreter's ``webhook``, beside
    ``heap`` applications' worth of live objects."""
    from tests.builders import state
    from webhook.admission.admit import Admission
    from webhook.core.admission.decisions import Policy
    from webhook.core.admission.reviews import parse_review, review_response
    from webhook.core.base import json_codec
    from webhook.core.base.json_codec import decode_json, encode_json
    from webhook.http import app as http_app
    from webhook.http import fairness

    # What a replica holds of each application (a few maps and lists), kept alive to the end.
    kept = [
        {"metadata": {"name": f"vm{n}", "labels": {"app": "x"}}, "spec": {"disks": [{"n": n}]}}
        for n in range(heap)
    ]

    # The bound on a body's values before it is decoded, where the tree has one (strings left
    # out of the count where the tree does that).
    bound: int | None = getattr(http_app, "MAX_REVIEW_VALUES", None)
    beyond: Callable[[bytes, int], int | None] | None = getattr(
        json_codec, "json_values_beyond", None
    )
    at_most: Callable[[bytes], int] | None = getattr(json_codec, "json_values_at_most", None)

    def refused(raw: bytes) -> bool:
        if bound is None:
            return False
        if beyond is not None:
            return beyond(raw, bound) is not None
        return at_most is not None and at_most(raw) > bound

    admission = Admission(
        state({"tenant-acme": {"memory": "1Ti"}, "tenant-acme-dev": None}), Policy()
    )
    loop = asyncio.new_event_loop()
    # One review at a time here: nobody waits for a turn.
    fair = fairness.FairAdmission(wait_seconds=60.0) if hasattr(fairness, "FairAdmission") else None

    async def answered(raw: bytes) -> bytes:
        request = parse_review(decode_json(raw))
        decision = await admission.validate(request)
        return encode_json(review_response(request.uid, decision.response()))

    async def in_turn(raw: bytes) -> object:
        if fair is None:
            return await answered(raw)
        return await fair.run("tenant-acme", len(raw), answered(raw))

    made = cases()
    figures = {}
    for name in names:
        spent = []
        for index in range(3):
            raw = made[name](index + 1)
            started = time.thread_time()
            try:
                if refused(raw):
                    raise ValueError("refused before decoding, as /validate does")
                loop.run_until_complete(in_turn(raw))
            except Exception:  # refused at the edge (a 400): the time it took is the figure
                pass
            spent.append(time.thread_time() - started)
        figures[name] = statistics.median(spent) * 1000
    del kept
    return figures


def _run(python: Path, tree: Path, names: list[str], heap: int) -> dict[str, float]:
    code = (  # this file's cases, that tree's code (its ``webhook`` and ``tests.builders``)
        f"import sys, json, importlib.util; sys.path.insert(0, {str(tree)!r}); "
        f"spec = importlib.util.spec_from_file_location('costliest', {__file__!r}); "
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
        f"print(json.dumps(module.measure({names!r}, {heap})))"
    )
    done = subprocess.run([str(python), "-c", code], cwd=tree, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout, run in the same rounds")
    parser.add_argument(
        "--heap",
        type=int,
        default=100_000,
        help="applications' worth of live objects beside the reviews (0: none)",
    )
    args = parser.parse_args()
    names = list(cases())
    trees = [("after", Path(sys.executable), ROOT)]
    if args.before is not None:
        before = args.before.resolve()
        trees.insert(0, ("before", before / ".venv" / "bin" / "python", before))
    rows: dict[str, dict[str, list[float]]] = {label: {} for label, _, _ in trees}
    for _ in range(args.rounds):
        for label, python, tree in trees:
            for name, ms in _run(python, tree, names, args.heap).items():
                rows[label].setdefault(name, []).append(ms)
    header = "".join(f"{label + ' ms':>12}" for label, _, _ in trees)
    print(
        f"CPU per review, median of {args.rounds} rounds x 3 (each a fresh process, beside "
        f"{args.heap:,} applications' worth of live objects)"
    )
    print(f"{'case':<42}{header}")
    for name in names:
        cells = "".join(f"{statistics.median(rows[label][name]):>12.1f}" for label, _, _ in trees)
        print(f"{name:<42}{cells}")


if __name__ == "__main__":
    main()

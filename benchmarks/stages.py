"""Where one admission's time goes: each stage of a cache-miss decision, in process.

``benchmarks.server`` says how fast the webhook answers; this says why. It times, for the same
realistic bodies the server benchmark sends (a VMInstance with its own disks, a Kubernetes
application with its own node groups), each stage a ``/validate`` request passes through:
decoding the body, reading the review, bounding/defaulting/digesting the values, evaluating
the contract (no cache; beside it, the same values through the interpreter the compiled
contracts are tested against, which no request runs), the whole decision with a cold charge
cache (and what is left of it once the two stages before are taken out), encoding the answer,
and the metrics plus the INFO log line. ``total`` is the sum of the measured stages, what the
event loop spends on one request besides aiohttp and TLS. Decoding and encoding are the
server's own (:mod:`webhook.http.codec`). Beside the total, the whole ``/validate`` handler
(body read, decoded, decided, counted, logged, the response built) on bodies received whole,
as aiohttp hands them over: what the stages leave out (the deadlines, the admission's own
checks, building the response) shows as the difference.

Two figures are compared before and after in the same rounds (a ratio above 1 is the saving):
the unknown-key walk over the kind's raw ``openAPISchema`` (the old walk, kept as the tests'
reference) against the walk over the kind's index, and a dry run's decision with its record
signed at once (as before) against the decision that signs only what is read (nothing: a dry
run's answer carries no record).

Stages are interleaved within each round (a noisy neighbour slows them all alike) and every
figure is the median over the rounds, in microseconds of this thread's CPU per request (a
neighbour's turn on the core is not counted). The machine is shared: compare figures from one
run, not across runs.

What the fair queue costs one admission (the goal: at most 5% of its CPU) is the whole handler
against the same handler with the queue's place taken by a pass-through (no queue, no metering,
no collector pause), in turns of 50 bodies on the same bodies, each from a cold charge cache
(which goes first alternates from turn to turn), printed as the median of each round's ratio.

Run: .venv/bin/python -m benchmarks.stages [--rounds N] [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import streams, web
from aiohttp.test_utils import make_mocked_request

from benchmarks.server import BODIES, kubernetes_review, vm_review
from tests.core.pricing.raw_schema_walk import raw_unknown_keys
from webhook.admission.admit import Admission
from webhook.core.admission.decisions import Decision, Policy, decide, decide_prepared
from webhook.core.admission.reviews import AdmissionRequest, parse_review, review_response
from webhook.core.admission.state import ReservationState
from webhook.core.base.json_codec import decode_json, encode_json
from webhook.core.pricing.evaluation import interpret
from webhook.core.pricing.unknown_keys import MAX_FINDINGS, MAX_NODES, unknown_keys
from webhook.http import app as http_app
from webhook.http.metrics import Metrics
from webhook.logs import configure as configure_logs
from webhook.settings import Settings
from webhook.state.manifests import load_state

ROOT = Path(__file__).resolve().parent.parent
STAGES = (
    "decode body",
    "parse_review",
    "values (bound, default, digest)",
    "evaluate (no cache)",
    "decide (cache miss)",
    "response encoding",
    "metrics + log line",
)
# (figure, before, after): each pair timed in the same rounds as the stages.
COMPARED = (
    ("unknown keys", "unknown keys (raw schema, before)", "unknown keys (index, after)"),
    ("decide, dry run", "decide (record signed at once, before)", "decide (cache miss)"),
)
INTERPRETED = "evaluate, interpreted"  # a reference beside its stage, not in the total
HANDLER = "the /validate handler, whole"  # all of the above through aiohttp's handler, no TLS
# The same handler with the fair queue's place taken by a pass-through: no queue, no metering,
# no collector pause; what the scheduler costs one admission is the difference.
UNSCHEDULED = "the handler, fair queue bypassed"
PAIRED = 50  # bodies each side takes in its turn


class _Unscheduled:
    """Runs each review's work at once: the handler as it would be with no scheduling."""

    async def run(self, flow: str, size: int, work: Any) -> tuple[Any, float]:
        return await work, 0.0


class _Protocol:
    """What a request's body stream asks of the connection: never paused (the body is whole)."""

    _reading_paused = False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


def handler_run(app: web.Application, raws: list[bytes]) -> float:
    """Microseconds per request of ``validate`` on whole bodies, as aiohttp hands them over
    (the body already received), the response built; the requests are made before timing."""
    loop = asyncio.new_event_loop()
    try:
        requests = []
        for raw in raws:
            payload = streams.StreamReader(_Protocol(), 2**16, loop=loop)  # type: ignore[arg-type]
            payload.feed_data(raw)
            payload.feed_eof()
            headers = {"Content-Type": "application/json", "Content-Length": str(len(raw))}
            requests.append(
                make_mocked_request(
                    "POST", "/validate", headers, payload=payload, app=app, client_max_size=2**23
                )
            )

        async def serve() -> float:
            started = time.thread_time()
            for request in requests:
                await http_app.validate(request)
            return (time.thread_time() - started) / len(requests) * 1e6

        return loop.run_until_complete(serve())
    finally:
        loop.close()


class Kind:
    """One kind's prepared inputs, with a cursor that walks past the charge cache."""

    def __init__(self, name: str, make: Callable[[int], dict[str, Any]], state: ReservationState):
        self.name = name
        self.state = state
        self.raws = [json.dumps(make(i)).encode() for i in range(BODIES)]
        self.bodies = [json.loads(raw) for raw in self.raws]
        self.requests = [parse_review(body) for body in self.bodies]
        self.cursor = 0  # BODIES is twice the cache's entries: a cyclic walk always misses

    def next_requests(self, count: int) -> list[AdmissionRequest]:
        start = self.cursor
        self.cursor = (self.cursor + count) % BODIES
        return [self.requests[(start + i) % BODIES] for i in range(count)]


def per_request(action: Callable[[int], object], count: int) -> float:
    """Microseconds per call of ``action(i)`` for i in range(count)."""
    started = time.thread_time()
    for index in range(count):
        action(index)
    return (time.thread_time() - started) / count * 1e6


def one_round(
    kind: Kind,
    policy: Policy,
    metrics: Metrics,
    count: int,
    apps: tuple[web.Application, web.Application],
    turn: int,
) -> dict[str, float]:
    state = kind.state
    platform = state.platform
    found = platform.kinds[kind.name]
    raws, bodies = kind.raws[:count], kind.bodies[:count]
    requests = kind.requests[:count]
    specs = [r.object["spec"] if r.object is not None else None for r in requests]
    prepared = [platform.values(kind.name, spec) for spec in specs]
    fresh = kind.next_requests(count)
    decisions: list[Decision] = [decide(r, state, policy) for r in requests]

    def observe(i: int) -> None:
        http_app._observe(
            metrics, "validate", requests[i], decisions[i], 0.001, known=True, flow="t", waited=0.0
        )

    def evaluate(i: int) -> object:
        return found.charge_defaulted(prepared[i].defaulted, platform.catalog, namespace="")

    def interpreted(i: int) -> object:
        contract = found.contract
        assert contract is not None
        return interpret(contract, prepared[i].defaulted, platform.catalog, namespace="")

    def respond(i: int) -> object:
        return encode_json(review_response(requests[i].uid, decisions[i].response()))

    before = kind.next_requests(count)  # misses the cache as ``fresh`` does

    def signing_at_once(i: int) -> object:
        decided = decide_prepared(before[i], state, policy)
        return decided.prepared.factored.record if decided.prepared is not None else None

    raw_schema, index = found.schema, found.key_index
    start = kind.cursor
    kind.next_requests(count)  # the handler's bodies miss the cache too
    whole = [kind.raws[(start + i) % BODIES] for i in range(count)]
    # Scheduled and bypassed in turns of PAIRED bodies each, on the same bodies, each from a
    # cold charge cache, the first of each turn alternating: a neighbour's burst falls on both.
    spent = {HANDLER: 0.0, UNSCHEDULED: 0.0}
    for first, at in enumerate(range(0, count, PAIRED), start=turn):
        chunk = whole[at : at + PAIRED]
        pairs = sorted(zip((HANDLER, UNSCHEDULED), apps, strict=True), reverse=first % 2 == 1)
        for name, app in pairs:
            platform._charges.clear()
            spent[name] += handler_run(app, chunk) * len(chunk)
    handled = {name: total / count for name, total in spent.items()}

    return {
        "decode body": per_request(lambda i: decode_json(raws[i]), count),
        "parse_review": per_request(lambda i: parse_review(bodies[i]), count),
        "values (bound, default, digest)": per_request(
            lambda i: platform.values(kind.name, specs[i]), count
        ),
        "evaluate (no cache)": per_request(evaluate, count),
        INTERPRETED: per_request(interpreted, count),
        "decide (cache miss)": per_request(lambda i: decide(fresh[i], state, policy), count),
        "decide (record signed at once, before)": per_request(signing_at_once, count),
        "unknown keys (raw schema, before)": per_request(
            lambda i: raw_unknown_keys(
                specs[i], raw_schema, max_nodes=MAX_NODES, max_findings=MAX_FINDINGS
            ),
            count,
        ),
        "unknown keys (index, after)": per_request(lambda i: unknown_keys(specs[i], index), count),
        "response encoding": per_request(respond, count),
        "metrics + log line": per_request(observe, count),
        **handled,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=1000, help="per stage and round")
    args = parser.parse_args()
    # The log lines go where the server's would, minus the reader: a sink open until exit
    # (the logging thread may still be writing when main returns).
    sink = open(os.devnull, "w")  # noqa: SIM115
    with contextlib.redirect_stderr(sink):
        configure_logs("INFO")  # the default level: one JSON line per request, as served
    state = load_state([ROOT / "fixtures" / "cozystack", ROOT / "fixtures" / "tenants"])
    policy = Policy()
    metrics = Metrics(lambda: state)
    admission = Admission(state, policy)
    app = http_app.create_app(admission, Settings())
    unscheduled = http_app.create_app(admission, Settings())
    unscheduled[http_app.fairness_key] = _Unscheduled()  # type: ignore[misc]
    kinds = [
        Kind("VMInstance", vm_review, state),
        Kind("Kubernetes", kubernetes_review, state),
    ]
    count = min(args.requests, BODIES)
    # The prepared bodies are tens of thousands of long-lived objects the server never holds:
    # out of the collector's way, so a full collection does not charge them to a stage.
    gc.collect()
    gc.freeze()
    figures: dict[str, dict[str, list[float]]] = {k.name: {} for k in kinds}
    for turn in range(args.rounds):
        for kind in kinds:
            apps = (app, unscheduled)
            for stage, value in one_round(kind, policy, metrics, count, apps, turn).items():
                figures[kind.name].setdefault(stage, []).append(value)
    outcomes = {
        k.name: Counter(decide(r, state, policy).outcome for r in k.requests[:count]) for k in kinds
    }
    print(
        f"in-process stages of a cache-miss /validate, us per request, "
        f"median (min-max) of {args.rounds} interleaved rounds x {count} requests"
    )
    print(f"{'stage':34s}" + "".join(f"{k.name:>24s}" for k in kinds))
    totals = {k.name: 0.0 for k in kinds}
    for stage in STAGES:
        cells = []
        for kind in kinds:
            values = figures[kind.name][stage]
            median = statistics.median(values)
            totals[kind.name] += median
            cells.append(f"{median:9.1f} ({min(values):6.1f}-{max(values):6.1f})")
        print(f"{stage:34s}" + "".join(f"{c:>24s}" for c in cells))
        if stage == "evaluate (no cache)":
            reference = []
            for kind in kinds:
                values = figures[kind.name][INTERPRETED]
                ratio = statistics.median(values) / statistics.median(figures[kind.name][stage])
                reference.append(f"{statistics.median(values):9.1f} (x{ratio:4.2f} slower)")
            print(f"{'  the same, interpreted':34s}" + "".join(f"{c:>24s}" for c in reference))
        if stage == "decide (cache miss)":
            rest = [
                statistics.median(figures[k.name][stage])
                - statistics.median(figures[k.name]["values (bound, default, digest)"])
                - statistics.median(figures[k.name]["evaluate (no cache)"])
                for k in kinds
            ]
            print(f"{'  of which the rest of decide':34s}" + "".join(f"{r:24.1f}" for r in rest))
    print(f"{'total':34s}" + "".join(f"{totals[k.name]:24.1f}" for k in kinds))
    cells = [f"{statistics.median(figures[k.name][HANDLER]):24.1f}" for k in kinds]
    print(f"{HANDLER:34s}" + "".join(cells))
    cells = [f"{statistics.median(figures[k.name][UNSCHEDULED]):24.1f}" for k in kinds]
    print(f"{UNSCHEDULED:34s}" + "".join(cells))
    # Each round's ratio, scheduled over bypassed, from the same round: the goal is <= 1.05x.
    cells = []
    for kind in kinds:
        pairs = zip(figures[kind.name][HANDLER], figures[kind.name][UNSCHEDULED], strict=True)
        ratios = [scheduled / bypassed for scheduled, bypassed in pairs]
        cells.append(f"x{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    print(f"{'  scheduled / bypassed (<= 1.05)':34s}" + "".join(f"{c:>24s}" for c in cells))
    print("before and after, same rounds (x: before / after)")
    for figure, before, after in COMPARED:
        cells = []
        for kind in kinds:
            old = statistics.median(figures[kind.name][before])
            new = statistics.median(figures[kind.name][after])
            cells.append(f"{old:7.1f} -> {new:7.1f} x{old / new:4.2f}")
        print(f"{figure:34s}" + "".join(f"{c:>24s}" for c in cells))
    for name, counts in outcomes.items():
        print(f"{name} outcomes: " + ", ".join(f"{o} {n}" for o, n in sorted(counts.items())))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""decide() latency and state memory as the number of applications grows.

Builds reservation states of 100, 10,000 and 100,000 VMInstance applications spread over
10,000 tenants (100 bounded tenants, each with 99 unbounded children), then times decide() on
the same CREATE against each, side by side. Pool usage is incremental, so the latency should
not grow with the state: the script prints the largest/smallest ratio (the target is < 1.5).
Memory per application is measured with tracemalloc as the growth of the state from the
10,000-application build to the 100,000-application build, divided by the difference.

Run: .venv/bin/python -m benchmarks.decide
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from pathlib import Path

from webhook.core.admission.decisions import Policy, decide
from webhook.core.admission.reviews import parse_review
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import Application
from webhook.state.manifests import load_platform

ROOT = Path(__file__).resolve().parent.parent
SIZES = (100, 10_000, 100_000)
TENANTS = 10_000
TYPES = ("u1.micro", "u1.small", "u1.medium", "u1.large", "cx1.medium", "m1.large")


def build(platform: object, apps: int) -> ReservationState:
    state = ReservationState(platform)  # type: ignore[arg-type]
    for top in range(TENANTS // 100):
        state.observe(
            Application(
                "Tenant",
                "tenant-root",
                f"t{top}",
                {"resourceQuotas": {"cpu": "100000", "memory": "100000Gi"}},
            )
        )
        for child in range(99):
            state.observe(Application("Tenant", f"tenant-t{top}", f"c{child}", {}))
    for index in range(apps):
        tenant = index % TENANTS
        top, child = divmod(tenant, 100)
        namespace = f"tenant-t{top}" if child == 99 else f"tenant-t{top}-c{child}"
        spec = {"instanceType": TYPES[index % len(TYPES)]}
        state.observe(Application("VMInstance", namespace, f"vm-{index:06d}", spec))
    return state


def review() -> dict[str, object]:
    obj = {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMInstance",
        "metadata": {"name": "probe", "namespace": "tenant-t42-c7"},
        "spec": {"instanceType": "u1.medium"},
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "bench",
            "operation": "CREATE",
            "namespace": "tenant-t42-c7",
            "name": "probe",
            "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": "VMInstance"},
            "resource": {
                "group": "apps.cozystack.io",
                "version": "v1alpha1",
                "resource": "vminstances",
            },
            "object": obj,
        },
    }


def latency_us(state: ReservationState, rounds: int = 2_000) -> tuple[float, float]:
    request = parse_review(review())
    policy = Policy()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        decision = decide(request, state, policy)
        samples.append(time.perf_counter_ns() - start)
        assert decision.allowed
    samples.sort()
    return statistics.median(samples) / 1000, samples[int(len(samples) * 0.99)] / 1000


def main() -> None:
    platform = load_platform([ROOT / "fixtures" / "cozystack"])
    results = {}
    for size in SIZES:
        started = time.perf_counter()
        state = build(platform, size)
        built = time.perf_counter() - started
        results[size] = (*latency_us(state), built)
        del state
        gc.collect()
    gc.collect()
    tracemalloc.start()
    base = build(platform, SIZES[1])
    before = tracemalloc.get_traced_memory()[0]
    del base
    gc.collect()
    tracemalloc.reset_peak()
    full = build(platform, SIZES[2])
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_app = (after - before) / (SIZES[2] - SIZES[1])
    del full

    print(f"decide() on one CREATE, {TENANTS:,} tenants")
    print(f"{'applications':>14} {'p50 us':>9} {'p99 us':>9} {'build s':>8}")
    for size, (p50, p99, built) in results.items():
        print(f"{size:>14,} {p50:>9.1f} {p99:>9.1f} {built:>8.1f}")
    smallest, largest = results[SIZES[0]][0], results[SIZES[-1]][0]
    print(f"p50 ratio largest/smallest: {largest / smallest:.2f} (target < 1.5)")
    print(f"state memory per application: {per_app:,.0f} bytes (target < 1024)")


if __name__ == "__main__":
    main()

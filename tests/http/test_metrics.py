"""The metrics the webhook exposes, read as Prometheus would scrape them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.builders import state
from webhook.core.base.quantities import parse_quantity
from webhook.core.capacity.guard import Quota, QuotaBook
from webhook.core.tenancy.applications import Application
from webhook.http.metrics import Metrics


def samples(metrics: Metrics, name: str) -> dict[tuple[str, ...], float]:
    found = {}
    for family in text_string_to_metric_families(metrics.expose().decode()):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sample.labels.values())] = sample.value
    return found


def test_the_guard_shows_need_and_room_per_namespace_with_a_quota() -> None:
    vms = [
        Application("VMInstance", "tenant-acme", f"vm{i}", {"instanceType": "u1.micro"})
        for i in range(13)
    ]
    current = state({"tenant-acme": {"memory": "16Gi", "cpu": "16"}}, *vms)
    quotas = QuotaBook()
    hard = {"requests.memory": parse_quantity("16Gi")}
    quotas.observe("tenant-acme", Quota("tenant-quota", hard, {}))
    metrics = Metrics(lambda: current)
    metrics.watch_guard(lambda: current, quotas)
    # 13 x (1Gi + 270Mi) = 16822Mi against 16384Mi: 438Mi short.
    need = samples(metrics, "reservation_guard_need")
    room = samples(metrics, "reservation_guard_room")
    assert need["tenant-acme", "requests.memory"] == 16822 * 1024**2
    assert room["tenant-acme", "requests.memory"] == -438 * 1024**2
    assert samples(metrics, "reservation_guard_unknown_applications") == {("tenant-acme",): 0}


def test_a_tenant_stored_with_thousands_of_keys_never_floods_metrics_with_series() -> None:
    # Admission refuses more than 64 keys, but a Tenant stored before (the webhook installed
    # on a running cluster, or the kind in mode off) keeps its keys: the pool metrics of one
    # such pool would be five series per key for every scrape, towards a scraper's sample
    # limit (and with it every other tenant's metrics and alerts).
    planted = {f"example.com/key{i:04d}": "1" for i in range(3000)}
    planted["memory"] = "1Mi"
    current = state({"tenant-acme": planted, "tenant-beta": {"memory": "1Gi"}})
    current.observe(Application("Thing", "tenant-acme", "t", {"memory": "2Mi"}))  # over it
    metrics = Metrics(lambda: current)
    budget = samples(metrics, "reservation_pool_budget")
    acme = sorted(key for pool, key in budget if pool == "tenant-acme")
    assert acme == ["memory", "other"]  # the planted keys summed under one label
    assert budget["tenant-acme", "other"] == 3000
    assert budget["tenant-beta", "memory"] == 1024**3
    reserved = samples(metrics, "reservation_pool_reserved")
    assert reserved["tenant-acme", "memory"] == 2 * 1024**2  # the overcommitted key is kept
    assert len([1 for pool, _ in reserved if pool == "tenant-acme"]) == 2


def test_cached_children_count_into_the_series_labels_would_give() -> None:
    metrics = Metrics(lambda: state({}))
    for _ in range(3):
        metrics.observe_latency("validate", "allowed", 0.002)
        metrics.count_decision("VMInstance", "allowed", "fits", "enforce")
    metrics.count_decision("VMInstance", "denied", "exceeded", "enforce")
    metrics.decisions.labels("VMInstance", "allowed", "fits", "enforce").inc()  # the same child
    counted = samples(metrics, "reservation_decisions_total")
    assert counted == {  # labels as the parser orders them: decision, kind, mode, reason
        ("allowed", "VMInstance", "enforce", "fits"): 4.0,
        ("denied", "VMInstance", "enforce", "exceeded"): 1.0,
    }
    latency = samples(metrics, "reservation_admission_duration_seconds_count")
    assert latency == {("allowed", "validate"): 3.0}  # decision, endpoint
    assert len(metrics._decisions) == 2

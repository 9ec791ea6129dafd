"""The server's real ``/metrics``, scraped once per test session, and what it says.

A live replica (the emulated API server, the real platform data, one tenant with a quota,
one kind left unserved so that ``reservation_kind_unavailable`` has a series) answers a few
reviews, takes the Lease and writes its ledger; then its metrics port is scraped over HTTP as
Prometheus would. The alert and dashboard tests take metric names, label names and whole
series from this text only, so a query naming a metric or label the server does not export
finds nothing to match.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp
import promql_parser
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import ROOT, review
from tests.cluster import app, cluster, tenant
from tests.test_live import MICRO, Caller, replica, store, wait_ready
from tests.waiting import eventually
from webhook.tls.certificates import generate

# Labels the scrape adds to every series (the Prometheus operator's ServiceMonitor and the
# VictoriaMetrics operator's VMServiceScrape both add these for an endpoints target).
TARGET_LABELS: Final = frozenset(
    {"job", "instance", "namespace", "service", "pod", "container", "endpoint"}
)
TARGET: Final = {
    "job": "reservation-webhook-metrics",
    "instance": "10.0.0.7:8080",
    "namespace": "cozy-reservation",
    "service": "reservation-webhook-metrics",
    "pod": "reservation-webhook-7d9c-abcde",
    "container": "webhook",
    "endpoint": "metrics",
}
UNSERVED: Final = "buckets"  # a kind whose applications cannot be listed during the scrape


@dataclass
class Scrape:
    """Series as scraped: (name, labels, value), and each name's label names."""

    series: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    labels: dict[str, set[str]] = field(default_factory=dict)

    def named(self, name: str) -> list[tuple[dict[str, str], float]]:
        return [(labels, value) for n, labels, value in self.series if n == name]


def parse(text: str) -> Scrape:
    scrape = Scrape()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            scrape.series.append((sample.name, dict(sample.labels), float(sample.value)))
            scrape.labels.setdefault(sample.name, set()).update(sample.labels)
    return scrape


async def _scrape(workdir: Path) -> str:
    certs = workdir / "certs"
    generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    async with cluster(workdir, unserved=[UNSERVED]) as (server, kubeconfig):
        server.create(tenant("tenant-root", "acme", {"memory": "2Gi", "cpu": "4"}))
        server.create(app("VMInstance", "tenant-acme", "existing", MICRO))
        async with replica(kubeconfig, certs) as webhook:
            services = webhook.services
            assert services is not None
            caller = Caller(certs)
            try:
                await wait_ready(caller, webhook.port)
                fits = review("VMInstance", "tenant-acme", "second", MICRO, uid="u1")
                assert (await caller.validate(webhook.port, fits))["allowed"]
                store(server, fits)
                over = review("VMInstance", "tenant-acme", "third", MICRO, uid="u2")
                assert not (await caller.validate(webhook.port, over))["allowed"]
                await eventually(lambda: services.elector.is_leader)
                services.on_failure("pool-status")  # a duty that raised: its counter's labels
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{webhook.metrics_port}/metrics") as answer,
                ):
                    assert answer.status == 200
                    return await answer.text()
            finally:
                await caller.close()


def scrape_live(workdir: Path) -> Scrape:
    return parse(asyncio.run(_scrape(workdir)))


# ---------------------------------------------------------------------------------------------
# PromQL: what a query selects


@dataclass
class Uses:
    """The metric names a query selects, every label name it mentions, and the values its
    matchers compare each label with."""

    metrics: set[str] = field(default_factory=set)
    labels: set[str] = field(default_factory=set)
    values: dict[str, set[str]] = field(default_factory=dict)


def uses(query: str) -> Uses:
    found = Uses()
    _walk(promql_parser.parse(query), found)
    return found


def _walk(node: object, found: Uses) -> None:
    if isinstance(node, promql_parser.MatrixSelector):
        _walk(node.vector_selector, found)
    elif isinstance(node, promql_parser.VectorSelector):
        if node.name:
            found.metrics.add(node.name)
        for matcher in [
            *node.matchers.matchers,
            *(m for ms in node.matchers.or_matchers for m in ms),
        ]:
            if matcher.name == "__name__":
                found.metrics.add(matcher.value)
                continue
            found.labels.add(matcher.name)
            found.values.setdefault(matcher.name, set()).update(matcher.value.split("|"))
    elif isinstance(node, promql_parser.AggregateExpr):
        if node.modifier is not None:
            found.labels.update(node.modifier.labels)
        _walk(node.expr, found)
        if node.param is not None:
            _walk(node.param, found)
    elif isinstance(node, promql_parser.BinaryExpr):
        modifier = node.modifier
        if modifier is not None:
            if modifier.matching is not None:
                found.labels.update(modifier.matching.labels)
            found.labels.update(modifier.group_labels or ())  # group_left(...) / group_right(...)
        _walk(node.lhs, found)
        _walk(node.rhs, found)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            _walk(arg, found)
    elif isinstance(
        node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr
    ):
        _walk(node.expr, found)


def unexported(query: str, scrape: Scrape) -> list[str]:
    """What ``query`` names that the scrape does not export, one phrase each."""
    found = uses(query)
    problems = [f"metric {name}" for name in sorted(found.metrics - set(scrape.labels))]
    known = set(TARGET_LABELS) | {"le"}
    for name in found.metrics & set(scrape.labels):
        known |= scrape.labels[name]
    problems += [f"label {label}" for label in sorted(found.labels - known)]
    for label, allowed in KNOWN_VALUES.items():
        allowed = allowed | {labels.get(label, "") for _, labels, _ in scrape.series}
        problems += [
            f"{label}={value!r}"
            for value in sorted(found.values.get(label, set()))
            if value not in allowed and value not in (".*", ".+")
        ]
    return problems


def _decision_reasons() -> set[str]:
    """Every reason a decision can carry, read from the source: the ``reason=`` keyword and
    the third argument of ``errored(...)``, wherever they are string constants."""
    found = set()
    for path in (ROOT / "webhook").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            for keyword in node.keywords:
                if keyword.arg == "reason" and isinstance(keyword.value, ast.Constant):
                    found.add(str(keyword.value.value))
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name == "errored" and len(node.args) >= 3 and isinstance(node.args[2], ast.Constant):
                found.add(str(node.args[2].value))
    return found


KNOWN_VALUES: Final[Mapping[str, set[str]]] = {
    "reason": _decision_reasons(),
    "mode": {"enforce", "warn", "off"},
    "decision": {"allowed", "denied", "warned", "skipped", "error"},
}


def grafana_free(query: str) -> str:
    """A dashboard query with Grafana's variables replaced, as Grafana does before sending."""
    for variable, value in (
        ("$__rate_interval", "5m"),
        ("$__interval", "1m"),
        ("$__range", "1h"),
        ("$pool", ".*"),
        ("$resource", ".*"),
    ):
        query = query.replace(variable, value)
    return query


def iter_queries(node: object) -> Iterator[str]:
    """Every ``expr`` in a dashboard's panels (rows' panels too)."""
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for value in node.values():
            yield from iter_queries(value)
    elif isinstance(node, list):
        for value in node:
            yield from iter_queries(value)

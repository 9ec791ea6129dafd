"""The Grafana dashboard: every query names only what the server exports, it covers what an
operator watches, and it loads in Grafana's own schema (grafana-foundation-sdk's models)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Final

import promql_parser
import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import prometheus, timeseries
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel

from tests.deploy.test_manifests import find, render
from tests.monitoring.scrape import Scrape, grafana_free, iter_queries, unexported, uses

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD: Final = (
    ROOT / "deploy" / "overlays" / "monitoring" / "dashboards" / "reservation-webhook.json"
)
LABEL_VALUES: Final = re.compile(r"label_values\((\w+),\s*(\w+)\)")


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(data: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in data["panels"]:
        found.append(panel)
        found.extend(panel.get("panels") or [])
    return found


def test_every_query_uses_only_metrics_and_labels_the_server_exports(scrape: Scrape) -> None:
    data = dashboard()
    queries = list(iter_queries(data["panels"]))
    assert len(queries) >= 15
    problems = {q: found for q in queries if (found := unexported(grafana_free(q), scrape))}
    assert problems == {}


def test_the_checker_finds_a_metric_or_label_the_server_does_not_export(scrape: Scrape) -> None:
    assert unexported("sum by (pool) (reservation_pool_reserve)", scrape) == [
        "metric reservation_pool_reserve",
        "label pool",
    ]
    assert unexported("sum by (tenant) (reservation_pool_reserved)", scrape) == ["label tenant"]
    assert unexported('rate(reservation_decisions_total{reason="exceded"}[5m])', scrape) == [
        "reason='exceded'"
    ]


def test_every_variable_reads_an_exported_label(scrape: Scrape) -> None:
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = LABEL_VALUES.fullmatch(variable["query"]["query"])
        assert match, variable["query"]
        metric, label = match.groups()
        assert label in scrape.labels.get(metric, set()), (metric, label)


@pytest.mark.parametrize(
    ("topic", "metrics", "grouped_by"),
    [
        pytest.param(
            "pools",
            {"reservation_pool_reserved", "reservation_pool_budget"},
            {"pool", "resource"},
            id="pools-reserved-vs-budget",
        ),
        pytest.param(
            "decisions",
            {"reservation_decisions_total"},
            {"reason", "mode"},
            id="decisions-by-reason-and-mode",
        ),
        pytest.param(
            "latency",
            {"reservation_admission_duration_seconds_bucket"},
            {"le"},
            id="admission-latency",
        ),
        pytest.param(
            "batches", {"reservation_ledger_batch_size_bucket"}, {"le"}, id="ledger-batch-sizes"
        ),
        pytest.param("conflicts", {"reservation_ledger_conflicts"}, set(), id="ledger-conflicts"),
        pytest.param("holds", {"reservation_ledger_holds"}, set(), id="ledger-holds"),
        pytest.param("sync", {"reservation_state_ready"}, set(), id="state-sync"),
        pytest.param("kinds", {"reservation_kind_unavailable"}, {"kind"}, id="unavailable-kinds"),
    ],
)
def test_a_panel_shows(topic: str, metrics: set[str], grouped_by: set[str]) -> None:
    for panel in panels(dashboard()):
        found = [uses(grafana_free(t["expr"])) for t in panel.get("targets", [])]
        named = set().union(*(u.metrics for u in found)) if found else set()
        labels = set().union(*(u.labels for u in found)) if found else set()
        if metrics <= named and grouped_by <= labels:
            return
    pytest.fail(f"no panel shows {topic}: {sorted(metrics)} by {sorted(grouped_by)}")


def subset(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Where ``ours`` has something ``theirs`` lacks or holds differently."""
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [path]
        lost = []
        for key, value in ours.items():
            if key not in theirs:
                lost.append(f"{path}.{key}")
            else:
                lost += subset(value, theirs[key], f"{path}.{key}")
        return lost
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            return [path]
        return [
            p
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
            for p in subset(a, b, f"{path}[{i}]")
        ]
    return [] if ours == theirs else [path]


def loaded(data: dict[str, Any]) -> tuple[Dashboard, dict[str, Any]]:
    register_default_plugins()
    model = Dashboard.from_json(copy.deepcopy(data))
    return model, json.loads(json.dumps(model, cls=JSONEncoder))


def test_the_dashboard_loads_in_grafanas_schema_without_losing_a_field() -> None:
    """grafana-foundation-sdk carries Grafana's dashboard schema as models: every panel and
    query decodes as its typed model (a timeseries panel's options, a Prometheus query), and
    encoding the model again keeps every field written (none unknown to the schema)."""
    data = dashboard()
    model, again = loaded(data)
    assert subset(data, again) == []
    assert model.uid == "reservation-webhook"
    for panel in model.panels or []:
        if isinstance(panel, RowPanel):
            continue
        assert isinstance(panel, Panel)
        assert panel.type_val == "timeseries"
        assert isinstance(panel.options, timeseries.Options)
        assert panel.targets
        for target in panel.targets:
            assert isinstance(target, prometheus.Dataquery)
            promql_parser.parse(grafana_free(target.expr))
    ids = [p["id"] for p in panels(data)]
    assert len(ids) == len(set(ids))


def test_a_field_grafana_does_not_know_is_found() -> None:
    data = dashboard()
    data["panels"][1]["targetz"] = data["panels"][1].pop("targets")
    assert ".panels[1].targetz" in subset(data, loaded(data)[1])


def test_the_overlay_ships_the_dashboard_in_a_configmap_for_grafanas_sidecar() -> None:
    config_map = find(
        render("deploy/overlays/monitoring"), "ConfigMap", "reservation-webhook-dashboard"
    )
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["reservation-webhook.json"]) == dashboard()

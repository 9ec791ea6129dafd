"""The alerts as code, tested with ``promtool test rules`` over series the server exports.

The rules are the PrometheusRule that ``kubectl kustomize deploy/overlays/monitoring``
renders. Every input series is a series scraped from a live replica's ``/metrics`` (names and
labels as they are, plus the labels the scrape adds), with only its values set by the case:
an alert that names a metric or a label the server does not export finds no series, does not
fire, and fails its case. Each case also runs on the healthy baseline, where nothing fires.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.deploy.test_manifests import find, render
from tests.monitoring.scrape import TARGET, Scrape, unexported

pytestmark = pytest.mark.promtool

OVERLAY: Final = "deploy/overlays/monitoring"
README: Final = Path(__file__).resolve().parents[2] / "docs/operators/policy-reports-and-alerts.md"
MINUTES: Final = 180  # samples per series in a case, one a minute (or one an hour, see below)

Labels = dict[str, str]
# A case's change to one scraped series: its values (promtool's expanding notation), or None
# to leave the series out.
Change = Callable[[Labels, float], str | None]


@dataclass(frozen=True)
class Case:
    changes: dict[str, Change] = field(default_factory=dict)
    # Series added as copies of a scraped one (name), with labels replaced, and their values.
    added: tuple[tuple[str, Labels, str], ...] = ()
    labels: Labels = field(default_factory=dict)  # the alert's labels besides severity
    at: str = "150m"
    interval: str = "1m"
    drop_all: bool = False


def const(value: float) -> Change:
    return lambda labels, old: f"{value:g}x{MINUTES}"


def pool_over(labels: Labels, old: float) -> str:
    if labels["resource"] != "memory":
        return f"{old:g}x{MINUTES}"
    return f"{3 * 2**30}x{MINUTES}"  # 3Gi reserved in a 2Gi pool


CASES: Final[dict[str, Case]] = {
    "ReservationWebhookNoReadyReplica": Case(changes={"reservation_state_ready": const(0)}),
    "ReservationWebhookAdmissionErrors": Case(
        added=(("reservation_decisions_total", {"reason": "internal-error"}, "0+10x180"),)
    ),
    "ReservationWebhookStateNotSynced": Case(
        changes={"reservation_state_ready": const(0)}, labels={"pod": TARGET["pod"]}
    ),
    "ReservationWebhookKindUnavailable": Case(
        changes={"reservation_kind_unavailable": const(1)}, labels={"kind": "Bucket"}
    ),
    "ReservationWebhookCertificateExpiring": Case(
        # 10 days after the case's time 0: within 14 days from the start.
        changes={"reservation_certificate_expiry_timestamp_seconds": const(10 * 86400)}
    ),
    "ReservationWebhookRecordKeysNotRead": Case(
        changes={"reservation_record_keys_read_timestamp_seconds": const(60)},
        labels={"pod": TARGET["pod"]},
    ),
    "ReservationWebhookRecordKeyRotationUnfinished": Case(
        changes={"reservation_record_keys_previous": const(1)}, interval="1h", at="170h"
    ),
    "ReservationWebhookDrift": Case(changes={"reservation_pool_drift": const(2)}),
    "ReservationWebhookLedgerConflicts": Case(
        changes={"reservation_ledger_conflicts": lambda labels, old: "0+120x180"}
    ),
    "ReservationWebhookTryAgain": Case(
        added=(("reservation_decisions_total", {"reason": "contention"}, "0+12x180"),)
    ),
    "ReservationWebhookPoolOvercommitted": Case(
        changes={"reservation_pool_reserved": pool_over},
        labels={"pool": "tenant-acme", "resource": "memory"},
    ),
    "ReservationWebhookLeaderMissing": Case(changes={"reservation_leader": const(0)}),
}

# The healthy baseline: what a replica exports when all is well. Timestamps scraped now are
# far in the case's future (its clock starts at 0), so they stand as they are.
HEALTHY: Final[dict[str, Change]] = {
    "reservation_kind_unavailable": lambda labels, old: None,
    "reservation_record_keys_read_timestamp_seconds": lambda labels, old: "0+60x180",
}


def rules() -> list[dict[str, Any]]:
    rule = find(render(OVERLAY), "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def unannotated() -> list[dict[str, Any]]:
    """The rules without annotations: promtool compares annotations too, and theirs are
    templates over the value (checked by ``promtool check rules``); the cases test labels."""
    groups = rules()
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return groups


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in rules() for r in group["rules"] if "alert" in r}


def series_text(name: str, labels: Labels) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def input_series(scrape: Scrape, case: Case | None) -> list[dict[str, str]]:
    changes = {**HEALTHY, **(case.changes if case else {})}
    found = []
    if case is not None and case.drop_all:
        return []
    for name, labels, value in scrape.series:
        if name.endswith("_created"):
            continue  # creation times: not a series an alert or a panel reads
        change = changes.get(name)
        values = change(labels, value) if change else f"{value:g}x{MINUTES}"
        if values is not None:
            found.append({"series": series_text(name, {**labels, **TARGET}), "values": values})
    for name, replaced, values in case.added if case else ():
        template = scrape.named(name)
        assert template, f"the server exports no {name} to copy"
        labels = {**template[0][0], **replaced, **TARGET}
        found.append({"series": series_text(name, labels), "values": values})
    return found


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip(
            "promtool is not on PATH: install Debian's prometheus package "
            "(apt-get install -y prometheus), as .ci/run does where apt can"
        )
    return found


def run_promtool(
    tmp_path: Path,
    groups: list[dict[str, Any]],
    tests: list[dict[str, Any]],
    *,
    every: str = "1m",
) -> str:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": every, "tests": tests})
    )
    done = subprocess.run(
        [promtool(), "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def case_tests(scrape: Scrape, name: str, case: Case, severity: str) -> list[dict[str, Any]]:
    fires = {
        "interval": case.interval,
        "input_series": input_series(scrape, case),
        "alert_rule_test": [
            {
                "eval_time": case.at,
                "alertname": name,
                "exp_alerts": [{"exp_labels": {**case.labels, "severity": severity}}],
            }
        ],
    }
    quiet = {
        "interval": case.interval,
        "input_series": input_series(scrape, None),
        "alert_rule_test": [{"eval_time": case.at, "alertname": name, "exp_alerts": []}],
    }
    return [fires, quiet]


def test_every_alert_has_a_case_and_a_runbook_section() -> None:
    found = alerts()
    assert set(found) == set(CASES)
    headings = README.read_text()
    for name, rule in found.items():
        assert (
            rule["annotations"]["runbook_url"]
            == f"docs/operators/policy-reports-and-alerts.md#alert-{name.lower()}"
        )
        assert f"#### Alert: {name}\n" in headings, f"the docs have no runbook section for {name}"


def test_the_rules_pass_promtools_check(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules()}))
    done = subprocess.run(
        [promtool(), "check", "rules", "rules.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_names_only_metrics_and_labels_the_server_exports(scrape: Scrape) -> None:
    problems = {
        name: found
        for name, rule in alerts().items()
        if (found := unexported(rule["expr"], scrape))
    }
    assert problems == {}


@pytest.mark.parametrize("name", list(CASES))
def test_the_alert_fires_from_real_series_and_not_on_a_healthy_replica(
    tmp_path: Path, scrape: Scrape, name: str
) -> None:
    severity = alerts()[name]["labels"]["severity"]
    case = CASES[name]
    tests = case_tests(scrape, name, case, severity)
    run_promtool(tmp_path, unannotated(), tests, every=case.interval)


def test_no_series_scraped_at_all_is_no_ready_replica(tmp_path: Path, scrape: Scrape) -> None:
    name = "ReservationWebhookNoReadyReplica"
    gone = Case(drop_all=True)
    tests = [
        {
            "interval": "1m",
            "input_series": [],
            "alert_rule_test": [
                {
                    "eval_time": "10m",
                    "alertname": name,
                    "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                }
            ],
        }
    ]
    assert input_series(scrape, gone) == []
    run_promtool(tmp_path, unannotated(), tests)


@pytest.mark.parametrize(
    ("name", "wrong", "right"),
    [
        pytest.param(
            "ReservationWebhookDrift",
            "reservation_pool_drifts",
            "reservation_pool_drift",
            id="misspelt-metric",
        ),
        pytest.param(
            "ReservationWebhookKindUnavailable",
            "by (application)",
            "by (kind)",
            id="label-not-exported",
        ),
    ],
)
def test_an_alert_on_something_the_server_does_not_export_fails_its_case(
    tmp_path: Path, scrape: Scrape, name: str, wrong: str, right: str
) -> None:
    """The cases can fail: the same alert naming a metric or label the server lacks."""
    groups = rules()
    for rule in groups[0]["rules"]:
        if rule.get("alert") == name:
            assert right in rule["expr"]
            rule["expr"] = rule["expr"].replace(right, wrong)
            if "$labels.kind" in rule["annotations"]["summary"]:
                rule["annotations"] = {
                    k: v.replace("$labels.kind", "$labels.application")
                    for k, v in rule["annotations"].items()
                }
            assert unexported(rule["expr"], scrape)
    severity = alerts()[name]["labels"]["severity"]
    with pytest.raises(AssertionError, match="FAILED"):
        run_promtool(tmp_path, groups, case_tests(scrape, name, CASES[name], severity)[:1])

"""Replay decides every write again; under the log's own policy it reproduces the log."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tests.audit.logs import (
    PLATFORM,
    RULE_CHANGE,
    START_FILES,
    history,
    phase_of,
    recorded_decisions,
    truth,
    writes,
)
from webhook.core.admission.decisions import Policy
from webhook.core.audit.events import parse_time
from webhook.core.audit.replay import Replayer
from webhook.core.audit.summary import Filters
from webhook.core.base.quantities import parse_quantity
from webhook.state.manifests import load_state


def replay(policy: Policy | None = None, **kwargs: Any) -> dict[str, Any]:
    budgets = kwargs.pop("budgets", None)
    state = kwargs.pop("state", ())
    past = history(*state)
    if budgets:
        past.budgets = budgets
        past._apply_budgets()
    replayer = Replayer(past, policy, **kwargs)
    for write in writes(kinds=past.kinds):
        replayer.add(write)
    return replayer.result(suggest=True)


def test_under_the_logs_own_policy_every_recorded_decision_is_reproduced() -> None:
    result = replay()
    [changed] = result["mismatches"]  # but the one today's carve-out rule decides otherwise
    assert changed["auditID"] == RULE_CHANGE
    assert changed["decision"] == {"recorded": "allowed", "replayed": "denied"}
    assert result["decided"] == len(recorded_decisions())
    assert result["notReplayed"] == []


def test_enforce_denies_exactly_what_warn_warned_about_and_what_enforce_denied() -> None:
    recorded = recorded_decisions()
    denied = {d["auditID"]: d for d in replay(Policy("enforce"))["denied"]}
    assert set(denied) == {a for a, d in recorded.items() if d in ("warned", "denied")} | {
        RULE_CHANGE
    }
    in_warn = {a for a, d in denied.items() if phase_of(d["time"]) in ("setup", "warn")}
    assert in_warn == {a for a, d in recorded.items() if d == "warned"}
    # ... and those are what kubectl printed "would be denied" for
    assert len(in_warn) == sum(op["would_deny"] for op in truth()["operations"])


def test_starting_from_the_start_snapshot_the_warn_and_enforce_phases_reproduce() -> None:
    since = parse_time(next(p["started"] for p in truth()["phases"] if p["name"] == "warn"))
    result = replay(state=(PLATFORM, *START_FILES), filters=Filters(since=since))
    assert [m["auditID"] for m in result["mismatches"]] == [RULE_CHANGE]
    assert result["decided"] == sum(1 for a in recorded_decisions() if a not in _setup_ids())


def _setup_ids() -> set[str]:
    return {w.audit_id for w in writes() if phase_of(w.timestamp) == "setup"}


def test_a_pool_first_overflows_when_a_warned_write_is_stored() -> None:
    pools = {p["pool"]: p for p in replay()["pools"]}
    gamma = pools["tenant-gamma"]
    assert gamma["firstOverflow"] == gamma["overflowedBy"]["time"]
    assert gamma["overflowedBy"]["name"] == "batch-1"
    assert pools["tenant-acme-prod"]["firstOverflow"] is None


def test_lowering_a_tenant_quota_below_its_usage_shows_as_an_overflow() -> None:
    ci = {p["pool"]: p for p in replay()["pools"]}["tenant-beta-ci"]
    assert ci["overflowedBy"]["kind"] == "Tenant"


def test_each_suggested_budget_would_have_denied_nothing_in_its_pool() -> None:
    pools = replay(Policy("enforce"))["pools"]
    for pool in pools:
        budget = {k: parse_quantity(v) for k, v in pool["suggestedBudget"].items()}
        again = replay(Policy("enforce"), budgets={pool["pool"]: budget})
        assert [d for d in again["denied"] if d["pool"] == pool["pool"]] == [], pool["pool"]


def test_a_what_if_budget_denies_what_it_cannot_hold() -> None:
    tight = {
        "tenant-acme-prod": {"cpu": Decimal(1), "memory": Decimal(2**31), "storage": Decimal(2**40)}
    }
    denied = replay(Policy("enforce"), budgets=tight)["denied"]
    assert {"tenant-acme-prod"} <= {d["namespace"] for d in denied}


def test_writes_logged_without_bodies_are_named_with_what_replay_needs() -> None:
    import json

    from tests.audit.logs import events
    from webhook.core.audit.events import write_from_event

    past = history()
    replayer = Replayer(past, Policy("enforce"))
    for event in events():
        if event.get("objectRef", {}).get("apiGroup") == "apps.cozystack.io":
            event = {k: v for k, v in event.items() if k not in ("requestObject", "responseObject")}
            event["level"] = "Metadata"
        write = write_from_event(json.loads(json.dumps(event)), kinds=past.kinds)
        if write is not None:
            replayer.add(write)
    result = replayer.result()
    # every create and update, the label-only patch too: without bodies nothing tells it apart
    assert result["missingBodies"] == 75
    assert result["decided"] == 0
    assert "RequestResponse" in result["note"]
    assert "cozystack-api" in result["note"]


def test_a_start_state_loads_as_the_replay_starting_point() -> None:
    state = load_state([str(PLATFORM), *map(str, START_FILES)])
    assert {v.namespace for v in state.tree.pools()} >= {"tenant-acme", "tenant-beta"}

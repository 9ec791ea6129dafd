"""Server settings for the metrics port, the record key and the overcommit rules."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from webhook.settings import SettingsError, load_settings


def test_metrics_listen_on_their_own_port_defaulting_to_the_listen_host() -> None:
    settings = load_settings({"listen": "0.0.0.0:8443"}, environ={})
    assert (settings.metrics_host, settings.metrics_port) == ("0.0.0.0", 8080)
    moved = load_settings({}, environ={"WEBHOOK_METRICS_LISTEN": "127.0.0.1:9090"})
    assert (moved.metrics_host, moved.metrics_port) == ("127.0.0.1", 9090)
    with pytest.raises(SettingsError, match="metrics-listen: 'nope' is not HOST:PORT"):
        load_settings({"metrics_listen": "nope"}, environ={})


def test_overcommit_rules_from_flags_and_environment() -> None:
    rules = load_settings(
        {"overcommit_admins": ["platform-ops", "system:serviceaccount:cozy-system:rollout"]},
        environ={
            "WEBHOOK_OVERCOMMIT_MAX": "memory=1.2 nvidia.com/gpu=2",
            "WEBHOOK_OVERCOMMIT_STEP": "0.05",
        },
    ).policy.overcommit
    assert rules.admins == {"platform-ops", "system:serviceaccount:cozy-system:rollout"}
    assert rules.maximum == {
        "cpu": Decimal(4),
        "memory": Decimal("1.2"),
        "nvidia.com/gpu": Decimal(2),
    }
    assert rules.step == Decimal("0.05")
    defaults = load_settings({}, environ={}).policy.overcommit
    assert defaults.admins == {"system:masters", "cozystack-cluster-admin"}


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ({"overcommit_max": ["memory=0.5"]}, "overcommit-max"),
        ({"overcommit_max": ["memory"]}, "overcommit-max"),
        ({"overcommit_step": "0"}, "overcommit-step"),
        ({"overcommit_step": "x"}, "overcommit-step"),
    ],
)
def test_bad_overcommit_settings_are_refused_by_name(flags: dict[str, object], why: str) -> None:
    with pytest.raises(SettingsError, match=why):
        load_settings(flags, environ={})


def test_escrow_is_off_unless_the_operator_turns_it_on() -> None:
    assert load_settings({}, environ={}).escrow is False
    assert load_settings({"escrow": "on"}, environ={}).escrow is True
    assert load_settings({}, environ={"WEBHOOK_ESCROW": "true"}).escrow is True
    with pytest.raises(SettingsError, match="escrow: 'maybe' is not on or off"):
        load_settings({"escrow": "maybe"}, environ={})


def test_an_unobserved_admission_is_held_until_its_request_can_no_longer_be_stored() -> None:
    # kube-apiserver stores an admitted request within its --request-timeout or never; the
    # hold must outlive that, plus the skew between replicas' clocks, whatever the timeout.
    assert load_settings({}, environ={}).grace_seconds == 65.0
    assert load_settings({"timeout_seconds": 30}, environ={}).grace_seconds == 65.0
    slow = load_settings({}, environ={"WEBHOOK_API_REQUEST_TIMEOUT_SECONDS": "120"})
    assert slow.grace_seconds == 125.0
    assert slow.api_request_timeout_seconds == 120.0
    chosen = {"WEBHOOK_PENDING_GRACE_SECONDS": "30"}
    assert load_settings({}, environ=chosen).grace_seconds == 30.0  # the operator's choice
    with pytest.raises(SettingsError, match="api-request-timeout-seconds: must be positive"):
        load_settings({}, environ={"WEBHOOK_API_REQUEST_TIMEOUT_SECONDS": "0"})


def test_dry_runs_are_held_unless_the_operator_turns_it_off() -> None:
    assert load_settings({}, environ={}).dry_run_holds is True
    assert load_settings({"dry_run_holds": "off"}, environ={}).dry_run_holds is False
    assert load_settings({}, environ={"WEBHOOK_DRY_RUN_HOLDS": "false"}).dry_run_holds is False
    with pytest.raises(SettingsError, match="dry-run-holds: 'maybe' is not on or off"):
        load_settings({"dry_run_holds": "maybe"}, environ={})


def test_a_tenants_share_of_a_pools_ledger_from_flag_environment_and_file(
    tmp_path: Path,
) -> None:
    assert load_settings({}, environ={}).ledger_namespace_share == 0.1
    flag = load_settings({"ledger_namespace_share": "0.25"}, environ={})
    assert flag.ledger_namespace_share == 0.25
    env = load_settings({}, environ={"WEBHOOK_LEDGER_NAMESPACE_SHARE": "0.05"})
    assert env.ledger_namespace_share == 0.05
    config = tmp_path / "settings.yaml"
    config.write_text("ledgerNamespaceShare: 0.5\n")
    assert load_settings({"config": str(config)}, environ={}).ledger_namespace_share == 0.5


@pytest.mark.parametrize("value", ["0", "-0.1", "1.5", "half"])
def test_a_share_outside_zero_to_one_is_refused_by_name(value: str) -> None:
    with pytest.raises(SettingsError, match="ledger-namespace-share"):
        load_settings({"ledger_namespace_share": value}, environ={})


def test_watch_resync_from_flag_and_environment_with_zero_for_off() -> None:
    assert load_settings({}, environ={}).watch_resync_seconds == 300.0
    assert load_settings({"watch_resync_seconds": "60"}, environ={}).watch_resync_seconds == 60
    off = load_settings({}, environ={"WEBHOOK_WATCH_RESYNC_SECONDS": "0"})
    assert off.watch_resync_seconds == 0
    with pytest.raises(SettingsError, match="watch-resync-seconds"):
        load_settings({"watch_resync_seconds": "-1"}, environ={})


@pytest.mark.parametrize(
    "flags",
    [
        {"watch_resync_seconds": "nan"},
        {"watch_resync_seconds": "inf"},
        {"shutdown_seconds": "nan"},
        {"ledger_namespace_share": "nan"},
    ],
)
def test_a_number_setting_of_nan_or_infinity_is_refused(flags: dict[str, object]) -> None:
    # nan passes every range check's "else": a resync of nan seconds would read every kind
    # at every tick, a share of nan would hold no limit.
    with pytest.raises(SettingsError, match="not a finite number"):
        load_settings(flags, environ={})


@pytest.mark.parametrize("value", [True, False])
def test_a_number_setting_written_as_a_boolean_is_refused_not_read_as_one(value: bool) -> None:
    # A settings file's `timeoutSeconds: true` is Python's 1: it was taken as a 1 s timeout.
    with pytest.raises(SettingsError, match=f"timeout-seconds: {value} is not a number"):
        load_settings({"timeout_seconds": value}, environ={})
    with pytest.raises(SettingsError, match="shutdown-seconds"):
        load_settings({"shutdown_seconds": value}, environ={})


def test_a_fractional_integer_setting_is_refused_not_truncated() -> None:
    # int(2.9) is 2: a file's `timeoutSeconds: 2.9` silently became 2.
    with pytest.raises(SettingsError, match=r"timeout-seconds: 2\.9 is not a whole number"):
        load_settings({"timeout_seconds": 2.9}, environ={})
    assert load_settings({"timeout_seconds": 3.0}, environ={}).timeout_seconds == 3


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_an_infinite_integer_setting_from_a_file_is_refused_not_a_crash(value: float) -> None:
    # A YAML file's `.inf` is a float: int() of it raises OverflowError, not ValueError, and
    # start-up died with a traceback instead of naming the setting.
    with pytest.raises(SettingsError, match="timeout-seconds"):
        load_settings({"timeout_seconds": value}, environ={})


def test_the_shutdown_delay_is_read_from_the_environment_and_bounded() -> None:
    loaded = load_settings({}, environ={"WEBHOOK_SHUTDOWN_DELAY_SECONDS": "5"})
    assert loaded.shutdown_delay_seconds == 5.0
    assert load_settings({}, environ={}).shutdown_delay_seconds == 0.0
    for value in ("-1", "600"):
        with pytest.raises(SettingsError, match="shutdown-delay-seconds: must be between 0 and 60"):
            load_settings({}, environ={"WEBHOOK_SHUTDOWN_DELAY_SECONDS": value})

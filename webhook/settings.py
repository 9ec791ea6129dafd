"""Server settings: one frozen value, from flags, environment variables and a settings file.

Precedence, highest first: command-line flags, ``WEBHOOK_*`` environment variables, the YAML
settings file (``--config``), built-in defaults. Every setting has all three spellings: flag
``--timeout-seconds``, variable ``WEBHOOK_TIMEOUT_SECONDS``, file key ``timeoutSeconds``.
Invalid values are refused at start with the setting's name.

Over 400 lines, and kept whole: every setting's field, its three spellings and its check are
read together, and one file is where an operator's setting is found from its name.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Final, cast

import yaml

from webhook.core.admission.decisions import MODES, Mode, Policy
from webhook.core.base.spelling import did_you_mean
from webhook.core.tenancy.overcommit import (
    DEFAULT_ADMINS,
    DEFAULT_MAXIMUM,
    DEFAULT_STEP,
    OvercommitRules,
)

__all__ = ["LOG_LEVELS", "Settings", "SettingsError", "check_mode_kinds", "load_settings"]

LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# controller-runtime's bound: two 1.5 MB etcd objects (object and oldObject) plus envelope.
MAX_REQUEST_BYTES: Final = 7 * 1024 * 1024
# Wall clocks of two replicas may differ by up to this much (docs/escrow.md, "Bounds").
SKEW_SECONDS: Final = 5.0


class SettingsError(ValueError):
    """A setting has a value the server cannot run with."""


@dataclass(frozen=True)
class Settings:
    state: tuple[str, ...] = ()
    kubeconfig: str = ""
    listen_host: str = "127.0.0.1"
    listen_port: int = 8443
    # /metrics on a port of its own, plain HTTP, so a NetworkPolicy can admit the scraper there
    # and only the API server's callers on the admission port. Host "" is the listen host.
    metrics_listen_host: str = ""
    metrics_port: int = 8080
    record_key_file: str = ""  # offline: the key signing charge records (else one per process)
    cert_dir: str = "certs"
    client_ca: str = ""
    timeout_seconds: int = 10
    mode: Mode = "enforce"
    mode_for: Mapping[str, Mode] = field(default_factory=dict)
    # Who may set an overcommit factor (groups or user names) and within which bounds.
    overcommit_admins: frozenset[str] = DEFAULT_ADMINS
    overcommit_max: Mapping[str, Decimal] = field(default_factory=lambda: dict(DEFAULT_MAXIMUM))
    overcommit_step: Decimal = DEFAULT_STEP
    cert_reload_seconds: float = 10.0
    shutdown_seconds: float = 20.0
    # After SIGTERM, how long to keep serving with readiness failing before the listener
    # closes: an endpoint removed reaches every node's proxy a few seconds late, and a
    # webhook call refused meanwhile fails its write (the Deployment ships 5 s).
    shutdown_delay_seconds: float = 0.0
    log_level: str = "INFO"
    # Live cluster state (no --state): who we are and where our objects live.
    namespace: str = "cozy-reservation"
    replica: str = field(default_factory=socket.gethostname)
    lease_name: str = "reservation-webhook"
    # kube-apiserver's --request-timeout: a request the webhook admitted at t is stored before
    # t plus this, or never (the webhook call is part of that request).
    api_request_timeout_seconds: float = 60.0
    pending_grace_seconds: float = 0.0  # 0: the longer of the store bound and 2 x timeout + 5 s
    # Hold a dry run's increase like a write's: cozystack-api stores what it calls a dry run.
    dry_run_holds: bool = True
    # Admit CREATEs from escrowed slices of busy pools' room, in memory (docs/escrow.md).
    escrow: bool = False
    watch_read_timeout: float = 90.0
    # Every kind is read this often to find what its watch lost (0: only when the ledger waits).
    watch_resync_seconds: float = 300.0
    # The share of a pool's ledger (MAX_ENTRIES entries) one tenant's unsettled holds may take.
    ledger_namespace_share: float = 0.1
    # Reviews one tenant (a top-level tenant's subtree) may have waiting for their turn; the
    # next is denied with 429 (as API Priority and Fairness queues hold 50 by default).
    fair_queue_length: int = 50

    @property
    def grace_seconds(self) -> float:
        """How long an admitted charge is held before it is released unobserved: never before
        the request it admitted can no longer be stored (the store bound plus five seconds of
        clock skew between replicas), so a slow write is never stored uncounted."""
        store_bound = self.api_request_timeout_seconds + SKEW_SECONDS
        return self.pending_grace_seconds or max(store_bound, 2.0 * self.timeout_seconds + 5.0)

    @property
    def policy(self) -> Policy:
        rules = OvercommitRules(
            self.overcommit_admins, dict(self.overcommit_max), self.overcommit_step
        )
        return Policy(self.mode, dict(self.mode_for), rules)

    @property
    def deadline_seconds(self) -> float:
        """A second below the webhook timeout, so the API server never times out on us."""
        return max(self.timeout_seconds - 1.0, 0.5)

    @property
    def fair_wait_seconds(self) -> float:
        """How long a review waits for its tenant's turn before a 429: a quarter of the
        decision's deadline, as API Priority and Fairness waits a quarter of the request's."""
        return self.deadline_seconds / 4

    @property
    def metrics_host(self) -> str:
        return self.metrics_listen_host or self.listen_host

    @property
    def cert_file(self) -> Path:
        return Path(self.cert_dir) / "tls.crt"

    @property
    def key_file(self) -> Path:
        return Path(self.cert_dir) / "tls.key"


# name -> (environment variable, file key)
_SPELLINGS: Final = {
    "state": ("WEBHOOK_STATE", "state"),
    "kubeconfig": ("WEBHOOK_KUBECONFIG", "kubeconfig"),
    "listen": ("WEBHOOK_LISTEN", "listen"),
    "metrics_listen": ("WEBHOOK_METRICS_LISTEN", "metricsListen"),
    "record_key_file": ("WEBHOOK_RECORD_KEY_FILE", "recordKeyFile"),
    "cert_dir": ("WEBHOOK_CERT_DIR", "certDir"),
    "client_ca": ("WEBHOOK_CLIENT_CA", "clientCA"),
    "timeout_seconds": ("WEBHOOK_TIMEOUT_SECONDS", "timeoutSeconds"),
    "mode": ("WEBHOOK_MODE", "mode"),
    "mode_for": ("WEBHOOK_MODE_FOR", "modeFor"),
    "overcommit_admins": ("WEBHOOK_OVERCOMMIT_ADMINS", "overcommitAdmins"),
    "overcommit_max": ("WEBHOOK_OVERCOMMIT_MAX", "overcommitMax"),
    "overcommit_step": ("WEBHOOK_OVERCOMMIT_STEP", "overcommitStep"),
    "cert_reload_seconds": ("WEBHOOK_CERT_RELOAD_SECONDS", "certReloadSeconds"),
    "shutdown_seconds": ("WEBHOOK_SHUTDOWN_SECONDS", "shutdownSeconds"),
    "shutdown_delay_seconds": ("WEBHOOK_SHUTDOWN_DELAY_SECONDS", "shutdownDelaySeconds"),
    "log_level": ("WEBHOOK_LOG_LEVEL", "logLevel"),
    "namespace": ("POD_NAMESPACE", "namespace"),
    "replica": ("POD_NAME", "replica"),
    "lease_name": ("WEBHOOK_LEASE_NAME", "leaseName"),
    "api_request_timeout_seconds": (
        "WEBHOOK_API_REQUEST_TIMEOUT_SECONDS",
        "apiRequestTimeoutSeconds",
    ),
    "pending_grace_seconds": ("WEBHOOK_PENDING_GRACE_SECONDS", "pendingGraceSeconds"),
    "dry_run_holds": ("WEBHOOK_DRY_RUN_HOLDS", "dryRunHolds"),
    "escrow": ("WEBHOOK_ESCROW", "escrow"),
    "watch_read_timeout": ("WEBHOOK_WATCH_READ_TIMEOUT", "watchReadTimeout"),
    "watch_resync_seconds": ("WEBHOOK_WATCH_RESYNC_SECONDS", "watchResyncSeconds"),
    "ledger_namespace_share": ("WEBHOOK_LEDGER_NAMESPACE_SHARE", "ledgerNamespaceShare"),
    "fair_queue_length": ("WEBHOOK_FAIR_QUEUE_LENGTH", "fairQueueLength"),
}


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve settings; ``flags`` holds the command-line values (``None`` when not given)."""
    environ = os.environ if environ is None else environ
    config_path = flags.get("config") or environ.get("WEBHOOK_CONFIG")
    from_file = _read_file(config_path) if config_path else {}
    raw: dict[str, Any] = {}
    for name, (variable, key) in _SPELLINGS.items():
        if flags.get(name) not in (None, [], ()):
            raw[name] = flags[name]
        elif variable in environ:
            raw[name] = _from_environment(name, environ[variable])
        elif key in from_file:
            raw[name] = from_file[key]
    return _build(raw)


def _read_file(path: str) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SettingsError(f"{path}: cannot read settings: {exc}") from None
    if not isinstance(data, Mapping):
        raise SettingsError(f"{path}: settings must be a mapping")
    unknown = sorted(set(data) - {key for _, key in _SPELLINGS.values()})
    if unknown:
        raise SettingsError(f"{path}: unknown settings: {', '.join(unknown)}")
    return data


def _from_environment(name: str, value: str) -> Any:
    if name in ("state", "mode_for", "overcommit_admins", "overcommit_max"):
        return [item for item in value.replace(",", " ").split() if item]
    return value


def _build(raw: Mapping[str, Any]) -> Settings:
    values: dict[str, Any] = {}
    if "state" in raw:
        state = raw["state"]
        values["state"] = tuple([state] if isinstance(state, str) else [str(s) for s in state])
    if "kubeconfig" in raw:
        values["kubeconfig"] = str(raw["kubeconfig"])
    if "listen" in raw:
        values["listen_host"], values["listen_port"] = _listen(str(raw["listen"]))
    if "metrics_listen" in raw:
        host, port = _listen(str(raw["metrics_listen"]), name="metrics-listen")
        values["metrics_listen_host"], values["metrics_port"] = host, port
    for name in (
        "cert_dir",
        "client_ca",
        "namespace",
        "replica",
        "lease_name",
        "record_key_file",
    ):
        if name in raw:
            values[name] = str(raw[name])
    if "log_level" in raw:
        values["log_level"] = _log_level(raw["log_level"])
    if "timeout_seconds" in raw:
        timeout = _number("timeout-seconds", raw["timeout_seconds"], integer=True)
        if not 1 <= timeout <= 30:
            # admissionregistration.k8s.io/v1: timeoutSeconds must be between 1 and 30.
            raise SettingsError("timeout-seconds: must be between 1 and 30")
        values["timeout_seconds"] = int(timeout)
    for name in (
        "cert_reload_seconds",
        "shutdown_seconds",
        "api_request_timeout_seconds",
        "pending_grace_seconds",
        "watch_read_timeout",
    ):
        if name in raw:
            number = _number(name.replace("_", "-"), raw[name], integer=False)
            if number <= 0:
                raise SettingsError(f"{name.replace('_', '-')}: must be positive")
            values[name] = number
    if "shutdown_delay_seconds" in raw:
        delay = _number("shutdown-delay-seconds", raw["shutdown_delay_seconds"], integer=False)
        if not 0 <= delay <= 60:
            raise SettingsError("shutdown-delay-seconds: must be between 0 and 60")
        values["shutdown_delay_seconds"] = delay
    if "watch_resync_seconds" in raw:
        resync = _number("watch-resync-seconds", raw["watch_resync_seconds"], integer=False)
        if resync < 0:
            raise SettingsError("watch-resync-seconds: must be 0 (off) or positive")
        values["watch_resync_seconds"] = resync
    if "dry_run_holds" in raw:
        values["dry_run_holds"] = _switch("dry-run-holds", raw["dry_run_holds"])
    if "escrow" in raw:
        values["escrow"] = _switch("escrow", raw["escrow"])
    if "ledger_namespace_share" in raw:
        share = _number("ledger-namespace-share", raw["ledger_namespace_share"], integer=False)
        if not 0 < share <= 1:
            raise SettingsError("ledger-namespace-share: must be above 0 and at most 1")
        values["ledger_namespace_share"] = share
    if "fair_queue_length" in raw:
        length = _number("fair-queue-length", raw["fair_queue_length"], integer=True)
        if not 1 <= length <= 10_000:
            raise SettingsError("fair-queue-length: must be between 1 and 10000")
        values["fair_queue_length"] = int(length)
    if "mode" in raw:
        values["mode"] = _mode("mode", raw["mode"])
    if "mode_for" in raw:
        values["mode_for"] = _mode_for(raw["mode_for"])
    if "overcommit_admins" in raw:
        values["overcommit_admins"] = overcommit_admins(raw["overcommit_admins"])
    if "overcommit_max" in raw:
        values["overcommit_max"] = overcommit_maximum(raw["overcommit_max"])
    if "overcommit_step" in raw:
        values["overcommit_step"] = overcommit_step(raw["overcommit_step"])
    settings = Settings(**values)
    if settings.state and settings.kubeconfig:
        raise SettingsError("state and kubeconfig: give one source of cluster state, not both")
    return settings


def _listen(text: str, *, name: str = "listen") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise SettingsError(f"{name}: {text!r} is not HOST:PORT")
    try:
        number = int(port)
    except ValueError:
        raise SettingsError(f"{name}: {port!r} is not a port") from None
    if not 0 <= number <= 65535:
        raise SettingsError(f"{name}: {number} is not a port")
    return host.strip("[]"), number


def _number(name: str, value: Any, *, integer: bool) -> float:
    # A file's `true` is an int to Python (1), and int() of a file's 2.5 is 2: both refused
    # rather than read as a number nobody wrote.
    if isinstance(value, bool):
        raise SettingsError(f"{name}: {value!r} is not a number")
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError, OverflowError):  # int() of a file's `.inf` overflows
        raise SettingsError(f"{name}: {value!r} is not a number") from None
    if integer and isinstance(value, float) and value != number:
        raise SettingsError(f"{name}: {value!r} is not a whole number")
    if not math.isfinite(number):  # nan passes every comparison's "else"
        raise SettingsError(f"{name}: {value!r} is not a finite number")
    return number


def _switch(name: str, value: Any) -> bool:
    """``on``/``off`` (also ``true``/``false``, as YAML and environment variables spell them)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "yes", "1"):
        return True
    if text in ("off", "false", "no", "0"):
        return False
    raise SettingsError(f"{name}: {str(value)[:64]!r} is not on or off")


def _mode(name: str, value: Any) -> Mode:
    if value not in MODES:
        raise SettingsError(f"{name}: {value!r} is not one of {', '.join(MODES)}")
    return cast(Mode, value)


def _log_level(value: Any) -> str:
    level = str(value).upper()
    if level not in LOG_LEVELS:
        choices = ", ".join(name.lower() for name in LOG_LEVELS)
        raise SettingsError(f"log-level: {value!r} is not one of {choices}")
    return level


def check_mode_kinds(
    mode_for: Mapping[str, Mode], known: Sequence[str], *, strict: bool = True
) -> list[str]:
    """Refuse a per-kind mode for a kind that does not exist or is mis-cased.

    A kind named with the wrong case (``postgres``) is always refused with the right spelling:
    kinds are case-sensitive and the mode would silently never apply. A kind the platform does
    not know is refused when ``strict`` (the platform is all there is, as with ``--state``);
    otherwise it is returned, for a warning (a live cluster may add kinds later).
    """
    unknown = []
    for kind in mode_for:
        if kind in known:
            continue
        hint = did_you_mean(kind, known)
        if strict or hint:
            names = ", ".join(sorted(known)) or "none"
            raise SettingsError(
                f"mode-for {kind}: no such application kind{hint}; known kinds: {names}"
            )
        unknown.append(kind)
    return unknown


def _mode_for(value: Any) -> dict[str, Mode]:
    items: Sequence[Any]
    if isinstance(value, Mapping):
        items = [f"{k}={v}" for k, v in value.items()]
    elif isinstance(value, str):
        items = [value]
    else:
        items = list(value)
    result: dict[str, Mode] = {}
    for item in items:
        kind, _, mode = str(item).partition("=")
        if not kind:
            raise SettingsError(f"mode-for: {item!r} is not KIND=MODE")
        result[kind] = _mode(f"mode-for {kind}", mode)
    return result


def _items(value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, str):
        value = [value]
    return [part.strip() for item in value for part in str(item).split(",") if part.strip()]


def overcommit_admins(value: Any) -> frozenset[str]:
    """Groups and user names allowed to set overcommit factors (comma-separated or a list)."""
    return frozenset(_items(value))


def overcommit_maximum(value: Any) -> dict[str, Decimal]:
    """``KEY=DECIMAL`` items: the largest factor per key; the defaults stay for keys not given."""
    maximum = dict(DEFAULT_MAXIMUM)
    for item in _items(value):
        key, sep, number = item.partition("=")
        try:
            bound = Decimal(number)
        except InvalidOperation:
            bound = Decimal(0)
        if not sep or not key or not bound.is_finite() or bound < 1 or bound > 100:
            raise SettingsError(f"overcommit-max: {item!r} is not KEY=DECIMAL with 1 <= DECIMAL")
        maximum[key.strip()] = bound
    return maximum


def overcommit_step(value: Any) -> Decimal:
    try:
        step = Decimal(str(value))
    except InvalidOperation:
        raise SettingsError(f"overcommit-step: {value!r} is not a decimal") from None
    if not step.is_finite() or not 0 < step <= 10:
        raise SettingsError("overcommit-step: must be above 0 and at most 10")
    return step

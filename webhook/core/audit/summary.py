"""What the gate decided and whom it touched: counts folded from a stream of audit writes.

Only writes that reached the webhook are counted by outcome. The others are told apart, since
each means something different to an operator: a DELETE (the webhook is not called for it), a
request RBAC refused, a request refused before admission (schema validation, a conflict), an
UPDATE that changes neither the spec nor the charge annotation (the shipped ``matchConditions``
skip it), and a stored write that carries no decision at all: the gate was bypassed, off or
misconfigured, and that list must be empty in a healthy cluster.

Memory is bounded by namespaces, kinds, users and reasons, plus one fingerprint per live object
(to tell an unchanged UPDATE from a bypass); the lists of individual writes are capped.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from webhook.core.audit.events import AuditWrite
from webhook.core.base.errors import QuantityError
from webhook.core.base.quantities import parse_quantity
from webhook.core.tenancy.applications import CHARGE_ANNOTATION

__all__ = [
    "OUTCOMES",
    "POINT_KEYS",
    "Filters",
    "SummaryBuilder",
    "chart_point",
    "fingerprint",
    "outcome_of",
    "touches_spec_or_charge",
]

OUTCOMES: Final = ("allowed", "denied", "warned", "skipped", "error")
LIST_CAP: Final = 1000  # individual writes kept per list; the counts stay exact
SERIES_CAP: Final = 4000  # points kept per pool for a chart; halved when full
# Keys kept per chart point: budget keys are a tenant's choice, and every point holds them all.
POINT_KEYS: Final = 64
# The webhook's own failures: it answered, but could not decide.
ERROR_REASONS: Final = frozenset({"internal-error", "not-synced"})
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Filters:
    """Which writes to count: all of them by default."""

    since: datetime | None = None
    until: datetime | None = None
    namespace: str = ""
    kind: str = ""
    user: str = ""

    def accept(self, write: AuditWrite) -> bool:
        if self.since is not None and write.time < self.since:
            return False
        if self.until is not None and write.time > self.until:
            return False
        if self.namespace and write.namespace != self.namespace:
            return False
        if self.kind and write.kind.lower() != self.kind.lower():
            return False
        return not (self.user and write.user != self.user)


def outcome_of(write: AuditWrite) -> str:
    """The outcome of a write that reached the webhook, or ``""`` when it did not."""
    if write.unreachable:
        return "error"
    decision = write.decision
    if not decision:
        return ""
    if write.webhook.get("reason") in ERROR_REASONS:
        return "error"
    return decision if decision in OUTCOMES else "error"


def fingerprint(obj: Mapping[str, Any]) -> int:
    """What the shipped ``matchConditions`` compare: the spec and the charge annotation."""
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    charge = annotations.get(CHARGE_ANNOTATION) if isinstance(annotations, Mapping) else None
    return hash(_CANONICAL.encode([obj.get("spec"), charge]))


def touches_spec_or_charge(patch: object) -> bool:
    """Whether a PATCH body could change the spec or the charge annotation.

    A JSON patch (a list of operations) does when a path starts at ``/spec`` or names the
    annotations; a merge or apply patch (an object) does when it has a ``spec`` or the charge
    annotation. Anything else is assumed to.
    """
    if isinstance(patch, list):
        for operation in patch:
            path = operation.get("path") if isinstance(operation, Mapping) else None
            if not isinstance(path, str) or path in ("", "/") or path.startswith("/spec"):
                return True
            if path.startswith("/metadata/annotations") or path == "/metadata":
                return True
        return False
    if isinstance(patch, Mapping):
        if "spec" in patch:
            return True
        metadata = patch.get("metadata")
        if metadata is None:
            return False
        if not isinstance(metadata, Mapping):
            return True
        annotations = metadata.get("annotations")
        return annotations is not None and (
            not isinstance(annotations, Mapping) or CHARGE_ANNOTATION in annotations
        )
    return True


@dataclass
class _Counts:
    allowed: int = 0
    denied: int = 0
    warned: int = 0
    skipped: int = 0
    error: int = 0
    dry_run: int = 0

    def add(self, outcome: str, *, dry_run: bool) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        if dry_run:
            self.dry_run += 1

    def as_json(self) -> dict[str, int]:
        return {
            "allowed": self.allowed,
            "denied": self.denied,
            "warned": self.warned,
            "skipped": self.skipped,
            "dryRun": self.dry_run,
            "errors": self.error,
        }


@dataclass
class _Series:
    """One pool's reserved figures over time, as the webhook recorded them, and its budgets."""

    points: list[tuple[str, dict[str, str], dict[str, str]]] = field(default_factory=list)
    denials: list[tuple[str, dict[str, str], str]] = field(default_factory=list)
    step: int = 1  # keep every ``step``-th point once the cap was reached
    seen: int = 0
    left_out: int = 0  # the most budget keys one point left out (chart_point)

    def add(self, time: str, reserved: dict[str, str], budget: dict[str, str]) -> None:
        self.left_out = max(self.left_out, len(budget) - POINT_KEYS)
        reserved, budget = chart_point(reserved, budget)
        self.seen += 1
        if self.seen % self.step:
            return
        self.points.append((time, reserved, budget))
        if len(self.points) >= SERIES_CAP:
            self.points = self.points[::2]
            self.step *= 2


class SummaryBuilder:
    """Folds audit writes into the summary; :meth:`result` is its JSON form."""

    def __init__(
        self,
        filters: Filters | None = None,
        *,
        objects: Mapping[tuple[str, str, str], Mapping[str, Any]] | None = None,
        series: bool = False,
    ) -> None:
        self.filters = filters or Filters()
        self.writes = 0
        self.rows: dict[tuple[str, str], _Counts] = {}
        self.pools: dict[str, _Counts] = {}
        self.users: dict[str, _Counts] = {}
        self.outcomes: Counter[str] = Counter()
        self.not_reaching: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.examples: dict[str, dict[str, str]] = {}
        self.denied_users: Counter[str] = Counter()
        self.undecided: list[dict[str, Any]] = []
        self.undecided_count = 0
        self.unreachable: list[dict[str, Any]] = []
        self.unreachable_count = 0
        self.levels: Counter[str] = Counter()
        # (namespace, resource, name) -> fingerprint of the stored object, from the log itself
        self._stored: dict[tuple[str, str, str], int] = {}
        for (kind, namespace, name), obj in (objects or {}).items():
            self._stored[(namespace, kind, name)] = fingerprint(obj)
        self.series: dict[str, _Series] | None = {} if series else None

    def add(self, write: AuditWrite) -> None:
        """Count one write (filtered), and remember what it stored."""
        stored_before = self._remember(write)
        if not self.filters.accept(write):
            return
        self.writes += 1
        self.levels[write.level] += 1
        outcome = outcome_of(write)
        if not outcome:
            self._not_reaching(write, stored_before)
            return
        self.outcomes[outcome] += 1
        for counts in self._counters(write):
            counts.add(outcome, dry_run=write.dry_run)
        if write.unreachable:
            self.unreachable_count += 1
            if len(self.unreachable) < LIST_CAP:
                self.unreachable.append({**_identity(write), "message": write.message})
        if outcome in ("denied", "warned", "error") and not write.unreachable:
            self._denial(write, outcome)
        if self.series is not None and write.webhook.get("pool"):
            self._chart(write, outcome)

    def _counters(self, write: AuditWrite) -> list[_Counts]:
        row = self.rows.setdefault((write.namespace, write.kind or write.resource), _Counts())
        pool = self.pools.setdefault(write.webhook.get("pool", ""), _Counts())
        user = self.users.setdefault(write.user, _Counts())
        return [row, pool, user]

    def _denial(self, write: AuditWrite, outcome: str) -> None:
        reason = write.webhook.get("reason", "") or outcome
        self.reasons[reason] += 1
        if outcome == "denied":
            self.denied_users[write.user] += 1
        if reason not in self.examples:
            message = write.webhook.get("message") or write.webhook.get("would-deny") or ""
            self.examples[reason] = {**_identity(write), "message": message or write.message}

    def _chart(self, write: AuditWrite, outcome: str) -> None:
        assert self.series is not None
        reserved = _resources(write.webhook.get("reserved-after"))
        budget = _resources(write.webhook.get("budget"))
        series = self.series.setdefault(write.webhook["pool"], _Series())
        if outcome in ("allowed", "warned") and not write.dry_run:
            series.add(write.timestamp, reserved, budget)
        elif outcome == "denied" and len(series.denials) < LIST_CAP:
            over = {k: v for k, v in reserved.items() if k in budget and _above(v, budget[k])}
            series.denials.append((write.timestamp, over or reserved, f"{write.kind}/{write.name}"))

    def _remember(self, write: AuditWrite) -> int | None:
        """Record what the write stored; return the fingerprint stored before it."""
        key = (write.namespace, write.kind or write.resource, write.name)
        before = self._stored.get(key)
        if write.dry_run or not write.succeeded:
            return before
        if write.verb == "delete":
            self._stored.pop(key, None)
            return before
        stored = write.stored_object
        if stored is not None:
            self._stored[key] = fingerprint(stored)
        return before

    def _not_reaching(self, write: AuditWrite, stored_before: int | None) -> None:
        if write.verb == "delete":
            self.not_reaching["delete"] += 1
        elif write.rbac_forbidden:
            self.not_reaching["rbac"] += 1
        elif not write.succeeded:
            self.not_reaching["refusedBeforeAdmission"] += 1
        elif self._unchanged(write, stored_before):
            self.not_reaching["unchanged"] += 1
        else:
            self.undecided_count += 1
            if len(self.undecided) < LIST_CAP:
                why = "stored without a decision from the webhook"
                if write.mutated is None:
                    why += "; neither webhook left a trace"
                self.undecided.append({**_identity(write), "code": write.code, "why": why})

    def _unchanged(self, write: AuditWrite, stored_before: int | None) -> bool:
        """Whether ``matchConditions`` skipped it: an UPDATE that changed neither watched part."""
        if write.operation != "UPDATE":
            return False
        stored = write.stored_object
        if stored_before is not None and stored is not None:
            return fingerprint(stored) == stored_before
        return write.verb == "patch" and not touches_spec_or_charge(write.request_object)

    def result(self, *, events: int, malformed: list[dict[str, Any]]) -> dict[str, Any]:
        """The summary as JSON-ready data."""
        rows = [
            {"namespace": ns, "kind": kind, **counts.as_json()}
            for (ns, kind), counts in sorted(self.rows.items())
        ]
        result: dict[str, Any] = {
            "events": events,
            "malformed": len(malformed),
            "malformedLines": malformed[:LIST_CAP],
            "writes": self.writes,
            "outcomes": {o: self.outcomes.get(o, 0) for o in OUTCOMES},
            "rows": rows,
            "pools": [
                {"pool": pool or None, **counts.as_json()}
                for pool, counts in sorted(self.pools.items())
            ],
            "users": [
                {"user": user, **counts.as_json()} for user, counts in sorted(self.users.items())
            ],
            "topDenials": [
                {"reason": reason, "count": count, "example": self.examples[reason]}
                for reason, count in self.reasons.most_common(10)
            ],
            "deniedUsers": [
                {"user": user, "denied": count} for user, count in self.denied_users.most_common(10)
            ],
            "notReachingWebhook": dict(sorted(self.not_reaching.items())),
            "undecided": self.undecided,
            "undecidedCount": self.undecided_count,
            "unreachable": self.unreachable,
            "unreachableCount": self.unreachable_count,
            "levels": dict(sorted(self.levels.items())),
        }
        return result

    def chart(self) -> dict[str, Any]:
        """Per pool: recorded reserved figures over time, budgets, and denials."""
        return {
            pool: {
                "points": [{"time": t, "reserved": r, "budget": b} for t, r, b in series.points],
                "denials": [
                    {"time": t, "reserved": r, "what": what} for t, r, what in series.denials
                ],
                "keysLeftOut": series.left_out,
            }
            for pool, series in sorted((self.series or {}).items())
        }


def _identity(write: AuditWrite) -> dict[str, Any]:
    return {
        "auditID": write.audit_id,
        "time": write.timestamp,
        "namespace": write.namespace,
        "kind": write.kind or write.resource,
        "name": write.name,
        "user": write.user,
        "verb": write.verb,
    }


def chart_point(
    reserved: Mapping[str, str], budget: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """One chart point's figures, bounded: the :data:`POINT_KEYS` budget keys with the largest
    share of their budget (then by name), so one event's keys cost a chart only so much."""
    if len(budget) <= POINT_KEYS:
        return dict(reserved), dict(budget)

    def share(key: str) -> Decimal:
        try:
            limit = parse_quantity(budget[key])
            used = parse_quantity(reserved.get(key, "0"))
        except QuantityError:
            return Decimal(0)
        return used / limit if limit > 0 else Decimal(0)

    kept = sorted(budget, key=lambda key: (-share(key), key))[:POINT_KEYS]
    return (
        {k: reserved[k] for k in kept if k in reserved},
        {k: budget[k] for k in kept},
    )


def _above(value: str, limit: str) -> bool:
    try:
        return parse_quantity(value) > parse_quantity(limit)
    except QuantityError:
        return True


def _resources(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        body = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(body, Mapping):
        return {}
    return {str(k): str(v) for k, v in body.items()}

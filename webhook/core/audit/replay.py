"""What-if replay: decide every write of an audit log again under another policy.

The log's stored history is applied as it happened (see :mod:`.history`), and each write that
reached, or should have reached, the webhook is decided again with ``decide`` under the what-if
policy, budgets and contracts. The answers: which writes would have been denied, when each pool
would first have overflowed, each pool's peak reserved, and the smallest budget per pool that
would have denied nothing. Application counts (``count/<plural>.apps.cozystack.io``) are
tracked in every pool whether its budget limits them or not, so the suggestion includes a count
budget per kind the pool held: counts can be rolled out in ``warn`` from it. With no policy
given, each write is decided under the mode the webhook recorded for it, and any difference
from the recorded decision is listed: an empty list shows the replay reproduces the log.

Writes before ``since`` only build the state; filters choose which writes are decided, never
which are applied.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, cast

from webhook.core.admission.decisions import MODES, Decision, Mode, Policy, decide
from webhook.core.audit.events import AuditWrite
from webhook.core.audit.history import History
from webhook.core.audit.summary import (
    ERROR_REASONS,
    LIST_CAP,
    POINT_KEYS,
    SERIES_CAP,
    Filters,
    chart_point,
)
from webhook.core.base import resources as rl
from webhook.core.base.errors import QuantityError
from webhook.core.base.quantities import format_quantity, parse_quantity
from webhook.core.tenancy.counts import is_count_key
from webhook.core.tenancy.tenants import TENANT_KIND

__all__ = ["LEVEL_NOTE", "PoolTrack", "Replayer", "recorded_resources"]

_ZERO = Decimal(0)
LEVEL_NOTE: Final = (
    "{count} write(s) were logged without request and response bodies (level {levels}); "
    "replay needs the apps.cozystack.io group at RequestResponse in the audit policy of the "
    "API server that serves it (cozystack-api)"
)


@dataclass
class PoolTrack:
    """One pool over the replay: its peak reserved, first overflow, and a chart's points."""

    budget: dict[str, Decimal] = field(default_factory=dict)
    peak: dict[str, Decimal] = field(default_factory=dict)
    needed: dict[str, Decimal] = field(default_factory=dict)  # peaks incl. refused writes
    first_overflow: str | None = None
    overflowed_by: dict[str, Any] | None = None
    points: list[tuple[str, dict[str, str], dict[str, str]]] = field(default_factory=list)
    left_out: int = 0  # the most budget keys one chart point left out (chart_point)
    denials: list[tuple[str, dict[str, str], str]] = field(default_factory=list)
    step: int = 1
    seen: int = 0

    def observe(
        self,
        time: str,
        reserved: Mapping[str, Decimal],
        budget: Mapping[str, Decimal],
        write: dict[str, Any] | None,
        *,
        chart: bool,
    ) -> None:
        self.budget = dict(budget)
        self.peak = rl.maximum(self.peak, reserved)
        self.needed = rl.maximum(self.needed, reserved)
        if self.first_overflow is None and any(
            reserved.get(k, _ZERO) > v for k, v in budget.items()
        ):
            self.first_overflow = time
            self.overflowed_by = write
        if chart:
            self.seen += 1
            if self.seen % self.step == 0:
                self.left_out = max(self.left_out, len(budget) - POINT_KEYS)
                point = chart_point(rl.to_strings(reserved), rl.to_strings(budget))
                self.points.append((time, *point))
                if len(self.points) >= SERIES_CAP:
                    self.points = self.points[::2]
                    self.step *= 2


class Replayer:
    """Folds audit writes into a replay report; :meth:`result` is its JSON form."""

    def __init__(
        self,
        history: History,
        policy: Policy | None = None,
        *,
        filters: Filters | None = None,
        chart: bool = False,
    ) -> None:
        self.history = history
        self.policy = policy
        self.filters = filters or Filters()
        self.chart_wanted = chart
        self.writes = 0
        self.decided = 0
        self.denied: list[dict[str, Any]] = []
        self.warned: list[dict[str, Any]] = []
        self.mismatches: list[dict[str, Any]] = []
        self.not_replayed: list[dict[str, Any]] = []
        self.not_replayed_count = 0
        self.missing_bodies: dict[str, int] = {}
        self.pools: dict[str, PoolTrack] = {}
        self._started = False

    # -- folding -------------------------------------------------------------------------------

    def add(self, write: AuditWrite) -> None:
        if not self._started:
            self._started = True
            self._track_all(write.timestamp)
        if self.filters.until is not None and write.time > self.filters.until:
            return
        self.writes += 1
        decide_it = self.filters.accept(write) and self.history.reaches_webhook(write)
        decision = self._decide(write) if decide_it else None
        if self.history.apply(write, decision):
            self._track(write)

    def _decide(self, write: AuditWrite) -> Decision | None:
        if write.request_object is None and write.stored_object is None:
            level = write.level or "unknown"
            self.missing_bodies[level] = self.missing_bodies.get(level, 0) + 1
            return None
        rebuilt = self.history.rebuild(write)
        if rebuilt.request is None:
            self.not_replayed_count += 1
            if len(self.not_replayed) < LIST_CAP:
                self.not_replayed.append({**_identity(write), "why": rebuilt.problem})
            return None
        policy = self.policy or Policy(_recorded_mode(write))
        decision = decide(rebuilt.request, self.history.state, policy)
        self.decided += 1
        entry = {
            **_identity(write, rebuilt.request.kind),
            "pool": decision.pool or None,
            "reason": decision.reason,
            "message": decision.message,
        }
        if decision.outcome == "denied" and len(self.denied) < LIST_CAP:
            self.denied.append(entry)
        elif decision.outcome == "warned" and len(self.warned) < LIST_CAP:
            self.warned.append(entry)
        if self.policy is None and write.decision:
            self._compare(write, decision, rebuilt.request.kind)
        if decision.outcome in ("denied", "warned") and rebuilt.request.operation == "CREATE":
            self._count_refused(rebuilt.request.kind, write)
        if decision.pool and decision.reserved_after:
            track = self.pools.setdefault(decision.pool, PoolTrack())
            track.needed = rl.maximum(track.needed, decision.reserved_after)
            if decision.outcome in ("denied", "warned") and len(track.denials) < LIST_CAP:
                over = {
                    k: v
                    for k, v in decision.reserved_after.items()
                    if k in decision.budget and v > decision.budget[k]
                }
                track.denials.append(
                    (
                        write.timestamp,
                        rl.to_strings(over or decision.reserved_after),
                        f"{rebuilt.request.kind}/{write.name}",
                    )
                )
        return decision

    def _compare(self, write: AuditWrite, decision: Decision, kind: str) -> None:
        recorded = write.decision
        differences: dict[str, Any] = {}
        if recorded != decision.outcome:
            differences["decision"] = {"recorded": recorded, "replayed": decision.outcome}
        reason = write.webhook.get("reason", "")
        if reason and reason not in ERROR_REASONS and reason != decision.reason:
            differences["reason"] = {"recorded": reason, "replayed": decision.reason}
        charge = write.webhook.get("charge")
        if charge is not None and decision.charge is not None:
            mine = rl.to_strings(decision.charge)
            theirs = recorded_resources(charge)
            if theirs != mine:
                differences["charge"] = {"recorded": theirs, "replayed": mine}
        if differences and len(self.mismatches) < LIST_CAP:
            self.mismatches.append({**_identity(write, kind), **differences})

    def _count_refused(self, kind: str, write: AuditWrite) -> None:
        """A refused CREATE would have added its application to every pool above it: the
        count budget suggested there must hold it too (sizes get this from the decision)."""
        state = self.history.state
        counted = state.platform.count_of((kind, write.namespace, write.name))
        if not counted:
            return
        for node in state.tree.chain(write.namespace):
            if node.budget:
                track = self.pools.setdefault(node.namespace, PoolTrack())
                wanted = {key: node.usage.get(key, _ZERO) + n for key, n in counted.items()}
                track.needed = rl.maximum(track.needed, wanted)

    # -- pools ---------------------------------------------------------------------------------

    def _track_all(self, time: str) -> None:
        tree = self.history.state.tree
        for view in tree.pools():
            node = tree.get(view.namespace)
            reserved = _reserved(node.usage, node.budget) if node is not None else view.reserved
            self._observe(view.namespace, time, reserved, view.budget, None)

    def _track(self, write: AuditWrite) -> None:
        tree = self.history.state.tree
        namespaces = [write.namespace]
        kind = self.history.kind_of(write)
        if kind == TENANT_KIND:
            owned = self.history.state.owned_namespace((kind, write.namespace, write.name))
            if owned:
                namespaces.insert(0, owned)
        seen: set[str] = set()
        for namespace in namespaces:
            for node in tree.chain(namespace):
                if node.budget and node.namespace not in seen:
                    seen.add(node.namespace)
                    reserved = _reserved(node.usage, node.budget)
                    self._observe(
                        node.namespace, write.timestamp, reserved, node.budget, _identity(write)
                    )

    def _observe(
        self,
        pool: str,
        time: str,
        reserved: Mapping[str, Decimal],
        budget: Mapping[str, Decimal],
        write: dict[str, Any] | None,
    ) -> None:
        track = self.pools.setdefault(pool, PoolTrack())
        track.observe(time, reserved, budget, write, chart=self.chart_wanted)

    # -- results -------------------------------------------------------------------------------

    def result(self, *, suggest: bool = False) -> dict[str, Any]:
        pools = []
        for name, track in sorted(self.pools.items()):
            entry: dict[str, Any] = {
                "pool": name,
                "budget": _quantities(track.budget),
                "peak": _quantities(track.peak),
                "firstOverflow": track.first_overflow,
            }
            if track.overflowed_by is not None:
                entry["overflowedBy"] = track.overflowed_by
            if suggest:
                entry["suggestedBudget"] = _quantities(
                    {
                        k: v
                        for k, v in track.needed.items()
                        if k in track.budget or (is_count_key(k) and v)
                    }
                )
            pools.append(entry)
        result: dict[str, Any] = {
            "policy": _policy_json(self.policy),
            "writes": self.writes,
            "decided": self.decided,
            "denied": self.denied,
            "warned": self.warned,
            "pools": pools,
            "notReplayed": self.not_replayed,
            "notReplayedCount": self.not_replayed_count,
        }
        if self.policy is None:
            result["mismatches"] = self.mismatches
        missing = sum(self.missing_bodies.values())
        if missing:
            levels = ", ".join(sorted(self.missing_bodies))
            result["missingBodies"] = missing
            result["note"] = LEVEL_NOTE.format(count=missing, levels=levels)
        return result

    def chart(self) -> dict[str, Any]:
        return {
            pool: {
                "points": [{"time": t, "reserved": r, "budget": b} for t, r, b in track.points],
                "denials": [
                    {"time": t, "reserved": r, "what": what} for t, r, what in track.denials
                ],
                "keysLeftOut": track.left_out,
            }
            for pool, track in sorted(self.pools.items())
        }


def _reserved(usage: Mapping[str, Decimal], budget: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """A pool's figures to track: every key its budget limits, and every application count."""
    reserved = {key: usage.get(key, _ZERO) for key in budget}
    reserved.update({key: value for key, value in usage.items() if is_count_key(key)})
    return reserved


def _recorded_mode(write: AuditWrite) -> Mode:
    mode = write.webhook.get("mode", "enforce")
    return cast(Mode, mode) if mode in MODES else "enforce"


def _policy_json(policy: Policy | None) -> dict[str, Any]:
    if policy is None:
        return {"mode": "as recorded"}
    return {"mode": policy.mode, "perKind": dict(policy.per_kind)}


def _identity(write: AuditWrite, kind: str = "") -> dict[str, Any]:
    return {
        "auditID": write.audit_id,
        "time": write.timestamp,
        "namespace": write.namespace,
        "kind": kind or write.kind or write.resource,
        "name": write.name,
        "user": write.user,
        "dryRun": write.dry_run,
    }


def _quantities(resources: Mapping[str, Decimal]) -> dict[str, str]:
    return {k: format_quantity(v) for k, v in sorted(resources.items())}


def recorded_resources(text: str) -> dict[str, str]:
    """A recorded ResourceList annotation, normalised (unreadable: as written)."""
    try:
        body = json.loads(text)
        if isinstance(body, Mapping):
            return rl.to_strings({str(k): parse_quantity(v) for k, v in body.items()})
    except (ValueError, QuantityError):
        pass
    return {"unreadable": text}

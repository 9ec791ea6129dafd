"""Current-state policy reports: one OpenReports ``Report`` per tenant namespace, computed.

Platform teams read policy results through Policy Reporter and ``kubectl get reports``; the
OpenReports ``openreports.io/v1alpha1`` ``Report`` is the format those tools read (Kyverno's
PolicyReport, moved to its own project). This module turns the reservation state into those
reports and nothing else: no client, no clock, so the leader's writer and ``webhook report -o
openreports`` print the same bytes for the same state, and a writer can tell "unchanged" by
comparing two values. One result per application, the worst finding first:

- ``error``: the application cannot be evaluated (unknown reservation, or values that no longer
  evaluate: the recorded charge is kept), with the reason;
- ``fail``: it is stored as a HelmRelease labelled with another application's name (which
  cozystack-api cannot delete), with the command that removes it; or a write charging what it
  reserves would be denied now: an ancestor pool bounding a key it reserves holds more than its
  budget (a budget lowered after the fact), with figures;
- ``warn``: near a limit (:data:`NEAR_LIMIT` of a budget it draws on), its pool sold beyond its
  budget through overcommit factors, or its namespace's ResourceQuota (the pod-level guard)
  short of what the admitted applications' pods will request, with figures;
- ``pass``: it fits (or no pool limits it: no pool, no limit).

Every value a tenant wrote (names, and the reasons quoting values) is bounded before it lands
in a report, and a report holds at most :data:`MAX_RESULTS` results and
:data:`MAX_REPORT_BYTES` of them as sent, the worst kept; the ``summary`` still counts every
application and an annotation says how many results were left out, so neither a namespace of
100,000 applications nor reasons full of hostile unicode push its report past etcd's object
limit (a report the API server refuses would leave the stale one standing).

Over 400 lines, and kept whole: it is one report format, and its findings, their order and the
bounds on what a report holds are one rule that reads best in one place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from webhook.core.admission.state import AppRecord, ReservationState
from webhook.core.base import resources as rl
from webhook.core.base.quantities import format_quantity
from webhook.core.capacity.guard import QuotaBook, guard_room, namespace_need
from webhook.core.tenancy.applications import APPS_API_VERSION, AppKey
from webhook.core.tenancy.tenants import ancestors, is_tenant_namespace

__all__ = [
    "MANAGED_BY",
    "MAX_MESSAGE",
    "MAX_REPORT_BYTES",
    "MAX_RESULTS",
    "NEAR_LIMIT",
    "POLICY",
    "REPORT_API_VERSION",
    "REPORT_NAME",
    "SOURCE",
    "TRUNCATED_ANNOTATION",
    "Finding",
    "ReportContext",
    "assemble_report",
    "build_report",
    "build_reports",
    "report_content",
    "report_findings",
    "report_namespaces",
]

REPORT_API_VERSION: Final = "openreports.io/v1alpha1"
REPORT_NAME: Final = "reservation-webhook"
SOURCE: Final = "reservation-webhook"
POLICY: Final = "tenant-reservations"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "reservation-webhook"}
TRUNCATED_ANNOTATION: Final = "reservation.cozystack.io/truncated"
# A result is about 600 bytes with its figures; 500 of them stay far below etcd's 1.5 MiB
# request limit (and Policy Reporter pages well at that size), whatever a tenant names things.
MAX_RESULTS: Final = 500
# Reasons quote what a tenant wrote (values, names): cut, so one result stays small.
MAX_MESSAGE: Final = 1024
# ... but 1024 characters are up to 12 bytes each as the client sends JSON (an emoji is two
# escaped surrogates): the results a report keeps are bounded in bytes too, below etcd's 1.5 MiB
# with room for the rest, so a report a tenant fills with hostile text is still written.
MAX_REPORT_BYTES: Final = 1024 * 1024
_RESULTS_BYTES: Final = MAX_REPORT_BYTES - 16 * 1024
# A pool drawn on past this share of its budget warns the applications that reserve from it.
NEAR_LIMIT: Final = Decimal("0.9")

_ORDER: Final = {"error": 0, "fail": 1, "warn": 2, "pass": 3}
_SEVERITY: Final = {"error": "high", "fail": "high", "warn": "medium"}
_ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class _Finding:
    result: str  # pass, fail, warn, error
    rule: str
    message: str
    properties: dict[str, str]


Finding = tuple[AppKey, _Finding]


def build_reports(
    state: ReservationState,
    *,
    quotas: QuotaBook | None = None,
    namespace: str = "",
) -> dict[str, dict[str, Any]]:
    """A ``Report`` per tenant namespace (every declared tenant, and every tenant namespace
    holding an application), by namespace; with ``namespace``, that one and those below it."""
    keys = report_namespaces(state, namespace=namespace)
    context = ReportContext.of(state, quotas, keys)
    return {ns: build_report(state, ns, keys[ns], context) for ns in sorted(keys)}


def report_namespaces(state: ReservationState, *, namespace: str = "") -> dict[str, list[AppKey]]:
    """The namespaces that get a report, each with its applications' keys, sorted."""
    keys: dict[str, list[AppKey]] = {}
    for node in state.tree.nodes():
        if node.declared:
            keys.setdefault(node.namespace, [])
    for key in [*(k for k, _ in state.records()), *state.unknown()]:
        if is_tenant_namespace(key[1]):
            keys.setdefault(key[1], []).append(key)
    return {
        ns: sorted(apps)
        for ns, apps in sorted(keys.items())
        if not namespace or namespace in ancestors(ns)
    }


@dataclass(frozen=True, slots=True)
class ReportContext:
    """What the reports of every namespace share, computed once per round."""

    short: Mapping[str, Mapping[str, Decimal]]  # namespace -> ResourceQuota keys short
    beyond: Mapping[str, Mapping[str, tuple[Decimal, Decimal]]]  # pool -> sold beyond budget

    @classmethod
    def of(
        cls,
        state: ReservationState,
        quotas: QuotaBook | None,
        keys: Mapping[str, list[AppKey]],
    ) -> ReportContext:
        short = _guard_shortfalls(state, quotas, keys) if quotas is not None else {}
        return cls(short, _sold_beyond(state))


def build_report(
    state: ReservationState, namespace: str, keys: Iterable[AppKey], context: ReportContext
) -> dict[str, Any]:
    """The ``Report`` of one namespace, for the applications ``keys`` (those still known)."""
    return assemble_report(namespace, report_findings(state, namespace, keys, context))


def report_findings(
    state: ReservationState, namespace: str, keys: Iterable[AppKey], context: ReportContext
) -> list[Finding]:
    """Each application's finding, for any part of a namespace's keys (a caller may walk a
    large namespace in parts and join them)."""
    short = context.short.get(namespace, {})
    return [
        (key, _finding(state, key, short, context.beyond))
        for key in keys
        if key in state.unknown() or state.record(key) is not None
    ]


def report_content(report: Mapping[str, Any]) -> dict[str, Any]:
    """What a writer compares to decide whether a stored report must be written again: the
    fields this module sets, without what the API server adds (resourceVersion, uid, ...)."""
    metadata = report.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return {
        "labels": {k: (metadata.get("labels") or {}).get(k) for k in MANAGED_BY},
        "truncated": annotations.get(TRUNCATED_ANNOTATION),
        **{
            field: report.get(field)
            for field in ("source", "configuration", "summary", "results", "scope")
        },
    }


def _finding(
    state: ReservationState,
    key: AppKey,
    short: Mapping[str, Decimal],
    beyond: Mapping[str, Mapping[str, tuple[Decimal, Decimal]]],
) -> _Finding:
    reason = state.unknown().get(key)
    if reason is not None:
        return _Finding(
            "error",
            "unknown-reservation",
            f"cannot be evaluated, so its pool grants nothing more until it is fixed or "
            f"deleted: {reason}",
            {},
        )
    record = state.record(key)
    assert record is not None  # keys come from records() or unknown()
    charged = {k: v for k, v in record.resources.items() if v > 0}
    properties = {"charge": rl.format_resources(record.resources) or "nothing"}
    if record.problem:
        return _Finding(
            "error",
            "unevaluable",
            f"no longer evaluates, its recorded charge is kept: {record.problem}",
            properties,
        )
    wrong = state.mislabel_of(key)
    if wrong is not None:
        return _Finding(
            "fail",
            "mislabelled-release",
            wrong.explain(key),
            {**properties, "helmRelease": wrong.release, "nameLabel": wrong.label},
        )
    over, near, pools = _limits(state, key[1], charged)
    if pools:
        properties["pool"] = ",".join(sorted(pools))
    if over:
        pool, resource, reserved, budget = over[0]
        return _Finding(
            "fail",
            "over-budget",
            f"a write reserving this again would be denied now: pool {pool} reserves "
            f"{resource}={format_quantity(reserved)} of a budget of "
            f"{format_quantity(budget)} (over by {format_quantity(reserved - budget)})",
            {**properties, **_figures(pool, resource, reserved, budget)},
        )
    warnings: list[tuple[str, str, dict[str, str]]] = []
    if near:
        pool, resource, reserved, budget = near[0]
        share = reserved * 100 / budget
        warnings.append(
            (
                "near-limit",
                f"pool {pool} reserves {resource}={format_quantity(reserved)} of a budget of "
                f"{format_quantity(budget)} ({share:.0f}%)",
                _figures(pool, resource, reserved, budget),
            )
        )
    if record.committed is not None:
        for pool in sorted(pools):
            for resource, (committed, budget) in sorted(beyond.get(pool, {}).items()):
                if resource in charged:
                    warnings.append(
                        (
                            "overcommitted",
                            f"pool {pool} is sold beyond its budget through overcommit factors: "
                            f"{resource} committed {format_quantity(committed)} of "
                            f"{format_quantity(budget)}",
                            {
                                "pool": pool,
                                "resource": resource,
                                "committed": format_quantity(committed),
                                "budget": format_quantity(budget),
                            },
                        )
                    )
                    break
    if short and _pods_need(key, record):
        resource, amount = sorted(short.items())[0]
        warnings.append(
            (
                "pod-level-guard",
                f"the namespace's ResourceQuota cannot hold every admitted application's pods: "
                f"{resource} short by {format_quantity(-amount)}",
                {"quotaResource": resource, "quotaShort": format_quantity(-amount)},
            )
        )
    if warnings:
        rule, message, figures = warnings[0]
        if len(warnings) > 1:
            message += "; also " + "; ".join(m for _, m, _ in warnings[1:])
        return _Finding("warn", rule, message, {**properties, **figures})
    if not pools:
        return _Finding("pass", "fits", "fits: no pool limits what it reserves", properties)
    return _Finding("pass", "fits", "fits the budget of every pool it reserves from", properties)


def _limits(
    state: ReservationState, namespace: str, charged: Mapping[str, Decimal]
) -> tuple[
    list[tuple[str, str, Decimal, Decimal]], list[tuple[str, str, Decimal, Decimal]], set[str]
]:
    """Pools over budget and pools near it, on the keys ``charged``: per key the nearest tenant
    whose budget bounds it, the one admission checks (a carve-out occupies ``max(quota, usage)``
    of its parent, so the pools above it deny none of its writes, and their figures, its
    siblings' sums, are not its to read)."""
    over = []
    near = []
    pools = set()
    unseen = set(charged)
    for node in state.tree.chain(namespace):
        for resource in sorted(unseen):
            if resource not in node.budget:
                continue
            unseen.discard(resource)
            pools.add(node.namespace)
            budget = node.budget[resource]
            reserved = node.usage.get(resource, _ZERO)
            if reserved > budget:
                over.append((node.namespace, resource, reserved, budget))
            elif budget > 0 and reserved >= budget * NEAR_LIMIT:
                near.append((node.namespace, resource, reserved, budget))
    return over, near, pools


def _figures(pool: str, resource: str, reserved: Decimal, budget: Decimal) -> dict[str, str]:
    return {
        "pool": pool,
        "resource": resource,
        "reserved": format_quantity(reserved),
        "budget": format_quantity(budget),
    }


def _pods_need(key: AppKey, record: AppRecord) -> bool:
    need, unknown = namespace_need([(key, record.resources)])
    return bool(need) and not unknown


def _guard_shortfalls(
    state: ReservationState, quotas: QuotaBook, keys: Mapping[str, list[AppKey]]
) -> dict[str, dict[str, Decimal]]:
    """Namespaces whose ResourceQuota is short of what admitted pods will request."""
    found = {}
    for ns in quotas.namespaces():
        if ns not in keys:
            continue
        need, _ = namespace_need(
            (key, record.resources if record else None) for key, record in state.records_in(ns)
        )
        room = {k: v for k, v in guard_room(quotas.quotas(ns), need).items() if v < 0}
        if room:
            found[ns] = room
    return found


def _sold_beyond(state: ReservationState) -> dict[str, dict[str, tuple[Decimal, Decimal]]]:
    """Per pool and key, committed (reserved + discount) and budget where committed exceeds it."""
    found: dict[str, dict[str, tuple[Decimal, Decimal]]] = {}
    discounts = state.pool_discounts()
    for pool in state.tree.pools():
        off = discounts.get(pool.namespace, {})
        for resource, budget in pool.budget.items():
            committed = pool.reserved.get(resource, _ZERO) + off.get(resource, _ZERO)
            if off.get(resource) and committed > budget:
                found.setdefault(pool.namespace, {})[resource] = (committed, budget)
    return found


def assemble_report(namespace: str, findings: Iterable[Finding]) -> dict[str, Any]:
    """The ``Report`` of ``namespace`` from every one of its applications' findings."""
    ordered = sorted(findings, key=lambda item: (_ORDER[item[1].result], item[0]))
    summary = {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    for _, finding in ordered:
        summary[finding.result] += 1
    results = []
    size = 0
    for key, finding in ordered[:MAX_RESULTS]:
        result = _result(key, finding)
        size += len(json.dumps(result)) + 2
        if size > _RESULTS_BYTES:
            break
        results.append(result)
    metadata: dict[str, Any] = {
        "name": REPORT_NAME,
        "namespace": namespace,
        "labels": dict(MANAGED_BY),
    }
    left_out = len(ordered) - len(results)
    if left_out:
        metadata["annotations"] = {
            TRUNCATED_ANNOTATION: (
                f"{left_out} of {len(ordered)} results left out (at most {MAX_RESULTS} per "
                f"report and {MAX_REPORT_BYTES // 1024} KiB of them, the worst first); the "
                "summary counts every application"
            )
        }
    return {
        "apiVersion": REPORT_API_VERSION,
        "kind": "Report",
        "metadata": metadata,
        "source": SOURCE,
        "configuration": {"limits": {"maxResults": MAX_RESULTS}},
        "summary": summary,
        "results": results,
    }


def _result(key: AppKey, finding: _Finding) -> dict[str, Any]:
    kind, namespace, name = key
    result: dict[str, Any] = {
        "policy": POLICY,
        "rule": finding.rule,
        "result": finding.result,
        "message": _bounded(f"{kind}/{name}: {finding.message}"),
        "resources": [
            {
                "apiVersion": APPS_API_VERSION,
                "kind": _bounded(kind),
                "namespace": namespace,
                "name": _bounded(name),
            }
        ],
        "properties": {k: _bounded(v) for k, v in sorted(finding.properties.items())},
    }
    if finding.result in _SEVERITY:
        result["severity"] = _SEVERITY[finding.result]
    return result


def _bounded(text: str) -> str:
    if len(text) <= MAX_MESSAGE:
        return text
    return text[: MAX_MESSAGE - 14] + " ...(cut)"

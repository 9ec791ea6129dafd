"""Proof the gate held: every admitted charge recomputed, every stored write accounted for.

Walking the log's stored history (see :mod:`.history`), for each write the webhook let through:

- the charge it recorded (its audit annotation) and the charge stored on the object (the
  annotation the mutating webhook wrote) must agree, and equal the charge recomputed from the
  stored spec when the contract is the one that priced it (same digest; a changed contract is
  listed as unverifiable, not as a finding);
- a write recorded as ``allowed`` must fit: decided again under ``enforce`` against the state
  its author met, it must not exceed a budget;
- a stored write that should have reached the webhook must carry its decision.

- with the webhook's record keys, the stored charge annotation must be a record the webhook
  signed for exactly this object and values (:mod:`webhook.core.tenancy.records`); without them
  signatures are not checked, and verification rests on recomputing charges.

Charges are recomputed under today's rules and contracts: a write the webhook admitted under
older rules (a carve-out charged differently, say) shows as a finding here, which is the point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.admission.decisions import Policy, decide
from webhook.core.audit.events import AuditWrite
from webhook.core.audit.history import History
from webhook.core.audit.replay import recorded_resources
from webhook.core.audit.summary import LIST_CAP
from webhook.core.base import resources as rl
from webhook.core.base.errors import EvaluationError
from webhook.core.pricing.volumes import RELEASED, hold
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, parse_recorded_charge
from webhook.core.tenancy.records import RecordKeys, verifies

__all__ = ["Verifier"]

_ENFORCE = Policy("enforce")


class Verifier:
    """Folds audit writes into findings; :meth:`result` is its JSON form."""

    def __init__(self, history: History, keys: RecordKeys | None = None) -> None:
        self.history = history
        self.keys = keys
        self.checked = 0
        self.findings: list[dict[str, Any]] = []
        self.finding_count = 0
        self.unverifiable: list[dict[str, Any]] = []

    def add(self, write: AuditWrite) -> None:
        if self.history.reaches_webhook(write) and write.succeeded:
            self._check(write)
        self.history.apply(write)

    def _check(self, write: AuditWrite) -> None:
        if not write.decision and not write.unreachable:
            self._finding(write, "no-decision", "stored without a decision from the webhook")
            return
        if write.dry_run or write.decision not in ("allowed", "warned"):
            return
        stored = write.stored_object
        if stored is None:
            return
        self.checked += 1
        self._check_charge(write, stored)
        if write.decision == "allowed":
            self._check_fit(write)

    def _check_charge(self, write: AuditWrite, stored: Mapping[str, Any]) -> None:
        kind = self.history.kind_of(write)
        metadata = stored.get("metadata")
        annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
        text = annotations.get(CHARGE_ANNOTATION) if isinstance(annotations, Mapping) else None
        recorded = write.webhook.get("charge")
        digest = write.webhook.get("contract-digest", "")
        on_object = parse_recorded_charge(text)
        if recorded is None:
            return  # the webhook could not price it (warned as invalid): nothing recorded
        audit_charge = recorded_resources(recorded)
        if on_object is None:
            self._finding(
                write,
                "unrecorded-charge",
                f"stored without a readable {CHARGE_ANNOTATION} annotation",
            )
        elif self.keys is not None and not verifies(
            self.keys,
            (kind, write.namespace, write.name),
            self.history.state.values_digest(kind, stored.get("spec")),
            on_object,
        ):
            self._finding(
                write,
                "unsigned-charge",
                f"the stored {CHARGE_ANNOTATION} annotation is not a record the webhook signed "
                "for this object and its values",
            )
        elif rl.to_strings(on_object.resources) != audit_charge or on_object.digest != digest:
            self._finding(
                write,
                "altered-charge",
                f"stored charge {rl.to_strings(on_object.resources)} ({on_object.digest}) "
                f"differs from the decision's {audit_charge} ({digest})",
            )
        try:
            charge = self.history.state.platform.charge(
                kind, stored.get("spec"), namespace=write.namespace
            )
        except EvaluationError as exc:
            self._unverifiable(write, f"cannot be evaluated today: {exc}")
            return
        if charge.digest != digest:
            self._unverifiable(write, f"priced by contract {digest}; today's is {charge.digest}")
            return
        if on_object is not None and on_object.marks:  # volumes held at their high marks
            found = self.history.state.platform.kind(kind)
            contract = found.contract if found is not None else None
            released = [t.name for t in contract.terms if t.volume == RELEASED] if contract else []
            charge = hold(charge, on_object.marks, released).charge
        if rl.to_strings(charge.resources) != audit_charge:
            self._finding(
                write,
                "charge-mismatch",
                f"recorded {audit_charge}, recomputed {rl.to_strings(charge.resources)}",
            )

    def _check_fit(self, write: AuditWrite) -> None:
        rebuilt = self.history.rebuild(write)
        if rebuilt.request is None:
            return
        again = decide(rebuilt.request, self.history.state, _ENFORCE)
        if again.outcome == "denied" and again.reason in ("exceeded", "unknown-usage"):
            self._finding(write, "admitted-over-budget", again.message)

    def _finding(self, write: AuditWrite, what: str, detail: str) -> None:
        self.finding_count += 1
        if len(self.findings) < LIST_CAP:
            self.findings.append(
                {**_identity(write, self.history), "finding": what, "detail": detail}
            )

    def _unverifiable(self, write: AuditWrite, why: str) -> None:
        if len(self.unverifiable) < LIST_CAP:
            self.unverifiable.append({**_identity(write, self.history), "why": why})

    def result(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "findings": self.findings,
            "findingCount": self.finding_count,
            "unverifiable": self.unverifiable,
            "signatures": "checked with the record keys given"
            if self.keys is not None
            else "not checked: pass the webhook's record keys (--record-key-file)",
        }


def _identity(write: AuditWrite, history: History) -> dict[str, Any]:
    return {
        "auditID": write.audit_id,
        "time": write.timestamp,
        "namespace": write.namespace,
        "kind": history.kind_of(write) or write.resource,
        "name": write.name,
        "user": write.user,
    }

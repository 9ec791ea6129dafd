"""The stored history an audit log tells, applied to a reservation state write by write.

Replay and verification both walk the log as it happened: every write the API server stored
(its ``responseObject``) is applied to the state, whatever a what-if policy would have decided,
so each write is judged against the state its author actually met. A write is rebuilt as the
object the webhook would have seen: the stored object for a successful write; the request body
for a refused CREATE; the patch applied to the last stored copy for a refused PATCH (JSON
patch, merge patch, or a server-side apply body taken as a merge).

Charge annotations are removed from the rebuilt objects: the mutating webhook recomputes the
annotation under whatever contracts are in force, and an old object's charge comes from the
state, which records it (see ``decide``'s ``_old_charge``).

Memory: one spec per live application, as the state itself.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import jsonpatch

from webhook.core.admission.decisions import Decision
from webhook.core.admission.resolve import written_alike
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.admission.state import ReservationState
from webhook.core.audit.events import APPS_GROUP, AuditWrite
from webhook.core.tenancy.applications import (
    CHARGE_ANNOTATION,
    AppKey,
    Application,
    RecordedCharge,
    application_from_object,
    parse_recorded_charge,
)
from webhook.core.tenancy.tenants import TENANT_KIND

__all__ = ["History", "Rebuilt", "merge_patch"]


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """A write as an admission request, or why it cannot be rebuilt."""

    request: AdmissionRequest | None
    problem: str = ""


class History:
    """The stored objects and the state, advanced one audit write at a time."""

    def __init__(
        self,
        state: ReservationState,
        objects: Mapping[AppKey, Mapping[str, Any]] | None = None,
        *,
        budgets: Mapping[str, Mapping[str, Decimal]] | None = None,
        stored_dry_runs: bool = False,
    ) -> None:
        self.state = state
        # The API server stored what it answered as dry runs (cozystack-api ignores dryRun):
        # a successful one changed the objects like any write.
        self.stored_dry_runs = stored_dry_runs
        self.objects: dict[AppKey, dict[str, Any]] = {
            key: _without_charge(obj) for key, obj in (objects or {}).items()
        }
        self.budgets = dict(budgets or {})
        self.kinds: dict[str, str] = {k.plural: k.kind for k in state.platform.kinds.values()}
        self._apply_budgets()

    def kind_of(self, write: AuditWrite) -> str:
        return write.kind or self.kinds.get(write.resource, "")

    def reaches_webhook(self, write: AuditWrite) -> bool:
        """Whether the API server called, or should have called, the webhook for ``write``.

        Not for a DELETE, a request RBAC refused, or one refused before admission (schema,
        conflict); nor for an UPDATE that leaves the spec and every ``reservation.cozystack.io/``
        annotation but the charge record as stored (the shipped ``matchConditions`` skip some of
        those, and earlier ones skipped all of them; the others are decided and change nothing;
        the charge record is the webhook's own, and its changes are checked apart). A write
        that sets, changes or removes an overcommit factor unseen is a bypass: earlier
        configurations let one through that way.
        """
        if write.verb == "delete" or write.rbac_forbidden:
            return False
        if write.decision or write.unreachable:
            return True
        if not write.succeeded:
            return False
        old = self.objects.get((self.kind_of(write), write.namespace, write.name))
        stored = write.stored_object
        return not (
            write.operation == "UPDATE"
            and old is not None
            and stored is not None
            and written_alike(
                [old.get("spec"), _reservation_annotations(old)],
                [stored.get("spec"), _reservation_annotations(stored)],
            )
        )

    def rebuild(self, write: AuditWrite) -> Rebuilt:
        """The admission request the webhook saw (or would have seen) for ``write``."""
        kind = self.kind_of(write)
        if not kind:
            return Rebuilt(None, f"resource {write.resource!r}: kind unknown")
        key = (kind, write.namespace, write.name)
        old = self.objects.get(key)
        operation = write.operation or ("UPDATE" if old is not None else "CREATE")
        if operation == "DELETE":
            return Rebuilt(None, "a DELETE is not admitted")
        stored = write.stored_object
        new: Mapping[str, Any] | None
        if stored is not None:
            new = stored
        elif write.request_object is None:
            return Rebuilt(None, f"logged at {write.level or 'an unknown'} level: no bodies")
        elif operation == "CREATE" or write.verb == "update":
            new = write.request_object if isinstance(write.request_object, Mapping) else None
        elif old is None:
            return Rebuilt(None, "a refused PATCH of an object the log never showed stored")
        else:
            new = _patched(old, write.request_object)
        if new is None:
            return Rebuilt(None, "the request body cannot be applied to the stored object")
        request = AdmissionRequest(
            uid=write.audit_id,
            group=APPS_GROUP,
            version="v1alpha1",
            kind=kind,
            resource=write.resource,
            namespace=write.namespace,
            name=write.name,
            operation=operation,
            dry_run=write.dry_run,
            object=_without_charge(new),
            old_object=old if operation == "UPDATE" else None,
            user=write.user,
        )
        return Rebuilt(request)

    def apply(self, write: AuditWrite, decision: Decision | None = None) -> bool:
        """Apply what ``write`` stored; return whether the state changed."""
        if (write.dry_run and not self.stored_dry_runs) or not write.succeeded:
            return False
        kind = self.kind_of(write)
        key = (kind, write.namespace, write.name)
        if write.verb == "delete":
            self.objects.pop(key, None)
            self.state.forget(key)
            if kind == TENANT_KIND:
                self._apply_budgets()
            return True
        stored = write.stored_object
        if stored is None or not kind:
            return False
        obj = _without_charge(stored)
        self.objects[key] = obj
        app = _application(obj, kind, write, decision)
        if app is None:
            return False
        self.state.observe(app)
        if kind == TENANT_KIND:
            self._apply_budgets()
        return True

    def _apply_budgets(self) -> None:
        """What-if budgets beat the ones Tenants declare, for as long as the replay runs."""
        for namespace, budget in self.budgets.items():
            self.state.tree.set_budget(namespace, budget)


def _application(
    obj: Mapping[str, Any], kind: str, write: AuditWrite, decision: Decision | None
) -> Application | None:
    if decision is not None and decision.admitted is not None:
        return decision.admitted
    try:
        app = application_from_object({**obj, "kind": kind})
    except ValueError:
        return None
    recorded = _recorded(write)
    if recorded is not None:
        app = Application(app.kind, app.namespace, app.name, app.spec, recorded)
    return app


def _recorded(write: AuditWrite) -> RecordedCharge | None:
    """The charge the stored object carries (what the real state would have recorded)."""
    stored = write.stored_object
    metadata = stored.get("metadata") if stored is not None else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return None
    return parse_recorded_charge(annotations.get(CHARGE_ANNOTATION))


def _without_charge(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy without the charge annotation (the webhook's own record), and without bulk."""
    metadata = obj.get("metadata")
    result = {k: v for k, v in obj.items() if k != "metadata"}
    if isinstance(metadata, Mapping):
        meta = {k: v for k, v in metadata.items() if k != "managedFields"}
        annotations = meta.get("annotations")
        if isinstance(annotations, Mapping):
            meta["annotations"] = {
                k: v
                for k, v in annotations.items()
                if k != CHARGE_ANNOTATION
                and k != "kubectl.kubernetes.io/last-applied-configuration"
            }
        result["metadata"] = meta
    return result


def _patched(old: Mapping[str, Any], patch: object) -> Mapping[str, Any] | None:
    if isinstance(patch, list):
        try:
            result = jsonpatch.apply_patch(copy.deepcopy(dict(old)), patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError):
            return None
        return result if isinstance(result, Mapping) else None
    if isinstance(patch, Mapping):
        merged = merge_patch(old, patch)
        return merged if isinstance(merged, Mapping) else None
    return None


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386 JSON merge patch: a new value, ``target`` untouched."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _reservation_annotations(obj: Mapping[str, Any]) -> dict[str, object]:
    """``obj``'s ``reservation.cozystack.io/`` annotations."""
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return {}
    return {
        str(k): v
        for k, v in annotations.items()
        if str(k).startswith("reservation.cozystack.io/") and k != CHARGE_ANNOTATION
    }

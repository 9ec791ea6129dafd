"""Admission orchestration: an AdmissionReview in, a decision, an AdmissionReview out.

The shell around the pure decision shared by the server and the ``review`` command. It turns
any unexpected exception into a denial that echoes the uid and carries a request id (nothing
ever answers "allowed" by accident), and applies what was admitted to the state: for the
``review`` command and for a server running on manifest directories, the state then holds what
the API server would have stored, so a sequence of requests accumulates.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

from webhook.core.admission.answers import finish
from webhook.core.admission.decisions import (
    WARNING_LIMIT,
    Decision,
    Policy,
    decide,
    errored,
    mutate,
)
from webhook.core.admission.reviews import AdmissionRequest, parse_review, review_response
from webhook.core.admission.state import ReservationState
from webhook.core.admission.storable import unstorable
from webhook.core.admission.warn_caps import explain_cap, warn_cap, with_cap_warning
from webhook.core.capacity.guard import QuotaBook, guard_warning
from webhook.core.capacity.room import RoomBook, room_warning
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.core.tenancy.records import parse_recorded_charge

__all__ = [
    "Admission",
    "Outcome",
    "admit",
    "apply_admitted",
    "as_live",
    "conflict",
    "existing",
    "internal_error",
    "with_guard_warning",
    "with_room_warning",
]

log = logging.getLogger(__name__)

# How long a request waits for the record keys to be re-read when it carries a record signed
# with a key this replica does not know (a rotation another replica has already seen).
KEY_REREAD_SECONDS: Final = 2.0


@dataclass(frozen=True)
class Outcome:
    request: AdmissionRequest
    decision: Decision

    @property
    def review(self) -> dict[str, Any]:
        return review_response(self.request.uid, self.decision.response())


class Reserver(Protocol):
    """Admits through a ledger shared with other replicas (see ``webhook.admission.ledger``)."""

    async def admit(self, request: AdmissionRequest, policy: Policy) -> Decision: ...


class Admission:
    """Decides validating and mutating reviews against one state.

    ``state`` is the state, or a function returning the current one (a live state is replaced
    when the platform changes). Without a ``reserver``, what is admitted is applied to the state
    at once (manifest directories: nothing else would ever show it); with one, admitted charges
    are held as pending until the cluster shows the object.
    """

    def __init__(
        self,
        state: ReservationState | Callable[[], ReservationState],
        policy: Policy,
        *,
        reserver: Reserver | None = None,
        quotas: QuotaBook | None = None,
        room: RoomBook | None = None,
        refresh_keys: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._state = state if callable(state) else (lambda: state)
        self.policy = policy
        self.reserver = reserver
        self.quotas = quotas
        self.room = room
        self.refresh_keys = refresh_keys

    @property
    def state(self) -> ReservationState:
        return self._state()

    async def validate(self, request: AdmissionRequest) -> Decision:
        mode = self.policy.mode_for(request.kind)
        if mode != "off":  # off holds nothing; warn allows it, warned, and holds nothing either
            too_large = unstorable(request)
            if too_large is not None:
                return finish(mode, too_large, request)
        await self.know_keys(request)
        if self.reserver is not None:
            decision = existing(request, self.state, self.policy) or await self.reserver.admit(
                request, self.policy
            )
            decision = with_guard_warning(decision, request, self.state, self.quotas)
            return with_room_warning(decision, request, self.room)
        decision = conflict(request, self.state) or decide(request, self.state, self.policy)
        decision = as_live(request, decision, self.state)
        decision = with_guard_warning(decision, request, self.state, self.quotas)
        decision = with_room_warning(decision, request, self.room)
        apply_admitted(self.state, request, decision)
        return decision

    async def mutate(self, request: AdmissionRequest) -> Decision:
        await self.know_keys(request)
        return mutate(request, self.state, self.policy)

    async def know_keys(self, request: AdmissionRequest) -> None:
        """Before deciding: if a record on the request names a key this replica does not know,
        re-read the keys (bounded), so a rotation another replica saw first refuses nothing."""
        if self.refresh_keys is None:
            return
        keys = self.state.keys
        for obj in (request.object, request.old_object):
            record = parse_recorded_charge(_charge_annotation(obj))
            if record is not None and record.kid and not keys.knows(record.kid):
                try:
                    async with asyncio.timeout(KEY_REREAD_SECONDS):
                        await self.refresh_keys(record.kid)
                except TimeoutError:
                    log.warning("record keys not re-read in time", extra={"uid": request.uid})
                return


def _charge_annotation(obj: Mapping[str, Any] | None) -> object:
    metadata = obj.get("metadata") if obj is not None else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations.get(CHARGE_ANNOTATION) if isinstance(annotations, Mapping) else None


def admit(
    body: object,
    state: ReservationState,
    policy: Policy,
    *,
    quotas: QuotaBook | None = None,
) -> Outcome:
    """Decide a decoded AdmissionReview; raises ``ReviewError`` only for a malformed review."""
    request = parse_review(body)
    try:
        decision = conflict(request, state) or decide(request, state, policy)
        decision = as_live(request, decision, state)
        decision = with_guard_warning(decision, request, state, quotas)
    except Exception:
        decision = internal_error(request)
    return Outcome(request, decision)


def as_live(request: AdmissionRequest, decision: Decision, state: ReservationState) -> Decision:
    """Where this process is the only store: what the live ledger does around a decision.

    A carve-out admitted in warn beyond what fits is capped (recorded in ``state`` before the
    answer, the cap :func:`~webhook.core.admission.warn_caps.warn_cap` finds for the ledger
    too), so the writes after it are decided as the cluster would decide them; a refusal by a
    capped pool says so. Call it before the write is applied: the cap is what counted before.
    """
    found = warn_cap(request, decision, state)
    if found is not None:
        state.add_cap(found.pool, found.owned, found.cap)
        return with_cap_warning(decision, found)
    if not decision.allowed and decision.reason == "exceeded":
        return explain_cap(decision, state)
    return decision


def conflict(request: AdmissionRequest, state: ReservationState) -> Decision | None:
    """Where this process is the only store (``review``, manifest directories): a CREATE of a
    name the state already holds is refused as the API server would refuse it, and changes
    nothing; the first object keeps its record."""
    if request.operation != "CREATE":
        return None
    key = (request.kind, request.namespace, request.name)
    if state.record(key) is None and key not in state.unknown():
        return None
    return errored(
        409,
        "AlreadyExists",
        "already-exists",
        f"{request.kind} {request.name} already exists in {request.namespace}; "
        "nothing was changed (update it instead)",
    )


def existing(request: AdmissionRequest, state: ReservationState, policy: Policy) -> Decision | None:
    """On a live cluster: a CREATE of a name the state already holds is refused before
    anything is held for it.

    The API server calls admission webhooks before its storage refuses a duplicate name with
    AlreadyExists (``genericregistry.Store.Create`` runs ``createValidation`` first), so an
    admitted CREATE of an existing name would hold its charge in the pool's ledger for the
    whole grace period with nothing ever stored. In ``warn`` the write is let through
    unheld, with the warning (the API server refuses it anyway); ``off`` looks at nothing.
    """
    if request.operation != "CREATE":
        return None
    mode = policy.mode_for(request.kind)
    if mode == "off" or not state.synced:
        return None
    clash = conflict(request, state) or _same_release(request, state)
    if clash is None:
        return None
    message = f"tenant reservations: {clash.message}; if it was just deleted, try again"
    audit = {"decision": "denied", "mode": mode, "reason": clash.reason, "message": message}
    if mode == "warn":
        warning = f"would be denied: {message}"
        audit = {**audit, "decision": "warned", "would-deny": message}
        del audit["message"]
        return Decision(
            allowed=True,
            outcome="warned",
            reason=clash.reason,
            message=message,
            warnings=(warning[:WARNING_LIMIT],),
            audit=audit,
            mode=mode,
            kind=request.kind,
        )
    return replace(clash, message=message, audit=audit, mode=mode, kind=request.kind)


def _same_release(request: AdmissionRequest, state: ReservationState) -> Decision | None:
    """A CREATE that cozystack-api would store under the HelmRelease name of an application
    of another kind (release prefix + name: Kubernetes ``nodes-x`` and KubernetesNodes ``x``
    are both ``kubernetes-nodes-x``; a kind with no prefix meets every other), which its
    storage refuses as AlreadyExists after admission. One lookup per kind."""
    platform = state.platform
    kind = platform.kind(request.kind)
    if kind is None or not request.name:
        return None
    release = kind.release_prefix + request.name
    for other in platform.kinds.values():
        prefix = other.release_prefix
        if other.kind == request.kind or not release.startswith(prefix):
            continue
        key = (other.kind, request.namespace, release[len(prefix) :])
        if key[2] and (state.record(key) is not None or key in state.unknown()):
            return errored(
                409,
                "AlreadyExists",
                "already-exists",
                f"{request.kind} {request.name} would be stored as HelmRelease {release} in "
                f"{request.namespace}, which {other.kind} {key[2]} already is; nothing was "
                "changed (choose another name)",
            )
    return None


def with_guard_warning(
    decision: Decision,
    request: AdmissionRequest,
    state: ReservationState,
    quotas: QuotaBook | None,
) -> Decision:
    """Add the pod-level guard's warning to an allowed write whose pods will not start.

    The reservation decides; the namespace's ResourceQuotas only decide whether the pods run,
    so this never turns an answer around. Work is done only for namespaces with a quota.
    """
    if quotas is None or not decision.allowed or decision.charge is None:
        return decision
    found = quotas.quotas(request.namespace)
    if not found:
        return decision
    key = (request.kind, request.namespace, request.name)
    charges = ((k, r.resources if r else None) for k, r in state.records_in(request.namespace))
    warning = guard_warning(key, decision.charge, charges, found)
    if warning is None:
        return decision
    return replace(decision, warnings=(*decision.warnings, warning))


def with_room_warning(
    decision: Decision, request: AdmissionRequest, room: RoomBook | None
) -> Decision:
    """Add "no node has room right now" to an allowed VM write, from the last snapshot."""
    if room is None or not decision.allowed or decision.charge is None:
        return decision
    warning = room_warning(request.kind, decision.charge, room.largest)
    if warning is None:
        return decision
    return replace(decision, warnings=(*decision.warnings, warning))


def internal_error(request: AdmissionRequest) -> Decision:
    """The denial for an unexpected failure: logged with its stack trace, answered without."""
    request_id = uuid.uuid4().hex[:12]
    log.exception("admission failed", extra={"uid": request.uid, "request_id": request_id})
    return errored(
        500,
        "InternalError",
        "internal-error",
        f"tenant reservations: internal error (request id {request_id}); denied to be safe",
    )


def apply_admitted(state: ReservationState, request: AdmissionRequest, decision: Decision) -> None:
    """Store what the API server stores after an allowed, non-dry-run request."""
    if not decision.allowed or request.dry_run:
        return
    if request.operation in ("CREATE", "UPDATE") and decision.admitted is not None:
        state.observe(decision.admitted)
    elif request.operation == "DELETE":
        state.forget((request.kind, request.namespace, request.name))

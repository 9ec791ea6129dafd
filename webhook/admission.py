"""Admission orchestration: an AdmissionReview in, a decision, an AdmissionReview out.

The shell around the pure decision shared by the server and the ``review`` command. It turns
any unexpected exception into a denial that echoes the uid and carries a request id (nothing
ever answers "allowed" by accident), and applies what was admitted to the state: for the
``review`` command and for a server running on manifest directories, the state then holds what
the API server would have stored, so a sequence of requests accumulates.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from webhook.core.decisions import Decision, Policy, decide, errored, mutate
from webhook.core.reviews import AdmissionRequest, parse_review, review_response
from webhook.core.state import ReservationState

__all__ = ["Admission", "Outcome", "admit", "apply_admitted", "internal_error"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    request: AdmissionRequest
    decision: Decision

    @property
    def review(self) -> dict[str, Any]:
        return review_response(self.request.uid, self.decision.response())


class Admission:
    """Decides validating and mutating reviews against one state."""

    def __init__(
        self, state: ReservationState, policy: Policy, *, apply_admitted: bool = True
    ) -> None:
        self.state = state
        self.policy = policy
        self.apply_admitted = apply_admitted

    async def validate(self, request: AdmissionRequest) -> Decision:
        decision = decide(request, self.state, self.policy)
        if self.apply_admitted:
            apply_admitted(self.state, request, decision)
        return decision

    async def mutate(self, request: AdmissionRequest) -> Decision:
        return mutate(request, self.state, self.policy)


def admit(body: object, state: ReservationState, policy: Policy) -> Outcome:
    """Decide a decoded AdmissionReview; raises ``ReviewError`` only for a malformed review."""
    request = parse_review(body)
    try:
        decision = decide(request, state, policy)
    except Exception:
        decision = internal_error(request)
    return Outcome(request, decision)


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

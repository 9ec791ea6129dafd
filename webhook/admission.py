"""Admission orchestration: a decoded AdmissionReview in, an AdmissionReview response out.

The shell around :func:`webhook.core.decisions.decide` shared by the server and the ``review``
command: parse the review, decide, serialise, and turn any unexpected exception into a denial
that echoes the uid (nothing ever answers "allowed" by accident). Applying an admitted request
to the state is the caller's choice: the ``review`` command does it at once, the server leaves
it to the ledger.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from webhook.core.decisions import Decision, Policy, decide, errored
from webhook.core.reviews import AdmissionRequest, parse_review, review_response
from webhook.core.state import ReservationState

__all__ = ["Outcome", "admit"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    request: AdmissionRequest
    decision: Decision
    review: dict[str, Any]


def admit(body: object, state: ReservationState, policy: Policy) -> Outcome:
    """Decide a decoded AdmissionReview; raises ``ReviewError`` only for a malformed review."""
    request = parse_review(body)
    try:
        decision = decide(request, state, policy)
    except Exception:
        request_id = uuid.uuid4().hex[:12]
        log.exception("admission failed", extra={"uid": request.uid, "request_id": request_id})
        decision = errored(
            500,
            "InternalError",
            "internal-error",
            f"tenant reservations: internal error (request id {request_id}); denied to be safe",
        )
    return Outcome(request, decision, review_response(request.uid, decision.response()))

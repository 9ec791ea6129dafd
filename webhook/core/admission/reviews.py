"""AdmissionReview (``admission.k8s.io/v1``) in and out.

:func:`parse_review` turns a decoded request body into an :class:`AdmissionRequest` or raises
:class:`ReviewError` (a malformed review: the HTTP layer answers 400). :func:`review_response`
builds the response envelope from a decision; it is the one place that echoes the ``uid``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict, cast

from webhook.core.base.errors import ReservationError

__all__ = [
    "OPERATIONS",
    "AdmissionRequest",
    "Operation",
    "ReviewError",
    "parse_review",
    "review_response",
]

API_VERSION: Final = "admission.k8s.io/v1"
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT")
MAX_GROUPS: Final = 256
# ``dict`` first: a decoded body is made of dicts, and the check against the ``Mapping`` ABC
# alone costs three times more.
_MAPPINGS: Final = (dict, Mapping)


class ReviewError(ReservationError):
    """The body is not an AdmissionReview this server can answer."""


class StatusCause(TypedDict):
    field: str
    message: str
    reason: str


class Status(TypedDict, total=False):
    code: int
    reason: str
    message: str
    details: dict[str, Any]


class PatchFields(TypedDict, total=False):
    patchType: str
    patch: str


class Response(TypedDict, total=False):
    uid: str
    allowed: bool
    status: Status
    warnings: list[str]
    auditAnnotations: dict[str, str]
    patchType: str
    patch: str


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    uid: str
    group: str
    version: str
    kind: str
    resource: str
    namespace: str
    name: str
    operation: Operation
    dry_run: bool
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    user: str
    groups: tuple[str, ...] = ()
    # The review's bytes as received (0: unknown): its objects are never larger.
    size: int = 0


def parse_review(body: object, size: int = 0) -> AdmissionRequest:
    """The request of an ``admission.k8s.io/v1`` AdmissionReview; raises :class:`ReviewError`.
    ``size`` is the review's bytes as received (0: unknown), set here rather than by a copy."""
    if not isinstance(body, _MAPPINGS):
        raise ReviewError("the body is not a JSON object")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        raise ReviewError(f"not an AdmissionReview {API_VERSION}")
    request = body.get("request")
    if not isinstance(request, _MAPPINGS):
        raise ReviewError("request: missing")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid: missing")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise ReviewError(f"request.operation: unknown operation {operation!r}")
    kind = request.get("kind")
    if not isinstance(kind, _MAPPINGS) or not isinstance(kind.get("kind"), str):
        raise ReviewError("request.kind: missing")
    resource = request.get("resource")
    obj, old = request.get("object"), request.get("oldObject")
    if obj is not None and not isinstance(obj, _MAPPINGS):
        raise ReviewError("request.object: not an object")
    if old is not None and not isinstance(old, _MAPPINGS):
        raise ReviewError("request.oldObject: not an object")
    user = request.get("userInfo")
    return AdmissionRequest(
        uid=uid,
        group=str(kind.get("group") or ""),
        version=str(kind.get("version") or ""),
        kind=str(kind["kind"]),
        resource=str(resource.get("resource") or "") if isinstance(resource, _MAPPINGS) else "",
        namespace=str(request.get("namespace") or ""),
        name=str(request.get("name") or ""),
        operation=cast(Operation, operation),
        dry_run=request.get("dryRun") is True,
        object=obj,
        old_object=old,
        user=str(user.get("username") or "") if isinstance(user, _MAPPINGS) else "",
        groups=_groups(user),
        size=size,
    )


def _groups(user: object) -> tuple[str, ...]:
    """``userInfo.groups``: the strings of it, at most :data:`MAX_GROUPS`."""
    groups = user.get("groups") if isinstance(user, _MAPPINGS) else None
    if not isinstance(groups, list):
        return ()
    return tuple(g for g in groups[:MAX_GROUPS] if isinstance(g, str))


def review_response(uid: str, response: Response) -> dict[str, Any]:
    """The AdmissionReview envelope for ``response``, with the request's ``uid``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "response": {**response, "uid": uid},
    }

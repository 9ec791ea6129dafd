"""One audit event of an ``apps.cozystack.io`` write, as the reviews need it.

What the API server writes (kube-apiserver v1.36, ``audit.k8s.io/v1``), as seen in real logs:

- the validating webhook's ``auditAnnotations`` appear as ``<webhook name>/<key>``
  (``reservation.cozystack.io/decision``, ``.../charge`` ...);
- the mutating webhook leaves only the API server's own
  ``mutation.webhook.admission.k8s.io/round_<r>_index_<i>`` (which webhook, whether it mutated)
  and ``patch.webhook.admission.k8s.io/round_<r>_index_<i>`` (the JSONPatch it applied);
- at ``RequestResponse`` level ``requestObject`` is the body the client sent (before mutation;
  for a PATCH it is the patch, not the object) and ``responseObject`` the stored object, or the
  ``Status`` of a refusal;
- a dry run shows only as ``dryRun=All`` in ``requestURI`` (or in a DELETE's ``DeleteOptions``);
- a server-side apply that creates answers 201 to a PATCH;
- a request refused by RBAC carries ``authorization.k8s.io/decision: forbid`` and no webhook
  annotation; a webhook the API server could not call leaves its own failure message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "APPS_GROUP",
    "WEBHOOK_NAME",
    "WRITE_VERBS",
    "AuditWrite",
    "parse_time",
    "write_from_event",
]

APPS_GROUP: Final = "apps.cozystack.io"
WEBHOOK_NAME: Final = "reservation.cozystack.io"  # the validating webhook: annotation prefix
MUTATING_WEBHOOK: Final = "charge.reservation.cozystack.io"
WRITE_VERBS: Final = frozenset({"create", "update", "patch", "delete"})
MUTATION_PREFIX: Final = "mutation.webhook.admission.k8s.io/"
PATCH_PREFIX: Final = "patch.webhook.admission.k8s.io/"
# The API server's messages when it cannot get an answer from a webhook
# (k8s.io/apiserver/pkg/admission/plugin/webhook/errors and .../webhook/request).
UNREACHABLE_MARKERS: Final = ("failed calling webhook", "failed to call webhook")

Operation = Literal["CREATE", "UPDATE", "DELETE"]


@dataclass(frozen=True, slots=True)
class AuditWrite:
    """A completed write (create, update, patch, delete) of one application."""

    audit_id: str
    time: datetime
    timestamp: str  # as written: stageTimestamp
    verb: str
    namespace: str
    resource: str
    name: str
    kind: str  # "" when neither body names it (a refused merge patch, a delete)
    user: str  # the acting user: the impersonated one when there is one
    code: int
    message: str  # the API server's message for a failure
    dry_run: bool
    level: str
    rbac_forbidden: bool
    webhook: Mapping[str, str]  # our audit annotations, without the webhook-name prefix
    mutated: bool | None  # None: the mutating webhook left no trace
    mutation_patch: Any  # the JSONPatch the mutating webhook applied, if any
    request_object: Any = None
    response_object: Any = None

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300

    @property
    def stored_object(self) -> Mapping[str, Any] | None:
        """The object as stored (``responseObject`` of a successful write), if logged."""
        obj = self.response_object
        if self.succeeded and isinstance(obj, Mapping) and obj.get("kind") not in (None, "Status"):
            return obj
        return None

    @property
    def decision(self) -> str:
        """The validating webhook's recorded outcome, or ``""``: it left no decision."""
        return self.webhook.get("decision", "")

    @property
    def unreachable(self) -> bool:
        """The API server failed calling a webhook (down, timeout, TLS)."""
        text = self.message.lower()
        return self.code >= 500 and any(marker in text for marker in UNREACHABLE_MARKERS)

    @property
    def operation(self) -> Operation | None:
        """CREATE, UPDATE or DELETE; ``None`` for a refused PATCH (it may have created)."""
        if self.verb == "create":
            return "CREATE"
        if self.verb == "delete":
            return "DELETE"
        if self.code == 201:
            return "CREATE"
        if self.succeeded or self.verb == "update":
            return "UPDATE"
        return None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)


def parse_time(text: str) -> datetime:
    """An RFC 3339 timestamp as the API server writes it; raises ``ValueError``."""
    return datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)


def write_from_event(
    event: Mapping[str, Any],
    *,
    kinds: MutableMapping[str, str] | None = None,
    webhook_name: str = WEBHOOK_NAME,
) -> AuditWrite | None:
    """The write an event records, or ``None`` (another group, a read, not the final stage).

    ``kinds`` maps a resource (plural) to its kind for the events whose bodies do not say; it
    learns from the events whose bodies do (one entry per kind: bounded).
    Raises ``ValueError`` for an event that is not a well-formed audit event.
    """
    ref = event.get("objectRef")
    if not isinstance(ref, Mapping) or ref.get("apiGroup") != APPS_GROUP:
        return None
    verb = event.get("verb")
    if verb not in WRITE_VERBS:
        return None
    if event.get("stage") not in ("ResponseComplete", "Panic"):
        return None
    stamp = event.get("stageTimestamp") or event.get("requestReceivedTimestamp")
    if not isinstance(stamp, str):
        raise ValueError("stageTimestamp: missing")
    time = parse_time(stamp)
    annotations = event.get("annotations")
    if not isinstance(annotations, Mapping):
        annotations = {}
    prefix = webhook_name + "/"
    webhook = {k[len(prefix) :]: str(v) for k, v in annotations.items() if k.startswith(prefix)}
    mutated, patch = _mutation(annotations)
    status = event.get("responseStatus")
    status = status if isinstance(status, Mapping) else {}
    code = status.get("code")
    request_object = event.get("requestObject")
    response_object = event.get("responseObject")
    resource = str(ref.get("resource") or "")
    kind = _kind(request_object, response_object)
    if kinds is not None:
        if kind and resource not in kinds:
            kinds[resource] = kind
        kind = kind or kinds.get(resource, "")
    return AuditWrite(
        audit_id=str(event.get("auditID") or ""),
        time=time,
        timestamp=stamp,
        verb=str(verb),
        namespace=str(ref.get("namespace") or ""),
        resource=resource,
        name=str(ref.get("name") or _name(request_object) or ""),
        kind=kind,
        user=_user(event),
        code=code if isinstance(code, int) else 0,
        message=str(status.get("message") or ""),
        dry_run=_dry_run(event.get("requestURI"), request_object),
        level=str(event.get("level") or ""),
        rbac_forbidden=annotations.get("authorization.k8s.io/decision") == "forbid",
        webhook=webhook,
        mutated=mutated,
        mutation_patch=patch,
        request_object=request_object,
        response_object=response_object,
    )


def _mutation(annotations: Mapping[str, Any]) -> tuple[bool | None, Any]:
    """Whether our mutating webhook was called and mutated, and its patch."""
    mutated: bool | None = None
    patch: Any = None
    for key, value in annotations.items():
        if not key.startswith((MUTATION_PREFIX, PATCH_PREFIX)):
            continue
        try:
            body = json.loads(value) if isinstance(value, str) else None
        except ValueError:
            continue
        if not isinstance(body, Mapping) or body.get("webhook") != MUTATING_WEBHOOK:
            continue
        if key.startswith(MUTATION_PREFIX):
            mutated = bool(body.get("mutated")) or bool(mutated)
        else:
            patch = body.get("patch")
    return mutated, patch


def _kind(*bodies: object) -> str:
    for body in bodies:
        if isinstance(body, Mapping):
            kind = body.get("kind")
            if isinstance(kind, str) and kind and kind not in ("Status", "DeleteOptions"):
                return kind
    return ""


def _name(body: object) -> str:
    metadata = body.get("metadata") if isinstance(body, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else ""


def _user(event: Mapping[str, Any]) -> str:
    for field_name in ("impersonatedUser", "user"):
        user = event.get(field_name)
        if isinstance(user, Mapping) and isinstance(user.get("username"), str):
            return str(user["username"])
    return ""


def _dry_run(uri: object, request_object: object) -> bool:
    if isinstance(uri, str) and "dryRun" in uri:
        query = parse_qs(urlsplit(uri).query)
        if any(v for v in query.get("dryRun", [])):
            return True
    if isinstance(request_object, Mapping) and request_object.get("kind") == "DeleteOptions":
        return bool(request_object.get("dryRun"))
    return False

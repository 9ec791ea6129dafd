"""Whether etcd could store the object under admission at all: one it could not holds nothing.

kube-apiserver takes request bodies up to 3 MiB, and etcd stores at most 1.5 MiB, so a write
between the two is decided by the webhooks and only then refused by storage (500 "etcdserver:
request is too large"). An admitted write is held in its pool until it is observed or its grace
period ends, and kube-apiserver tries a create refused for its size once more without its
managedFields: the webhook was asked twice, held the charge twice, and the tenant's pool, with
nothing stored, refused its next application for the grace period. Such a write is denied here
first, naming the sizes, so nothing is held.

The object is measured as JSON, compact, as the webhook writes it: never longer than the API
server writes the same object (Go's encoder escapes ``<``, ``>`` and ``&``, writes exponents
with a sign and pads them to two digits; the review it sent wrote every number as it stores
it), so what is refused here storage would have refused too.
"""

from __future__ import annotations

from webhook.core.admission.answers import Decision, errored
from webhook.core.admission.reviews import AdmissionRequest
from webhook.core.base.json_codec import encode_json
from webhook.core.base.kube_limits import ETCD_MAX_REQUEST_BYTES

__all__ = ["unstorable"]


def unstorable(request: AdmissionRequest) -> Decision | None:
    """The denial of a write whose object is larger than etcd stores, or ``None``."""
    if request.object is None or request.operation not in ("CREATE", "UPDATE"):
        return None
    if 0 < request.size <= ETCD_MAX_REQUEST_BYTES:
        return None  # the object is part of the review: not measured at all
    try:
        size = len(encode_json(request.object))
    except (TypeError, ValueError, RecursionError):  # nested past what can be written here
        return None  # left to the API server
    if size <= ETCD_MAX_REQUEST_BYTES:
        return None
    return errored(
        413,
        "RequestEntityTooLarge",
        "too-large",
        f"tenant reservations: this {request.kind or 'object'} takes {size} bytes as JSON, "
        f"more than the {ETCD_MAX_REQUEST_BYTES} etcd stores (1.5 MiB): it could not be "
        f"stored, so nothing is reserved for it; make it smaller",
    )

"""Whether the mutating side's patch leaves an object's annotations within what Kubernetes stores.

Kubernetes refuses an object whose annotations, keys and values together, take more than 256
KiB in UTF-8 (``metadata.annotations: Too long: may not be more than 262144 bytes``), and it
checks after the mutating webhooks. The charge record written on every application is a few
hundred bytes (more with many volumes), so on an object whose own annotations come within that
of the limit the patched object was refused with a message about annotations the tenant had
kept in bounds. The patch is measured here first: a write it would push past the limit is
denied, saying what the record needs and how much the tenant's annotations take. In warn mode
nothing is blocked: the write goes on without the record (priced as it stands, as one without a
record always is), kubectl warned of what enforce would answer; but not one whose volumes are
held at their high marks above what its values say (only the record keeps a mark: stored without
it, a 100Gi PVC lowered to 1Gi would count 1Gi), which is refused as in enforce. An object already
past the limit is left to the API server, whose message is then the right one.

cozystack-api stores an application as a HelmRelease whose annotations are the application's,
each key under ``apps.cozystack.io-`` (18 bytes more each), and the HelmRelease is held to the
same limit ("failed to create HelmRelease: ... Too long"): the patch is measured that way too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from webhook.core.admission.answers import Decision, fit, invalid
from webhook.core.admission.modes import Mode
from webhook.core.base.kube_limits import ANNOTATIONS_LIMIT_BYTES
from webhook.core.tenancy.applications import USER_PREFIX

__all__ = ["ANNOTATIONS_LIMIT_BYTES", "annotation_bytes", "beyond_annotation_limit", "left_off"]

_PREFIX: Final = "/metadata/annotations/"
_RELEASE_PREFIX: Final = len(USER_PREFIX)  # what cozystack-api adds to each key
_ON_RELEASE: Final = f", each key under {USER_PREFIX} on the HelmRelease cozystack-api stores"


def annotation_bytes(annotations: Mapping[str, object]) -> int:
    """What Kubernetes counts against its limit: each key and string value, in UTF-8 bytes."""
    return sum(
        _utf8(key) + (_utf8(value) if isinstance(value, str) else 0)
        for key, value in annotations.items()
    )


def beyond_annotation_limit(
    obj: Mapping[str, object], operations: Iterable[Mapping[str, object]]
) -> Decision | None:
    """The denial of a write whose annotations ``operations`` (the mutating side's JSONPatch)
    take past :data:`ANNOTATIONS_LIMIT_BYTES`, on the object or on the HelmRelease cozystack-api
    stores it as, or ``None``: they fit, or were already past it."""
    metadata = obj.get("metadata")
    found = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    before: Mapping[str, object] = found if isinstance(found, Mapping) else {}
    after = _patched(before, operations)
    # Characters are never more than bytes, and a character is at most four of them.
    if 4 * _chars(after) + _RELEASE_PREFIX * len(after) <= ANNOTATIONS_LIMIT_BYTES:
        return None
    ours = {key: value for key, value in after.items() if before.get(key) != value}
    others = {key: value for key, value in before.items() if key not in ours}
    for prefix, where in ((0, ""), (_RELEASE_PREFIX, _ON_RELEASE)):
        needed = _bytes(after, prefix)
        written = _bytes(before, prefix)
        if written <= ANNOTATIONS_LIMIT_BYTES < needed:  # past it only with the patch
            kept, record = _bytes(others, prefix), _bytes(ours, prefix)
            replaced = f" (with the record they replace, {written})" if kept != written else ""
            excess = needed - ANNOTATIONS_LIMIT_BYTES
            fix = (
                f"remove at least {excess} bytes of them"
                if excess <= kept
                # A record keeps a volume mark per forEach item, named by the item's key.
                else "the record alone does not fit: shorten the names of the values' items"
            )
            return invalid(
                "metadata.annotations",
                f"tenant reservations: the charge record this webhook writes on every "
                f"application ({record} bytes with its key{where}) does not fit beside the "
                f"object's other annotations: they take {kept} bytes{replaced}, and Kubernetes "
                f"stores at most {ANNOTATIONS_LIMIT_BYTES} bytes of annotations; {fix}",
            )
    return None


def left_off(
    denial: Decision, operations: Iterable[Mapping[str, object]], *, kind: str, mode: Mode
) -> Decision:
    """What a mode that blocks nothing answers instead of ``denial``: the patch without the
    record (the removals it makes, which only shrink the annotations), and a warning."""
    removals = tuple(operation for operation in operations if operation.get("op") == "remove")
    return Decision(
        allowed=True,
        outcome="warned",
        reason="record-left-off",
        kind=kind,
        mode=mode,
        warnings=(fit(f"would be denied: {denial.message}"),),
        patch=removals,
    )


def _patched(
    annotations: Mapping[str, object], operations: Iterable[Mapping[str, object]]
) -> dict[str, object]:
    """``annotations`` once the operations on them are applied (the others touch nothing)."""
    result = dict(annotations)
    for operation in operations:
        path, op = operation.get("path"), operation.get("op")
        if not isinstance(path, str):
            continue
        if path == _PREFIX.rstrip("/"):
            value = operation.get("value")
            result = dict(value) if op != "remove" and isinstance(value, Mapping) else {}
        elif path.startswith(_PREFIX):
            key = path[len(_PREFIX) :].replace("~1", "/").replace("~0", "~")
            if op == "remove":
                result.pop(key, None)
            else:
                result[key] = operation.get("value")
    return result


def _bytes(annotations: Mapping[str, object], prefix: int) -> int:
    return annotation_bytes(annotations) + prefix * len(annotations)


def _chars(annotations: Mapping[str, object]) -> int:
    return sum(
        len(key) + (len(value) if isinstance(value, str) else 0)
        for key, value in annotations.items()
    )


def _utf8(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))

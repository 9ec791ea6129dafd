"""Applications as the webhook sees them, whichever form they arrive in.

An ``apps.cozystack.io`` application is stored by Cozystack as a Flux ``HelmRelease`` named
``<release prefix><name>`` whose ``spec.values`` is the application's spec, verbatim and sparse,
with labels naming the kind and the application. Admission sees the application form; a state
directory or a cache may hold either. Both become an :class:`Application`.

The charge admitted for an application travels with it as the annotation
:data:`CHARGE_ANNOTATION` (written by the mutating webhook): a record signed by the webhook
(:mod:`webhook.core.tenancy.records`). It is read here as a claim; it stays authoritative, once
verified, until the application is next written, so a contract change never silently re-prices
existing applications.

cozystack-api serves a HelmRelease as the application named by the release's name without the
kind's prefix, and deletes it only when its name label agrees. Concurrent creates of one kind
can store a release labelled with another request's name (``vm-instance-m4`` labelled ``m0``:
a shared label map written by racing requests, cozystack ``3c780acd4``): served and charged as
``m4``, it cannot be deleted through the API. :func:`mislabel` names such a release, so the
reports can say which HelmRelease to remove.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from webhook.core.tenancy.overcommit import OVERCOMMIT_ANNOTATION
from webhook.core.tenancy.records import RecordedCharge, parse_recorded_charge

__all__ = [
    "APPS_API_VERSION",
    "CHARGE_ANNOTATION",
    "NAME_LABEL",
    "AppKey",
    "Application",
    "Mislabel",
    "RecordedCharge",
    "application_from_helmrelease",
    "application_from_object",
    "as_served",
    "mislabel",
    "parse_recorded_charge",
    "resource_version",
]

APPS_API_VERSION: Final = "apps.cozystack.io/v1alpha1"
CHARGE_ANNOTATION: Final = "reservation.cozystack.io/charge"
HELMRELEASE_API_PREFIX: Final = "helm.toolkit.fluxcd.io/"
KIND_LABEL: Final = "apps.cozystack.io/application.kind"
GROUP_LABEL: Final = "apps.cozystack.io/application.group"
NAME_LABEL: Final = "apps.cozystack.io/application.name"
USER_PREFIX: Final = "apps.cozystack.io-"

AppKey = tuple[str, str, str]  # (kind, namespace, name)


@dataclass(frozen=True, slots=True)
class Application:
    kind: str
    namespace: str
    name: str
    spec: Any
    recorded: RecordedCharge | None = None
    overcommit: str | None = None  # the overcommit annotation as written (believed if vouched)
    version: int = 0  # metadata.resourceVersion when stored (0: not known)
    uid: str = ""  # metadata.uid when stored ("" not known); a record bound to another is void
    release: str = ""  # the HelmRelease it was read from ("" when read as an application)

    @property
    def key(self) -> AppKey:
        return (self.kind, self.namespace, self.name)


def application_from_object(obj: Mapping[str, Any]) -> Application:
    """An ``apps.cozystack.io`` object; raises ``ValueError`` naming the missing field."""
    kind = obj.get("kind")
    metadata = obj.get("metadata")
    if not isinstance(kind, str) or not kind:
        raise ValueError("kind: missing")
    if not isinstance(metadata, Mapping):
        raise ValueError("metadata: missing")
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name: missing")
    if not isinstance(namespace, str) or not namespace:
        raise ValueError("metadata.namespace: missing")
    recorded = parse_recorded_charge(_annotation(metadata, CHARGE_ANNOTATION))
    overcommit = _annotation(metadata, OVERCOMMIT_ANNOTATION)
    return Application(
        kind,
        namespace,
        name,
        obj.get("spec"),
        recorded,
        overcommit if isinstance(overcommit, str) else None,
        version=resource_version(metadata.get("resourceVersion")),
        uid=_uid(metadata),
    )


def _uid(metadata: Mapping[str, Any]) -> str:
    uid = metadata.get("uid")
    return uid if isinstance(uid, str) and 0 < len(uid) <= 128 else ""


def resource_version(value: object) -> int:
    """A resourceVersion as a number to order by (0 when absent or not a plain revision).

    Kubernetes calls resourceVersions opaque, but every object of one etcd shares its revision
    counter, and the ledger relies on that order (see ``webhook.admission.ledger``)."""
    if isinstance(value, str) and value.isdigit() and len(value) <= 20:
        return int(value)
    return 0


def application_from_helmrelease(release: Mapping[str, Any]) -> Application | None:
    """The application a HelmRelease stores, or ``None`` for a release that is not one."""
    metadata = release.get("metadata")
    if not isinstance(metadata, Mapping):
        raise ValueError("metadata: missing")
    labels = metadata.get("labels")
    if not isinstance(labels, Mapping):
        return None
    if labels.get(GROUP_LABEL) != "apps.cozystack.io" or not labels.get(KIND_LABEL):
        return None
    kind, name = str(labels[KIND_LABEL]), str(labels.get(NAME_LABEL) or "")
    namespace = str(metadata.get("namespace") or "")
    if not name or not namespace:
        raise ValueError(f"metadata: a {kind} HelmRelease needs a namespace and {NAME_LABEL}")
    if kind == "Tenant" and name == "tenant-root":
        name = "root"  # the shipped root release carries its full name in the label
    recorded = parse_recorded_charge(_annotation(metadata, USER_PREFIX + CHARGE_ANNOTATION))
    overcommit = _annotation(metadata, USER_PREFIX + OVERCOMMIT_ANNOTATION)
    spec = release.get("spec")
    values = spec.get("values") if isinstance(spec, Mapping) else None
    return Application(
        kind,
        namespace,
        name,
        values,
        recorded,
        overcommit if isinstance(overcommit, str) else None,
        uid=_uid(metadata),  # cozystack-api gives the application its HelmRelease's uid
        release=str(metadata.get("name") or ""),
    )


@dataclass(frozen=True, slots=True)
class Mislabel:
    """A HelmRelease whose application-name label names another application than the one
    cozystack-api serves it as."""

    release: str  # the HelmRelease's name
    label: str  # what its name label says

    def explain(self, key: AppKey) -> str:
        """What an operator reads: what is wrong with the application ``key`` and the command
        that removes it (deleting the application answers 404)."""
        kind, namespace, name = key
        return (
            f"stored as HelmRelease {self.release} labelled with another application's name "
            f"({NAME_LABEL}={self.label}): cozystack-api serves it and the webhook charges it as "
            f"{kind} {name}, but deleting {name} answers 404 and creating it again is refused; "
            f"remove it with: kubectl -n {namespace} delete helmrelease {self.release}"
        )


def mislabel(release: str, label: object, prefix: str) -> Mislabel | None:
    """Whether HelmRelease ``release`` of a kind whose releases are named ``prefix`` + name is
    labelled with another application's name (``label``); ``None`` when the label agrees.

    A label of the release's whole name is the shipped root tenant's (``tenant-root``, served
    as Tenant ``root``), not a mistake; an absent label names nothing."""
    if not isinstance(label, str) or not label:
        return None
    if label in (release.removeprefix(prefix), release):
        return None
    return Mislabel(release, label)


def as_served(app: Application, prefix: str) -> tuple[Application, Mislabel | None]:
    """An application read from a HelmRelease, named as cozystack-api serves it (the release's
    name without ``prefix``, its kind's), and the mislabel when its name label said otherwise."""
    if not app.release:
        return app, None
    found = mislabel(app.release, app.name, prefix)
    if found is None:
        return app, None
    return replace(app, name=app.release.removeprefix(prefix)), found


def _annotation(metadata: Mapping[str, Any], key: str) -> object:
    """One annotation's value; annotations that are not a map hold nothing."""
    annotations = metadata.get("annotations")
    return annotations.get(key) if isinstance(annotations, Mapping) else None


def is_helmrelease(manifest: Mapping[str, Any]) -> bool:
    api_version = manifest.get("apiVersion")
    return (
        isinstance(api_version, str)
        and api_version.startswith(HELMRELEASE_API_PREFIX)
        and manifest.get("kind") == "HelmRelease"
    )

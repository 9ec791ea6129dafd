"""A one-shot read of the cluster for a question, reading only what that question needs.

The kubectl plugin asks about the whole cluster or about one namespace; a tenant's user may
read only its own namespaces. So, unlike the webhook's live state (lists and watches of every
kind everywhere), a snapshot issues plain GETs, each bounded by the client's request timeout,
and never watches, so it cannot hang:

- the platform: ApplicationDefinitions and cluster instance types (cluster-scoped reads), the
  preset ConfigMap in the webhook's namespace (optional: without it the built-in table is used
  and a note says so);
- for one namespace: the Tenant that owns it (or, when the parent namespace cannot be read, the
  budget from that namespace's ``TenantReservation``), the tenants below it, namespace by
  namespace, and the applications in each of those namespaces; the pool above it is read from
  the ``TenantReservation`` of the nearest ancestor that has one, as far up as is readable;
- for the whole cluster: every kind's applications in every namespace.

A required read that is refused (403) stops at once with the verb, resource and scope that are
missing; an unreachable API server stops with the URL and the error. Optional reads that are
refused become notes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.core.admission.state import ReservationState
from webhook.core.capacity.guard import QuotaBook, quota_from_object
from webhook.core.pricing.platform import Platform, PlatformBuilder
from webhook.core.tenancy.applications import APPS_API_VERSION, application_from_object
from webhook.core.tenancy.tenants import TENANT_KIND, ancestors, owned_namespace, owner_release
from webhook.defaults import default_contracts, default_presets
from webhook.kube.client import ApiError, KubeClient, ResourceRef

__all__ = ["Snapshot", "SnapshotError", "get_application", "read_platform", "read_snapshot"]

Obj = dict[str, Any]

DEFINITIONS: Final = ResourceRef(
    "cozystack.io", "v1alpha1", "applicationdefinitions", namespaced=False
)
CLUSTER_TYPES: Final = ResourceRef(
    "instancetype.kubevirt.io", "v1beta1", "virtualmachineclusterinstancetypes", namespaced=False
)
NAMESPACED_TYPES: Final = ResourceRef(
    "instancetype.kubevirt.io", "v1beta1", "virtualmachineinstancetypes"
)
CONFIGMAPS: Final = ResourceRef("", "v1", "configmaps")
TENANT_RESERVATIONS: Final = ResourceRef(
    "reservation.cozystack.io", "v1alpha1", "tenantreservations"
)
PRESETS_CONFIGMAP: Final = "reservation-resource-presets"
APPS_GROUP, APPS_VERSION = APPS_API_VERSION.split("/")
PAGE: Final = 500
MAX_NAMESPACES: Final = 500  # a namespace's subtree, read namespace by namespace
PARALLEL: Final = 8  # concurrent reads against the API server


class SnapshotError(Exception):
    """A read the question needs was refused or failed; the message says which and why."""


@dataclass
class Snapshot:
    state: ReservationState
    notes: list[str] = field(default_factory=list)
    # With a namespace: the pool above it as its TenantReservation's status shows it.
    pool_above: dict[str, Any] | None = None
    known: bool = True  # with a namespace: whether anything says it exists


async def read_snapshot(
    client: KubeClient, *, namespace: str = "", webhook_namespace: str = "cozy-reservation"
) -> Snapshot:
    """The state needed to report on ``namespace`` (``""``: the whole cluster)."""
    reader = _Reader(client)
    builder, notes = await _platform(reader, webhook_namespace, namespace)
    platform = builder.build()
    if not platform.kinds:
        raise SnapshotError(
            f"{client.host}: no ApplicationDefinitions; is this a Cozystack cluster?"
        )
    state = ReservationState(platform)
    snapshot = Snapshot(state, notes)
    kinds = sorted(platform.kinds.values(), key=lambda k: k.kind)
    limit = asyncio.Semaphore(PARALLEL)

    async def one(kind_name: str, plural: str, ns: str) -> list[Obj]:
        async with limit:
            items = await reader.list(_apps(plural), ns, kind=kind_name, optional_404=True)
            if items is None:
                unserved.add(kind_name)
            return items or []

    unserved: set[str] = set()
    if not namespace:
        results = await asyncio.gather(*(one(k.kind, k.plural, "") for k in kinds))
        for objs in results:
            for obj in objs:
                _observe(snapshot, obj)
        _note_unserved(snapshot, unserved)
        return snapshot
    tenant = platform.kind(TENANT_KIND)
    snapshot.known = await _own_budget(reader, snapshot, namespace, tenant.plural if tenant else "")
    namespaces = [namespace]
    queue = [namespace]
    while queue and tenant is not None:
        current = queue.pop(0)
        for obj in await reader.list(_apps(tenant.plural), current, kind=TENANT_KIND) or []:
            _observe(snapshot, obj)
            child = owned_namespace(current, str(obj["metadata"]["name"]))
            if len(namespaces) >= MAX_NAMESPACES:
                raise SnapshotError(
                    f"{namespace} has more than {MAX_NAMESPACES} namespaces below it; "
                    "report on a namespace further down, or on the whole cluster"
                )
            namespaces.append(child)
            queue.append(child)
    others = [k for k in kinds if k.kind != TENANT_KIND]
    results = await asyncio.gather(
        *(one(k.kind, k.plural, ns) for ns in namespaces for k in others)
    )
    for objs in results:
        for obj in objs:
            _observe(snapshot, obj)
    _note_unserved(snapshot, unserved)
    if any(results):
        snapshot.known = True
    node = state.tree.get(namespace)
    if node is None or not node.bounded:
        snapshot.pool_above = await _pool_above(reader, snapshot, namespace)
    return snapshot


async def read_platform(
    client: KubeClient, *, namespace: str, webhook_namespace: str = "cozy-reservation"
) -> tuple[Platform, list[str]]:
    """The platform alone (for explaining one application), with notes on what was skipped."""
    builder, notes = await _platform(_Reader(client), webhook_namespace, namespace)
    return builder.build(), notes


async def get_application(client: KubeClient, plural: str, namespace: str, name: str) -> Obj | None:
    """One application, ``None`` when it does not exist."""
    return await _Reader(client).get(_apps(plural), namespace, name)


async def _platform(
    reader: _Reader, webhook_namespace: str, namespace: str
) -> tuple[PlatformBuilder, list[str]]:
    notes: list[str] = []
    builder = PlatformBuilder(default_contracts(), default_presets())
    for obj in await reader.list(DEFINITIONS, kind="ApplicationDefinition") or []:
        builder.add(obj, source=f"ApplicationDefinition/{obj['metadata'].get('name')}")
    for obj in await reader.list(CLUSTER_TYPES, kind="VirtualMachineClusterInstancetype") or []:
        builder.add(obj, source=f"VirtualMachineClusterInstancetype/{obj['metadata'].get('name')}")
    try:
        namespaced = await reader.list(
            NAMESPACED_TYPES, namespace, kind="VirtualMachineInstancetype", optional_404=True
        )
        for obj in namespaced or []:
            builder.add(obj, source=f"VirtualMachineInstancetype/{obj['metadata'].get('name')}")
    except SnapshotError as exc:
        notes.append(f"namespaced instance types not read ({exc})")
    try:
        presets = await reader.get(CONFIGMAPS, webhook_namespace, PRESETS_CONFIGMAP)
    except SnapshotError as exc:
        notes.append(f"the built-in preset table is used: {exc}")
        presets = None
    if presets is not None:
        builder.add({**presets, "apiVersion": "v1", "kind": "ConfigMap"}, source="ConfigMap")
    return builder, notes


async def _own_budget(reader: _Reader, snapshot: Snapshot, namespace: str, plural: str) -> bool:
    """Observe the Tenant owning ``namespace`` (its budget); whether the namespace is known."""
    owner = owner_release(namespace)
    if owner is None or not plural:
        return False
    release, parent = owner
    name = release.removeprefix("tenant-")  # the root tenant is "root", as any other
    try:
        obj = await reader.get(_apps(plural), parent, name)
    except SnapshotError as exc:
        if "forbidden" not in str(exc):
            raise
        obj = None
        record = await reader.get(TENANT_RESERVATIONS, namespace, namespace, required=False)
        budget = ((record or {}).get("status") or {}).get("budget")
        if isinstance(budget, Mapping) and budget:
            snapshot.notes.append(
                f"{namespace}'s budget read from TenantReservation {namespace} "
                f"(the Tenant object in {parent} is not readable)"
            )
            obj = {"metadata": {"name": name, "namespace": parent}, "spec": {}}
            obj["spec"]["resourceQuotas"] = dict(budget)
        else:
            snapshot.notes.append(f"{namespace}'s own budget is unknown: {exc}")
            return True
    if obj is None:
        return False
    snapshot.state.observe(application_from_object({**obj, "kind": TENANT_KIND}))
    return True


async def _pool_above(reader: _Reader, snapshot: Snapshot, namespace: str) -> dict[str, Any] | None:
    for above in ancestors(namespace)[1:]:
        try:
            record = await reader.get(TENANT_RESERVATIONS, above, above)
        except SnapshotError as exc:
            snapshot.notes.append(f"pools above {namespace} not read from {above}: {exc}")
            return None
        if record is not None:
            status = record.get("status") or {}
            return {
                "pool": above,
                "budget": dict(status.get("budget") or {}),
                "reserved": dict(status.get("reserved") or {}),
                "source": f"TenantReservation {above}/{above} status",
            }
    return None


def _observe(snapshot: Snapshot, obj: Obj) -> None:
    """Add one application; a malformed one is a note, never the end of the report."""
    try:
        snapshot.state.observe(application_from_object(obj))
    except ValueError as exc:
        metadata = obj.get("metadata") or {}
        where = f"{obj.get('kind')}/{metadata.get('name')} in {metadata.get('namespace')}"
        snapshot.notes.append(f"{where} skipped: {exc}")


def _note_unserved(snapshot: Snapshot, unserved: set[str]) -> None:
    if unserved:
        snapshot.notes.append(
            f"not served by the API (404), so not counted: {', '.join(sorted(unserved))}"
        )


def _apps(plural: str) -> ResourceRef:
    return ResourceRef(APPS_GROUP, APPS_VERSION, plural)


async def read_quotas(client: KubeClient, namespaces: list[str] | None) -> QuotaBook:
    """The ResourceQuotas of these namespaces (``None``: every namespace), for the guard."""
    reader = _Reader(client)
    book = QuotaBook()
    ref = ResourceRef("", "v1", "resourcequotas")
    scopes = [""] if namespaces is None else namespaces
    limit = asyncio.Semaphore(PARALLEL)

    async def one(namespace: str) -> list[Obj]:
        async with limit:
            return await reader.list(ref, namespace, kind="ResourceQuota") or []

    for objs in await asyncio.gather(*(one(ns) for ns in scopes)):
        for obj in objs:
            metadata = obj.get("metadata")
            if isinstance(metadata, Mapping):
                book.observe(str(metadata.get("namespace", "")), quota_from_object(obj))
    return book


class _Reader:
    """GET and paged LIST with errors turned into one sentence naming what is missing."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def get(
        self, ref: ResourceRef, namespace: str, name: str, *, required: bool = True
    ) -> Obj | None:
        try:
            return await self.client.request("GET", ref.path(namespace, name))
        except ValueError:
            path = ref.path(namespace, name)
            raise SnapshotError(f"{self.client.host}{path}: the answer is not JSON") from None
        except ApiError as exc:
            if exc.status == 404 or (exc.status == 403 and not required):
                return None
            raise self._error(exc, "get", ref, namespace, ref.path(namespace, name)) from None

    async def list(
        self, ref: ResourceRef, namespace: str = "", *, kind: str, optional_404: bool = False
    ) -> list[Obj] | None:
        """Every object (paged); ``None`` when the type is not served and that is optional."""
        items: list[Obj] = []
        params = {"limit": str(PAGE)}
        path = ref.path(namespace)
        while True:
            try:
                page = await self.client.request("GET", path, params=params)
            except ValueError:
                raise SnapshotError(f"{self.client.host}{path}: the answer is not JSON") from None
            except ApiError as exc:
                if exc.status == 404 and optional_404:
                    return None
                raise self._error(exc, "list", ref, namespace, path) from None
            for item in page.get("items") or []:
                if isinstance(item, Mapping):
                    items.append({**item, "apiVersion": ref.api_version, "kind": kind})
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params = {"limit": str(PAGE), "continue": str(token)}

    def _error(
        self, exc: ApiError, verb: str, ref: ResourceRef, namespace: str, path: str
    ) -> SnapshotError:
        resource = f"{ref.plural}.{ref.group}" if ref.group else ref.plural
        scope = f"in namespace {namespace}" if namespace and ref.namespaced else "cluster-wide"
        if exc.status == 403:
            hint = (
                "; a tenant's user can ask about its own namespace: -n NAMESPACE"
                if ref.group == APPS_GROUP and not namespace
                else ""
            )
            return SnapshotError(
                f"forbidden: this needs RBAC verb {verb!r} on {resource} {scope} "
                f"({self.client.host}{path}){hint}"
            )
        if exc.status == 0:
            return SnapshotError(f"cannot reach the API server: {exc.message}")
        return SnapshotError(f"{verb} {resource} {scope}: {exc} ({self.client.host}{path})")

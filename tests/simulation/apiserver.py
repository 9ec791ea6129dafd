"""An in-memory API server whose every answer and watch event is released by the simulator.

The replicas talk to it through :class:`SimClient`, a :class:`KubeClient` whose one call (the
lists, gets, creates and replaces the reflectors and the ledger make) and whose watches it answers
in place of an API server's sockets. Nothing is answered on its own for the resources under test
(applications and TenantReservations): a call waits in :attr:`SimAPI.calls` until the simulator
answers it (at the state of that moment) or fails it; a watch is a cursor into its resource's event
log, and moves one event at a time when the simulator delivers, so events of one resource always
arrive in order while the streams of different resources interleave freely. The simulator may also
end a stream with ``410 Gone``, send a bookmark, or stay silent until the client's read timeout
fires.

Platform resources (definitions, instance types, ConfigMaps) never change in a simulation; they
are answered at once and their watches send a bookmark every 30 seconds, as a live API server
does, so they never mask what is being tested.

Storage follows the API server's rules: one resourceVersion counter for everything, a create of
an existing name is ``409 AlreadyExists``, an update carrying a stale resourceVersion is
``409 Conflict``, except for the plurals named ``unconditioned``: those are written as
cozystack-api writes applications (a read, then a write of the whole object with no
resourceVersion precondition), so whichever admitted update is stored last wins, whatever it
read.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, Unpack

from tests.apiserver.server import metadata_only
from webhook.kube.client import ApiError, KubeClient, RequestOptions, WatchTimeout

Obj = dict[str, Any]
Key = tuple[str, str, str]  # plural, namespace, name
T = TypeVar("T")

PLATFORM_BOOKMARK_SECONDS = 30.0
CLOCK_RESOLUTION = 1e-6  # well above an event loop's clock resolution at any simulated instant
HELM_RELEASES = "helmreleases"
KIND_LABEL = "apps.cozystack.io/application.kind"
NAME_LABEL = "apps.cozystack.io/application.name"
GROUP_LABEL = "apps.cozystack.io/application.group"


@dataclass
class Call:
    """One request waiting for the simulator to answer it."""

    id: int
    replica: str
    method: str
    plural: str
    namespace: str
    name: str
    subresource: str
    body: Obj | None
    future: asyncio.Future[Obj]
    params: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        target = "/".join(p for p in (self.plural, self.namespace, self.name) if p)
        suffix = f"/{self.subresource}" if self.subresource else ""
        return f"#{self.id} {self.replica} {self.method} {target}{suffix}"


@dataclass
class Stream:
    """One open watch: a cursor into its resource's event log."""

    id: int
    replica: str
    plural: str
    cursor: int  # index of the next event in the log to deliver
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)
    closed: bool = False

    def describe(self) -> str:
        return f"~{self.id} {self.replica} {self.plural}"


class SimAPI:
    """Objects, their event logs, and the calls and watches waiting on the simulator."""

    def __init__(
        self,
        scheduled: set[str],
        trace: Callable[[str], None],
        *,
        unconditioned: frozenset[str] = frozenset(),
    ) -> None:
        self.scheduled = scheduled  # plurals whose calls and events the simulator releases
        self.unconditioned = unconditioned  # plurals updated with no resourceVersion check
        self.trace = trace
        self.version = 1
        self.objects: dict[Key, Obj] = {}
        self.logs: dict[str, list[tuple[int, str, Obj]]] = {}
        self.calls: list[Call] = []
        self.streams: list[Stream] = []
        # The newest resourceVersion of each resource the server has sent each replica (in an
        # event, a bookmark or a list): what that replica could know of, at the latest.
        self.told: dict[tuple[str, str], int] = {}
        self._ids = 0

    def _tell(self, replica: str, plural: str, version: int) -> None:
        key = (replica, plural)
        self.told[key] = max(self.told.get(key, 0), version)

    # -- storage -------------------------------------------------------------------------

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _bump(self, plural: str, event: str, obj: Obj) -> Obj:
        self.version += 1
        obj = _copy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.logs.setdefault(plural, []).append((self.version, event, _copy(obj)))
        return obj

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        found = self.objects.get((plural, namespace, name))
        return None if found is None else _copy(found)

    def items(self, plural: str) -> list[Obj]:
        return [_copy(o) for (p, _, _), o in sorted(self.objects.items()) if p == plural]

    def create(self, plural: str, obj: Obj) -> Obj:
        metadata = obj.get("metadata") or {}
        key = (plural, str(metadata.get("namespace") or ""), str(metadata["name"]))
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f"{'/'.join(key)} already exists")
        obj = _copy(obj)
        obj["metadata"] = {**metadata, "generation": 1}
        obj["metadata"].pop("resourceVersion", None)
        stored = self._bump(plural, "ADDED", obj)
        self.objects[key] = stored
        return _copy(stored)

    def replace(self, plural: str, obj: Obj, *, status: bool = False) -> Obj:
        metadata = obj.get("metadata") or {}
        key = (plural, str(metadata.get("namespace") or ""), str(metadata["name"]))
        current = self.objects.get(key)
        if current is None:
            raise ApiError(404, "NotFound", f"{'/'.join(key)} not found")
        expected = metadata.get("resourceVersion")
        if plural in self.unconditioned:
            expected = None  # cozystack-api's Update: no precondition on what it read
        if expected and expected != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f"{'/'.join(key)}: the object has been modified")
        updated = _copy(current)
        if status:
            updated["status"] = _copy(obj.get("status"))
        else:
            if obj.get("spec") != current.get("spec"):
                updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
            updated["spec"] = _copy(obj.get("spec"))
            for field_name in ("labels", "annotations"):
                updated["metadata"][field_name] = _copy(metadata.get(field_name))
        stored = self._bump(plural, "MODIFIED", updated)
        self.objects[key] = stored
        return _copy(stored)

    def delete(self, plural: str, namespace: str, name: str) -> Obj | None:
        current = self.objects.pop((plural, namespace, name), None)
        if current is None:
            return None
        return self._bump(plural, "DELETED", current)

    # -- calls ---------------------------------------------------------------------------

    def submit(self, call: Call) -> None:
        if call.plural in self.scheduled:
            self.calls.append(call)
            return
        self._answer(call)

    def answer(self, call: Call, *, fail: ApiError | None = None) -> None:
        self.calls.remove(call)
        if fail is not None:
            self.trace(f"fail   {call.describe()}: {fail.status} {fail.reason}")
            if not call.future.done():
                call.future.set_exception(fail)
            return
        self._answer(call)

    def _answer(self, call: Call) -> None:
        try:
            result = self._serve(call)
        except ApiError as exc:
            if call.plural in self.scheduled:
                self.trace(f"answer {call.describe()}: {exc.status} {exc.reason}")
            if not call.future.done():
                call.future.set_exception(exc)
            return
        if call.plural in self.scheduled:
            self.trace(f"answer {call.describe()}: {_summary(result)}")
            if "items" in result:
                self._tell(call.replica, call.plural, int(result["metadata"]["resourceVersion"]))
        if not call.future.done():
            call.future.set_result(result)

    def _serve(self, call: Call) -> Obj:
        if call.method == "GET" and call.plural == HELM_RELEASES:
            return self._releases(call.params.get("labelSelector", ""))
        if call.method == "GET" and not call.name:
            items = [
                o
                for o in self.items(call.plural)
                if not call.namespace or o["metadata"].get("namespace") == call.namespace
            ]
            return {"items": items, "metadata": {"resourceVersion": str(self.version)}}
        if call.method == "GET":
            found = self.get(call.plural, call.namespace, call.name)
            if found is None:
                raise ApiError(404, "NotFound", f"{call.plural}/{call.name} not found")
            return found
        assert call.body is not None
        if call.method == "POST":
            return self.create(call.plural, call.body)
        if call.method == "PUT":
            return self.replace(call.plural, call.body, status=call.subresource == "status")
        raise ApiError(405, "MethodNotAllowed", call.method)

    def _releases(self, selector: str) -> Obj:
        """The HelmReleases applications are stored as (cozystack-api's storage), selected by
        kind label, at the current version: the same objects, at the same versions."""
        wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
        kind = wanted.get(KIND_LABEL)
        items = []
        for (_, namespace, name), obj in sorted(self.objects.items()):
            if obj.get("kind") != kind or not obj.get("apiVersion", "").startswith("apps."):
                continue
            labels = {KIND_LABEL: kind, NAME_LABEL: name, GROUP_LABEL: "apps.cozystack.io"}
            metadata = {
                "name": name,
                "namespace": namespace,
                "labels": labels,
                "resourceVersion": obj["metadata"]["resourceVersion"],
            }
            items.append({"kind": "HelmRelease", "metadata": metadata})
        return {"items": items, "metadata": {"resourceVersion": str(self.version)}}

    # -- watches -------------------------------------------------------------------------

    def open(self, replica: str, plural: str, resource_version: str) -> Stream:
        since = int(resource_version or 0)
        log = self.logs.get(plural, [])
        cursor = next((i for i, (v, _, _) in enumerate(log) if v > since), len(log))
        stream = Stream(self._next_id(), replica, plural, cursor)
        if plural in self.scheduled:
            self.streams.append(stream)
            self.trace(f"watch  {stream.describe()} from rv {since}")
        return stream

    def pending(self, stream: Stream) -> int:
        """How many events the stream has not delivered yet."""
        return len(self.logs.get(stream.plural, [])) - stream.cursor

    def deliver(self, stream: Stream) -> None:
        version, event, obj = self.logs[stream.plural][stream.cursor]
        stream.cursor += 1
        self._tell(stream.replica, stream.plural, version)
        self.trace(f"event  {stream.describe()} {event} {_summary(obj)}")
        stream.queue.put_nowait({"type": event, "object": _copy(obj)})

    def bookmark(self, stream: Stream) -> None:
        """Everything up to now has been sent: only when the stream is caught up."""
        self.trace(f"mark   {stream.describe()} rv {self.version}")
        self._tell(stream.replica, stream.plural, self.version)
        stream.queue.put_nowait(
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.version)}}}
        )

    def gone(self, stream: Stream) -> None:
        """The stream's resume point was compacted away: 410, the client must list again."""
        self.trace(f"gone   {stream.describe()}")
        stream.queue.put_nowait(
            {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
        )
        self.close(stream)

    def close(self, stream: Stream) -> None:
        stream.closed = True
        if stream in self.streams:
            self.streams.remove(stream)


class SimClient(KubeClient):
    """The calls a replica makes, routed to :class:`SimAPI` (no configuration, no sockets)."""

    def __init__(self, api: SimAPI, replica: str) -> None:  # no super(): nothing to configure
        self.api = api
        self.replica = replica
        self.host = "sim://"
        self._session = None

    async def close(self) -> None:
        return None

    async def _call(
        self, method: str, path: str, **options: Unpack[RequestOptions]
    ) -> tuple[Obj, int]:
        """The call, answered by the simulator: objects in memory, with nothing to bound and no
        bytes read (so list pages keep the size they start with)."""
        plural, namespace, name, subresource = _parse(path)
        future: asyncio.Future[Obj] = asyncio.get_running_loop().create_future()
        body = options.get("body")
        payload = _copy(dict(body)) if isinstance(body, Mapping) else None
        call = Call(
            self.api._next_id(),
            self.replica,
            method,
            plural,
            namespace,
            name,
            subresource,
            payload,
            future,
            dict(options.get("params") or {}),
        )
        self.api.submit(call)
        answer = await future
        if "as=PartialObjectMetadataList" in options.get("accept", "") and "items" in answer:
            answer = {**answer, "items": [metadata_only(item) for item in answer["items"]]}
        return answer, 0

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        read_timeout: float,
        params: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[Obj, None]:
        plural, _, _, _ = _parse(path)
        stream = self.api.open(self.replica, plural, resource_version)
        loop = asyncio.get_running_loop()
        ends = loop.time() + timeout_seconds
        platform = plural not in self.api.scheduled
        try:
            while True:
                left = ends - loop.time()
                # The server closes the watch; the client reopens it. A remainder below the
                # event loop's clock resolution is no time at all: a timer that short is ready at
                # once, so waiting it out would yield bookmarks at one instant forever.
                if left <= CLOCK_RESOLUTION:
                    return
                wait = min(left, PLATFORM_BOOKMARK_SECONDS if platform else read_timeout)
                try:
                    async with asyncio.timeout(wait):
                        event = await stream.queue.get()
                except TimeoutError:
                    if platform:
                        yield {"type": "BOOKMARK", "object": {"metadata": {}}}
                        continue
                    if loop.time() >= ends:
                        return
                    self.api.trace(f"silent {stream.describe()}: read timeout")
                    raise WatchTimeout(f"watch {path}: silent for {read_timeout:g}s") from None
                if event is None:
                    return
                yield event
        finally:
            self.api.close(stream)


def _copy(obj: T) -> T:
    """A deep copy of JSON-like data (several times faster than ``copy.deepcopy``)."""
    copied: T = pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
    return copied


def _parse(path: str) -> tuple[str, str, str, str]:
    """(plural, namespace, name, subresource) of an API path."""
    parts = path.strip("/").split("/")
    parts = parts[3:] if parts[0] == "apis" else parts[2:]
    namespace = ""
    if parts and parts[0] == "namespaces" and len(parts) > 2:
        namespace, parts = parts[1], parts[2:]
    plural = parts[0]
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 else ""
    return plural, namespace, name, subresource


def _summary(obj: Mapping[str, Any]) -> str:
    """A short, stable description of an object or list for the trace."""
    if "items" in obj:
        names = [_summary(i) for i in obj["items"]]
        return f"list rv {obj['metadata']['resourceVersion']} [{', '.join(names)}]"
    metadata = obj.get("metadata") or {}
    where = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
    version = metadata.get("resourceVersion", "")
    spec = obj.get("spec")
    if obj.get("kind") == "TenantReservation":
        pending = (obj.get("status") or {}).get("pending") or []
        entries = ",".join(f"{e.get('id')}:{e.get('application')}" for e in pending)
        return f"TR {where} rv {version} pending [{entries}]"
    return f"{obj.get('kind', '')} {where} rv {version} {json.dumps(spec, sort_keys=True)}"

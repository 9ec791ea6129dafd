"""An in-process Kubernetes API server that tests talk to over real HTTP.

No real API server can run in this project's test environment, and call-by-call
mocks of a client library would only replay our own assumptions. This emulator
speaks the wire protocol that clients and informers depend on instead: JSON
objects and ``Status`` errors with the real codes, reasons and message shapes;
one etcd-like resourceVersion counter shared by every resource; optimistic
concurrency; a status subresource; consistent paginated lists; and chunked
watch streams with history replay, synthetic initial events, bookmarks,
selector-aware DELETED events and ``410 Expired``. Resource types are data
(group, version, plural, kind, scope), never per-kind code. Faults a client
must survive (compaction, dropped or silenced watches, injected error statuses,
a server that stops answering) are switches a test flips. The places where it
knowingly differs from kube-apiserver are listed in this folder's README.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import copy
import enum
import json
import random
import re
import socket
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final, NamedTuple, Self

import yaml
from aiohttp import web
from multidict import MultiMapping

Obj = dict[str, Any]

ADDED: Final = "ADDED"
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"
BOOKMARK: Final = "BOOKMARK"
ERROR: Final = "ERROR"

INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"

# kube-apiserver's --max-request-body-bytes default (3 MiB).
MAX_BODY_BYTES: Final = 3 * 1024 * 1024

SERVER_VERSION: Final[Obj] = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_REASONS: Final[Mapping[int, str]] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

_MODIFIED_MESSAGE: Final = (
    "the object has been modified; please apply your changes to the latest version and try again"
)
_CONTINUE_EXPIRED: Final = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token "
    "in this response to retrieve the remainder of the results. Continuing with the provided "
    "token results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)
_NOT_FOUND_PATH: Final = "the server could not find the requested resource"
_MERGE_PATCH: Final = "application/merge-patch+json"

# apimachinery's DNS-1123 subdomain rule, used for metadata.name of most kinds.
_DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_DNS_SUBDOMAIN_MESSAGE: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*"
    "[a-z0-9])?)*')"
)
# apimachinery's names.SimpleNameGenerator: 5 characters from an alphabet without vowels.
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
_MAX_GENERATED_PREFIX: Final = 63 - 5

_LABEL_TERM: Final = re.compile(
    r"\s*(?P<not>!)?\s*(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*)"
    r"|\s(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?\s*"
)
_FIELD_TERM: Final = re.compile(
    r"\s*(?P<field>[A-Za-z0-9_.]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*?)\s*"
)
_SELECTABLE_FIELDS: Final = ("metadata.name", "metadata.namespace")


# --- Status errors ---------------------------------------------------------------------------


def status_object(
    code: int, message: str, *, reason: str | None = None, details: Obj | None = None
) -> Obj:
    """A ``kind: Status`` failure body as kube-apiserver writes it (reason omitted if empty)."""
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
    }
    reason = _REASONS.get(code, "") if reason is None else reason
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


class APIError(Exception):
    """A request the server refuses; ``status`` is the ``Status`` body sent on the wire."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: Obj | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status_object(code, message, reason=reason, details=details)
        self.headers: dict[str, str] = dict(headers or {})

    @property
    def code(self) -> int:
        return int(self.status["code"])

    @property
    def reason(self) -> str:
        return str(self.status.get("reason", ""))


def _bad_request(message: str) -> APIError:
    return APIError(400, message)


def _details(resource: Resource, name: str) -> Obj:
    details: Obj = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.plural
    return details


def _not_found(resource: Resource, name: str) -> APIError:
    return APIError(
        404, f'{resource.group_resource} "{name}" not found', details=_details(resource, name)
    )


def _conflict(resource: Resource, name: str, why: str = _MODIFIED_MESSAGE) -> APIError:
    return APIError(
        409,
        f'Operation cannot be fulfilled on {resource.group_resource} "{name}": {why}',
        details=_details(resource, name),
    )


def _invalid(resource: Resource, kind: str, name: str, causes: list[Obj]) -> APIError:
    """422 Invalid; each cause is ``{reason, message, field}`` as in field.ErrorList."""
    errors = [f"{cause['field']}: {cause['message']}" for cause in causes]
    summary = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    group_kind = f"{kind}.{resource.group}" if resource.group else kind
    details: Obj = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details.update(kind=kind, causes=causes)
    return APIError(422, f'{group_kind} "{name}" is invalid: {summary}', details=details)


def _invalid_options(options_kind: str, field_path: str, message: str) -> APIError:
    cause = {"reason": "FieldValueInvalid", "message": message, "field": field_path}
    return APIError(
        422,
        f'{options_kind}.meta.k8s.io "" is invalid: {field_path}: {message}',
        details={"group": "meta.k8s.io", "kind": options_kind, "causes": [cause]},
    )


def _too_large_resource_version(requested: int, current: int) -> APIError:
    return APIError(
        504,
        f"Timeout: Too large resource version: {requested}, current: {current}",
        details={
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
        headers={"Retry-After": "1"},
    )


# --- Resources, selectors, events ------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """One registered resource type; the group "" is the core group served under /api/v1."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = False
    # Served as cozystack-api serves applications (see "Aggregated resources" in the README).
    aggregated: bool = False
    # Updated as cozystack-api updates applications: a read, then a write with no
    # resourceVersion precondition, so the last write wins whatever it read.
    unconditioned: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """``plural.group`` as error messages spell it (just ``plural`` for the core group)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str = ""
    ) -> str:
        """The URL path of the collection (all namespaces if ``namespace`` is None), of an
        object, or of its subresource."""
        path = self.prefix
        if namespace is not None and self.namespaced:
            path += f"/namespaces/{namespace}"
        path += f"/{self.plural}"
        if name is not None:
            path += f"/{name}"
            if subresource:
                path += f"/{subresource}"
        return path


class RecordedRequest(NamedTuple):
    """One request as it reached the server, for assertions."""

    method: str
    path: str
    query: dict[str, str]
    accept: str = ""


@dataclass(frozen=True)
class _Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "!":
            return self.key not in labels
        if self.operator in ("=", "in"):
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # "!=" and "notin" match absent keys


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside ``in (...)`` value sets."""
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return terms


def parse_label_selector(text: str) -> tuple[_Requirement, ...]:
    """Parse the labelSelector query syntax: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``,
    ``a in (x,y)``, ``a notin (x)``, joined by commas (AND). Raises a 400 APIError."""
    if not text.strip():
        return ()
    requirements = []
    for term in _split_terms(text):
        match = _LABEL_TERM.fullmatch(term)
        if match is None or (match["not"] and (match["op"] or match["setop"])):
            raise _bad_request(f"unable to parse requirement: invalid label selector: {term!r}")
        key = match["key"]
        if match["not"]:
            requirements.append(_Requirement(key, "!"))
        elif match["op"]:
            operator = "!=" if match["op"] == "!=" else "="
            requirements.append(_Requirement(key, operator, frozenset({match["value"]})))
        elif match["setop"]:
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            requirements.append(_Requirement(key, match["setop"], values))
        else:
            requirements.append(_Requirement(key, "exists"))
    return tuple(requirements)


def parse_field_selector(text: str) -> tuple[tuple[str, bool, str], ...]:
    """Parse a fieldSelector over metadata.name and metadata.namespace into
    ``(field, equal, value)`` terms. Raises a 400 APIError for anything else."""
    if not text.strip():
        return ()
    terms = []
    for term in text.split(","):
        match = _FIELD_TERM.fullmatch(term)
        if match is None:
            raise _bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        if match["field"] not in _SELECTABLE_FIELDS:
            raise _bad_request(f"field label not supported: {match['field']}")
        terms.append((match["field"], match["op"] != "!=", match["value"]))
    return tuple(terms)


@dataclass(frozen=True)
class _Selection:
    """Which objects a list or watch sees: a namespace (None: all) and selectors."""

    namespace: str | None = None
    labels: tuple[_Requirement, ...] = ()
    fields: tuple[tuple[str, bool, str], ...] = ()

    @property
    def selective(self) -> bool:
        return bool(self.labels or self.fields)

    def matches(self, obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        if not all(requirement.matches(labels) for requirement in self.labels):
            return False
        values = {
            "metadata.name": meta.get("name", ""),
            "metadata.namespace": meta.get("namespace", ""),
        }
        return all((values[name] == value) == equal for name, equal, value in self.fields)


@dataclass(frozen=True)
class _Change:
    """One write, as etcd's revision log records it.

    ``obj`` is the new state; for DELETED it is the last state, stamped with the
    deletion's revision. ``prev`` is the state before (None for ADDED)."""

    revision: int
    resource: Resource
    type: str
    obj: Obj
    prev: Obj | None


class _Signal(enum.Enum):
    DROP = "drop"  # close the connection without ending the chunked body
    STOP = "stop"  # end the stream cleanly
    WAKE = "wake"  # re-check pause and silence


@dataclass(eq=False)
class _Watcher:
    resource: Resource
    selection: _Selection
    queue: asyncio.Queue[tuple[str, Obj] | _Signal] = field(default_factory=asyncio.Queue)
    silenced: bool = False
    deaf: bool = False  # told nothing of any change (cozystack-api's watch from "0")


@dataclass
class _Fault:
    remaining: int
    code: int
    method: str | None


@dataclass(frozen=True)
class _Target:
    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str | None


def _key(namespace: str | None, name: str) -> str:
    """The object's etcd key below its resource prefix; lists are sorted by it."""
    return f"{namespace}/{name}" if namespace else name


def _object_key(obj: Obj) -> str:
    meta = obj["metadata"]
    return _key(meta.get("namespace"), meta["name"])


def _at_revision(obj: Obj, revision: int) -> Obj:
    stamped = dict(obj)
    stamped["metadata"] = {**obj["metadata"], "resourceVersion": str(revision)}
    return stamped


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _flag(value: str | None) -> bool:
    """apimachinery's query-bool conversion: absent, "0" and "false" are false."""
    return value is not None and value != "0" and value.lower() != "false"


def _parse_revision(value: str) -> int:
    try:
        revision = int(value)
    except ValueError:
        raise _bad_request(f"invalid resource version: {value!r}") from None
    if revision < 0:
        raise _bad_request(f"invalid resource version: {value!r}")
    return revision


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes, others replace."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _json_response(
    body: Obj, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


# --- The server ------------------------------------------------------------------------------


class EmulatedAPIServer:
    """A small, protocol-faithful kube-apiserver on 127.0.0.1 over plain HTTP.

    All state lives in the instance. Writes made over HTTP and through the
    direct-access methods (``create``, ``update`` ...) share one code path, so
    both bump the resourceVersion and reach open watches.
    """

    def __init__(
        self,
        *,
        token: str | None = "test-token",
        bookmark_interval: float = 1.0,
        history_limit: int = 10_000,
        seed: int = 0,
    ) -> None:
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.requests: list[RecordedRequest] = []
        self._lose = 0  # changes still to keep from open watches (lose_next_events)
        self._history_limit = history_limit
        self._random = random.Random(seed)
        self._resources: dict[tuple[str, str], Resource] = {}
        self._store: dict[Resource, dict[str, Obj]] = {}
        self._revision = 1
        # Every change with a revision above the floor is still in the history.
        self._floor = 1
        self._history: deque[_Change] = deque()
        self._watchers: set[_Watcher] = set()
        self._snapshots: dict[Resource, tuple[int, dict[str, Obj], list[str]]] = {}
        self._faults: list[_Fault] = []
        self._running = asyncio.Event()
        self._running.set()
        self._runner: web.AppRunner | None = None
        self._base_url: str | None = None

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> str:
        """Serve on a free port of 127.0.0.1 and return the base URL."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        self._runner = runner
        self._base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self._base_url

    async def stop(self) -> None:
        """End every watch cleanly, release paused requests and stop serving."""
        if self._runner is None:
            return
        self._running.set()
        for watcher in self._watchers:
            watcher.queue.put_nowait(_Signal.STOP)
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        if self._base_url is None:
            raise RuntimeError("the emulated API server has not been started")
        return self._base_url

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion (etcd's revision)."""
        return str(self._revision)

    def kubeconfig(
        self, path: Path, *, token: str | None = None, namespace: str = "default"
    ) -> Path:
        """Write a kubeconfig for this server: one cluster, one bearer-token user, one
        current context. ``token`` defaults to the server's own token."""
        user: Obj = {}
        if token is not None or self.token is not None:
            user["token"] = token if token is not None else self.token
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulated", "cluster": {"server": self.base_url}}],
            "users": [{"name": "emulated", "user": user}],
            "contexts": [
                {
                    "name": "emulated",
                    "context": {"cluster": "emulated", "user": "emulated", "namespace": namespace},
                }
            ],
            "current-context": "emulated",
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    # --- registration and direct access ----------------------------------------------------

    def resource(
        self,
        group: str,
        version: str,
        plural: str,
        kind: str,
        *,
        namespaced: bool = True,
        status: bool = False,
        aggregated: bool = False,
        unconditioned: bool = False,
    ) -> Resource:
        """Register a resource type; the same registration twice is harmless. ``aggregated``
        serves its lists and watches as cozystack-api does, ``unconditioned`` its updates
        (no resourceVersion precondition: see the README)."""
        if not group and version != "v1":
            raise ValueError("the core group is served as /api/v1 only")
        resource = Resource(
            group, version, plural, kind, namespaced, status, aggregated, unconditioned
        )
        existing = self._resources.get((group, plural))
        if existing is not None and existing != resource:
            raise ValueError(f"{resource.group_resource} is already registered as {existing}")
        self._resources[(group, plural)] = resource
        self._store.setdefault(resource, {})
        return resource

    def create(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Obj:
        """Create as ``POST`` would; the resource comes from apiVersion and kind."""
        resource = self._resource_of(obj)
        return copy.deepcopy(
            self._create(resource, self._namespace_of(resource, obj), dict(obj), dry_run=dry_run)
        )

    def update(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Obj:
        """Replace as ``PUT`` would (``status`` ignored if the type has a status subresource)."""
        return self._direct_update(obj, status=False, dry_run=dry_run)

    def update_status(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Obj:
        """Replace ``status`` only, as ``PUT .../status`` would."""
        return self._direct_update(obj, status=True, dry_run=dry_run)

    def patch(
        self,
        group: str,
        plural: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        status: bool = False,
    ) -> Obj:
        """Apply a JSON merge patch, as ``PATCH`` with application/merge-patch+json would."""
        resource = self._registered(group, plural)
        namespace = namespace if resource.namespaced else None
        return copy.deepcopy(
            self._patch(resource, namespace, name, dict(patch), status=status, dry_run=False)
        )

    def delete(self, group: str, plural: str, namespace: str | None, name: str) -> Obj:
        """Delete as ``DELETE`` would; returns the deleted (or now terminating) object."""
        resource = self._registered(group, plural)
        namespace = namespace if resource.namespaced else None
        return copy.deepcopy(self._delete(resource, namespace, name, {}, dry_run=False))

    def get(self, group: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        """The stored object, or None."""
        resource = self._registered(group, plural)
        namespace = namespace if resource.namespaced else None
        return copy.deepcopy(self._store[resource].get(_key(namespace, name)))

    def objects(self, group: str, plural: str, namespace: str | None = None) -> list[Obj]:
        """Every stored object of a type (optionally one namespace), in list order."""
        bucket = self._store[self._registered(group, plural)]
        selection = _Selection(namespace=namespace)
        return [copy.deepcopy(bucket[k]) for k in sorted(bucket) if selection.matches(bucket[k])]

    # --- fault injection -------------------------------------------------------------------

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: a watch or continue token
        from before now gets 410 Expired."""
        self._floor = self._revision
        self._history.clear()
        self._snapshots.clear()

    def drop_watches(self) -> None:
        """Abruptly close every open watch: the connection ends without the final chunk."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(_Signal.DROP)

    def silence_watches(self) -> None:
        """Keep the currently open watches connected but send nothing more on them, not
        even bookmarks or the timeoutSeconds close; events meant for them are lost.
        Watches opened later are unaffected."""
        for watcher in self._watchers:
            watcher.silenced = True
            watcher.queue.put_nowait(_Signal.WAKE)

    def lose_next_events(self, count: int = 1) -> None:
        """The next ``count`` changes reach no open watch, which stays open and goes on with
        the changes after them, as cozystack-api's watches can. They are stored, and in the
        history: a list, and a watch opened later, see them."""
        self._lose += count

    def pause(self) -> None:
        """Stop answering: new requests are accepted but wait, unanswered, until
        ``resume()``; open watches go silent (events queue up, no bookmarks, no timeout
        close)."""
        self._running.clear()

    def resume(self) -> None:
        """Answer waiting requests and flush what paused watches queued up."""
        self._running.set()
        for watcher in self._watchers:
            watcher.queue.put_nowait(_Signal.WAKE)

    def fail_next(self, count: int, status: int, *, method: str | None = None) -> None:
        """Answer the next ``count`` authenticated requests (of ``method``, if given) with
        ``status`` and the Status body kube-apiserver would send for it."""
        if count > 0:
            self._faults.append(_Fault(count, status, method.upper() if method else None))

    # --- the write path --------------------------------------------------------------------

    def _commit(self, resource: Resource, kind: str, obj: Obj, prev: Obj | None) -> None:
        bucket = self._store[resource]
        if kind == DELETED:
            del bucket[_object_key(obj)]
        else:
            bucket[_object_key(obj)] = obj
        change = _Change(self._revision, resource, kind, obj, prev)
        self._history.append(change)
        while len(self._history) > self._history_limit:
            self._floor = self._history.popleft().revision
        if self._lose > 0:
            self._lose -= 1
            return
        for watcher in self._watchers:
            if watcher.resource == resource and not watcher.silenced and not watcher.deaf:
                event = self._translate(change, watcher.selection)
                if event is not None:
                    watcher.queue.put_nowait(event)

    @staticmethod
    def _translate(change: _Change, selection: _Selection) -> tuple[str, Obj] | None:
        """What a watcher with this selection sees, as the watch cache decides it: an
        object entering the selection is ADDED, one leaving it is DELETED (its previous
        state at the change's revision)."""
        now = change.type != DELETED and selection.matches(change.obj)
        before = change.prev is not None and selection.matches(change.prev)
        if now:
            return (MODIFIED if before else ADDED, change.obj)
        if before:
            assert change.prev is not None
            gone = (
                change.obj if change.type == DELETED else _at_revision(change.prev, change.revision)
            )
            return (DELETED, gone)
        return None

    def _decode(self, resource: Resource, body: object) -> Obj:
        if not isinstance(body, dict):
            raise _bad_request(
                f"couldn't get version/kind; json parse error: cannot unmarshal "
                f"{type(body).__name__} into an object"
            )
        obj = copy.deepcopy(body)
        if not obj.get("apiVersion"):
            obj["apiVersion"] = resource.api_version
        if obj["apiVersion"] != resource.api_version:
            raise _bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the "
                f"expected API version ({resource.api_version})"
            )
        if obj.get("metadata") is None:
            obj["metadata"] = {}
        if not isinstance(obj["metadata"], dict):
            raise _bad_request("metadata: expected an object")
        if not obj.get("kind"):
            obj["kind"] = resource.kind
        head = {
            "apiVersion": obj.pop("apiVersion"),
            "kind": obj.pop("kind"),
            "metadata": obj.pop("metadata"),
        }
        obj = {**head, **obj}
        if obj["kind"] != resource.kind:
            cause = {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "{obj["kind"]}": must be {resource.kind}',
                "field": "kind",
            }
            raise _invalid(resource, str(obj["kind"]), obj["metadata"].get("name", ""), [cause])
        return obj

    def _check_name(self, resource: Resource, name: str) -> None:
        if not name:
            cause = {
                "reason": "FieldValueRequired",
                "message": "Required value: name or generateName is required",
                "field": "metadata.name",
            }
            raise _invalid(resource, resource.kind, "", [cause])
        if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
            cause = {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "{name}": {_DNS_SUBDOMAIN_MESSAGE}',
                "field": "metadata.name",
            }
            raise _invalid(resource, resource.kind, name, [cause])

    def _create(
        self, resource: Resource, namespace: str | None, body: object, *, dry_run: bool
    ) -> Obj:
        obj = self._decode(resource, body)
        meta = obj["metadata"]
        if resource.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise _bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        bucket = self._store[resource]
        if not meta.get("name") and meta.get("generateName"):
            prefix = str(meta["generateName"])[:_MAX_GENERATED_PREFIX]
            for _ in range(8):
                meta["name"] = prefix + "".join(self._random.choices(_NAME_ALPHABET, k=5))
                if _key(namespace, meta["name"]) not in bucket:
                    break
        name = str(meta.get("name") or "")
        self._check_name(resource, name)
        if resource.status:
            obj.pop("status", None)
        for system_field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(system_field, None)
        meta["uid"] = str(uuid.UUID(int=self._random.getrandbits(128), version=4))
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        if meta.get("resourceVersion"):
            # The etcd3 store returns a plain error here, which the handler turns into a 500.
            raise APIError(
                500, "resourceVersion should not be set on objects to be created", reason=""
            )
        if _key(namespace, name) in bucket:
            raise APIError(
                409,
                f'{resource.group_resource} "{name}" already exists',
                reason="AlreadyExists",
                details=_details(resource, name),
            )
        meta.pop("resourceVersion", None)
        if dry_run:
            return obj
        self._revision += 1
        meta["resourceVersion"] = str(self._revision)
        self._commit(resource, ADDED, obj, None)
        return obj

    def _update(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: object,
        *,
        status: bool,
        dry_run: bool,
    ) -> Obj:
        obj = self._decode(resource, body)
        meta = obj["metadata"]
        if meta.get("name", "") != name:
            raise _bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on "
                f"the URL ({name})"
            )
        if resource.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
            raise _bad_request(
                f"the namespace of the object ({meta['namespace']}) does not match the "
                f"namespace on the request ({namespace})"
            )
        current = self._store[resource].get(_key(namespace, name))
        if current is None:
            raise _not_found(resource, name)
        current_meta = current["metadata"]
        wanted = str(meta.get("resourceVersion") or "")
        if wanted:
            _parse_revision(wanted)
            if wanted != current_meta["resourceVersion"] and not resource.unconditioned:
                raise _conflict(resource, name)
        if meta.get("uid") and meta["uid"] != current_meta["uid"]:
            cause = {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "{meta["uid"]}": field is immutable',
                "field": "metadata.uid",
            }
            raise _invalid(resource, resource.kind, name, [cause])

        if status:
            new = copy.deepcopy(current)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
        else:
            new = obj
            if resource.status:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
            for kept in (
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                if kept in current_meta:
                    meta[kept] = current_meta[kept]
                else:
                    meta.pop(kept, None)
            if resource.namespaced:
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
            if self._spec_of(resource, new) != self._spec_of(resource, current):
                meta["generation"] = int(current_meta.get("generation", 0)) + 1
        new["metadata"]["resourceVersion"] = current_meta["resourceVersion"]

        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return self._remove(resource, current, dry_run=dry_run)
        if new == current:
            return current  # etcd3 skips writes that change nothing: no new revision, no event
        if dry_run:
            return new
        self._revision += 1
        new["metadata"]["resourceVersion"] = str(self._revision)
        self._commit(resource, MODIFIED, new, current)
        return new

    @staticmethod
    def _spec_of(resource: Resource, obj: Obj) -> Obj:
        """What metadata.generation tracks: everything but metadata (and status, when it
        is a subresource)."""
        skipped = {"metadata", "status"} if resource.status else {"metadata"}
        return {key: value for key, value in obj.items() if key not in skipped}

    def _patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: object,
        *,
        status: bool,
        dry_run: bool,
    ) -> Obj:
        if not isinstance(patch, dict):
            raise _bad_request("the merge patch must be a JSON object")
        current = self._store[resource].get(_key(namespace, name))
        if current is None:
            raise _not_found(resource, name)
        patched = merge_patch(current, patch)
        return self._update(resource, namespace, name, patched, status=status, dry_run=dry_run)

    def _delete(
        self, resource: Resource, namespace: str | None, name: str, options: Obj, *, dry_run: bool
    ) -> Obj:
        current = self._store[resource].get(_key(namespace, name))
        if current is None:
            raise _not_found(resource, name)
        meta = current["metadata"]
        preconditions = options.get("preconditions") or {}
        if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
            raise _conflict(
                resource,
                name,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                f"UID in object meta: {meta['uid']}",
            )
        wanted = preconditions.get("resourceVersion")
        if wanted and wanted != meta["resourceVersion"]:
            raise _conflict(
                resource,
                name,
                f"Precondition failed: ResourceVersion in precondition: {wanted}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}",
            )
        if not meta.get("finalizers"):
            return self._remove(resource, current, dry_run=dry_run)
        if meta.get("deletionTimestamp"):
            return current
        terminating = copy.deepcopy(current)
        terminating["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0)
        if dry_run:
            return terminating
        self._revision += 1
        terminating["metadata"]["resourceVersion"] = str(self._revision)
        self._commit(resource, MODIFIED, terminating, current)
        return terminating

    def _remove(self, resource: Resource, current: Obj, *, dry_run: bool) -> Obj:
        if dry_run:
            return current
        self._revision += 1
        gone = _at_revision(current, self._revision)
        self._commit(resource, DELETED, gone, current)
        return gone

    # --- the read path ---------------------------------------------------------------------

    def _snapshot(self, resource: Resource, revision: int) -> tuple[dict[str, Obj], list[str]]:
        """The resource at ``revision`` with its keys sorted, kept while pages of one list are
        served (every page of a paginated list reads the same revision, as from etcd)."""
        cached = self._snapshots.get(resource)
        if cached is not None and cached[0] == revision:
            return cached[1], cached[2]
        state = self._state_at(resource, revision)
        ordered = sorted(state)
        self._snapshots[resource] = (revision, state, ordered)
        return state, ordered

    def _state_at(self, resource: Resource, revision: int) -> dict[str, Obj]:
        """The resource's objects as they were at ``revision``, rebuilt by undoing later
        changes; older than the history floor is 410 Expired."""
        state = dict(self._store[resource])
        if revision >= self._revision:
            return state
        if revision < self._floor:
            raise APIError(410, "The resourceVersion for the provided list is too old.")
        for change in reversed(self._history):
            if change.revision <= revision:
                break
            if change.resource != resource:
                continue
            if change.prev is None:
                state.pop(_object_key(change.obj), None)
            else:
                state[_object_key(change.prev)] = change.prev
        return state

    def _list(self, resource: Resource, selection: _Selection, query: Mapping[str, str]) -> Obj:
        if resource.aggregated:
            return self._aggregated_list(resource, selection)
        version = query.get("resourceVersion", "")
        match = query.get("resourceVersionMatch", "")
        token = query.get("continue", "")
        limit = self._int_param(query, "limit")
        start = ""
        if token:
            if version:
                raise _bad_request("specifying resource version is not allowed when using continue")
            revision, start = self._decode_continue(token)
            if revision < self._floor:
                raise APIError(410, _CONTINUE_EXPIRED)
        else:
            if match and match not in ("Exact", "NotOlderThan"):
                raise _invalid_options(
                    "ListOptions",
                    "resourceVersionMatch",
                    f'Unsupported value: "{match}": supported values: "Exact", "NotOlderThan"',
                )
            if match and not version:
                raise _invalid_options(
                    "ListOptions",
                    "resourceVersionMatch",
                    "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is "
                    "provided",
                )
            if match == "Exact" and version == "0":
                raise _invalid_options(
                    "ListOptions",
                    "resourceVersionMatch",
                    'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                )
            revision = self._revision
            if version not in ("", "0"):
                requested = _parse_revision(version)
                if requested > self._revision:
                    raise _too_large_resource_version(requested, self._revision)
                if match == "Exact":
                    revision = requested
        state, ordered = self._snapshot(resource, revision)
        first = bisect.bisect_left(ordered, start)
        keys: list[str] = []
        more = False
        for key in ordered[first:]:
            if not selection.matches(state[key]):
                continue
            if limit > 0 and len(keys) == limit:
                more = True
                break
            keys.append(key)
        metadata: Obj = {"resourceVersion": str(revision)}
        if more:
            metadata["continue"] = self._encode_continue(revision, keys[-1])
            if not selection.selective:
                metadata["remainingItemCount"] = len(ordered) - first - limit
        return {
            "kind": f"{resource.kind}List",
            "apiVersion": resource.api_version,
            "metadata": metadata,
            "items": [state[k] for k in keys],
        }

    def _aggregated_list(self, resource: Resource, selection: _Selection) -> Obj:
        """cozystack-api's list: every match at once (no pages), at the largest
        resourceVersion among the kind's objects, ``"0"`` when it has none."""
        bucket = self._store[resource]
        largest = max((int(o["metadata"]["resourceVersion"]) for o in bucket.values()), default=0)
        return {
            "kind": f"{resource.kind}List",
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(largest)},
            "items": [bucket[k] for k in sorted(bucket) if selection.matches(bucket[k])],
        }

    @staticmethod
    def _encode_continue(revision: int, last_key: str) -> str:
        """The etcd3 store's token: base64url of {"v", "rv", "start"}, start just past the
        last key returned."""
        token = {"v": "meta.k8s.io/v1", "rv": revision, "start": last_key + "\x00"}
        return base64.urlsafe_b64encode(json.dumps(token).encode()).rstrip(b"=").decode()

    @staticmethod
    def _decode_continue(token: str) -> tuple[int, str]:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            decoded = json.loads(raw)
            revision, start = decoded["rv"], decoded["start"]
            if decoded["v"] != "meta.k8s.io/v1" or not isinstance(revision, int):
                raise ValueError(token)
        except (binascii.Error, ValueError, KeyError, TypeError):
            raise _bad_request(
                "continue key is not valid: incorrect encoded start resourceVersion"
            ) from None
        return revision, str(start)

    @staticmethod
    def _int_param(query: Mapping[str, str], name: str) -> int:
        value = query.get(name, "")
        if not value:
            return 0
        try:
            return int(value)
        except ValueError:
            raise _bad_request(f"{name}: invalid value {value!r}") from None

    def _open_watch(
        self, resource: Resource, selection: _Selection, query: Mapping[str, str]
    ) -> _Watcher:
        """Register a watcher with its starting events already queued. Nothing awaits in
        here, so no write can fall between the replay and the live events."""
        version = query.get("resourceVersion", "")
        match = query.get("resourceVersionMatch", "")
        initial_param = query.get("sendInitialEvents")
        if initial_param is None and match:
            raise _invalid_options(
                "ListOptions",
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents "
                "is provided",
            )
        if initial_param is not None:
            if match != "NotOlderThan":
                raise _invalid_options(
                    "ListOptions",
                    "resourceVersionMatch",
                    "Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
                    "NotOlderThan",
                )
            if _flag(initial_param) and not _flag(query.get("allowWatchBookmarks")):
                raise _invalid_options(
                    "ListOptions",
                    "allowWatchBookmarks",
                    "Forbidden: allowWatchBookmarks must be set to true when sendInitialEvents "
                    "is set to true",
                )
        watcher = _Watcher(resource, selection)
        queue = watcher.queue
        if resource.aggregated:
            return self._open_aggregated_watch(watcher, version)
        send_current = version in ("", "0") if initial_param is None else _flag(initial_param)
        if send_current:
            bucket = self._store[resource]
            for key in sorted(bucket):
                if selection.matches(bucket[key]):
                    queue.put_nowait((ADDED, bucket[key]))
            if initial_param is not None:
                queue.put_nowait((BOOKMARK, self._bookmark(resource, initial_end=True)))
        elif version not in ("", "0"):
            since = _parse_revision(version)
            if since < self._floor:
                expired = status_object(
                    410, f"too old resource version: {since} ({self._floor})", reason="Expired"
                )
                queue.put_nowait((ERROR, expired))
                queue.put_nowait(_Signal.STOP)
            else:
                for change in self._history:
                    if change.revision > since and change.resource == resource:
                        event = self._translate(change, selection)
                        if event is not None:
                            queue.put_nowait(event)
        self._watchers.add(watcher)
        return watcher

    def _open_aggregated_watch(self, watcher: _Watcher, version: str) -> _Watcher:
        """cozystack-api's watch: from ``""`` or ``"0"``, one initial-events-end bookmark and
        then nothing, ever; from N, every object newer than N as ADDED (the objects as they
        are now: nothing of the history, so a delete before the watch opened is never told),
        then every change. Never 410."""
        resource = watcher.resource
        if version in ("", "0"):
            bookmark = self._bookmark(resource, initial_end=True)
            bookmark["metadata"]["resourceVersion"] = version
            watcher.queue.put_nowait((BOOKMARK, bookmark))
            watcher.deaf = True
        else:
            since = _parse_revision(version)
            bucket = self._store[resource]
            for key in sorted(bucket):
                obj = bucket[key]
                if int(obj["metadata"]["resourceVersion"]) > since and watcher.selection.matches(
                    obj
                ):
                    watcher.queue.put_nowait((ADDED, obj))
        self._watchers.add(watcher)
        return watcher

    def _bookmark(self, resource: Resource, *, initial_end: bool = False) -> Obj:
        metadata: Obj = {"resourceVersion": str(self._revision)}
        if initial_end:
            metadata["annotations"] = {INITIAL_EVENTS_END: "true"}
        return {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": metadata}

    # --- HTTP ------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(
            RecordedRequest(
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("Accept", ""),
            )
        )
        await self._running.wait()
        if (
            self.token is not None
            and request.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return _json_response(status_object(401, "Unauthorized"), 401)
        try:
            fault = self._take_fault(request.method)
            if fault is not None:
                raise self._fault_error(fault, request.path)
            return await self._dispatch(request)
        except APIError as error:
            return _json_response(error.status, error.code, error.headers)
        except web.HTTPRequestEntityTooLarge:
            return _json_response(
                status_object(413, f"the request body is too large, limit is {MAX_BODY_BYTES}"),
                413,
            )

    def _take_fault(self, method: str) -> int | None:
        for fault in self._faults:
            if fault.method in (None, method):
                fault.remaining -= 1
                if fault.remaining == 0:
                    self._faults.remove(fault)
                return fault.code
        return None

    def _fault_error(self, code: int, path: str) -> APIError:
        try:
            target = self._target(path)
        except APIError:
            target = None
        if target is not None and target.name is not None:
            if code == 409:
                return _conflict(target.resource, target.name)
            if code == 404:
                return _not_found(target.resource, target.name)
        if code == 409:
            return APIError(409, f"Operation cannot be fulfilled: {_MODIFIED_MESSAGE}")
        if code == 500:
            return APIError(
                500,
                "Internal error occurred: injected fault",
                details={"causes": [{"message": "injected fault"}]},
            )
        if code == 503:
            return APIError(503, "the server is currently unable to handle the request")
        if code == 429:
            return APIError(
                429,
                "Too many requests, please try again later.",
                details={"retryAfterSeconds": 1},
                headers={"Retry-After": "1"},
            )
        if code == 504:
            return APIError(504, "Timeout: request did not complete within the allowed duration")
        return APIError(code, f"injected fault: HTTP {code}")

    def _target(self, path: str) -> _Target | None:
        """Resolve a resource path; None for discovery paths, 404 for unknown resources."""
        segments = [segment for segment in path.split("/") if segment]
        if len(segments) >= 2 and segments[0] == "api" and segments[1] == "v1":
            group, version, rest = "", "v1", segments[2:]
        elif len(segments) >= 3 and segments[0] == "apis":
            group, version, rest = segments[1], segments[2], segments[3:]
        else:
            return None
        if not rest:
            return None

        def lookup(plural: str) -> Resource | None:
            found = self._resources.get((group, plural))
            return found if found is not None and found.version == version else None

        namespaced = lookup(rest[2]) if len(rest) >= 3 and rest[0] == "namespaces" else None
        if namespaced is not None and namespaced.namespaced:
            resource, namespace, tail = namespaced, rest[1], rest[3:]
        else:
            found = lookup(rest[0])
            if found is None or (found.namespaced and len(rest) > 1):
                raise APIError(404, _NOT_FOUND_PATH, details={})
            resource, namespace, tail = found, None, rest[1:]
        if len(tail) > 2:
            raise APIError(404, _NOT_FOUND_PATH, details={})
        subresource = tail[1] if len(tail) == 2 else None
        if subresource is not None and (subresource != "status" or not resource.status):
            raise APIError(404, _NOT_FOUND_PATH, details={})
        return _Target(resource, namespace, tail[0] if tail else None, subresource)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        target = self._target(request.path)
        if target is None:
            if request.method != "GET":
                raise _method_not_allowed()
            return self._discovery(request.path)
        query = request.query
        resource, namespace, name = target.resource, target.namespace, target.name
        method = request.method
        writes = ("POST", "PUT", "PATCH", "DELETE")
        dry_run = self._dry_run(query, method) if method in writes else False
        if name is None:
            selection = _Selection(
                namespace=namespace,
                labels=parse_label_selector(query.get("labelSelector", "")),
                fields=parse_field_selector(query.get("fieldSelector", "")),
            )
            if method == "GET":
                if _flag(query.get("watch")):
                    return await self._serve_watch(request, resource, selection)
                listed = self._list(resource, selection, query)
                if "as=PartialObjectMetadataList" in request.headers.get("Accept", ""):
                    listed = _metadata_list(listed)
                return _json_response(listed)
            if method == "POST" and (namespace is not None or not resource.namespaced):
                body = await self._read_json(request)
                return _json_response(self._create(resource, namespace, body, dry_run=dry_run), 201)
            if method == "DELETE" and (namespace is not None or not resource.namespaced):
                options = await self._read_options(request)
                return _json_response(
                    self._delete_collection(resource, selection, options, dry_run=dry_run)
                )
            raise _method_not_allowed()
        status = target.subresource == "status"
        if method == "GET":
            stored = self._store[resource].get(_key(namespace, name))
            if stored is None:
                raise _not_found(resource, name)
            return _json_response(stored)
        if method == "PUT":
            body = await self._read_json(request)
            return _json_response(
                self._update(resource, namespace, name, body, status=status, dry_run=dry_run)
            )
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            if content_type != _MERGE_PATCH:
                raise APIError(
                    415,
                    "the body of the request was in an unknown format - accepted media types "
                    f"include: {_MERGE_PATCH}",
                )
            patch = await self._read_json(request)
            return _json_response(
                self._patch(resource, namespace, name, patch, status=status, dry_run=dry_run)
            )
        if method == "DELETE" and not status:
            options = await self._read_options(request)
            return _json_response(self._delete(resource, namespace, name, options, dry_run=dry_run))
        raise _method_not_allowed()

    def _delete_collection(
        self, resource: Resource, selection: _Selection, options: Obj, *, dry_run: bool
    ) -> Obj:
        bucket = self._store[resource]
        doomed = [bucket[k] for k in sorted(bucket) if selection.matches(bucket[k])]
        items = [
            self._delete(
                resource,
                obj["metadata"].get("namespace"),
                obj["metadata"]["name"],
                options,
                dry_run=dry_run,
            )
            for obj in doomed
        ]
        return {
            "kind": f"{resource.kind}List",
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(self._revision)},
            "items": items,
        }

    @staticmethod
    def _dry_run(query: MultiMapping[str], method: str) -> bool:
        values = query.getall("dryRun", [])
        options_kind = {
            "POST": "CreateOptions",
            "PUT": "UpdateOptions",
            "PATCH": "PatchOptions",
            "DELETE": "DeleteOptions",
        }[method]
        for value in values:
            if value != "All":
                raise _invalid_options(
                    options_kind,
                    "dryRun",
                    f'Unsupported value: ["{value}"]: supported values: "All"',
                )
        return bool(values)

    @staticmethod
    async def _read_json(request: web.Request) -> object:
        content_type = request.headers.get("Content-Type", "")
        if request.method != "PATCH" and content_type and "json" not in content_type:
            raise APIError(
                415,
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json",
            )
        raw = await request.read()
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _bad_request(f"couldn't get version/kind; json parse error: {error}") from None

    @staticmethod
    async def _read_options(request: web.Request) -> Obj:
        if not request.can_read_body:
            return {}
        raw = await request.read()
        if not raw.strip():
            return {}
        try:
            options = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _bad_request(f"couldn't get version/kind; json parse error: {error}") from None
        if not isinstance(options, dict):
            raise _bad_request("DeleteOptions must be a JSON object")
        return options

    async def _serve_watch(
        self, request: web.Request, resource: Resource, selection: _Selection
    ) -> web.StreamResponse:
        query = request.query
        # cozystack-api asks its own watch for bookmarks only on a WatchList request.
        bookmarks = _flag(query.get("allowWatchBookmarks")) and not resource.aggregated
        timeout = self._int_param(query, "timeoutSeconds")
        watcher = self._open_watch(resource, selection, query)
        response = web.StreamResponse(
            headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
        )
        response.enable_chunked_encoding()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout > 0 else None
        next_bookmark = loop.time() + self.bookmark_interval
        pending: deque[tuple[str, Obj]] = deque()
        try:
            await response.prepare(request)
            while True:
                quiet = watcher.silenced or not self._running.is_set()
                if watcher.silenced:
                    pending.clear()
                if pending and not quiet:
                    await response.write(_encode_event(*pending.popleft()))
                    continue
                wait: float | None = None
                if not quiet:
                    candidates = (deadline, next_bookmark if bookmarks else None)
                    wakeups = [t for t in candidates if t is not None]
                    if wakeups:
                        wait = max(0.0, min(wakeups) - loop.time())
                item = await _next_item(watcher.queue, wait)
                if item is None:
                    now = loop.time()
                    if watcher.silenced or not self._running.is_set():
                        continue  # paused or silenced while waiting: say nothing
                    if deadline is not None and now >= deadline:
                        break
                    if bookmarks and now >= next_bookmark:
                        await response.write(_encode_event(BOOKMARK, self._bookmark(resource)))
                        next_bookmark = now + self.bookmark_interval
                    continue
                if item is _Signal.DROP:
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                if item is _Signal.STOP:
                    break
                if isinstance(item, tuple):
                    pending.append(item)
            while pending and not watcher.silenced:
                await response.write(_encode_event(*pending.popleft()))
            await response.write_eof()
        except ConnectionError:
            pass
        finally:
            self._watchers.discard(watcher)
        return response

    def _discovery(self, path: str) -> web.Response:
        path = "/" + path.strip("/")
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok", content_type="text/plain")
        if path == "/version":
            return _json_response(SERVER_VERSION)
        if path == "/api":
            address = self.base_url.removeprefix("http://")
            return _json_response(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": address}
                    ],
                }
            )
        if path == "/api/v1":
            return _json_response(self._resource_list("", "v1"))
        groups = self._groups()
        if path == "/apis":
            return _json_response(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [self._group(name, versions) for name, versions in groups.items()],
                }
            )
        segments = path.split("/")[1:]
        if len(segments) >= 2 and segments[0] == "apis" and segments[1] in groups:
            group, versions = segments[1], groups[segments[1]]
            if len(segments) == 2:
                return _json_response(
                    {"kind": "APIGroup", "apiVersion": "v1", **self._group(group, versions)}
                )
            if len(segments) == 3 and segments[2] in versions:
                return _json_response(self._resource_list(group, segments[2]))
        raise APIError(404, _NOT_FOUND_PATH, details={})

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for resource in self._resources.values():
            if resource.group:
                versions = groups.setdefault(resource.group, [])
                if resource.version not in versions:
                    versions.append(resource.version)
        return groups

    @staticmethod
    def _group(name: str, versions: list[str]) -> Obj:
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": entries, "preferredVersion": entries[0]}

    def _resource_list(self, group: str, version: str) -> Obj:
        resources: list[Obj] = []
        for resource in self._resources.values():
            if resource.group != group or resource.version != version:
                continue
            resources.append(
                {
                    "name": resource.plural,
                    "singularName": resource.kind.lower(),
                    "namespaced": resource.namespaced,
                    "kind": resource.kind,
                    "verbs": [
                        "create",
                        "delete",
                        "deletecollection",
                        "get",
                        "list",
                        "patch",
                        "update",
                        "watch",
                    ],
                }
            )
            if resource.status:
                resources.append(
                    {
                        "name": f"{resource.plural}/status",
                        "singularName": "",
                        "namespaced": resource.namespaced,
                        "kind": resource.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        group_version = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }

    # --- helpers for the direct-access API -------------------------------------------------

    def _registered(self, group: str, plural: str) -> Resource:
        resource = self._resources.get((group, plural))
        if resource is None:
            raise ValueError(f"no resource {plural}.{group} is registered")
        return resource

    def _resource_of(self, obj: Mapping[str, Any]) -> Resource:
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        for resource in self._resources.values():
            if resource.api_version == api_version and resource.kind == kind:
                return resource
        raise ValueError(f"no resource is registered for apiVersion {api_version!r} kind {kind!r}")

    @staticmethod
    def _namespace_of(resource: Resource, obj: Mapping[str, Any]) -> str | None:
        namespace = (obj.get("metadata") or {}).get("namespace")
        if resource.namespaced and not namespace:
            raise ValueError(f"a {resource.kind} needs metadata.namespace")
        return namespace if resource.namespaced else None

    def _direct_update(self, obj: Mapping[str, Any], *, status: bool, dry_run: bool) -> Obj:
        resource = self._resource_of(obj)
        namespace = self._namespace_of(resource, obj)
        name = str((obj.get("metadata") or {}).get("name", ""))
        return copy.deepcopy(
            self._update(resource, namespace, name, dict(obj), status=status, dry_run=dry_run)
        )


def _method_not_allowed() -> APIError:
    return APIError(
        405, "the server does not allow this method on the requested resource", details={}
    )


async def _next_item(
    queue: asyncio.Queue[tuple[str, Obj] | _Signal], wait: float | None
) -> tuple[str, Obj] | _Signal | None:
    """The watcher's next queued item, waiting at most ``wait`` seconds; None only when the
    wait ran out with nothing queued. A bookmark or the timeout close follows a None, and a
    bookmark carries the current revision: sent while a change was still queued, it would
    move a watch resumed from it past that change (kube-apiserver queues its bookmarks behind
    the watcher's events). ``wait_for`` can time out with an item queued (a wait of 0, or an
    item put as the wait ran out), so the queue is read first and again after."""
    if not queue.empty():
        return queue.get_nowait()
    try:
        return await asyncio.wait_for(queue.get(), wait)
    except TimeoutError:
        return None if queue.empty() else queue.get_nowait()


def _encode_event(kind: str, obj: Obj) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _metadata_list(listed: Obj) -> Obj:
    """A list as kube-apiserver answers ``Accept: ...;as=PartialObjectMetadataList``."""
    return {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": listed.get("metadata") or {},
        "items": [metadata_only(item) for item in listed.get("items") or []],
    }


def metadata_only(obj: Obj) -> Obj:
    """An item of a PartialObjectMetadataList, as kube-apiserver answers one."""
    return {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": copy.deepcopy(obj.get("metadata") or {}),
    }

"""A small async client for the Kubernetes API, on aiohttp.

Configuration (kubeconfig or in-cluster service account, bearer tokens that rotate, client
certificates, the cluster CA) is loaded with the official ``kubernetes`` package, which does that
well; requests and watches go through aiohttp, which this project already runs on. The official
async clients were not used: kubernetes_asyncio retries a ``410 Gone`` once and then raises, and
a watch without a client-side read timeout can hang silently, both of which the reflector must
control itself.

Over 400 lines, and kept whole: requests, list pages and watches share one session, its
headers, token and timeouts, and the bounds every body is read within.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypedDict, Unpack
from urllib.parse import quote

import aiohttp
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from webhook.core.base.json_codec import decode_json, encode_json
from webhook.core.base.kube_limits import ETCD_MAX_REQUEST_BYTES
from webhook.kube.list_stream import NotAList, decode_list

__all__ = [
    "METADATA_ONLY",
    "ApiError",
    "KubeClient",
    "ListUnreadable",
    "PageOptions",
    "RequestOptions",
    "ResourceRef",
    "ResponseTooLarge",
    "WatchEventUnreadable",
    "WatchTimeout",
]
# A list of objects as their metadata only (PartialObjectMetadataList), plain JSON where a server
# cannot: what client-go's metadata informers ask for, and a fraction of whole objects' bytes.
METADATA_ONLY: Final = (
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)

Obj = dict[str, Any]
# Request deadlines: an API call that takes longer than this is treated as failed (and retried
# by whoever called it); a watch is bounded by its own server timeout and read timeout instead.
REQUEST_TIMEOUT: Final = 10.0
TOKEN_SECONDS: Final = 10.0  # kubelet rotates projected tokens long before they expire
# The longest watch event read: the API server's own limits, never ours. etcd refuses a request
# over 1.5 MiB (ETCD_MAX_REQUEST_BYTES), so no stored object is larger; served as JSON,
# an object etcd holds as JSON (every custom resource, every application) is its stored bytes,
# and one it holds as protobuf grows at most sixfold (Go's encoding/json writes "<" as "\u003c").
# The event's framing ({"type":"MODIFIED","object":...} and the newline) is a few bytes; 64 KiB
# covers it with room. kube-apiserver itself accepts request bodies up to 3 MiB (twice etcd's
# limit) for the same reason; an event is read up to three times that, and never whole past it.
MAX_WATCH_EVENT_BYTES: Final = 6 * ETCD_MAX_REQUEST_BYTES + 65_536
# A list page read as a stream (:meth:`KubeClient.list_page`) may take as long as its kind is
# large (cozystack-api sends a whole kind, hundreds of MB, whatever a page asks for): each read
# is bounded by the caller's read timeout, and the whole by this (a GB at under 2 MB/s).
STREAMED_LIST_SECONDS: Final = 600.0
CHUNK: Final = 1 << 16  # bytes read (and fed to the decoder) at a time
MAX_ERROR_BYTES: Final = 1 << 16  # of an error answer's body, what is read of a streamed page's
MAX_ERROR_MESSAGE: Final = 1024  # characters of an error's message kept: what is logged of it


class ApiError(Exception):
    """The API server answered with an error Status (or could not be reached: status 0).
    Its message is kept to :data:`MAX_ERROR_MESSAGE` characters: it is logged, counted and
    may be quoted in a denial, and a Status can quote what was written at any length."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        if len(message) > MAX_ERROR_MESSAGE:
            message = f"{message[:MAX_ERROR_MESSAGE]}... ({len(message)} characters)"
        self.status = status
        self.reason = reason[:200]
        self.message = message
        super().__init__(f"{status} {self.reason}: {message}")


class ResponseTooLarge(ApiError):
    """An answer longer than the caller's ``max_bytes``: left unread past the bound."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "ResponseTooLarge", message)


class WatchEventUnreadable(ApiError):
    """A watch event over the line bound, not JSON, or not an event: the watch cannot go past
    it, and resuming from before it would meet it again (the reflector lists instead)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "WatchEventUnreadable", message)


class ListUnreadable(ApiError):
    """A list page read as a stream that is not a JSON list of objects (malformed, truncated,
    an item not an object) or holds an item longer than any object can be: named by its
    request, for the list to be retried, never decoded past the bound."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "ListUnreadable", message)


class WatchTimeout(Exception):
    """A watch stayed silent longer than its read timeout: treated as dead."""


@dataclass(frozen=True, slots=True)
class ResourceRef:
    """Where a resource type lives in the API."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str = "", name: str = "", subresource: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace and self.namespaced:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
        if subresource:
            base += f"/{subresource}"
        return base


class PageOptions(TypedDict, total=False):
    """How a page of a list is asked for (:meth:`KubeClient.list_page`)."""

    params: Mapping[str, str] | None  # the query
    max_bytes: int | None  # an answer longer than this is not read whole: ResponseTooLarge
    accept: str  # replaces the Accept header (METADATA_ONLY: a list of metadata)


class RequestOptions(PageOptions, total=False):
    """How an API call is made besides its method and path (:meth:`KubeClient.request`)."""

    body: object  # sent as compact JSON
    content_type: str  # the body's (application/json unless given)


class KubeClient:
    """Requests and watches against one API server."""

    def __init__(
        self,
        configuration: k8s_client.Configuration,
        *,
        timeout: float = REQUEST_TIMEOUT,
        max_event_bytes: int = MAX_WATCH_EVENT_BYTES,
    ) -> None:
        self._configuration = configuration
        self.timeout = timeout
        self.max_event_bytes = max_event_bytes
        self.unreadable_events = 0  # watch events met that could not be read, since start
        self.host = str(configuration.host).rstrip("/")
        self._ssl = _ssl_context(configuration)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._token: str | None = None
        self._token_at: float | None = None
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    @classmethod
    def from_kubeconfig(cls, path: str | None, *, context: str | None = None) -> KubeClient:
        """From a kubeconfig file; ``None``: $KUBECONFIG or ~/.kube/config, as kubectl does."""
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration
        )
        return cls(configuration)

    @classmethod
    def in_cluster(cls) -> KubeClient:
        configuration = k8s_client.Configuration()
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
        return cls(configuration)

    async def close(self) -> None:
        """Close every connection; a call made after (a task still ending) fails as if the
        server could not be reached, instead of opening connections nothing closes."""
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        # The client keeps the token under "BearerToken" (older releases: "authorization");
        # asking through the hook-aware getter lets in-cluster tokens rotate. The hook reloads
        # the whole configuration (about a millisecond), so the token is asked for at most
        # every TOKEN_SECONDS, not on every request.
        now = time.monotonic()
        if self._token_at is None or now - self._token_at >= TOKEN_SECONDS:
            self._token = self._configuration.get_api_key_with_prefix(
                "BearerToken"
            ) or self._configuration.get_api_key_with_prefix("authorization")
            self._token_at = now
        token = self._token
        if token:
            headers["Authorization"] = token
        return headers

    def _client(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ApiError(0, "Unreachable", f"{self.host}: the client is closed")
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> Obj:
        """One API call; the decoded object, or :class:`ApiError`. With ``max_bytes``, an
        answer longer than that is never read whole: :class:`ResponseTooLarge` (a list of
        objects others write, such as a page of reports, is only as small as they make it).
        ``accept`` replaces the Accept header (:data:`METADATA_ONLY`: a list of metadata)."""
        result, _ = await self._call(method, path, **options)
        return result

    async def list_page(
        self,
        path: str,
        *,
        stream: Callable[[Obj], None] | None = None,
        read_timeout: float | None = None,
        **options: Unpack[PageOptions],
    ) -> tuple[Obj, int]:
        """One page of a list (a ``GET`` as :meth:`request` makes it) and how many bytes it
        came in: the next page is sized by them (:mod:`webhook.kube.pages`).

        With ``stream`` (and ``max_bytes``), a page longer than ``max_bytes`` is not cut short
        but read on as a stream: each item is handed to ``stream`` as it is decoded and then
        dropped, and the page comes back without ``items``. A server that ignores ``limit``
        sends a whole kind in one page, larger than a replica's memory once decoded; read so,
        it costs a chunk and one object at a time. Each read waits ``read_timeout`` at most,
        the whole :data:`STREAMED_LIST_SECONDS`; an item longer than :attr:`max_event_bytes`
        (no object is) or a body that is no JSON list raises :class:`ListUnreadable`."""
        max_bytes = options.get("max_bytes")
        if stream is None or max_bytes is None:
            return await self._call("GET", path, **options)
        return await self._streamable(
            path,
            stream,
            max_bytes=max_bytes,
            read_timeout=self.timeout if read_timeout is None else read_timeout,
            params=options.get("params"),
            accept=options.get("accept", ""),
        )

    async def _streamable(
        self,
        path: str,
        stream: Callable[[Obj], None],
        *,
        max_bytes: int,
        read_timeout: float,
        params: Mapping[str, str] | None,
        accept: str,
    ) -> tuple[Obj, int]:
        """A page read whole and decoded at once up to ``max_bytes`` within the request's
        deadline (the common case, and the fastest: orjson decodes some three times faster
        than an incremental decoder), else read on as a stream (:mod:`webhook.kube.list_stream`).

        Its first byte is waited for as any read of a stream is, ``read_timeout`` at most: a
        server that builds a whole kind before it answers (cozystack-api) may take longer than
        the request deadline to send any of it. The deadline runs from that byte."""
        what = f"GET {path}"
        headers = self._headers()
        if accept:
            headers["Accept"] = accept
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeout, sock_read=read_timeout
        )
        loop = asyncio.get_running_loop()
        try:
            async with (
                asyncio.timeout(STREAMED_LIST_SECONDS) as deadline,
                self._client().get(
                    self.host + path, params=params, headers=headers, timeout=timeout
                ) as response,
            ):
                if response.status >= 400:
                    deadline.reschedule(loop.time() + self.timeout)
                    raise await _error_of(response)
                declared = response.content_length
                head, whole = bytearray(), False
                if declared is None or declared <= max_bytes:
                    head = bytearray(await response.content.readany())  # within read_timeout
                    deadline.reschedule(loop.time() + self.timeout)
                    head, whole = await _head(response, max_bytes, head)
                if whole:
                    raw = _utf8(head)
                    result: Obj = decode_json(raw) if raw else {}
                    return result, len(raw)
                deadline.reschedule(asyncio.get_running_loop().time() + STREAMED_LIST_SECONDS)
                try:
                    return await decode_list(
                        _chunks(head, response.content), stream, self.max_event_bytes
                    )
                except NotAList as exc:
                    raise ListUnreadable(f"{what}: {exc}") from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ApiError(
                0, "Unreachable", f"GET {self.host}{path}: {exc or type(exc).__name__}"
            ) from None

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
        max_bytes: int | None = None,
        accept: str = "",
    ) -> tuple[Obj, int]:
        """The call :meth:`request` and :meth:`list_page` make: the decoded answer and its
        length in bytes."""
        headers = self._headers()
        if accept:
            headers["Accept"] = accept
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            # Compact: the same content in fewer bytes (a pool's ledger object is written on
            # every batch, and its entries are mostly punctuation and short strings).
            data = encode_json(body)
        if self._timeout.total != self.timeout:
            self._timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with self._client().request(
                method,
                self.host + path,
                params=params,
                data=data,
                headers=headers,
                timeout=self._timeout,
            ) as response:
                if response.status >= 400:
                    raise await _error_of(response)
                if max_bytes is None:
                    raw = await response.read()
                else:
                    raw = await _bounded_body(response, max_bytes, f"{method} {path}")
                result: Obj = decode_json(raw) if raw else {}
                return result, len(raw)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ApiError(
                0, "Unreachable", f"{method} {self.host}{path}: {exc or type(exc).__name__}"
            ) from None

    async def get(self, ref: ResourceRef, namespace: str, name: str) -> Obj:
        return await self.request("GET", ref.path(namespace, name))

    async def create(self, ref: ResourceRef, obj: Mapping[str, Any]) -> Obj:
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        return await self.request("POST", ref.path(namespace), body=obj)

    async def replace(
        self, ref: ResourceRef, obj: Mapping[str, Any], *, status: bool = False
    ) -> Obj:
        metadata = obj.get("metadata") or {}
        path = ref.path(
            str(metadata.get("namespace") or ""), str(metadata["name"]), "status" if status else ""
        )
        return await self.request("PUT", path, body=obj)

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        read_timeout: float,
        params: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[Obj, None]:
        """Watch events from ``resource_version``, with bookmarks, until the server closes.

        Raises :class:`WatchTimeout` when no line arrives within ``read_timeout`` (a dead or
        silent connection), :class:`WatchEventUnreadable` for an event longer than
        :attr:`max_event_bytes` or that is not a JSON event (counted in
        :attr:`unreadable_events`), :class:`ApiError` when the watch cannot be opened or breaks.
        Lines are split here, not by aiohttp, whose line limit (512 KiB) is far below what the
        API server may send: one object a tenant stored would otherwise stop the watch.
        """
        query = {
            **(params or {}),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=REQUEST_TIMEOUT, sock_read=read_timeout
        )
        try:
            async with self._client().get(
                self.host + path, params=query, headers=self._headers(), timeout=timeout
            ) as response:
                if response.status >= 400:
                    raise await _error_of(response)
                async for line in bounded_lines(response.content, self.max_event_bytes):
                    if line.strip():
                        yield self._event(line)
        except WatchEventUnreadable as exc:
            self.unreadable_events += 1
            raise WatchEventUnreadable(f"watch {path}: {exc.message}") from None
        except TimeoutError:
            raise WatchTimeout(f"watch {path}: silent for {read_timeout:g}s") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise ApiError(0, "WatchBroken", f"watch {path}: {exc or type(exc).__name__}") from None

    @staticmethod
    def _event(line: bytes) -> Obj:
        """One watch event: an object with a string ``type`` and an object ``object``."""
        try:
            event = decode_json(line)
        except Exception as exc:  # ValueError, RecursionError: whatever the decoder refuses
            raise WatchEventUnreadable(
                f"an event of {len(line)} bytes is not JSON ({type(exc).__name__})"
            ) from None
        if (
            not isinstance(event, dict)
            or not isinstance(event.get("type"), str)
            or not isinstance(event.get("object"), dict)
        ):
            raise WatchEventUnreadable(f"a line of {len(line)} bytes is no watch event")
        return event


async def bounded_lines(content: aiohttp.StreamReader, limit: int) -> AsyncGenerator[bytes, None]:
    """The newline-separated lines of ``content``, each at most ``limit`` bytes (without its
    newline); a longer one raises :class:`WatchEventUnreadable` once ``limit`` bytes of it
    were read, never more. Each chunk is scanned once, so a long line costs its length."""
    pending = bytearray()
    async for chunk in content.iter_any():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if len(pending) + end - start > limit:
                raise WatchEventUnreadable(f"a watch event longer than {limit} bytes")
            if pending:
                pending += chunk[start:end]
                yield bytes(pending)
                pending.clear()
            else:
                yield chunk[start:end]
            start = end + 1
        if len(pending) + len(chunk) - start > limit:
            raise WatchEventUnreadable(f"a watch event longer than {limit} bytes")
        pending += chunk[start:]
    if pending:
        yield bytes(pending)


async def _error_of(response: aiohttp.ClientResponse) -> ApiError:
    """The error ``response`` states, read from at most :data:`MAX_ERROR_BYTES` of its body:
    an error answer is logged, counted and may be quoted in a denial, and what fills it (a
    Status echoing the object written, a proxy's page) is not the client's to size."""
    text, _ = await _head(response, MAX_ERROR_BYTES)
    return _api_error(response.status, text.decode("utf-8", errors="replace"))


def _api_error(status: int, text: str) -> ApiError:
    try:
        body = json.loads(text)
    except ValueError:  # not JSON, or a Status cut short: its first characters stand for it
        body = {}
    if not isinstance(body, Mapping):
        body = {}
    return ApiError(status, str(body.get("reason") or ""), str(body.get("message") or text[:200]))


def _ssl_context(configuration: k8s_client.Configuration) -> ssl.SSLContext | None:
    if not str(configuration.host).startswith("https"):
        return None
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context


async def _bounded_body(response: aiohttp.ClientResponse, max_bytes: int, what: str) -> bytes:
    """The body, reading at most ``max_bytes`` (plus one chunk) of it; bytes that are not
    UTF-8 are replaced (U+FFFD), as a text read with ``errors="replace"`` would."""
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        raise ResponseTooLarge(f"{what}: {declared} bytes, more than {max_bytes}")
    body, whole = await _head(response, max_bytes)
    if not whole:
        raise ResponseTooLarge(f"{what}: more than {max_bytes} bytes")
    return _utf8(body)


async def _head(
    response: aiohttp.ClientResponse, max_bytes: int, body: bytearray | None = None
) -> tuple[bytearray, bool]:
    """The body up to ``max_bytes`` (plus one chunk), after the ``body`` already read of it,
    and whether that was all of it; the rest is left unread, for the caller to drop or to
    read on."""
    body = body if body is not None else bytearray()
    if len(body) > max_bytes:
        return body, False
    async for chunk in response.content.iter_chunked(CHUNK):
        body += chunk
        if len(body) > max_bytes:
            return body, False
    return body, True


def _utf8(body: bytearray) -> bytes:
    """``body``, its bytes that are not UTF-8 replaced (U+FFFD)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("utf-8", errors="replace").encode()
    return bytes(body)


async def _chunks(head: bytearray, content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """``head`` in chunks, each dropped once taken, then the rest of ``content``."""
    while head:
        chunk = bytes(head[:CHUNK])
        del head[:CHUNK]
        yield chunk
    async for chunk in content.iter_chunked(CHUNK):
        yield chunk

"""How many objects each page of a list asks for: as many as fit a byte budget.

A page of :data:`PAGE_SIZE` objects is as large as what its objects carry: 500 applications with
248 KB of annotations each (Kubernetes allows 256 KiB) make a 124 MB page, read and decoded
whole on the event loop, and held twice over (its bytes, then its decoded objects) while it is
reduced; two kinds listed at once passed the Deployment's memory limit. So each page asks for as
many objects as fit :data:`PAGE_BYTES` at the size of those the last page brought (at most
:data:`PAGE_SIZE`, and at most twice as many as the last asked for: a run of small objects
before fat ones grows the count step by step), and a page that still comes back larger than
:data:`MAX_PAGE_BYTES` (its objects grew since, or small ones came first) is left unread past
that and asked for again with a quarter of the objects. A page that cannot be asked for
smaller is read on as a stream past the bound instead, one object decoded at a time
(:meth:`~webhook.kube.client.KubeClient.list_page`): a page of one object, and any page of a
resource whose server ignores ``limit`` (cozystack-api answers from its cache with every object
of a kind, however few are asked for), known from a page that brought more than it asked for
and remembered, so its next lists are not cut short four times first. The sizes are kept
between lists of one resource, so a resync starts at the size the last one ended with.
:func:`consistent_read` is such a list, made now: the reflector's lists and the state's reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from webhook.kube.client import REQUEST_TIMEOUT, ApiError, KubeClient, ResourceRef, ResponseTooLarge

__all__ = ["MAX_PAGE_BYTES", "PAGE_BYTES", "PAGE_SIZE", "PageSizes", "consistent_read"]

Obj = dict[str, Any]

PAGE_SIZE: Final = 500  # objects a page asks for at most (client-go's pager asks for 500)
PAGE_BYTES: Final = 2 * 2**20  # what a page is sized to, at its objects' last known size
MAX_PAGE_BYTES: Final = 2 * PAGE_BYTES  # a page past this is cut short and asked for smaller
SHRINK: Final = 4  # a page cut short is asked for again with this fraction of its objects


@dataclass(slots=True)
class PageSizes:
    """The next page's object count, from the bytes the pages of one resource bring."""

    page_bytes: int = PAGE_BYTES  # what a page is sized to (cut short past twice that)
    limit: int = PAGE_SIZE  # objects the next page asks for
    listed_bytes: int = 0  # bytes the pages of the list under way (or the last) brought
    pages: int = 0  # pages read by the list under way (or the last)
    cut_short: int = 0  # pages left unread past MAX_PAGE_BYTES, since start
    unlimited: bool = False  # the server sent more objects than asked for: it ignores limit

    def start(self) -> None:
        """A list begins (or begins again): its bytes are counted from zero."""
        self.listed_bytes = 0
        self.pages = 0

    @property
    def max_bytes(self) -> int:
        """How much of the next page is read whole at most (past it: cut short, or streamed)."""
        return 2 * self.page_bytes

    @property
    def streamed(self) -> bool:
        """Whether the next page past :attr:`max_bytes` is read on as a stream, not cut short:
        asked for smaller, it would come back as large."""
        return self.limit == 1 or self.unlimited

    def read(self, objects: int, size: int, *, more: bool = True) -> None:
        """A page of ``objects`` objects came in ``size`` bytes (``more``: with a continue
        token): size the next by them, and tell a server that ignores ``limit``."""
        self.listed_bytes += size
        self.pages += 1
        if objects > self.limit:
            self.unlimited = True
        elif more:
            self.unlimited = False  # paged as asked: it honours limit (again)
        if objects > 0 and size > 0:
            fit = self.page_bytes * objects // size
            self.limit = max(1, min(PAGE_SIZE, 2 * self.limit, fit))

    def too_large(self) -> None:
        """The page just asked for ran past :attr:`max_bytes` and was cut short."""
        self.cut_short += 1
        self.limit = max(1, self.limit // SHRINK)


async def consistent_read(
    client: KubeClient,
    resource: ResourceRef,
    reduce: Callable[[Obj], Any],
    *,
    namespace: str = "",
    params: Mapping[str, str] | None = None,
    accept: str = "",
    pages: PageSizes | None = None,
    read_timeout: float = REQUEST_TIMEOUT,
) -> tuple[str, list[Any]]:
    """A paginated list without a resourceVersion (kube-apiserver serves it at its current
    revision), each item reduced as its page arrives and the page dropped before the next is
    asked for; the list's resourceVersion and the reduced items. ``accept``: the pages' Accept
    header (``METADATA_ONLY``: metadata only). ``pages`` sizes each page by the bytes the last
    brought (:class:`PageSizes`, kept by the caller between reads of one resource) and
    counts the bytes this read listed. A page that cannot be asked for smaller is streamed
    past its bound, each item reduced as it is decoded, each read waiting ``read_timeout``."""
    pages = pages if pages is not None else PageSizes()
    pages.start()
    items: list[Any] = []
    streamed = 0  # items of the page under way handed over as they were decoded
    token = ""
    path = resource.path(namespace)

    def take(obj: Obj) -> None:
        nonlocal streamed
        streamed += 1
        reduced = reduce(obj)
        if reduced is not None:
            items.append(reduced)

    while True:
        query = {**(params or {}), "limit": str(pages.limit)}
        if token:
            query["continue"] = token
        streamed = 0
        try:
            page, size = await client.list_page(
                path,
                params=query,
                accept=accept,
                max_bytes=pages.max_bytes,
                stream=take if pages.streamed else None,
                read_timeout=read_timeout,
            )
        except ResponseTooLarge:
            pages.too_large()  # cut short, unread past the bound: the same page, fewer objects
            continue
        except ApiError as exc:
            if exc.status == 410:  # the continue token expired: start the read over
                items, token = [], ""
                pages.start()
                continue
            raise
        metadata = page.get("metadata") or {}
        objects = page.get("items") or []
        token = str(metadata.get("continue") or "")
        pages.read(streamed + len(objects), size, more=bool(token))
        for obj in objects:
            take(obj)
        del page, objects
        if not token:
            return str(metadata.get("resourceVersion") or ""), items

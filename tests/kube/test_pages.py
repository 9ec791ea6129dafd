"""List pages sized by bytes as well as objects: fat annotations make every list page huge.

500 applications with 248 KB of annotations each made one 500-object page of 124 MB, read and
decoded whole; a page now asks for as many objects as fit the byte budget at the size of the
last page's, and one that still comes back past twice that is cut short and asked for again
with fewer objects, so no page read is much larger than the budget, whatever its objects carry.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.apiserver.server import EmulatedAPIServer
from tests.kube.reflecting import THINGS
from webhook.kube.client import KubeClient
from webhook.kube.pages import PAGE_SIZE, PageSizes, consistent_read

BUDGET = 64 * 1024  # a page's bytes in these tests (the shipped budget is 8 MiB)


def thing(name: str, note: int) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1",
        "kind": "Thing",
        "metadata": {"name": name, "namespace": "ns", "annotations": {"fat": "x" * note}},
        "spec": {"value": 1},
    }


class Recording:
    """The client, with the bytes of every list page it read, the limit it asked and whether
    it was offered a stream."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.sizes: list[int] = []
        self.limits: list[int] = []
        self.streamed: list[bool] = []

    async def list_page(self, path: str, **kwargs: Any) -> tuple[dict[str, Any], int]:
        self.limits.append(int(kwargs["params"]["limit"]))
        self.streamed.append(kwargs.get("stream") is not None)
        page, size = await self.client.list_page(path, **kwargs)
        self.sizes.append(size)
        return page, size


async def read_all(client: KubeClient, pages: PageSizes) -> tuple[list[str], Recording]:
    recording = Recording(client)
    _, names = await consistent_read(
        recording,  # type: ignore[arg-type]
        THINGS,
        lambda obj: obj["metadata"]["name"],
        pages=pages,
    )
    return names, recording


async def test_fat_annotations_make_every_list_page_huge_no_longer(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    names = [f"t{index:03d}" for index in range(60)]
    for name in names:
        server.create(thing(name, 20_000))  # 60 x 20 KB: one 500-object page of 1.2 MB
    pages = PageSizes(page_bytes=BUDGET)
    listed, recording = await read_all(client, pages)
    assert listed == names
    assert max(recording.sizes) <= 2 * BUDGET, recording.sizes
    assert pages.listed_bytes == sum(recording.sizes)
    assert pages.pages > 1
    assert pages.cut_short >= 1  # the first page, asked for 500 objects, was cut short
    assert pages.limit * 20_000 <= BUDGET  # the next read asks for what fits, from the start


async def test_small_objects_first_cannot_make_a_page_of_fat_ones_large(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    # A tenant whose fat objects sort after others' small ones: the page after the small ones
    # asks for many objects, comes back fat, and is cut short rather than read whole.
    for index in range(40):
        server.create(thing(f"a{index:03d}", 10))
    for index in range(40):
        server.create(thing(f"b{index:03d}", 20_000))
    pages = PageSizes(page_bytes=BUDGET, limit=40)
    listed, recording = await read_all(client, pages)
    assert len(listed) == 80
    assert max(recording.sizes) <= 2 * BUDGET, recording.sizes


async def test_sizes_are_kept_between_reads_of_one_resource(
    server: EmulatedAPIServer, client: KubeClient
) -> None:
    for index in range(30):
        server.create(thing(f"t{index:03d}", 20_000))
    pages = PageSizes(page_bytes=BUDGET)
    await read_all(client, pages)
    _, again = await read_all(client, pages)
    assert again.limits[0] < PAGE_SIZE  # a resync starts at the size the last list ended with
    assert max(again.sizes) <= 2 * BUDGET


@settings(max_examples=300, deadline=None)
@given(
    pages=st.lists(
        st.tuples(st.integers(0, PAGE_SIZE), st.integers(0, 10 * 2**20)), min_size=1, max_size=8
    ),
    cuts=st.integers(0, 12),
)
def test_a_page_asks_for_one_to_page_size_objects_and_a_cut_page_for_fewer(
    pages: list[tuple[int, int]], cuts: int
) -> None:
    sizes = PageSizes(page_bytes=BUDGET)
    for objects, size in pages:
        asked = sizes.limit
        sizes.read(objects, size)
        assert 1 <= sizes.limit <= min(PAGE_SIZE, 2 * asked)
        if objects and size:
            assert sizes.limit * size <= max(BUDGET * objects, size)  # fits, or is one object
    for _ in range(cuts):
        before = sizes.limit
        sizes.too_large()
        assert sizes.limit < before or before == 1
        assert sizes.streamed == (sizes.limit == 1 or sizes.unlimited)

"""A kind the real cozystack-api lists whole, whatever ``limit`` asks, is read as a stream.

cozystack-api answers a list of applications from its cache with every object of the kind and
no ``continue`` token. Past the page bound the list is decoded one item at a time, and once a
kind is known to ignore ``limit`` its next list is one request, never cut short again.
"""

from __future__ import annotations

import json
import tracemalloc

import pytest

from tests.cozystack_api.conftest import NAMESPACE, CozystackAPI
from webhook.kube.client import KubeClient, ResourceRef
from webhook.kube.pages import MAX_PAGE_BYTES, PageSizes, consistent_read

pytestmark = pytest.mark.cozystack_api

VMDISKS = ResourceRef("apps.cozystack.io", "v1alpha1", "vmdisks")
DISKS = 24
NOTES = 200  # annotations of 990 bytes each, under the HelmRelease's 256 KiB with its prefixes


class Counting:
    """The client, counting the pages it asked for."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.limits: list[str] = []

    async def list_page(self, path: str, **kwargs: object) -> object:
        self.limits.append(kwargs["params"]["limit"])  # type: ignore[index]
        return await self.client.list_page(path, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def env(cozystack_api: CozystackAPI) -> CozystackAPI:
    notes = {f"example.com/n{index:03d}": "x" * 990 for index in range(NOTES)}
    disks = [
        {
            "apiVersion": "apps.cozystack.io/v1alpha1",
            "kind": "VMDisk",
            "metadata": {"name": f"disk{index:02d}", "namespace": NAMESPACE, "annotations": notes},
            "spec": {"storage": "1Gi"},
        }
        for index in range(DISKS)
    ]
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": disks})
    cozystack_api.kubectl("create", "-f", "-", stdin=body, timeout=120)
    return cozystack_api


async def test_a_kind_cozystack_api_lists_whole_is_streamed_and_then_asked_for_once(
    env: CozystackAPI,
) -> None:
    client = KubeClient.from_kubeconfig(str(env.kubeconfig))
    counting = Counting(client)
    pages = PageSizes()

    async def read() -> tuple[str, list[str]]:
        return await consistent_read(
            counting,  # type: ignore[arg-type]
            VMDISKS,
            lambda obj: obj["metadata"]["name"],
            namespace=NAMESPACE,
            pages=pages,
        )

    try:
        tracemalloc.start()
        try:
            version, names = await read()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert names == [f"disk{index:02d}" for index in range(DISKS)]
        assert version.isdigit()
        assert pages.listed_bytes > MAX_PAGE_BYTES
        assert counting.limits[-1] == "1"  # cut short until one object was asked for
        assert pages.unlimited  # and that brought them all
        assert peak < 4 * MAX_PAGE_BYTES, peak
        first = len(counting.limits)
        again, listed = await read()
        assert listed == names
        assert int(again) >= int(version)
        assert len(counting.limits) == first + 1  # one request: streamed at once
    finally:
        await client.close()

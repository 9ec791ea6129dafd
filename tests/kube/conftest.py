"""The emulated API server serving Things (:data:`tests.kube.reflecting.THINGS`), and a client
of it: what the client's lists and the reflector's tests run against. A module serving
something else defines its own ``server``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.apiserver.server import EmulatedAPIServer
from tests.cluster import kube_client
from webhook.kube.client import KubeClient


@pytest.fixture
async def server() -> AsyncIterator[EmulatedAPIServer]:
    emulated = EmulatedAPIServer(bookmark_interval=0.1)
    emulated.resource("example.io", "v1", "things", "Thing")
    async with emulated:
        yield emulated


@pytest.fixture
async def client(server: EmulatedAPIServer, tmp_path: Path) -> AsyncIterator[KubeClient]:
    async with kube_client(server.kubeconfig(tmp_path / "kubeconfig")) as kube:
        yield kube

"""Where a capacity snapshot comes from: a file an operator saved, or the cluster itself.

A file is what ``kubectl get nodes,pods,virtualmachineinstances -A -o yaml`` prints: a ``List``
(or several YAML documents, or JSON). The cluster is read with three LIST calls through the
project's API client. Either way the objects go to the pure
:func:`~webhook.core.capacity.snapshot.snapshot_from_objects`; this module only does the I/O, and
turns unreadable input into :class:`~webhook.core.capacity.snapshot.SnapshotError` naming the file.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from webhook.core.capacity.snapshot import Snapshot, SnapshotError
from webhook.core.capacity.snapshot_objects import snapshot_from_objects
from webhook.kube.client import KubeClient, ResourceRef

__all__ = ["NODES", "PODS", "VMIS", "load_snapshot", "read_cluster", "snapshot_objects"]

# A snapshot file is bounded before it is parsed: 200 nodes and 4,000 VMs are about 40 MiB.
MAX_BYTES: Final = 256 * 1024 * 1024

NODES: Final = ResourceRef("", "v1", "nodes", namespaced=False)
PODS: Final = ResourceRef("", "v1", "pods")
VMIS: Final = ResourceRef("kubevirt.io", "v1", "virtualmachineinstances")


def load_snapshot(path: str) -> Snapshot:
    """Read a snapshot file (``-`` is stdin)."""
    return snapshot_from_objects(snapshot_objects(path))


def snapshot_objects(path: str) -> list[Mapping[str, Any]]:
    try:
        if path == "-":
            text = sys.stdin.read(MAX_BYTES + 1)
        else:
            with Path(path).open(encoding="utf-8") as handle:
                text = handle.read(MAX_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotError(
            f"{path}: {exc.strerror if isinstance(exc, OSError) else exc}"
        ) from None
    if len(text) > MAX_BYTES:
        raise SnapshotError(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise SnapshotError(f"{path}:{where} not YAML: {getattr(exc, 'problem', exc)}") from None
    objects = list(_flatten(documents, path))
    if not objects:
        raise SnapshotError(f"{path}: no objects")
    return objects


def _flatten(documents: list[object], path: str) -> Iterator[Mapping[str, Any]]:
    for index, doc in enumerate(documents):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise SnapshotError(f"{path}: document {index} is not an object")
        items = doc.get("items")
        if str(doc.get("kind", "")).endswith("List") and isinstance(items, list):
            kind = str(doc.get("kind"))[: -len("List")]
            for item in items:
                if not isinstance(item, Mapping):
                    raise SnapshotError(f"{path}: document {index}: an item is not an object")
                # A typed list (NodeList) leaves kind off its items; `kubectl get` keeps it.
                yield item if "kind" in item or not kind else {**item, "kind": kind}
        else:
            yield doc


async def read_cluster(client: KubeClient) -> Snapshot:
    """List nodes, pods and VMIs now and build a snapshot from them."""
    objects: list[Mapping[str, Any]] = []
    for ref, kind in ((NODES, "Node"), (PODS, "Pod"), (VMIS, "VirtualMachineInstance")):
        listed = await client.request("GET", ref.path())
        items = listed.get("items")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping):
                objects.append({**item, "kind": kind})
    return snapshot_from_objects(objects)

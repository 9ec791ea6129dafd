"""Directories of Kubernetes manifests as a state source, for offline use and tests.

Every ``.yaml``, ``.yml`` and ``.json`` file below each directory is read, recursively and in
name order; YAML files may hold many documents and ``kind: List`` objects are unpacked. Each
manifest keeps its source (``file.yaml#2`` for the third document) so that errors name the file,
the document and the path inside it. A file that cannot be parsed fails the whole load: a state
that silently lost a manifest would admit against the wrong figures.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.core.applications import (
    APPS_API_VERSION,
    Application,
    application_from_helmrelease,
    application_from_object,
    is_helmrelease,
)
from webhook.core.errors import ManifestError
from webhook.core.guard import QuotaBook, quota_from_object
from webhook.core.platform import Platform, PlatformBuilder
from webhook.core.state import ReservationState
from webhook.defaults import default_contracts, default_presets

__all__ = ["Manifest", "load_platform", "load_state", "read_manifests"]

_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class Manifest:
    source: str
    body: Mapping[str, Any]


def read_manifests(paths: Iterable[str | Path]) -> list[Manifest]:
    """All manifests under ``paths`` (directories or single files), in a stable order."""
    manifests: list[Manifest] = []
    for root in paths:
        root_path = Path(root)
        if not root_path.exists():
            raise ManifestError(str(root_path), "", "no such file or directory")
        files = (
            [root_path]
            if root_path.is_file()
            else sorted(p for p in root_path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES)
        )
        for file in files:
            manifests.extend(_read_file(file))
    return manifests


def load_platform(paths: Iterable[str | Path]) -> Platform:
    """The platform (kinds, instance types, presets, contracts) described under ``paths``."""
    return _platform(read_manifests(paths))


def load_state(paths: Iterable[str | Path], *, quotas: QuotaBook | None = None) -> ReservationState:
    """The platform and every application under ``paths``, as a reservation state.

    Applications come as ``apps.cozystack.io`` objects or as the HelmReleases Cozystack stores
    them in; ResourceQuotas go into ``quotas`` when it is given (the pod-level guard); other
    manifests (Namespaces, preferences ...) are ignored.
    """
    manifests = read_manifests(paths)
    state = ReservationState(_platform(manifests))
    for manifest in manifests:
        app = _application(manifest)
        if app is not None:
            state.observe(app)
        elif quotas is not None and _is_quota(manifest.body):
            namespace = manifest.body.get("metadata", {}).get("namespace") or ""
            quotas.observe(str(namespace), quota_from_object(manifest.body))
    return state


def _is_quota(body: Mapping[str, Any]) -> bool:
    return body.get("apiVersion") == "v1" and body.get("kind") == "ResourceQuota"


def _platform(manifests: list[Manifest]) -> Platform:
    builder = PlatformBuilder(default_contracts(), default_presets())
    for manifest in manifests:
        builder.add(manifest.body, source=manifest.source)
    return builder.build()


def _application(manifest: Manifest) -> Application | None:
    try:
        if manifest.body.get("apiVersion") == APPS_API_VERSION:
            return application_from_object(manifest.body)
        if is_helmrelease(manifest.body):
            return application_from_helmrelease(manifest.body)
    except ValueError as exc:
        raise ManifestError(manifest.source, "", str(exc)) from None
    return None


def _read_file(file: Path) -> Iterator[Manifest]:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(str(file), "", f"cannot read: {exc}") from None
    try:
        documents = [json.loads(text)] if file.suffix == ".json" else list(yaml.safe_load_all(text))
    except json.JSONDecodeError as exc:
        raise ManifestError(str(file), f"line {exc.lineno}", f"not JSON: {exc.msg}") from None
    except RecursionError:
        raise ManifestError(str(file), "", "nested too deeply to read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise ManifestError(str(file), where, f"not YAML: {reason}") from None
    except ValueError as exc:  # a number past Python's integer digit limit, in JSON or YAML
        raise ManifestError(str(file), "", f"cannot read: {str(exc)[:120]}") from None
    for index, document in enumerate(documents):
        source = str(file) if len(documents) == 1 else f"{file}#{index}"
        if document is None:
            continue
        yield from _unpack(document, source)


def _unpack(document: object, source: str) -> Iterator[Manifest]:
    if not isinstance(document, Mapping):
        raise ManifestError(source, "", "a manifest must be a mapping")
    for field in ("apiVersion", "kind"):
        if not isinstance(document.get(field), str) or not document[field]:
            raise ManifestError(source, field, "missing")
    if document["kind"] == "List" or str(document["kind"]).endswith("List"):
        items = document.get("items")
        if not isinstance(items, list):
            raise ManifestError(source, "items", "a List needs a list of items")
        for index, item in enumerate(items):
            yield from _unpack(item, f"{source} items[{index}]")
        return
    yield Manifest(source, document)

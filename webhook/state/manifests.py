"""Directories of Kubernetes manifests as a state source, for offline use and tests.

Every ``.yaml``, ``.yml`` and ``.json`` file below each directory is read, recursively and in
name order; YAML files may hold many documents and ``kind: List`` objects are unpacked. Each
manifest keeps its source (``file.yaml#2`` for the third document) so that errors name the file,
the document and the path inside it. A file that cannot be parsed fails the whole load: a state
that silently lost a manifest would admit against the wrong figures.

Over 400 lines, and kept whole: finding the files, the YAML loader that builds PyYAML's types
in one pass and unpacking ``List``s are one reader, whose errors must all name the same file,
document and path.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from webhook import collector
from webhook.core.admission.state import ReservationState
from webhook.core.base.errors import ManifestError
from webhook.core.capacity.guard import QuotaBook, quota_from_object
from webhook.core.pricing.platform import Platform, PlatformBuilder
from webhook.core.tenancy.applications import (
    APPS_API_VERSION,
    AppKey,
    Application,
    Mislabel,
    application_from_helmrelease,
    application_from_object,
    as_served,
    is_helmrelease,
)
from webhook.core.tenancy.records import RecordKeys
from webhook.defaults import default_contracts, default_presets

__all__ = [
    "Manifest",
    "Progress",
    "iter_manifests",
    "load_platform",
    "load_state",
    "read_manifests",
]

_SUFFIXES = (".yaml", ".yml", ".json")
# The kinds a platform is made of (see PlatformBuilder.add). A file that names none of them
# cannot describe the platform, so reading only the platform skips it without parsing it.
_PLATFORM_KINDS: Final = (
    "ApplicationDefinition",
    "Instancetype",
    "ReservationContract",
    "ConfigMap",
)

# Called as files and documents are read: (files read, files in all, manifests so far).
Progress = Callable[[int, int, int], None]
# libyaml's parser (``CSafeLoader``) is several times faster than the pure-Python one and builds
# the same safe types; the pure one stands in where PyYAML was built without libyaml.
_BASE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_PLAIN_TAGS: dict[str, str] = {}  # plain scalar -> its resolved tag (a function of the text)
_PLAIN_TAGS_MAX = 8192
# Only short scalars (keys, names, sizes: those that recur) are cached: the cache lives as long
# as the process, and a tenant's long strings would stay in it after their manifests are read.
_PLAIN_TAG_CHARS = 256


class _Loader(_BASE_LOADER):  # type: ignore[misc]
    """The safe loader, resolving each distinct plain scalar's tag once (the same keys and
    values recur in every manifest) and skipping path resolvers, which safe loading has none
    of."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            tag = _PLAIN_TAGS.get(value)
            if tag is None:
                tag = super().resolve(kind, value, implicit)
                if len(_PLAIN_TAGS) < _PLAIN_TAGS_MAX and len(value) <= _PLAIN_TAG_CHARS:
                    _PLAIN_TAGS[value] = tag
            return tag
        if self.yaml_path_resolvers:  # pragma: no cover - safe loading registers none
            return super().resolve(kind, value, implicit)
        # What the base resolver answers for everything else (a quoted scalar, a collection),
        # without its walk: a third of a manifest's nodes.
        if kind is yaml.ScalarNode:
            return _STR
        return _SEQ if kind is yaml.SequenceNode else _MAP

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        return None

    def ascend_resolver(self) -> None:
        return None


_LOADER: Any = _Loader
_END = object()
_STR, _SEQ, _MAP, _MERGE = (f"tag:yaml.org,2002:{name}" for name in ("str", "seq", "map", "merge"))


@dataclass(frozen=True, slots=True)
class Manifest:
    source: str
    body: Mapping[str, Any]


def read_manifests(paths: Iterable[str | Path], *, platform_only: bool = False) -> list[Manifest]:
    """All manifests under ``paths`` (directories or single files), in a stable order."""
    return list(iter_manifests(paths, platform_only=platform_only))


def iter_manifests(
    paths: Iterable[str | Path],
    *,
    platform_only: bool = False,
    progress: Progress | None = None,
) -> Iterator[Manifest]:
    """The manifests under ``paths`` one by one, in a stable order (one file parsed at a time).

    ``platform_only`` skips, unparsed, every file that names no platform kind; ``progress`` is
    called after every file and every thousand manifests.
    """
    files = list(_files(paths))
    count = 0
    for done, file in enumerate(files, start=1):
        for manifest in _read_file(file, platform_only=platform_only):
            count += 1
            if progress is not None and count % 1000 == 0:
                progress(done - 1, len(files), count)
            yield manifest
        if progress is not None:
            progress(done, len(files), count)


def _files(paths: Iterable[str | Path]) -> Iterator[Path]:
    for root in paths:
        root_path = Path(root)
        if not root_path.exists():
            raise ManifestError(str(root_path), "", "no such file or directory")
        if root_path.is_file():
            yield root_path
        else:
            yield from sorted(
                p for p in root_path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES
            )


def load_platform(paths: Iterable[str | Path]) -> Platform:
    """The platform (kinds, instance types, presets, contracts) described under ``paths``.

    Only files that name a platform kind are parsed: applications are not read at all.
    """
    return _platform(read_manifests(paths, platform_only=True))


def load_state(
    paths: Iterable[str | Path],
    *,
    quotas: QuotaBook | None = None,
    keys: RecordKeys | None = None,
    progress: Progress | None = None,
) -> ReservationState:
    """The platform and every application under ``paths``, as a reservation state.

    Applications come as ``apps.cozystack.io`` objects or as the HelmReleases Cozystack stores
    them in; ResourceQuotas go into ``quotas`` when it is given (the pod-level guard); other
    manifests (Namespaces, preferences ...) are ignored. Charge records are believed only when
    signed with ``keys`` (default: a key of this process, so none is).
    """
    # Loading creates the long-lived state and little cyclic garbage: the collector's full
    # passes over the growing heap would cost seconds and free almost nothing.
    collector.pause()
    try:
        return _Load(quotas, keys, progress).run(list(_files(paths)))
    finally:
        collector.resume()


class _Load:
    """One ``--state`` load.

    The platform first, from the files that can describe it (their text names a platform kind);
    then every other file is read and its applications priced one document at a time, so no
    file's parsed documents outlive it (a load that parses everything before pricing holds
    every document's values at once: about 2.4 KB per application left resident, against 0.5).
    A platform manifest found where no kind was named (an escaped name) makes the load start
    over, holding applications until the platform is known.
    """

    def __init__(
        self, quotas: QuotaBook | None, keys: RecordKeys | None, progress: Progress | None
    ) -> None:
        self.quotas = quotas
        self.keys = keys
        self.progress = progress
        self.seen: dict[tuple[str, str, str], str] = {}  # application -> where it was first
        self.platform: Platform | None = None  # once built: how releases are named
        self.mislabelled: dict[AppKey, Mislabel] = {}
        self.files_done = 0
        self.manifests = 0

    def run(self, files: list[Path]) -> ReservationState:
        builder = PlatformBuilder(default_contracts(), default_presets())
        held: list[tuple[Application, str]] = []
        rest: list[Path] = []
        for file in files:
            text = _read_text(file)
            if not any(kind in text for kind in _PLATFORM_KINDS):
                rest.append(file)
                continue
            for manifest in self.read(file, len(files), text):
                if not builder.add(manifest.body, source=manifest.source):
                    self.take(manifest, held)
            del text
        state = self.known(ReservationState(builder.build(), keys=self.keys))
        state.observe_all(self.once(app, source) for app, source in held)
        del held
        try:
            state.observe_all(self.applications(rest, len(files)))
        except _PlatformFound:
            self.seen.clear()
            self.mislabelled.clear()
            return self.holding_everything(files)
        return self.noted(state)

    def known(self, state: ReservationState) -> ReservationState:
        self.platform = state.platform
        return state

    def noted(self, state: ReservationState) -> ReservationState:
        """``state``, told of the HelmReleases labelled with another application's name."""
        for kind in sorted({key[0] for key in self.mislabelled}):
            state.set_mislabelled(kind, self.mislabelled)
        return state

    def applications(self, files: list[Path], total: int) -> Iterator[Application]:
        """The applications in ``files``, one by one; raises :class:`_PlatformFound` at a
        manifest that describes the platform."""
        for file in files:
            for manifest in self.read(file, total):
                if _describes_platform(manifest):
                    raise _PlatformFound
                app = self.take(manifest, None)
                if app is not None:
                    yield app

    def read(self, file: Path, total: int, text: str | None = None) -> Iterator[Manifest]:
        for manifest in _read_file(file, text=text):
            self.manifests += 1
            if self.progress is not None and self.manifests % 1000 == 0:
                self.progress(self.files_done, total, self.manifests)
            yield manifest
        self.files_done += 1
        if self.progress is not None:
            self.progress(self.files_done, total, self.manifests)

    def holding_everything(self, files: list[Path]) -> ReservationState:
        builder = PlatformBuilder(default_contracts(), default_presets())
        apps: list[tuple[Application, str]] = []
        for file in files:
            for manifest in _read_file(file):
                if not builder.add(manifest.body, source=manifest.source):
                    self.take(manifest, apps)
        state = self.known(ReservationState(builder.build(), keys=self.keys))
        apps.reverse()
        # each one's values go once priced
        state.observe_all(self.once(*apps.pop()) for _ in range(len(apps)))
        return self.noted(state)

    def take(
        self, manifest: Manifest, into: list[tuple[Application, str]] | None
    ) -> Application | None:
        """The application a manifest holds, checked to be defined once (or appended to
        ``into`` with its source, before the platform is known, to be checked then); a
        ResourceQuota goes to the quota book; anything else is ignored."""
        app = _application(manifest)
        if app is not None:
            if into is not None:
                into.append((app, manifest.source))
                return app
            return self.once(app, manifest.source)
        if self.quotas is not None and _is_quota(manifest.body):
            namespace = manifest.body.get("metadata", {}).get("namespace") or ""
            self.quotas.observe(str(namespace), quota_from_object(manifest.body))
        return app

    def once(self, app: Application, source: str) -> Application:
        """``app`` named as cozystack-api serves it (a HelmRelease by its name, not its name
        label: see :func:`~webhook.core.tenancy.applications.as_served`), checked to be the
        only object of that name."""
        kind = self.platform.kind(app.kind) if self.platform is not None else None
        if kind is not None:
            app, wrong = as_served(app, kind.release_prefix)
            if wrong is not None:
                self.mislabelled[app.key] = wrong
        first = self.seen.setdefault(app.key, source)
        if first != source:  # a second object of one name would replace the first
            raise ManifestError(
                source,
                "metadata.name",
                f"{app.kind} {app.namespace}/{app.name} is already defined in {first}",
            )
        return app


class _PlatformFound(Exception):
    """A platform manifest where no platform kind was named: the load starts over."""


def _describes_platform(manifest: Manifest) -> bool:
    """Whether a manifest describes the platform (a malformed one raises, as in a load)."""
    if manifest.body.get("apiVersion") == APPS_API_VERSION:  # an application: the common case
        return False
    return PlatformBuilder({}, {}).add(manifest.body, source=manifest.source)


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


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(str(file), "", f"cannot read: {exc}") from None


def _read_file(
    file: Path, *, platform_only: bool = False, text: str | None = None
) -> Iterator[Manifest]:
    if text is None:
        text = _read_text(file)
    if platform_only and not any(kind in text for kind in _PLATFORM_KINDS):
        return
    if file.suffix == ".json":
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(str(file), f"line {exc.lineno}", f"not JSON: {exc.msg}") from None
        except RecursionError:
            raise ManifestError(str(file), "", "nested too deeply to read") from None
        except ValueError as exc:  # a number past Python's integer digit limit
            raise ManifestError(str(file), "", f"cannot read: {str(exc)[:120]}") from None
        if document is not None:
            yield from _unpack(document, str(file))
        return
    documents = _yaml_documents(file, text)
    del text
    # A single document is named by its file, several by their index: look one ahead.
    first = next(documents, _END)
    second = next(documents, _END)
    if second is _END:
        if first is not None and first is not _END:
            yield from _unpack(first, str(file))
        return
    for index, document in enumerate(itertools.chain((first, second), documents)):
        if document is not None:
            yield from _unpack(document, f"{file}#{index}")


def _yaml_documents(file: Path, text: str) -> Iterator[object]:
    """The documents of a YAML text as they are parsed (libyaml's parser when present)."""
    loader = _LOADER(text)
    try:
        while loader.check_node():
            yield _construct(loader, loader.get_node(), {})
    except RecursionError:
        raise ManifestError(str(file), "", "nested too deeply to read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        reason = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ManifestError(str(file), where, f"not YAML: {reason}") from None
    except ValueError as exc:  # a number past Python's integer digit limit
        raise ManifestError(str(file), "", f"cannot read: {str(exc)[:120]}") from None
    finally:
        loader.dispose()


def _construct(loader: Any, node: yaml.Node, made: dict[int, object]) -> object:
    """What ``SafeLoader`` builds from ``node``, on a short path for the plain tags.

    Most of a manifest is plain maps, lists and strings; PyYAML's constructor spends more time
    on its bookkeeping than on them. Other scalars go through the safe constructor's own
    functions, other tags (merge keys, sets, ordered maps) through the safe constructor whole.
    ``made`` holds each collection built, by node, so an alias (even a recursive one) yields
    the same object, as PyYAML's does.
    """
    if isinstance(node, yaml.ScalarNode):
        if node.tag == _STR:
            return node.value
        return loader.yaml_constructors.get(node.tag, loader.yaml_constructors[None])(loader, node)
    done = made.get(id(node))
    if done is not None:
        return done
    if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
        items: list[object] = []
        made[id(node)] = items
        items.extend(_construct(loader, child, made) for child in node.value)
        return items
    if (
        isinstance(node, yaml.MappingNode)
        and node.tag == _MAP
        and not any(key.tag == _MERGE for key, _ in node.value)
    ):
        mapping: dict[object, object] = {}
        made[id(node)] = mapping
        for key_node, value_node in node.value:
            key = _construct(loader, key_node, made)
            try:
                mapping[key] = _construct(loader, value_node, made)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found unhashable key",
                    key_node.start_mark,
                ) from None
        return mapping
    constructed = loader.construct_document(node)
    made[id(node)] = constructed
    return constructed


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

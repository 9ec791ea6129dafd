"""The platform objects the live state watches, what of each a charge depends on, and the
platform built from them.

Of each object only what charges depend on is kept (a definition's kind, plural, schema,
contract and release prefix; an instance type's guest CPU, memory and GPUs; the preset table),
so an event that changes none of it (a label, a status) changes nothing. An object that cannot
be read never empties or reverts the platform: its last good version stands in, or, with none,
it is left out (the preset table: preset-based charges fail closed, never the built-in figures),
each such problem named in the platform's problems.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from webhook.core.base.errors import ManifestError, ReservationError
from webhook.core.pricing.kinds import kind_from_definition
from webhook.core.pricing.platform import PRESETS_KEY, Platform, PlatformBuilder
from webhook.defaults import default_contracts, default_presets
from webhook.kube.client import ResourceRef
from webhook.state.held_applications import CANONICAL

__all__ = [
    "CLUSTER_TYPES",
    "CONFIGMAPS",
    "DEFINITIONS",
    "NAMESPACED_TYPES",
    "STORES",
    "build_platform",
    "reduce_configmap",
    "reduce_definition",
    "reduce_instance_type",
    "uid_of",
]

Obj = dict[str, Any]

DEFINITIONS = ResourceRef("cozystack.io", "v1alpha1", "applicationdefinitions", namespaced=False)
CLUSTER_TYPES = ResourceRef(
    "instancetype.kubevirt.io", "v1beta1", "virtualmachineclusterinstancetypes", namespaced=False
)
NAMESPACED_TYPES = ResourceRef("instancetype.kubevirt.io", "v1beta1", "virtualmachineinstancetypes")
CONFIGMAPS = ResourceRef("", "v1", "configmaps")
STORES: Final = ("definitions", "cluster-types", "namespaced-types", "presets")


def build_platform(
    objects: Mapping[str, Mapping[str, Obj]], last_good: dict[tuple[str, str], Obj]
) -> tuple[Platform, str]:
    """The platform from ``objects`` (per store, by uid; bad ones replaced by their last good
    version in ``last_good``, which this keeps up to date, or left out), and the canonical text of
    what it was built from."""
    builder = PlatformBuilder(default_contracts(), default_presets())
    problems: list[str] = []
    used: list[tuple[str, str, Obj]] = []
    present = set()
    for store in STORES:
        for uid, obj in sorted(objects[store].items()):
            present.add((store, uid))
            source = source_of(obj)
            reason = unusable(store, obj, source)
            if not reason:
                last_good[(store, uid)] = obj
                used.append((store, uid, obj))
                continue
            good = last_good.get((store, uid))
            if good is not None:
                problems.append(f"{store}: {reason}; its last good version is kept")
                used.append((store, uid, good))
            elif store == "presets":
                problems.append(
                    f"{store}: {reason}; no good table was seen, so charges that need a "
                    "preset fail closed (the built-in table is not used)"
                )
                builder.presets = {}
            else:
                problems.append(f"{store}: {reason}; left out")
    for key in [k for k in last_good if k not in present]:
        del last_good[key]  # deleted objects have no last good version to fall back on
    for _, uid, obj in used:
        try:
            builder.add(obj, source=source_of(obj))
        except ReservationError as exc:  # checked above; never expected
            problems.append(f"{uid}: {exc}")
    kinds = builder.kinds(skipped=problems)
    platform = Platform(kinds, builder.catalog(), tuple(problems))
    inputs = CANONICAL.encode([[store, uid, obj] for store, uid, obj in used])
    if builder.presets == {}:
        inputs += "|presets-broken"
    return platform, inputs


def unusable(store: str, obj: Obj, source: str) -> str:
    """Why ``obj`` cannot go into a platform; empty when it can."""
    try:
        if store == "definitions":
            kind_from_definition(obj, {}, source=source)
        else:
            PlatformBuilder({}, {}).add(obj, source=source)
    except ValueError as exc:
        return str(ManifestError(source, _name(obj), str(exc)))
    except ReservationError as exc:
        return str(exc)
    return ""


def reduce_definition(obj: Obj) -> Obj:
    """An ApplicationDefinition as far as charges go: kind, plural, schema, contract, prefix."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return _reduced(obj, spec, "spec")  # kept as it is, to be reported
    kept: Obj = {key: spec[key] for key in ("application", "reservation") if key in spec}
    release = spec.get("release")
    if isinstance(release, Mapping) and "prefix" in release:
        kept["release"] = {"prefix": release["prefix"]}
    return _reduced(obj, kept, "spec")


def reduce_instance_type(obj: Obj) -> Obj:
    """An instance type as far as charges go: guest CPU and memory, GPU device names."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return _reduced(obj, spec, "spec")
    kept: Obj = {}
    for key in ("cpu", "memory"):
        if key in spec:
            section = spec[key]
            kept[key] = {"guest": section.get("guest")} if isinstance(section, Mapping) else section
    if "gpus" in spec:
        gpus = spec["gpus"]
        kept["gpus"] = (
            [{"deviceName": g.get("deviceName")} if isinstance(g, Mapping) else g for g in gpus]
            if isinstance(gpus, list)
            else gpus
        )
    return _reduced(obj, kept, "spec")


def reduce_configmap(obj: Obj) -> Obj:
    data = obj.get("data")
    kept: Any = {PRESETS_KEY: data.get(PRESETS_KEY)} if isinstance(data, Mapping) else data
    return _reduced(obj, kept, "data")


def _reduced(obj: Obj, kept: Any, section: str) -> Obj:
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {k: metadata[k] for k in ("name", "namespace") if k in metadata},
        section: kept,
    }


def source_of(obj: Obj) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    where = f"{namespace}/" if namespace else ""
    return f"{obj.get('kind')} {where}{metadata.get('name')}"


def _name(obj: Obj) -> str:
    metadata = obj.get("metadata")
    return str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""


def uid_of(obj: Obj) -> str:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace', '')}/{metadata.get('name')}")

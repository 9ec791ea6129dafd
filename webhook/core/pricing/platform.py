"""The platform as the evaluator sees it: application kinds and the size catalog.

Assembled from Kubernetes manifests (ApplicationDefinitions, KubeVirt instance types, an
optional preset-table ConfigMap, ``ReservationContract`` documents) plus the defaults the project
ships, whatever the manifests come from: a directory, a live cluster, a test. Building is pure:
manifests in, a frozen :class:`Platform` out, every rejected manifest named with its reason.

Over 400 lines, and kept whole: a platform answers what an application of one of its kinds
reserves, and its two bounded caches (prepared values, charges) are that answer given once;
they live and die with the platform version they were computed on.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any

import orjson
import yaml
from cachetools import LRUCache

from webhook.core.base.errors import UNEVALUABLE, ContractError, EvaluationError, ManifestError
from webhook.core.pricing.bounds import check_values, non_string_key
from webhook.core.pricing.catalog import (
    CLUSTER_INSTANCETYPE,
    NAMESPACED_INSTANCETYPE,
    InstanceType,
    Preset,
    StaticCatalog,
    instance_type_from_manifest,
    presets_from_table,
)
from webhook.core.pricing.contract_schema import CONTRACT_API_VERSION, CONTRACT_KIND
from webhook.core.pricing.contracts import Contract, compile_document
from webhook.core.pricing.evaluation import Charge
from webhook.core.pricing.kinds import ApplicationKind, kind_from_definition
from webhook.core.tenancy.applications import AppKey
from webhook.core.tenancy.counts import count_key
from webhook.core.tenancy.records import canonical_sha256, digest_text, plain_json
from webhook.core.tenancy.tenants import TENANT_KIND, owned_namespace

__all__ = [
    "APPLICATION_DEFINITION",
    "PRESETS_CONFIGMAP",
    "PRESETS_KEY",
    "Platform",
    "PlatformBuilder",
    "Prepared",
    "Values",
]

APPLICATION_DEFINITION = ("cozystack.io/v1alpha1", "ApplicationDefinition")
# The charge cache holds at most this many entries and about this many bytes. Keys are digests
# of the canonical values, never the values themselves (a 1 MB cloudInit would otherwise be
# kept whole per entry); an entry's size is estimated from its charge (see _entry_bytes).
CHARGE_CACHE_SIZE = 4096
CHARGE_CACHE_BYTES = 16 * 1024 * 1024
# The values memo (:meth:`Platform.prepare`): applications with the very same values (many
# share a spec: disks of one size, databases of one preset) are bounded, defaulted, digested
# and priced once. A tenant can write endless distinct values, so it holds at most this many
# entries and about this many bytes (keyed by a digest, never the values; see _prepared_bytes).
PREPARED_CACHE_SIZE = 16_384
PREPARED_CACHE_BYTES = 16 * 1024 * 1024
INSTANCETYPE_GROUP = "instancetype.kubevirt.io/"
# A ConfigMap with this name replaces the built-in preset table (data key PRESETS_KEY holds the
# table in the shape of Cozystack's resource-presets.yaml).
PRESETS_CONFIGMAP = "reservation-resource-presets"
PRESETS_KEY = "presets.yaml"
_NO_COUNT: Mapping[str, Decimal] = MappingProxyType({})


@dataclass(frozen=True)
class Platform:
    """Kinds by name and the catalog their contracts resolve against.

    A platform never changes once built (a new cluster state builds a new one), so the charges
    it computes are cached by kind, a digest of what the contract reads of the defaulted values
    and (when the contract looks instance types up there) the namespace: a cluster holds few
    distinct sizes next to the number of writes and stored objects, and an UPDATE re-evaluates
    its old object. Values are bounded
    (:func:`~webhook.core.pricing.bounds.check_values`) before they are defaulted, encoded or
    evaluated.
    """

    kinds: Mapping[str, ApplicationKind] = field(default_factory=dict)
    catalog: StaticCatalog = field(default_factory=StaticCatalog)
    # What was left out or kept from before while building (a live platform tolerates one bad
    # manifest); reported by readiness, metrics and the report.
    problems: tuple[str, ...] = ()
    _charges: LRUCache[tuple[str, str, bytes], Charge] = field(
        default_factory=lambda: LRUCache(maxsize=CHARGE_CACHE_BYTES, getsizeof=_entry_bytes),
        init=False,
        repr=False,
        compare=False,
    )
    _prepared: LRUCache[tuple[str, str, bytes], Prepared] = field(
        default_factory=lambda: LRUCache(maxsize=PREPARED_CACHE_BYTES, getsizeof=_prepared_bytes),
        init=False,
        repr=False,
        compare=False,
    )
    _counts: Mapping[str, Mapping[str, Decimal]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _plurals: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = {
            name: MappingProxyType({count_key(kind.plural): Decimal(1)})
            for name, kind in self.kinds.items()
        }
        object.__setattr__(self, "_counts", counts)
        object.__setattr__(self, "_plurals", frozenset(k.plural for k in self.kinds.values()))

    def kind(self, name: str) -> ApplicationKind | None:
        return self.kinds.get(name)

    def plurals(self) -> frozenset[str]:
        """The plurals the ApplicationDefinitions declare: the kinds a budget may count."""
        return self._plurals

    def count_of(self, key: AppKey) -> Mapping[str, Decimal]:
        """What an application's existence charges: 1 of its kind's count key.

        The one place counts are charged, for every kind (exempt ones included), whatever its
        contract or recorded charge says: a count is not priced, so it never drifts and needs
        no record. The root tenant, which owns the namespace it lives in, is nobody's child and
        counts nowhere.
        """
        kind, namespace, name = key
        if kind == TENANT_KIND and owned_namespace(namespace, name) == namespace:
            return _NO_COUNT
        return self._counts.get(kind, _NO_COUNT)

    def charge(self, kind: str, spec: object, *, namespace: str = "") -> Charge:
        """Charge an application of ``kind``; an unknown kind fails closed."""
        return self.charge_values(kind, self.values(kind, spec), namespace=namespace)

    def values(self, kind: str, spec: object) -> Values:
        """``spec`` as evaluation and the signed records read it: bounded, defaulted, digested.

        Admission needs both the charge and the values digest of one spec; preparing them once
        bounds, defaults and encodes the values once. Raises :class:`EvaluationError` for an
        unknown kind or values past the bounds, ``TypeError``/``ValueError`` for values JSON
        cannot hold.
        """
        found = self.kinds.get(kind)
        if found is None:
            raise EvaluationError("", f"unknown application kind {kind!r}", kind=kind)
        check_values(spec)
        return self._values(found, spec)

    def prepare(self, kind: str, spec: object, *, namespace: str = "") -> Prepared:
        """The values digest of ``spec`` and its charge (or why it has none), as :meth:`values`
        and :meth:`charge_values` give them, once per distinct values of a kind.

        Raises as :meth:`values` does (the values cannot be prepared); a charge that fails is
        returned as ``failure``. Values are bounded before anything else is done with them; the
        memo keys on an exact digest of them (plain JSON only: others are prepared each time)
        and, when the kind's charge can depend on it, the namespace. Only prepared values with a
        charge are kept, at most :data:`PREPARED_CACHE_SIZE` of them.
        """
        found = self.kinds.get(kind)
        if found is None:
            raise EvaluationError("", f"unknown application kind {kind!r}", kind=kind)
        check_values(spec)
        reads = found.reads
        if reads is not None and (spec is None or isinstance(spec, Mapping)):
            where = namespace if reads.namespaced else ""
        else:
            where = namespace
        try:
            key: tuple[str, str, bytes] | None = (kind, where, _exact_sha256(spec))
        except (TypeError, ValueError, RecursionError):
            key = None
        if key is not None:
            cached = self._prepared.get(key)
            if cached is not None:
                return cached
        values = self._values(found, spec)
        try:
            charge = self.charge_values(kind, values, namespace=namespace)
        except UNEVALUABLE as exc:
            return Prepared(values.digest, None, exc)
        prepared = Prepared(values.digest, charge)
        if key is not None:
            with contextlib.suppress(ValueError):  # an entry larger than the whole memo
                self._prepared[key] = prepared
        return prepared

    @staticmethod
    def _values(found: ApplicationKind, spec: object) -> Values:
        """Bounded ``spec`` defaulted and digested; a key that is not a string (a YAML file's
        ``1:``) is refused by its path rather than failing as a ``TypeError`` that names none."""
        try:
            defaulted = found.defaulted(spec, checked=True)
            return Values(defaulted, canonical_sha256(defaulted))
        except TypeError:
            where = non_string_key(spec)
            if where is None:
                raise
            raise EvaluationError(
                where, "a key that is not a string: JSON keys are strings (quote it in YAML)"
            ) from None

    def charge_values(self, kind: str, values: Values, *, namespace: str = "") -> Charge:
        """The charge of values prepared by :meth:`values`, from the cache when seen before.

        The cache keys on the digest of what the kind's contract reads of the defaulted values
        (:class:`~webhook.core.pricing.evaluation.Reads`; all of them when its paths' reach is not
        plain), and on the namespace only when the contract looks instance types up there: so
        applications that differ only in what no term reads share one entry.
        """
        found = self.kinds.get(kind)
        if found is None:
            raise EvaluationError("", f"unknown application kind {kind!r}", kind=kind)
        reads, evaluated = found.reads, values.defaulted
        if reads is not None and isinstance(evaluated, Mapping):
            # Evaluated on what the contract reads, keyed by its digest: the cached charge is
            # a function of its key whatever else the values hold.
            evaluated = reads.project(evaluated)
            namespace = namespace if reads.namespaced else ""
        try:
            key = (kind, namespace, _exact_sha256(evaluated))
        except (TypeError, ValueError, RecursionError):
            # Not plain JSON (a YAML date, a key that is not a string): its canonical text
            # could equal another value's (a date and its text), so it is never cached.
            return found.charge_defaulted(evaluated, self.catalog, namespace=namespace)
        cached = self._charges.get(key)
        if cached is None:
            cached = found.charge_defaulted(evaluated, self.catalog, namespace=namespace)
            with contextlib.suppress(ValueError):  # an entry larger than the whole cache
                self._charges[key] = cached
        return cached


@dataclass(frozen=True, slots=True)
class Prepared:
    """An application's values digest and its charge, or the reason it has none."""

    digest: str
    charge: Charge | None
    failure: Exception | None = None


@dataclass(frozen=True, slots=True)
class Values:
    """An application's values bounded and defaulted, with the SHA-256 of their canonical JSON."""

    defaulted: Any
    sha256: bytes

    @property
    def digest(self) -> str:
        """The values digest a signed record carries
        (:func:`~webhook.core.tenancy.records.values_digest` of the defaulted values)."""
        return digest_text(self.sha256)


_EXACT = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _exact_sha256(values: object) -> bytes:
    """The SHA-256 of a JSON text of plain JSON values; raises ``TypeError`` for anything else
    (no value is turned into text that another value could also be). A cache key only: it is
    never stored or signed, so it need not be the canonical text records are signed over.

    orjson refuses keys that are not strings, integers past 64 bits, dates and subclasses, and
    writes NaN and infinities as ``null`` and a tuple as a list: only values the text reads back
    as are plain JSON (two values with one text then read back as one value, so are equal and
    of the same types: the text tells an integer, a float and a boolean apart). Values holding
    no float, tuple or subclass (:func:`plain_json`, a look at each container's children's
    types in C) always read back as they are; only the others are read back to be sure."""
    try:
        text = orjson.dumps(values, option=_EXACT)
        same = plain_json(values) or orjson.loads(text) == values
    except orjson.JSONEncodeError as exc:
        raise TypeError("not plain JSON") from exc
    if not same:
        raise TypeError("not plain JSON")
    return hashlib.sha256(text).digest()


def _prepared_bytes(prepared: Prepared) -> int:
    """An estimate of one values memo entry's memory (its charge is counted whole, though the
    charge cache often holds the same one), never below the share that caps the entry count."""
    estimate = 400 + (_entry_bytes(prepared.charge) if prepared.charge is not None else 0)
    return max(estimate, PREPARED_CACHE_BYTES // PREPARED_CACHE_SIZE)


def _entry_bytes(charge: Charge) -> int:
    """An estimate of one cache entry's memory, never below the share that caps the entry count.

    A charge is a few small maps: ~600 bytes plus ~300 per term and ~150 per resource key.
    Counting every entry as at least ``CHARGE_CACHE_BYTES / CHARGE_CACHE_SIZE`` bounds the
    number of entries by ``CHARGE_CACHE_SIZE`` as well as their bytes by ``CHARGE_CACHE_BYTES``.
    """
    estimate = 600 + 300 * len(charge.terms) + 150 * len(charge.resources)
    for term in charge.terms:
        estimate += len(term.path) + len(term.source) + 150 * len(term.resources)
    return max(estimate, CHARGE_CACHE_BYTES // CHARGE_CACHE_SIZE)


@dataclass
class PlatformBuilder:
    """Collects manifests, then builds a :class:`Platform`.

    ``default_contracts`` are the contracts the project ships, by kind; ``ReservationContract``
    documents among the manifests replace them kind by kind, and an ApplicationDefinition's own
    ``spec.reservation`` wins over both.
    """

    default_contracts: Mapping[str, Contract]
    default_presets: Mapping[str, Preset]
    definitions: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    instance_types: list[InstanceType] = field(default_factory=list)
    contracts: dict[str, Contract] = field(default_factory=dict)
    presets: dict[str, Preset] | None = None

    def add(self, manifest: Mapping[str, Any], *, source: str) -> bool:
        """Take one manifest if it describes the platform; return whether it did.

        Raises :class:`ManifestError` or :class:`ContractError` for a malformed one.
        """
        api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
        if (api_version, kind) == APPLICATION_DEFINITION:
            self.definitions.append((source, manifest))
            return True
        if (
            isinstance(api_version, str)
            and api_version.startswith(INSTANCETYPE_GROUP)
            and kind in (CLUSTER_INSTANCETYPE, NAMESPACED_INSTANCETYPE)
        ):
            try:
                self.instance_types.append(instance_type_from_manifest(manifest))
            except ValueError as exc:
                raise ManifestError(source, _name(manifest), str(exc)) from None
            return True
        if (api_version, kind) == (CONTRACT_API_VERSION, CONTRACT_KIND):
            contract = compile_document(manifest, source=source)
            self.contracts[contract.kind] = contract
            return True
        if (api_version, kind) == ("v1", "ConfigMap") and _name(manifest) == PRESETS_CONFIGMAP:
            self.presets = _presets_from_configmap(manifest, source)
            return True
        return False

    def build(self, *, problems: Iterable[str] = ()) -> Platform:
        """The platform; raises :class:`ManifestError` for a definition naming no kind."""
        return Platform(self.kinds(), self.catalog(), tuple(problems))

    def kinds(self, *, skipped: list[str] | None = None) -> dict[str, ApplicationKind]:
        """The kinds the definitions declare. With ``skipped``, a definition without a kind or
        plural is left out and its reason appended there instead of raising."""
        contracts = {**self.default_contracts, **self.contracts}
        kinds: dict[str, ApplicationKind] = {}
        for source, manifest in self.definitions:
            try:
                found = kind_from_definition(manifest, contracts, source=source)
            except ValueError as exc:
                error = ManifestError(source, _name(manifest), str(exc))
                if skipped is None:
                    raise error from None
                skipped.append(str(error))
                continue
            kinds[found.kind] = found
        return kinds

    def catalog(self) -> StaticCatalog:
        presets = self.presets if self.presets is not None else dict(self.default_presets)
        return StaticCatalog.of(self.instance_types, presets)


def _presets_from_configmap(manifest: Mapping[str, Any], source: str) -> dict[str, Preset]:
    data = manifest.get("data") or {}
    text = data.get(PRESETS_KEY) if isinstance(data, Mapping) else None
    if not isinstance(text, str):
        raise ManifestError(source, f"data.{PRESETS_KEY}", "missing")
    try:
        table = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ManifestError(source, f"data.{PRESETS_KEY}", f"not YAML: {exc}") from None
    if not isinstance(table, Mapping):
        raise ManifestError(source, f"data.{PRESETS_KEY}", "not a map")
    try:
        return presets_from_table(table)
    except ValueError as exc:
        raise ManifestError(source, f"data.{PRESETS_KEY}", str(exc)) from None


def _name(manifest: Mapping[str, Any]) -> str:
    metadata = manifest.get("metadata")
    return str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""


def contracts_from_documents(
    documents: Iterable[tuple[str, Mapping[str, Any]]],
) -> dict[str, Contract]:
    """Compile ``ReservationContract`` documents into contracts by kind; one kind, one contract."""
    contracts: dict[str, Contract] = {}
    for source, document in documents:
        contract = compile_document(document, source=source)
        if contract.kind in contracts:
            raise ContractError(
                source,
                "spec.kind",
                f"kind {contract.kind} already has a contract ({contracts[contract.kind].source})",
            )
        contracts[contract.kind] = contract
    return contracts

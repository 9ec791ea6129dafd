"""Evaluation: a contract applied to an application's values gives its charge.

``evaluate(contract, values, catalog) -> Charge`` is pure: the values are already defaulted (see
:mod:`webhook.core.pricing.defaulting`), names resolve through the
:class:`~webhook.core.pricing.catalog.Catalog` port, and nothing is read from a cluster or a file.
Every failure is an :class:`~webhook.core.base.errors.EvaluationError` naming the values path and
the reason, because the object under admission fails closed: a missing contract, an unknown instance
type or a bad quantity is never a charge of zero.

Reservation charges declared sizes only: no allocation ratios, no virtualization overhead.

:func:`evaluate` runs the contract compiled once into functions
(:mod:`webhook.core.pricing.compiled`); :func:`interpret`, the walk below, is the reference
semantics the compiled form is tested against, outcome for outcome.

Over 400 lines, and kept whole: one run (``_Run``) walks every construct of the contract
language in one recursion; split by construct, that recursion would be spread over modules.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from typing import Any, Final

from webhook.core.base import resources as rl
from webhook.core.base.errors import EvaluationError, QuantityError
from webhook.core.base.quantities import MAX_QUANTITY, format_quantity, parse_quantity
from webhook.core.pricing.catalog import Catalog
from webhook.core.pricing.contracts import (
    Condition,
    Contract,
    CountExpr,
    FirstOf,
    FromInstanceType,
    FromPreset,
    FromResources,
    Largest,
    Literal,
    MaxOf,
    NameExpr,
    PathRef,
    Product,
    SizeSource,
    Sum,
    Term,
    ValuePath,
)

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_QUOTED",
    "Charge",
    "EvaluationLimits",
    "Reads",
    "TermCharge",
    "contract_reads",
    "evaluate",
    "interpret",
    "quoted",
]


MAX_QUOTED: Final = 253  # characters of a tenant's value a message quotes: a Kubernetes name's most


def quoted(text: str) -> str:
    """``text`` as a refusal quotes it: whole up to a name's length, else its start and how
    long it was. A name no catalog holds is the tenant's own, at any length its values allow,
    and the refusal goes back in the answer, the log line and the audit annotation."""
    if len(text) <= MAX_QUOTED:
        return text
    return f"{text[:MAX_QUOTED]}... ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class EvaluationLimits:
    """Bounds that keep a hostile or mistaken contract from stalling admission."""

    max_items: int = 1_000  # items one forEach may expand to
    max_matches: int = 10_000  # path matches in one evaluation, all paths together


DEFAULT_LIMITS = EvaluationLimits()


@dataclass(frozen=True, slots=True)
class TermCharge:
    """One term's contribution: ``count`` units of ``source`` found at ``path``."""

    term: str
    path: str
    count: Decimal
    source: str
    resources: Mapping[str, Decimal]
    volume: str = ""  # "kept" | "released" when the term's storage is persistent volumes
    storage: Decimal = Decimal(0)  # the storage of one unit


@dataclass(frozen=True, slots=True)
class Charge:
    """What an application reserves, and the digest of what produced that figure."""

    kind: str
    resources: Mapping[str, Decimal]
    digest: str
    contract_digest: str
    terms: tuple[TermCharge, ...] = ()
    exempt_reason: str = ""

    def as_strings(self) -> dict[str, str]:
        return rl.to_strings(self.resources)


def evaluate(
    contract: Contract,
    values: object,
    catalog: Catalog,
    *,
    namespace: str = "",
    limits: EvaluationLimits = DEFAULT_LIMITS,
) -> Charge:
    """The charge of ``values`` (already defaulted) under ``contract``.

    ``namespace`` is the application's namespace, where namespaced instance types are looked up.
    Runs the contract's compiled form (:mod:`webhook.core.pricing.compiled`, built once per
    contract object), which gives exactly what :func:`interpret` gives.
    """
    # Imported here: the compiled form is built from this module's values and helpers.
    from webhook.core.pricing.compiled import program

    return program(contract).evaluate(values, catalog, namespace=namespace, limits=limits)


def interpret(
    contract: Contract,
    values: object,
    catalog: Catalog,
    *,
    namespace: str = "",
    limits: EvaluationLimits = DEFAULT_LIMITS,
) -> Charge:
    """:func:`evaluate` by walking the contract, construct by construct, on every call.

    The reference semantics of the contract language: the compiled form is tested against it
    on every shipped contract and hostile values, outcome for outcome.
    """
    if contract.exempt:
        return Charge(
            kind=contract.kind,
            resources={},
            digest=_digest(contract.digest, []),
            contract_digest=contract.digest,
            exempt_reason=contract.exempt_reason,
        )
    if not isinstance(values, Mapping):
        raise EvaluationError("spec", "must be an object", kind=contract.kind)
    run = _Run(values, catalog, namespace, limits)
    try:
        # Exact arithmetic: every operand is bounded (MAX_QUANTITY), so products and sums fit
        # in 60 digits and are never rounded (the default context would round at 28).
        with localcontext() as context:
            context.prec = 60
            terms = tuple(charge for term in contract.terms for charge in run.term(term))
            resources = {k: v for k, v in rl.total(t.resources for t in terms).items() if v != 0}
        _check_range(resources, terms)
    except EvaluationError as exc:
        raise exc.for_kind(contract.kind) from None
    return Charge(
        kind=contract.kind,
        resources=resources,
        digest=_digest(contract.digest, run.fingerprints),
        contract_digest=contract.digest,
        terms=terms,
    )


@dataclass(frozen=True, slots=True)
class Reads:
    """What evaluating one contract can read: the top-level values keys its paths start from,
    and whether it looks instance types up in the application's namespace.

    Evaluating the contract on the values restricted to ``keys`` gives the same charge, terms
    and errors as on the whole values (:func:`project`), so charges can be cached by what they
    read: applications that differ only in what the contract never looks at (names, labels,
    disks of a VM) share one evaluation.
    """

    keys: frozenset[str]
    namespaced: bool

    def project(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The part of ``values`` the contract reads."""
        return {key: values[key] for key in self.keys if key in values}


# A path whose reach is known from its text alone: a root key (absolute) or the current item
# (relative), then only child keys, wildcards and indices. Anything else (recursive descent
# from the root, unions, filters, jsonpath-ng's `parent`/`this` or `where` operators, which
# can climb back to the root) makes the whole contract read everything.
_BOUNDED_STEP = r"(?:\.[A-Za-z_][A-Za-z0-9_]*|\.\*|\[\*\]|\[[0-9]+\])"
_ABSOLUTE_PATH = re.compile(rf"\$\.([A-Za-z_][A-Za-z0-9_]*){_BOUNDED_STEP}*")
_RELATIVE_PATH = re.compile(rf"@{_BOUNDED_STEP}*")
_OPERATOR_NAMES = frozenset({"where", "wherenot", "parent", "this"})


def contract_reads(contract: Contract) -> Reads | None:
    """What ``contract`` reads of the values, or ``None`` when a path's reach is not plain
    (then a charge depends on the whole values)."""
    keys: set[str] = set()
    namespaced = False
    for node in _contract_nodes(contract):
        if isinstance(node, FromInstanceType) and node.namespaced:
            namespaced = True
        if not isinstance(node, ValuePath):
            continue
        text = node.text
        names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
        if names & _OPERATOR_NAMES:
            return None
        if node.relative:
            if not _RELATIVE_PATH.fullmatch(text):
                return None
            continue  # under a forEach item, itself found from a root key
        found = _ABSOLUTE_PATH.fullmatch(text)
        if found is None:
            return None
        keys.add(found[1])
    return Reads(frozenset(keys), namespaced)


def _contract_nodes(node: object) -> Iterator[object]:
    """Every compiled part of a contract, paths included (constants such as ``ifNone`` items
    are values, not parts, and are not entered)."""
    yield node
    if isinstance(node, ValuePath):
        return
    if isinstance(node, tuple | list):
        for item in node:
            yield from _contract_nodes(item)
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for member in dataclasses.fields(node):
            yield from _contract_nodes(getattr(node, member.name))


def _check_range(resources: Mapping[str, Decimal], terms: tuple[TermCharge, ...] = ()) -> None:
    """A charge, or a term's count of units, that no Kubernetes quantity could hold is a mistake
    or an attack: fail closed. (A count is a product of counts, each bounded alone; volume marks
    are keyed by it, and read back up to this bound: :mod:`webhook.core.pricing.volumes`.)"""
    for term in terms:
        if term.count > MAX_QUANTITY:
            raise EvaluationError(
                term.path or term.term,
                f"{term.term}.count exceeds what a Kubernetes quantity holds (2^63-1 units)",
            )
    for key, value in resources.items():
        if value > MAX_QUANTITY:
            raise EvaluationError(
                "", f"the {key} charge exceeds what a Kubernetes quantity holds (2^63-1)"
            )


def _digest(contract_digest: str, fingerprints: list[str]) -> str:
    text = "\n".join([contract_digest, *sorted(set(fingerprints))])
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(slots=True)
class _Scope:
    """Where paths resolve: the values root, and the current item with its display path."""

    item: object | None = None
    prefix: str = ""


@dataclass(slots=True)
class _Size:
    resources: dict[str, Decimal]
    source: str


_ABSENT = object()

# The most a count read from values may be (replicas, shards, maxReplicas ...). Kubernetes'
# own replica fields are int32, but no Cozystack application runs anywhere near this many of
# anything; past it a typo (``1e12``) would otherwise become an absurd charge.
MAX_COUNT: Final = 100_000
_DIGITS: Final = frozenset("0123456789")


@dataclass
class _Run:
    root: Mapping[str, Any]
    catalog: Catalog
    namespace: str
    limits: EvaluationLimits
    matches: int = 0
    fingerprints: list[str] = field(default_factory=list)

    # -- terms -----------------------------------------------------------------------------

    def term(self, term: Term) -> Iterator[TermCharge]:
        for scope in self.items(term):
            if not all(self.holds(c, scope) for c in term.when):
                continue
            if any(self.holds(c, scope) for c in term.unless):
                continue
            count = self.required(term.count, scope, integer=True, where=f"{term.name}.count")
            unit: dict[str, Decimal] = {}
            source = ""
            if term.size is not None:
                size = self.size(term.size, scope)
                if size is None:
                    raise EvaluationError(scope.prefix or term.name, no_size(term.size, scope))
                unit, source = size.resources, size.source
            if term.storage is not None:
                storage = self.required(term.storage, scope, integer=False, where="storage")
                unit = rl.add(unit, {"storage": storage})
            if term.devices is not None:
                unit = rl.add(unit, self.devices(term.devices, scope))
            for key, expression in term.objects:
                unit = rl.add(
                    unit, {key: self.required(expression, scope, integer=True, where=key)}
                )
            yield TermCharge(
                term.name,
                scope.prefix,
                count,
                source,
                rl.scale(unit, count),
                term.volume,
                unit.get("storage", Decimal(0)),
            )

    def holds(self, condition: Condition, scope: _Scope) -> bool:
        value = self.lookup(condition.path, scope)
        if condition.values is None:
            return _truthy(value)
        return value is not _ABSENT and value in condition.values

    def items(self, term: Term) -> Iterator[_Scope]:
        if term.for_each is None:
            yield _Scope()
            return
        self.check_items(term.for_each)
        found = self.find(term.for_each, _Scope())
        if len(found) > self.limits.max_items:
            raise EvaluationError(
                _display(term.for_each, _Scope()),
                f"{len(found)} items exceed the limit of {self.limits.max_items}",
            )
        if found:
            for path, item in found:
                yield _Scope(item, path)
            return
        base = _display(term.for_each, _Scope())
        for name, item in term.if_none:
            yield _Scope(item, f"{base.removesuffix('.*').removesuffix('[*]')}.{name}")

    def check_items(self, path: ValuePath) -> None:
        """Refuse a forEach over too many items before any match is materialised."""
        if path.container is None or path.relative:
            return
        datum: object = self.root
        for name in path.container:
            if not isinstance(datum, Mapping) or name not in datum:
                return
            datum = datum[name]
        if isinstance(datum, Mapping | list) and len(datum) > self.limits.max_items:
            raise EvaluationError(
                _display(path, _Scope()),
                f"{len(datum)} items exceed the limit of {self.limits.max_items}",
            )

    # -- sizes -----------------------------------------------------------------------------

    def size(self, source: SizeSource, scope: _Scope) -> _Size | None:
        match source:
            case FromInstanceType(name=name, namespaced=namespaced):
                return self.instance_type(name, namespaced, scope)
            case FromPreset(name=name, overrides=overrides):
                return self.preset(name, overrides, scope)
            case FromResources():
                return self.explicit(source, scope)
            case FirstOf(sources=sources):
                for candidate in sources:
                    size = self.size(candidate, scope)
                    if size is not None:
                        return size
                return None
            case MaxOf(sources=sources):
                first = self.size(sources[0], scope)
                if first is None:
                    return None
                for candidate in sources[1:]:
                    other = self.size(candidate, scope)
                    if other is not None:
                        first = _Size(
                            rl.maximum(first.resources, other.resources),
                            f"max({first.source}, {other.source})",
                        )
                return first
        raise AssertionError(source)  # pragma: no cover - exhaustive over SizeSource

    def instance_type(self, name: NameExpr, namespaced: bool, scope: _Scope) -> _Size | None:
        where, value = self.name(name, scope)
        if value is None:
            return None
        found = self.catalog.instance_type(value, namespace=self.namespace if namespaced else "")
        if found is None:
            scope_text = f" in namespace {self.namespace}" if namespaced else ""
            raise EvaluationError(where, f'unknown instance type "{quoted(value)}"{scope_text}')
        self.fingerprints.append(found.fingerprint())
        return _Size(found.resources(), f"instance type {value}")

    def preset(self, name: NameExpr, overrides: ValuePath | None, scope: _Scope) -> _Size | None:
        where, value = self.name(name, scope)
        if value is None:
            return None
        found = self.catalog.preset(value)
        if found is None:
            raise EvaluationError(where, f'unknown resource preset "{quoted(value)}"')
        self.fingerprints.append(found.fingerprint())
        resources = dict(found.resources)
        source = f"preset {value}"
        if overrides is not None:
            explicit = self.lookup(overrides, scope)
            if explicit is not _ABSENT and explicit is not None:
                if not isinstance(explicit, Mapping):
                    raise EvaluationError(_display(overrides, scope), "must be an object")
                replaced = []
                for key, raw in explicit.items():
                    if raw is None:
                        continue
                    resources[str(key)] = self.quantity(raw, f"{_display(overrides, scope)}.{key}")
                    replaced.append(str(key))
                if replaced:
                    source += f" with {', '.join(sorted(replaced))} from resources"
        return _Size(resources, source)

    def explicit(self, source: FromResources, scope: _Scope) -> _Size | None:
        # A required value must be set and truthy: charts test them with `if`, so a 0 there
        # leaves the chart on its other branch (an instance type, KubeVirt's one socket).
        for path in source.require:
            if not _truthy(self.lookup(path, scope)):
                return None
        resources: dict[str, Decimal] = {}
        for key, expression in source.resources:
            value = self.value(expression, scope, integer=False, where=key)
            if value is not None:
                resources[key] = value
        return _Size(resources, "resources") if resources else None

    # -- values ----------------------------------------------------------------------------

    def name(self, name: NameExpr, scope: _Scope) -> tuple[str, str | None]:
        if isinstance(name, Literal):
            return "", str(name.value)
        where = _display(name.path, scope)
        value = self.lookup(name.path, scope)
        if value is _ABSENT or value is None:
            value = name.default
        if value is None or value == "":
            return where, None
        if not isinstance(value, str):
            raise EvaluationError(where, f"{quoted(json.dumps(value, default=str))} is not a name")
        return where, value

    def devices(self, path: ValuePath, scope: _Scope) -> dict[str, Decimal]:
        devices: dict[str, Decimal] = {}
        for where, value in self.find(path, scope):
            if not isinstance(value, str) or not value:
                raise EvaluationError(where, "a device name must be a non-empty string")
            devices[value] = devices.get(value, Decimal(0)) + 1
        return devices

    def required(
        self, expression: CountExpr, scope: _Scope, *, integer: bool, where: str
    ) -> Decimal:
        value = self.value(expression, scope, integer=integer, where=where)
        if value is None:
            missing = _first_path(expression)
            path = _display(missing, scope) if missing is not None else where
            raise EvaluationError(path, "required value is missing")
        return value

    def value(
        self, expression: CountExpr, scope: _Scope, *, integer: bool, where: str
    ) -> Decimal | None:
        """A count or quantity; ``None`` when a path it needs is not set."""
        match expression:
            case Literal(value=value):
                return value if isinstance(value, Decimal) else parse_quantity(value)
            case PathRef(path=path, default=default):
                raw = self.lookup(path, scope)
                if raw is _ABSENT or raw is None:
                    raw = default
                if raw is None:
                    return None
                return self.number(raw, _display(path, scope), integer=integer)
            case Product(factors=factors):
                product = Decimal(1)
                for factor in factors:
                    factor_value = self.value(factor, scope, integer=integer, where=where)
                    if factor_value is None:
                        return None
                    product *= factor_value
                return product
            case Sum(terms=terms):
                total = Decimal(0)
                for part in terms:
                    part_value = self.value(part, scope, integer=integer, where=where)
                    if part_value is None:
                        return None
                    total += part_value
                return total
            case Largest(members=members):
                largest: Decimal | None = None
                for member in members:
                    member_value = self.value(member, scope, integer=integer, where=where)
                    if member_value is None:
                        return None
                    largest = member_value if largest is None else max(largest, member_value)
                return largest
        raise AssertionError(expression)  # pragma: no cover - exhaustive over CountExpr

    def number(self, raw: object, where: str, *, integer: bool) -> Decimal:
        if integer:
            return count(raw, where)
        return self.quantity(raw, where)

    def quantity(self, raw: object, where: str) -> Decimal:
        try:
            value = parse_quantity(raw)
        except QuantityError as exc:
            raise EvaluationError(where, str(exc)) from None
        if value < 0:
            raise EvaluationError(where, f"{format_quantity(value)} must not be negative")
        return value

    # -- paths -----------------------------------------------------------------------------

    def find(self, path: ValuePath, scope: _Scope) -> list[tuple[str, object]]:
        datum = scope.item if path.relative else self.root
        prefix = scope.prefix if path.relative else ""
        if path.fields is not None:
            for name in path.fields:
                if not isinstance(datum, Mapping) or name not in datum:
                    return []
                datum = datum[name]
            self.matches += 1
            return [(_join(prefix, ".".join(path.fields)), datum)]
        if path.head is not None and _leads_nowhere(datum, path.head):
            found = []
        else:
            found = path.expression.find(datum)
        self.matches += len(found)
        if self.matches > self.limits.max_matches:
            raise EvaluationError(
                _display(path, scope),
                f"evaluation matched more than {self.limits.max_matches} values",
            )
        return [(_join(prefix, str(match.full_path)), match.value) for match in found]

    def lookup(self, path: ValuePath, scope: _Scope) -> object:
        found = self.find(path, scope)
        if not found:
            return _ABSENT
        if len(found) > 1:
            raise EvaluationError(_display(path, scope), f"matches {len(found)} values, not one")
        return found[0][1]


def no_size(source: SizeSource, scope: _Scope) -> str:
    """Why a term has no size: the values that would give it one."""
    options = " or ".join(_describe(source, scope))
    return f"no size: set {options}"


def _describe(source: SizeSource, scope: _Scope) -> list[str]:
    match source:
        case FromInstanceType(name=PathRef(path=path)) | FromPreset(name=PathRef(path=path)):
            return [_display(path, scope)]
        case FromResources(require=require, resources=resources):
            paths = [_display(p, scope) for p in require] or [key for key, _ in resources]
            return [" and ".join(paths)]
        case FirstOf(sources=sources):
            return [text for s in sources for text in _describe(s, scope)]
        case MaxOf(sources=sources):
            return _describe(sources[0], scope)
    return ["a size"]


def _leads_nowhere(datum: object, keys: tuple[str, ...]) -> bool:
    """Whether ``keys`` miss in ``datum`` or reach an empty container: then a wildcard after
    them, and so the whole path, matches nothing (what jsonpath-ng would find, for less)."""
    for name in keys:
        if not isinstance(datum, Mapping) or name not in datum:
            return True
        datum = datum[name]
    return isinstance(datum, Mapping | list | tuple) and not datum


def _truthy(value: object) -> bool:
    return value is not _ABSENT and bool(value)


def _first_path(expression: CountExpr) -> ValuePath | None:
    match expression:
        case PathRef(path=path):
            return path
        case Product(factors=parts) | Sum(terms=parts) | Largest(members=parts):
            for part in parts:
                found = _first_path(part)
                if found is not None:
                    return found
    return None


def _display(path: ValuePath, scope: _Scope) -> str:
    """The values path a person reads: ``nodeGroups.md0.instanceType``."""
    rest = path.text[1:].lstrip(".")
    return _join(scope.prefix if path.relative else "", rest)


def _join(prefix: str, rest: str) -> str:
    rest = rest.replace(".[", "[").replace("$.", "")
    if rest in ("", "$"):
        return prefix
    if not prefix:
        return rest
    return f"{prefix}{rest}" if rest.startswith("[") else f"{prefix}.{rest}"


def count(raw: object, where: str) -> Decimal:
    """A count as written in values: a whole number from 0 to :data:`MAX_COUNT`.

    Digits only: no suffix (``1Ei``), exponent (``1e12``), fraction or boolean. The error
    quotes the value as the tenant typed it (``2.5``, ``true``), never a converted form.
    """
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif (isinstance(raw, float) and raw.is_integer() and abs(raw) <= MAX_COUNT) or (
        isinstance(raw, str) and 0 < len(raw) <= 20 and set(raw) <= _DIGITS
    ):
        value = int(raw)
    if value is None:
        raise EvaluationError(
            where, f"{_as_typed(raw)} is not a whole number (a count is digits only)"
        )
    if value < 0:
        raise EvaluationError(where, f"{_as_typed(raw)} must not be negative")
    if value > MAX_COUNT:
        raise EvaluationError(
            where, f"{_as_typed(raw)} is more than {MAX_COUNT:,}, the most a count may be"
        )
    return Decimal(value)


def _as_typed(raw: object) -> str:
    """A value as it appeared in YAML or JSON, shortened: ``true``, ``2.5``, ``"1Ei"``."""
    try:
        text = json.dumps(raw)
    except (TypeError, ValueError):
        text = type(raw).__name__
    return text if len(text) <= 40 else text[:37] + "..."

"""Compiled contracts: a contract turned once into nested closures that price values.

:func:`~webhook.core.pricing.evaluation.interpret` walks a contract on every application: a
``match`` per construct, a display path built per value read, jsonpath-ng per wildcard. A
contract does not change between the applications it prices (the platform builds its contracts
once per platform version, and the shipped ones once per process), so :func:`program` does that
walk once per contract object: paths become key, index and wildcard steps over plain dicts and
lists, literals and defaults are parsed, the constant lead of a product, sum or max is folded, and
a display path is built only for an error. The outcome must be the interpreter's exactly (charge,
terms, digest, and the same error with the same path and message under the same limits; a
property test runs both on every shipped contract and hostile values), so whatever the steps do
not cover (filters, recursive descent, a container of another type, a key that is not a string)
goes through jsonpath-ng, as the interpreter does.

Over 400 lines, and kept whole: one compiler per construct of the language, as the
interpreter's one run walks them; split by construct, the two could no longer be read side by
side.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from decimal import Decimal, localcontext
from typing import Any, Final

from jsonpath_ng import jsonpath

from webhook.core.base import resources as rl
from webhook.core.base.errors import EvaluationError, QuantityError
from webhook.core.base.quantities import format_quantity, parse_quantity
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
from webhook.core.pricing.evaluation import (
    _ABSENT,
    DEFAULT_LIMITS,
    MAX_COUNT,
    Charge,
    EvaluationLimits,
    TermCharge,
    _check_range,
    _digest,
    _display,
    _first_path,
    _join,
    _leads_nowhere,
    _Scope,
    _truthy,
    count,
    no_size,
    quoted,
)

__all__ = ["Program", "program"]


class _State:
    """One evaluation's inputs and what it accumulates (the interpreter's ``_Run``)."""

    __slots__ = ("catalog", "fingerprints", "limits", "matches", "namespace", "root")

    def __init__(
        self, root: Mapping[str, Any], catalog: Catalog, namespace: str, limits: EvaluationLimits
    ) -> None:
        self.root = root
        self.catalog = catalog
        self.namespace = namespace
        self.limits = limits
        self.matches = 0
        self.fingerprints: list[str] = []


Found = list[tuple[str, object]]
Find = Callable[[_State, object, str], Found]
Lookup = Callable[[_State, object, str], object]  # the one value, or _ABSENT
Value = Callable[[_State, object, str], Decimal | None]
Required = Callable[[_State, object, str], Decimal]
Size = Callable[[_State, object, str], "tuple[dict[str, Decimal], str] | None"]
Name = Callable[[_State, object, str], str | None]
Scopes = Callable[[_State], list[tuple[object, str]]]

_ZERO: Final = Decimal(0)
_ONE: Final = Decimal(1)
# Paths the steps answer: keys, `*`/`[*]` and single indices (anything else: jsonpath-ng).
_STEPPED: Final = re.compile(r"[$@](?:\.[A-Za-z_][A-Za-z0-9_]*|\.\*|\[\*\]|\[[0-9]+\])*")
# jsonpath-ng's Fields.__str__: a name it prints bare; any other is printed as its repr().
_BARE: Final = re.compile(r"^@?[A-Za-z_][A-Za-z0-9_@-]*$")
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})
_WILD: Final = object()


class _Fallback(Exception):
    """A value the steps do not cover: jsonpath-ng answers the whole path instead."""


def _steps(path: ValuePath) -> tuple[object, ...] | None:
    """The path as steps (a key, an index or ``_WILD``), or ``None`` for jsonpath-ng."""
    if not _STEPPED.fullmatch(path.text) or jsonpath.auto_id_field is not None:
        return None
    steps: list[object] = []
    node = path.expression
    while type(node) is jsonpath.Child:
        right = node.right
        if type(right) is jsonpath.Wildcard:
            steps.append(_WILD)
        elif type(right) is jsonpath.Fields and len(right.fields) == 1:
            steps.append(right.fields[0])
        elif type(right) is jsonpath.Index and len(right.indices) == 1:
            steps.append(right.indices[0])
        else:
            return None
        node = node.left
    if type(node) is not jsonpath.Root or any(s == "*" for s in steps):
        return None
    return tuple(reversed(steps))


def _walk(steps: tuple[object, ...], datum: object) -> list[tuple[object, tuple[object, ...]]]:
    """What jsonpath-ng finds, in its order, with the keys and indices that lead there."""
    current: list[tuple[Any, tuple[object, ...]]] = [(datum, ())]
    for step in steps:
        following: list[tuple[Any, tuple[object, ...]]] = []
        for value, parts in current:
            kind = type(value)
            if step is _WILD:
                if kind is dict:
                    for key, child in value.items():
                        if type(key) is not str:
                            raise _Fallback
                        following.append((child, (*parts, key)))
                elif kind is list or kind is tuple:
                    following.extend((child, (*parts, i)) for i, child in enumerate(value))
                elif kind not in _SCALARS:
                    raise _Fallback
            elif type(step) is str:
                if kind is dict:
                    child = value.get(step, _ABSENT)
                    if child is not _ABSENT:
                        following.append((child, (*parts, step)))
                elif kind not in _SCALARS and kind is not list and kind is not tuple:
                    raise _Fallback
            elif kind is list or kind is tuple:
                index: Any = step
                if value and -len(value) <= index < len(value):
                    following.append((value[index], (*parts, index)))
            elif kind not in _SCALARS and kind is not dict:
                raise _Fallback
        current = following
    return current


def _render(parts: tuple[object, ...]) -> str:
    """``str(match.full_path)`` as jsonpath-ng writes it for these keys and indices."""
    return ".".join(
        (p if _BARE.match(p) else repr(p)) if isinstance(p, str) else f"[{p}]" for p in parts
    )


def _shown(path: ValuePath, prefix: str) -> str:
    return _display(path, _Scope(None, prefix))


def _over(state: _State, path: ValuePath, prefix: str) -> None:
    if state.matches > state.limits.max_matches:
        raise EvaluationError(
            _shown(path, prefix),
            f"evaluation matched more than {state.limits.max_matches} values",
        )


def _finder(path: ValuePath, *, paths: bool) -> Callable[[_State, object, str], Any]:
    """A path's matches as ``(display path, value)`` (``paths``), else the matched values."""
    relative, names = path.relative, path.fields
    if names is not None:
        plain, joined = _plain(names, relative=relative), ".".join(names)

        def fields(state: _State, item: object, prefix: str) -> Any:
            datum = plain(state, item, prefix)
            if datum is _ABSENT:
                return []
            return [(_join(prefix if relative else "", joined), datum)] if paths else [datum]

        return fields
    steps, head, expression = _steps(path), path.head, path.expression

    def find(state: _State, item: object, prefix: str) -> Any:
        datum = item if relative else state.root
        shown = prefix if relative else ""  # an absolute path is named from the root
        walked: list[tuple[Any, tuple[object, ...]]] | None = None
        if head is not None and _leads_nowhere(datum, head):
            walked = []
        elif steps is not None:
            try:
                walked = _walk(steps, datum)
            except _Fallback:
                walked = None
        if walked is None:
            found = expression.find(datum)
            state.matches += len(found)
            _over(state, path, prefix)
            pairs = [(_join(shown, str(m.full_path)), m.value) for m in found]
            return pairs if paths else [value for _, value in pairs]
        state.matches += len(walked)
        _over(state, path, prefix)
        if not paths:
            return [value for value, _ in walked]
        return [(_join(shown, _render(parts)), value) for value, parts in walked]

    return find


def _plain(names: tuple[str, ...], *, relative: bool) -> Lookup:
    """A plain dotted path's one value, or ``_ABSENT`` (the interpreter's own shortcut)."""

    def plain(state: _State, item: object, prefix: str) -> object:
        datum = item if relative else state.root
        for name in names:
            if type(datum) is dict:
                datum = datum.get(name, _ABSENT)
                if datum is _ABSENT:
                    return _ABSENT
            elif isinstance(datum, Mapping) and name in datum:
                datum = datum[name]
            else:
                return _ABSENT
        state.matches += 1
        return datum

    return plain


def _lookup(path: ValuePath) -> Lookup:
    if path.fields is not None:  # one value or none: no list to build
        return _plain(path.fields, relative=path.relative)
    values: Callable[[_State, object, str], list[object]] = _finder(path, paths=False)

    def lookup(state: _State, item: object, prefix: str) -> object:
        found = values(state, item, prefix)
        if not found:
            return _ABSENT
        if len(found) > 1:
            raise EvaluationError(_shown(path, prefix), f"matches {len(found)} values, not one")
        return found[0]

    return lookup


def _quantity(raw: object, where: Callable[[], str]) -> Decimal:
    try:
        value = parse_quantity(raw)
    except QuantityError as exc:
        raise EvaluationError(where(), str(exc)) from None
    if value < 0:
        raise EvaluationError(where(), f"{format_quantity(value)} must not be negative")
    return value


def _number(raw: object, where: Callable[[], str], *, integer: bool) -> Decimal:
    if integer:
        if type(raw) is int and 0 <= raw <= MAX_COUNT:  # what count() returns, sooner
            return Decimal(raw)
        return count(raw, where())
    return _quantity(raw, where)


def _value(expression: CountExpr, *, integer: bool) -> tuple[Decimal | None, Value]:
    """A count or quantity: its constant if it has one, and the function that reads it."""
    match expression:
        case Literal(value=literal):
            try:
                constant = literal if isinstance(literal, Decimal) else parse_quantity(literal)
            except QuantityError:  # raised at evaluation, as it always was
                return None, lambda state, item, prefix: parse_quantity(literal)
            return constant, lambda state, item, prefix: constant
        case PathRef(path=path, default=default):
            return None, _path_value(path, default, integer=integer)
        case Product(factors=parts) | Sum(terms=parts) | Largest(members=parts):
            return _combined(expression, parts, integer=integer)
    raise AssertionError(expression)  # pragma: no cover - exhaustive over CountExpr


def _path_value(path: ValuePath, default: object, *, integer: bool) -> Value:
    lookup = _lookup(path)
    parsed: Decimal | None = None
    if default is not None:
        try:
            with localcontext() as context:
                context.prec = 60
                parsed = _number(default, lambda: "", integer=integer)
        except Exception:
            parsed = None

    def value(state: _State, item: object, prefix: str) -> Decimal | None:
        raw = lookup(state, item, prefix)
        if raw is _ABSENT or raw is None:
            if parsed is not None:
                return parsed
            raw = default
        if raw is None:
            return None
        return _number(raw, lambda: _shown(path, prefix), integer=integer)

    return value


def _combined(
    expression: Product | Sum | Largest, parts: tuple[CountExpr, ...], *, integer: bool
) -> tuple[Decimal | None, Value]:
    compiled = [_value(part, integer=integer) for part in parts]
    operator: Callable[[Decimal, Decimal], Decimal]
    if isinstance(expression, Product):
        start: Decimal | None = _ONE
        operator = Decimal.__mul__
    elif isinstance(expression, Sum):
        start, operator = _ZERO, Decimal.__add__
    else:
        start, operator = None, max
    # The leading constants, combined now in the order evaluation combines them.
    lead = 0
    with localcontext() as context:
        context.prec = 60
        while lead < len(compiled) and compiled[lead][0] is not None:
            member = compiled[lead][0]
            assert member is not None
            start = member if start is None else operator(start, member)
            lead += 1
    rest = [function for _, function in compiled[lead:]]
    if not rest:
        constant = start
        return constant, lambda state, item, prefix: constant
    first = start

    def combined(state: _State, item: object, prefix: str) -> Decimal | None:
        result = first
        for function in rest:
            member = function(state, item, prefix)
            if member is None:
                return None
            result = member if result is None else operator(result, member)
        return result

    return None, combined


def _required(expression: CountExpr, *, integer: bool, where: str) -> Required:
    constant, function = _value(expression, integer=integer)
    if constant is not None:
        known = constant
        return lambda state, item, prefix: known
    missing = _first_path(expression)

    def required(state: _State, item: object, prefix: str) -> Decimal:
        value = function(state, item, prefix)
        if value is None:
            path = _shown(missing, prefix) if missing is not None else where
            raise EvaluationError(path, "required value is missing")
        return value

    return required


def _name(name: NameExpr) -> tuple[Name, Callable[[str], str]]:
    """A name's reader and where it is (for errors)."""
    if isinstance(name, Literal):
        literal = str(name.value)
        return (lambda state, item, prefix: literal), (lambda prefix: "")
    path, default = name.path, name.default
    lookup = _lookup(path)

    def read(state: _State, item: object, prefix: str) -> str | None:
        value = lookup(state, item, prefix)
        if value is _ABSENT or value is None:
            value = default
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise EvaluationError(
                _shown(path, prefix), f"{quoted(json.dumps(value, default=str))} is not a name"
            )
        return value

    return read, lambda prefix: _shown(path, prefix)


def _size(source: SizeSource) -> Size:
    match source:
        case FromInstanceType(name=name, namespaced=namespaced):
            return _instance_type(name, namespaced=namespaced)
        case FromPreset(name=name, overrides=overrides):
            return _preset(name, overrides)
        case FromResources(resources=pairs, require=require):
            return _explicit(pairs, require)
        case FirstOf(sources=sources):
            options = [_size(s) for s in sources]

            def first(state: _State, item: object, prefix: str) -> Any:
                for option in options:
                    found = option(state, item, prefix)
                    if found is not None:
                        return found
                return None

            return first
        case MaxOf(sources=sources):
            lead, *others = [_size(s) for s in sources]

            def largest(state: _State, item: object, prefix: str) -> Any:
                found = lead(state, item, prefix)
                if found is None:
                    return None
                for other in others:
                    more = other(state, item, prefix)
                    if more is not None:
                        found = (rl.maximum(found[0], more[0]), f"max({found[1]}, {more[1]})")
                return found

            return largest
    raise AssertionError(source)  # pragma: no cover - exhaustive over SizeSource


def _instance_type(name: NameExpr, *, namespaced: bool) -> Size:
    read, where = _name(name)

    def size(state: _State, item: object, prefix: str) -> Any:
        value = read(state, item, prefix)
        if value is None:
            return None
        namespace = state.namespace if namespaced else ""
        found = state.catalog.instance_type(value, namespace=namespace)
        if found is None:
            scope_text = f" in namespace {state.namespace}" if namespaced else ""
            message = f'unknown instance type "{quoted(value)}"{scope_text}'
            raise EvaluationError(where(prefix), message)
        state.fingerprints.append(found.fingerprint())
        return found.resources(), f"instance type {value}"

    return size


def _preset(name: NameExpr, overrides: ValuePath | None) -> Size:
    read, where = _name(name)
    explicit = _lookup(overrides) if overrides is not None else None

    def size(state: _State, item: object, prefix: str) -> Any:
        value = read(state, item, prefix)
        if value is None:
            return None
        found = state.catalog.preset(value)
        if found is None:
            raise EvaluationError(where(prefix), f'unknown resource preset "{quoted(value)}"')
        state.fingerprints.append(found.fingerprint())
        resources = dict(found.resources)
        source = f"preset {value}"
        if explicit is not None and overrides is not None:
            given = explicit(state, item, prefix)
            if given is not _ABSENT and given is not None:
                if not isinstance(given, Mapping):
                    raise EvaluationError(_shown(overrides, prefix), "must be an object")
                replaced = []
                for key, raw in given.items():
                    if raw is None:
                        continue
                    resources[str(key)] = _quantity(raw, _key_path(overrides, prefix, key))
                    replaced.append(str(key))
                if replaced:
                    source += f" with {', '.join(sorted(replaced))} from resources"
        return resources, source

    return size


def _key_path(path: ValuePath, prefix: str, key: object) -> Callable[[], str]:
    return lambda: f"{_shown(path, prefix)}.{key}"


def _explicit(pairs: tuple[tuple[str, CountExpr], ...], require: tuple[ValuePath, ...]) -> Size:
    # A required value must be set and truthy, as a chart's `if` tests it.
    required = [_lookup(path) for path in require]
    readers = [(key, _value(expression, integer=False)[1]) for key, expression in pairs]

    def size(state: _State, item: object, prefix: str) -> Any:
        for lookup in required:
            if not _truthy(lookup(state, item, prefix)):
                return None
        resources: dict[str, Decimal] = {}
        for key, read in readers:
            value = read(state, item, prefix)
            if value is not None:
                resources[key] = value
        return (resources, "resources") if resources else None

    return size


def _condition(condition: Condition) -> Callable[[_State, object, str], bool]:
    lookup, values = _lookup(condition.path), condition.values
    if values is None:
        return lambda state, item, prefix: _truthy(lookup(state, item, prefix))

    def holds(state: _State, item: object, prefix: str) -> bool:
        value = lookup(state, item, prefix)
        return value is not _ABSENT and value in values  # a tuple: == as the contract says

    return holds


def _scopes(term: Term) -> Scopes:
    path = term.for_each
    if path is None:
        single: list[tuple[object, str]] = [(None, "")]
        return lambda state: single
    find: Find = _finder(path, paths=True)
    base = _shown(path, "")
    implicit = [
        (item, f"{base.removesuffix('.*').removesuffix('[*]')}.{name}")
        for name, item in term.if_none
    ]
    container = None if path.relative else path.container

    def scopes(state: _State) -> list[tuple[object, str]]:
        limit = state.limits.max_items
        if container is not None:  # refused on the container's size, before any match
            datum: object = state.root
            for name in container:
                if not isinstance(datum, Mapping) or name not in datum:
                    break
                datum = datum[name]
            else:
                if isinstance(datum, Mapping | list) and len(datum) > limit:
                    raise EvaluationError(base, f"{len(datum)} items exceed the limit of {limit}")
        found = find(state, None, "")
        if len(found) > limit:
            raise EvaluationError(base, f"{len(found)} items exceed the limit of {limit}")
        if found:
            return [(item, where) for where, item in found]
        return list(implicit)

    return scopes


Run = Callable[[_State, list[TermCharge]], None]


def _term(term: Term) -> Run:
    scopes = _scopes(term)
    when = [_condition(c) for c in term.when]
    unless = [_condition(c) for c in term.unless]
    units = _required(term.count, integer=True, where=f"{term.name}.count")
    size = _size(term.size) if term.size is not None else None
    storage = (
        _required(term.storage, integer=False, where="storage")
        if term.storage is not None
        else None
    )
    devices = _finder(term.devices, paths=True) if term.devices is not None else None
    objects = [(key, _required(e, integer=True, where=key)) for key, e in term.objects]
    name, volume, source_of = term.name, term.volume, term.size

    def run(state: _State, charges: list[TermCharge]) -> None:
        for item, prefix in scopes(state):
            if when and not all(holds(state, item, prefix) for holds in when):
                continue
            if unless and any(holds(state, item, prefix) for holds in unless):
                continue
            number = units(state, item, prefix)
            unit: dict[str, Decimal] = {}
            source = ""
            if size is not None and source_of is not None:
                found = size(state, item, prefix)
                if found is None:
                    raise EvaluationError(prefix or name, no_size(source_of, _Scope(item, prefix)))
                unit, source = found
            if storage is not None:
                unit = rl.add(unit, {"storage": storage(state, item, prefix)})
            if devices is not None:
                unit = rl.add(unit, _devices(devices(state, item, prefix)))
            for key, read in objects:
                unit = rl.add(unit, {key: read(state, item, prefix)})
            charges.append(
                TermCharge(
                    name,
                    prefix,
                    number,
                    source,
                    rl.scale(unit, number),
                    volume,
                    unit.get("storage", _ZERO),
                )
            )

    return run


def _devices(found: Found) -> dict[str, Decimal]:
    devices: dict[str, Decimal] = {}
    for where, value in found:
        if not isinstance(value, str) or not value:
            raise EvaluationError(where, "a device name must be a non-empty string")
        devices[value] = devices.get(value, _ZERO) + 1
    return devices


class Program:
    """A contract compiled: :meth:`evaluate` is :func:`~.evaluation.interpret`, done sooner."""

    __slots__ = ("_terms", "contract")

    def __init__(self, contract: Contract) -> None:
        self.contract = contract
        self._terms = tuple(_term(term) for term in contract.terms)

    def evaluate(
        self,
        values: object,
        catalog: Catalog,
        *,
        namespace: str = "",
        limits: EvaluationLimits = DEFAULT_LIMITS,
    ) -> Charge:
        contract = self.contract
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
        state = _State(values, catalog, namespace, limits)
        charges: list[TermCharge] = []
        try:
            # Exact arithmetic in 60 digits, as the interpreter computes.
            with localcontext() as context:
                context.prec = 60
                for run in self._terms:
                    run(state, charges)
                terms = tuple(charges)
                resources = {
                    k: v for k, v in rl.total(t.resources for t in terms).items() if v != 0
                }
            _check_range(resources, terms)
        except EvaluationError as exc:
            raise exc.for_kind(contract.kind) from None
        return Charge(
            kind=contract.kind,
            resources=resources,
            digest=_digest(contract.digest, state.fingerprints),
            contract_digest=contract.digest,
            terms=terms,
        )


# Programs by the identity of their contract (each keeps its contract, so an id is not reused
# while cached). A platform builds its contracts once per version, so this holds a few dozen;
# past the bound (contracts compiled anew, as tests do) it starts again rather than grow.
_PROGRAMS: dict[int, Program] = {}
_MAX_PROGRAMS: Final = 1024


def program(contract: Contract) -> Program:
    """``contract`` compiled, once per contract object."""
    found = _PROGRAMS.get(id(contract))
    if found is not None and found.contract is contract:
        return found
    compiled = Program(contract)
    if len(_PROGRAMS) >= _MAX_PROGRAMS:
        _PROGRAMS.clear()
    _PROGRAMS[id(contract)] = compiled
    return compiled

"""Reservation contracts: how to read one kind's charge from its values.

A contract is declarative data (validated by
:data:`~webhook.core.pricing.contract_schema.CONTRACT_SCHEMA`) that is compiled once, when loaded,
into the frozen values below; evaluation (:mod:`webhook.core.pricing.evaluation`) then walks them.
Loading rejects a contract with a mistake and names its source and the path inside it, so a bad
contract never reaches admission.

Over 400 lines, and kept whole: the language's frozen values and the compiler that builds them
from the declarative data are one definition of the language, changed together.

The language, in the order evaluation applies it::

    terms:                          # the charge is the sum of the terms
      - name: worker
        forEach: $.nodeGroups.*     # optional: one unit per list item / map value; `@` is the item
        ifNone: {md0: {...}}        # optional: items to use when forEach finds none
        when: $.external            # optional: the term counts only if this is truthy; also
                                    # {path: $.topology, equals: Simple}, {path: ..., in: [...]},
                                    # or a list of those, which must all hold
        unless: $.sharding          # optional: ... and only if none of these holds
        count: {product: [$.shards, $.replicas]}   # integer, path, product, sum or max; default 1
        size:                       # CPU and memory of one unit; the first source present wins
          first:
            - resources: {cpu: "@.resources.cpu", memory: "@.resources.memory"}
              require: ["@.resources.cpu", "@.resources.memory"]   # set and truthy, as a
                                                    # chart's `if` tests them (0 is not set)
            - instanceType: "@.instanceType"        # a KubeVirt instance type (guest size)
            - preset: $.resourcesPreset             # a cozy-lib preset ...
              overrides: $.resources                # ... with explicit keys winning key by key
        storage: "@.diskSize"       # a PVC per unit
        devices: "@.gpus[*].name"   # one device of resource <name> per match, per unit
        objects: {services.loadbalancers: 1}       # object counts per unit
    exempt: {reason: "..."}         # instead of terms: the kind truly reserves nothing

Strings starting with ``$`` are paths from the values root, ``@`` from the current item; any
other string is a literal. ``{path: ..., default: ...}`` gives a path a fallback. As a size,
``max: [a, b]`` is present when ``a`` is, and takes the key-wise maximum of the members present;
as a count or quantity, ``{max: [a, b]}`` is the largest of its members (missing when one is),
for values a tenant can set in a way that reads lower than what runs (``minReplicas`` above
``maxReplicas``: the platform starts ``minReplicas``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import jsonschema
from jsonpath_ng.jsonpath import JSONPath
from jsonpath_ng.parser import parse as parse_jsonpath

from webhook.core.base.errors import ContractError, QuantityError
from webhook.core.base.quantities import parse_quantity
from webhook.core.pricing.contract_schema import CONTRACT_SCHEMA, DOCUMENT_SCHEMA

__all__ = [
    "Condition",
    "Contract",
    "CountExpr",
    "FirstOf",
    "FromInstanceType",
    "FromPreset",
    "FromResources",
    "Largest",
    "Literal",
    "MaxOf",
    "NameExpr",
    "PathRef",
    "Product",
    "QuantityExpr",
    "SizeSource",
    "Sum",
    "Term",
    "ValuePath",
    "compile_contract",
    "compile_document",
    "contract_digest",
]

_VALIDATOR = jsonschema.Draft202012Validator(CONTRACT_SCHEMA)
_PLAIN_PATH = re.compile(r"[$@](\.[A-Za-z_][A-Za-z0-9_]*)+")
# A plain path followed by one wildcard (`$.nodeGroups.*`, `@.shards[*]`): its matches are the
# entries of one container, which evaluation can count before materialising them.
_WILDCARD_PATH = re.compile(r"[$@]((?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\.\*|\[\*\])")
# Plain keys, then a wildcard, then only keys and wildcards (`$.gpus[*].name`): a chain of
# children, so it matches nothing when the keys before the first wildcard lead nowhere or to an
# empty container. Group 1 holds those keys.
_HEADED_PATH = re.compile(
    r"[$@]((?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\.\*|\[\*\])(?:\.[A-Za-z_][A-Za-z0-9_]*|\.\*|\[\*\])*"
)


@dataclass(frozen=True, slots=True)
class ValuePath:
    """A compiled JSONPath, from the values root (``$``) or from the current item (``@``).

    ``fields`` holds the keys of a plain dotted path (``$.a.b``), which evaluation walks
    directly instead of through jsonpath-ng: same matches, a fraction of the cost.
    """

    text: str
    relative: bool
    expression: JSONPath = field(compare=False, repr=False)
    fields: tuple[str, ...] | None = None
    container: tuple[str, ...] | None = None  # for `<plain path>.*`: the container's keys
    # For `<plain path>` + wildcard + more (`$.gpus[*].name`): the plain keys before the
    # wildcard. Evaluation answers "no match" without jsonpath-ng when they lead nowhere or to
    # an empty container, as they do for most values (no GPUs).
    head: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Condition:
    """A path that must be truthy, or whose value must equal one of ``values``."""

    path: ValuePath
    values: tuple[object, ...] | None = None  # None: truthiness


@dataclass(frozen=True, slots=True)
class Literal:
    value: Decimal | str


@dataclass(frozen=True, slots=True)
class PathRef:
    path: ValuePath
    default: object | None = None


@dataclass(frozen=True, slots=True)
class Product:
    factors: tuple[CountExpr | QuantityExpr, ...]


@dataclass(frozen=True, slots=True)
class Sum:
    terms: tuple[CountExpr | QuantityExpr, ...]


@dataclass(frozen=True, slots=True)
class Largest:
    members: tuple[CountExpr | QuantityExpr, ...]


CountExpr = Literal | PathRef | Product | Sum | Largest
QuantityExpr = Literal | PathRef | Product | Sum | Largest
NameExpr = Literal | PathRef


@dataclass(frozen=True, slots=True)
class FromInstanceType:
    """The guest size of a KubeVirt instance type named by ``name`` (absent when empty)."""

    name: NameExpr
    namespaced: bool = False


@dataclass(frozen=True, slots=True)
class FromPreset:
    """A cozy-lib preset named by ``name``, with ``overrides`` merged over it key by key."""

    name: NameExpr
    overrides: ValuePath | None = None


@dataclass(frozen=True, slots=True)
class FromResources:
    """Explicit quantities; present when every ``require`` path and at least one key is set."""

    resources: tuple[tuple[str, QuantityExpr], ...]
    require: tuple[ValuePath, ...] = ()


@dataclass(frozen=True, slots=True)
class FirstOf:
    sources: tuple[SizeSource, ...]


@dataclass(frozen=True, slots=True)
class MaxOf:
    sources: tuple[SizeSource, ...]


SizeSource = FromInstanceType | FromPreset | FromResources | FirstOf | MaxOf


@dataclass(frozen=True, slots=True)
class Term:
    name: str
    count: CountExpr
    for_each: ValuePath | None = None
    if_none: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    when: tuple[Condition, ...] = ()  # all must hold
    unless: tuple[Condition, ...] = ()  # none may hold
    size: SizeSource | None = None
    storage: QuantityExpr | None = None
    devices: ValuePath | None = None
    objects: tuple[tuple[str, CountExpr], ...] = ()
    volume: str = ""  # "kept" | "released": the storage is persistent volumes


@dataclass(frozen=True, slots=True)
class Contract:
    """A compiled contract for one application kind."""

    kind: str
    source: str
    digest: str
    terms: tuple[Term, ...] = ()
    exempt_reason: str = ""
    description: str = ""

    @property
    def exempt(self) -> bool:
        return bool(self.exempt_reason)


def compile_contract(kind: str, spec: object, *, source: str) -> Contract:
    """Validate and compile a contract ``spec`` (without its ``kind``) for ``kind``.

    ``source`` names where it came from (a file, an ApplicationDefinition) for error messages.
    Raises :class:`ContractError` naming the source and the path of the first mistake.
    """
    if not isinstance(spec, Mapping):
        raise ContractError(source, "", "a contract must be a mapping")
    errors = sorted(_VALIDATOR.iter_errors(spec), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise ContractError(source, _format_path(error.absolute_path), _schema_reason(error))
    digest = contract_digest(spec)
    if "exempt" in spec:
        return Contract(
            kind=kind,
            source=source,
            digest=digest,
            exempt_reason=str(spec["exempt"]["reason"]),
            description=str(spec.get("description", "")),
        )
    compiler = _Compiler(source)
    terms = tuple(
        compiler.term(term, f"terms[{index}]") for index, term in enumerate(spec["terms"])
    )
    names = [term.name for term in terms]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ContractError(source, "terms", f"duplicate term names: {', '.join(duplicates)}")
    return Contract(
        kind=kind,
        source=source,
        digest=digest,
        terms=terms,
        description=str(spec.get("description", "")),
    )


def contract_digest(spec: Mapping[str, Any]) -> str:
    """``sha256:<16 hex>`` of the contract's canonical JSON: equal contracts, equal digests.

    A term's ``volume`` marker is left out: it does not change what any values evaluate to,
    only how a charge is held across writes (the marks the record keeps), so marking a term as
    a volume does not show every application of the kind as drifted.
    """
    terms = spec.get("terms")
    if isinstance(terms, list):
        unmarked = [
            {k: v for k, v in t.items() if k != "volume"} if isinstance(t, Mapping) else t
            for t in terms
        ]
        spec = {**spec, "terms": unmarked}
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


class _Compiler:
    """Turns validated contract data into model values; checks what the schema cannot."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.in_item = False

    def fail(self, where: str, reason: str) -> ContractError:
        return ContractError(self.source, where, reason)

    def term(self, data: Mapping[str, Any], where: str) -> Term:
        self.in_item = False
        for_each = self.path(data["forEach"], f"{where}.forEach") if "forEach" in data else None
        if "ifNone" in data and for_each is None:
            raise self.fail(f"{where}.ifNone", "ifNone needs forEach")
        self.in_item = for_each is not None
        count = self.expression(data.get("count", 1), f"{where}.count", integer=True)
        return Term(
            name=data["name"],
            count=count,
            for_each=for_each,
            if_none=tuple((str(k), v) for k, v in (data.get("ifNone") or {}).items()),
            when=self.conditions(data.get("when"), f"{where}.when"),
            unless=self.conditions(data.get("unless"), f"{where}.unless"),
            size=self.size(data["size"], f"{where}.size") if "size" in data else None,
            storage=(
                self.expression(data["storage"], f"{where}.storage", integer=False)
                if "storage" in data
                else None
            ),
            devices=self.path(data["devices"], f"{where}.devices") if "devices" in data else None,
            objects=tuple(
                (key, self.expression(value, f"{where}.objects.{key}", integer=True))
                for key, value in (data.get("objects") or {}).items()
            ),
            volume=str(data.get("volume", "")),
        )

    def conditions(self, data: object, where: str) -> tuple[Condition, ...]:
        if data is None:
            return ()
        items = data if isinstance(data, list) else [data]
        result = []
        for index, item in enumerate(items):
            at = f"{where}[{index}]" if isinstance(data, list) else where
            if isinstance(item, Mapping):
                values = (item["equals"],) if "equals" in item else tuple(item["in"])
                result.append(Condition(self.path(item["path"], f"{at}.path"), values))
            else:
                result.append(Condition(self.path(item, at)))
        return tuple(result)

    def size(self, data: Mapping[str, Any], where: str) -> SizeSource:
        if "instanceType" in data:
            return FromInstanceType(
                self.name(data["instanceType"], f"{where}.instanceType"),
                bool(data.get("namespaced", False)),
            )
        if "preset" in data:
            overrides = data.get("overrides")
            return FromPreset(
                self.name(data["preset"], f"{where}.preset"),
                self.path(overrides, f"{where}.overrides") if overrides is not None else None,
            )
        if "resources" in data:
            return FromResources(
                tuple(
                    (key, self.expression(value, f"{where}.resources.{key}", integer=False))
                    for key, value in data["resources"].items()
                ),
                tuple(
                    self.path(path, f"{where}.require[{index}]")
                    for index, path in enumerate(data.get("require", []))
                ),
            )
        if "first" in data:
            return FirstOf(
                tuple(self.size(s, f"{where}.first[{i}]") for i, s in enumerate(data["first"]))
            )
        return MaxOf(tuple(self.size(s, f"{where}.max[{i}]") for i, s in enumerate(data["max"])))

    def name(self, data: object, where: str) -> NameExpr:
        if isinstance(data, Mapping):
            return PathRef(self.path(data["path"], f"{where}.path"), data.get("default"))
        text = str(data)
        if text.startswith(("$", "@")):
            return PathRef(self.path(text, where))
        return Literal(text)

    def expression(self, data: object, where: str, *, integer: bool) -> CountExpr:
        if isinstance(data, Mapping) and "product" in data:
            return Product(
                tuple(
                    self.expression(f, f"{where}.product[{i}]", integer=integer)
                    for i, f in enumerate(data["product"])
                )
            )
        if isinstance(data, Mapping) and "sum" in data:
            return Sum(
                tuple(
                    self.expression(t, f"{where}.sum[{i}]", integer=integer)
                    for i, t in enumerate(data["sum"])
                )
            )
        if isinstance(data, Mapping) and "max" in data:
            return Largest(
                tuple(
                    self.expression(m, f"{where}.max[{i}]", integer=integer)
                    for i, m in enumerate(data["max"])
                )
            )
        if isinstance(data, Mapping):
            return PathRef(self.path(data["path"], f"{where}.path"), data.get("default"))
        if isinstance(data, str) and data.startswith(("$", "@")):
            return PathRef(self.path(data, where))
        try:
            value = parse_quantity(data)
        except QuantityError as exc:
            raise self.fail(where, str(exc)) from exc
        if value < 0:
            raise self.fail(where, "must not be negative")
        if integer and value != value.to_integral_value():
            raise self.fail(where, f"{data!r} is not a whole number")
        return Literal(value)

    def path(self, text: object, where: str) -> ValuePath:
        if not isinstance(text, str) or not text.startswith(("$", "@")):
            raise self.fail(where, f"{text!r} is not a path: paths start with $ or @")
        relative = text.startswith("@")
        if relative and not self.in_item:
            raise self.fail(where, f"{text!r} refers to the current item (@) outside forEach")
        try:
            expression = parse_jsonpath("$" + text[1:])
        except Exception as exc:  # jsonpath-ng raises bare Exception subclasses
            raise self.fail(where, f"{text!r} is not valid JSONPath: {exc}") from exc
        plain = _PLAIN_PATH.fullmatch(text)
        fields = tuple(text[2:].split(".")) if plain and len(text) > 1 else None
        wildcard = _WILDCARD_PATH.fullmatch(text)
        container = tuple(wildcard[1][1:].split(".")) if wildcard and wildcard[1] else None
        if wildcard and not wildcard[1]:
            container = ()
        headed = _HEADED_PATH.fullmatch(text)
        head = tuple(headed[1][1:].split(".")) if headed else None
        return ValuePath(text, relative, expression, fields, container, head)


def _format_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _schema_reason(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        return str(error.message)
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    options = schema.get(str(error.validator))
    if isinstance(options, list) and all(set(o) == {"required"} for o in options):
        fields = ", ".join(name for option in options for name in option["required"])
        return f"needs {'exactly' if error.validator == 'oneOf' else 'at least'} one of: {fields}"
    if error.validator in ("oneOf", "anyOf") and isinstance(error.instance, Mapping):
        keys = ", ".join(sorted(str(k) for k in error.instance)) or "nothing"
        return f"not a valid {schema.get('description', 'value')} (has {keys})"
    return str(error.message)


_DOCUMENT_VALIDATOR = jsonschema.Draft202012Validator(DOCUMENT_SCHEMA)


def compile_document(document: Mapping[str, Any], *, source: str) -> Contract:
    """Compile a ``ReservationContract`` document: its ``spec.kind`` and the contract beside it."""
    errors = list(_DOCUMENT_VALIDATOR.iter_errors(document))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise ContractError(source, _format_path(error.absolute_path), _schema_reason(error))
    spec = dict(document["spec"])
    kind = str(spec.pop("kind"))
    name = document["metadata"]["name"]
    try:
        return compile_contract(kind, spec, source=source)
    except ContractError as exc:
        path = f"spec.{exc.path}" if exc.path else "spec"
        raise ContractError(f"{source} ({name})", path, exc.reason) from None

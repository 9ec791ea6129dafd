"""Application kinds: what an ApplicationDefinition tells the webhook, and how a kind is charged.

An ``ApplicationDefinition`` (``cozystack.io/v1alpha1``, cluster-scoped) names a kind, its
plural, and its values schema with defaults (a JSON string). Its reservation contract is
``spec.reservation`` when present, else the platform's default contract for that kind. A kind
whose contract is missing or broken is still known: charging it fails closed, with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.core.base.errors import ContractError, EvaluationError
from webhook.core.pricing.bounds import DEFAULT_VALUES_LIMITS, check_values
from webhook.core.pricing.catalog import Catalog
from webhook.core.pricing.compiled import Program, program
from webhook.core.pricing.contracts import Contract, compile_contract
from webhook.core.pricing.defaulting import Defaulter, compile_defaults
from webhook.core.pricing.evaluation import (
    DEFAULT_LIMITS,
    Charge,
    EvaluationLimits,
    Reads,
    contract_reads,
)
from webhook.core.pricing.unknown_keys import KeyIndex, index_schema

__all__ = ["APPS_GROUP", "ApplicationKind", "kind_from_definition"]

APPS_GROUP = "apps.cozystack.io"


@dataclass(frozen=True)
class ApplicationKind:
    """One ``apps.cozystack.io`` kind, ready to charge."""

    kind: str
    plural: str
    definition: str  # the ApplicationDefinition's name, e.g. ``vm-instance``
    schema: Mapping[str, Any] = field(default_factory=dict, repr=False)
    release_prefix: str = ""
    contract: Contract | None = None
    problem: str = ""  # why there is no usable contract or schema
    defaulter: Defaulter | None = field(default=None, repr=False, compare=False)
    # What the contract reads of the values (None: all of them, or no contract).
    reads: Reads | None = field(default=None, init=False, repr=False, compare=False)
    # The schema as the unknown-key walk reads it, made once per kind (per platform version).
    key_index: KeyIndex = field(init=False, repr=False, compare=False)
    # The contract compiled, once per kind (so once per platform version).
    program: Program | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.defaulter is None:
            object.__setattr__(self, "defaulter", compile_defaults(self.schema))
        if self.contract is not None:
            object.__setattr__(self, "reads", contract_reads(self.contract))
            object.__setattr__(self, "program", program(self.contract))
        object.__setattr__(self, "key_index", index_schema(self.schema))

    def defaulted(self, spec: object, *, checked: bool = False) -> Any:
        """The values as Cozystack reads them back: schema defaults applied.

        Raises :class:`EvaluationError` for values past the bounds, before any defaulting
        (``checked``: the caller has just bounded them), and once the defaults would add more
        entries than :attr:`~webhook.core.pricing.bounds.ValuesLimits.max_defaulted`.
        """
        if not checked:
            check_values(spec)
        document = {} if spec is None else spec
        if self.defaulter is None:
            return document
        return self.defaulter.apply(document, max_added=DEFAULT_VALUES_LIMITS.max_defaulted)

    def charge(
        self,
        spec: object,
        catalog: Catalog,
        *,
        namespace: str = "",
        limits: EvaluationLimits = DEFAULT_LIMITS,
    ) -> Charge:
        """What an application of this kind with ``spec`` reserves; fails closed."""
        self._contract()  # a kind without a contract fails before its values are looked at
        return self.charge_defaulted(
            self.defaulted(spec), catalog, namespace=namespace, limits=limits
        )

    def charge_defaulted(
        self,
        values: object,
        catalog: Catalog,
        *,
        namespace: str = "",
        limits: EvaluationLimits = DEFAULT_LIMITS,
    ) -> Charge:
        """:meth:`charge` for values already bounded and defaulted (by :meth:`defaulted`)."""
        compiled = self.program
        if compiled is None:  # no contract: refused with why
            compiled = program(self._contract())
        return compiled.evaluate(values, catalog, namespace=namespace, limits=limits)

    def _contract(self) -> Contract:
        if self.contract is None:
            reason = f"no reservation contract for kind {self.kind}"
            raise EvaluationError(
                "", f"{reason}: {self.problem}" if self.problem else reason, kind=self.kind
            )
        return self.contract


def kind_from_definition(
    manifest: Mapping[str, Any],
    default_contracts: Mapping[str, Contract],
    *,
    source: str,
) -> ApplicationKind:
    """Read an ApplicationDefinition; a broken schema or contract becomes ``problem``.

    Raises :class:`ValueError` only when the definition lacks a kind or plural, since then it
    names nothing that could be admitted.
    """
    spec = manifest.get("spec") or {}
    application = spec.get("application") if isinstance(spec, Mapping) else None
    if not isinstance(application, Mapping):
        raise ValueError("spec.application: missing")
    kind, plural = application.get("kind"), application.get("plural")
    if not isinstance(kind, str) or not kind:
        raise ValueError("spec.application.kind: missing")
    if not isinstance(plural, str) or not plural:
        raise ValueError("spec.application.plural: missing")
    name = str((manifest.get("metadata") or {}).get("name") or kind.lower())
    release = spec.get("release") or {}
    prefix = str(release.get("prefix") or "") if isinstance(release, Mapping) else ""
    problems: list[str] = []
    schema: Mapping[str, Any] = {}
    raw_schema = application.get("openAPISchema")
    if raw_schema:
        try:
            parsed = json.loads(raw_schema) if isinstance(raw_schema, str) else raw_schema
        except json.JSONDecodeError as exc:
            problems.append(f"spec.application.openAPISchema: not JSON ({exc.msg})")
        else:
            if isinstance(parsed, Mapping):
                schema = parsed
            else:
                problems.append("spec.application.openAPISchema: not an object")
    contract: Contract | None = None
    if "reservation" in spec:
        try:
            contract = compile_contract(
                kind, spec["reservation"], source=f"{source} spec.reservation"
            )
        except ContractError as exc:
            problems.append(str(exc))
    else:
        contract = default_contracts.get(kind)
        if contract is None:
            problems.append(
                "the ApplicationDefinition has no spec.reservation and the platform ships "
                "no default contract for it"
            )
    if problems and raw_schema and not schema:
        contract = None  # without its defaults the kind cannot be evaluated faithfully
    return ApplicationKind(
        kind=kind,
        plural=plural,
        definition=name,
        schema=schema,
        release_prefix=prefix,
        contract=contract,
        problem="; ".join(problems),
    )

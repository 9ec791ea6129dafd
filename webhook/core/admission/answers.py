"""Stage 5 of the admission decision: the answer, as a value.

Every stage before this one says *what* was decided; this module says it to the API server, to
kubectl and to the audit log in one place, so the wording, the warning limits and the audit keys
cannot drift between the paths that refuse and the path that admits. Decisions are built by the
named constructors here (``skipped``, ``errored``, ``invalid``, ``quota_allowed``,
``quota_denied``), finished by :func:`finish` (the mode, warn's softening, dry run's note, the
audit annotations) and serialised by :meth:`Decision.response`; the mutating side's JSONPatch
operations are built here too. It imports no other stage: it is the bottom of the pipeline.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Final

import orjson

from webhook.core.admission.modes import Mode
from webhook.core.admission.reviews import AdmissionRequest, Response
from webhook.core.base import resources as rl
from webhook.core.base.quantities import format_quantity
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, Application
from webhook.core.tenancy.overcommit import OVERCOMMIT_ANNOTATION

__all__ = [
    "BAD_BUDGET_KEY",
    "CHARGE_POINTER",
    "DRY_RUN_NOTE",
    "OVERCOMMIT_POINTER",
    "WARNING_LIMIT",
    "Admitted",
    "Decision",
    "Facts",
    "errored",
    "evolve",
    "finish",
    "fit",
    "held_dry_run",
    "invalid",
    "quota_allowed",
    "quota_denied",
    "set_annotation",
    "skipped",
]

# The API server truncates warnings over 256 characters and drops them past 4096 in total
# (k8s.io/apiserver/pkg/warning); we aim for 120 so kubectl prints each on one line.
WARNING_TARGET: Final = 120
DRY_RUN_NOTE: Final = "dry run: nothing was reserved"
WARNING_LIMIT: Final = 256
# A Tenant budget key Kubernetes would refuse in a ResourceQuota, or a count nothing counts:
# refused in warn mode too, since admitting it protects nobody (the chart's ResourceQuota fails
# to apply, or the budget silently does not hold) and every key is work and a metric label.
BAD_BUDGET_KEY: Final = "invalid-budget-key"
_ZERO = Decimal(0)


class Admitted:
    """What the state holds once the object is stored, built the first time it is read.

    Its record is signed (an HMAC over the canonical record) only then: the validating answer
    never returns it, so a dry run, or a write held in the ledger, signs nothing; the state
    that observes it, the audit replay and the tests read it as before."""

    __slots__ = ("_app", "_build")

    def __init__(self, build: Callable[[], Application]) -> None:
        self._build = build
        self._app: Application | None = None

    def get(self) -> Application:
        if self._app is None:
            self._app = self._build()
        return self._app

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Admitted):
            return self.get() == other.get()
        if isinstance(other, Application):  # the same application, built at once
            return self.get() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal by content, which is built lazily

    def __repr__(self) -> str:
        return f"Admitted({self.get()!r})"


@dataclass(frozen=True)
class Decision:
    """The answer to one admission request, with every fact worth reporting."""

    allowed: bool
    outcome: str  # allowed | denied | warned | skipped | error: the metrics label
    reason: str = ""  # a short machine reason: fits, exceeded, invalid, no-contract, ...
    code: int = 200
    status_reason: str = ""  # Kubernetes StatusReason: Forbidden, Invalid, ...
    message: str = ""
    causes: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    audit: Mapping[str, str] = field(default_factory=dict)
    mode: Mode = "enforce"
    kind: str = ""
    pool: str = ""
    charge: Mapping[str, Decimal] | None = None
    committed: Mapping[str, Decimal] | None = None  # declared, when a factor discounts it
    factor: str = ""  # the factor applied and where it came from, e.g. "memory=1.2 (tenant-a)"
    delta: Mapping[str, Decimal] | None = None
    reserved_after: Mapping[str, Decimal] = field(default_factory=dict)
    budget: Mapping[str, Decimal] = field(default_factory=dict)
    digest: str = ""
    # What the state holds once the object is stored (:attr:`admitted`), built when read.
    admitting: Application | Admitted | None = None
    patch: tuple[Mapping[str, object], ...] = ()  # JSONPatch operations (mutating side)
    # For the ledger: the increases this request adds to each pool (by pool namespace), and
    # what the stored object will show once observed (its charge; a Tenant's budget).
    charged_pools: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)
    expected: Mapping[str, Decimal] | None = None

    @property
    def admitted(self) -> Application | None:
        """What the state holds once the object is stored: the application, its record signed."""
        held = self.admitting
        return held.get() if isinstance(held, Admitted) else held

    def response(self) -> Response:
        """The AdmissionResponse body (without the uid, added by ``review_response``)."""
        body: Response = {"allowed": self.allowed}
        if not self.allowed:
            body["status"] = {
                "code": self.code,
                "reason": self.status_reason,
                "message": self.message,
            }
            if self.causes:
                body["status"]["details"] = {
                    "causes": [
                        {"field": f, "message": m, "reason": "FieldValueInvalid"}
                        for f, m in self.causes
                    ]
                }
        if self.warnings:
            body["warnings"] = list(self.warnings)
        if self.audit:
            body["auditAnnotations"] = dict(self.audit)
        if self.patch:
            body["patchType"] = "JSONPatch"
            body["patch"] = base64.b64encode(json.dumps(list(self.patch)).encode()).decode()
        return body


@dataclass
class Facts:
    """What a quota decision reports about the application, whatever the pools say: gathered
    by the stages before the pool check (warnings and, for a Tenant, ``expected`` are added as
    it goes)."""

    kind: str
    charge: Mapping[str, Decimal]
    delta: Mapping[str, Decimal]
    digest: str
    admitted: Application | Admitted
    warnings: list[str] = field(default_factory=list)
    expected: Mapping[str, Decimal] | None = None
    committed: Mapping[str, Decimal] | None = None
    factor: str = ""


def finish(mode: Mode, decision: Decision, request: AdmissionRequest) -> Decision:
    """Finish a decision: the mode, warn-mode's softening, dry-run's note, the audit trail."""
    warnings = decision.warnings
    allowed, outcome = decision.allowed, decision.outcome
    if not allowed and mode == "warn":
        allowed, outcome = True, "warned"
        warnings = (fit(f"would be denied: {decision.message}"), *warnings)
    if request.dry_run and allowed:
        warnings = (*warnings, DRY_RUN_NOTE)
    audit = _audit(decision, outcome=outcome, mode=mode, allowed=allowed)
    if outcome == "warned":
        audit["would-deny"] = decision.message
    return evolve(
        decision,
        allowed=allowed,
        outcome=outcome,
        warnings=warnings,
        mode=mode,
        kind=decision.kind or request.kind,
        audit=audit,
    )


def evolve(decision: Decision, **changes: Any) -> Decision:
    """``dataclasses.replace(decision, **changes)`` for a fraction of a frozen ``__init__`` of
    24 fields: each is stored as given (no ``__post_init__``), so a copy of them is the same."""
    if not changes.keys() <= Decision.__dataclass_fields__.keys():
        raise TypeError(f"Decision has no field among {sorted(changes)!r}")
    copied = object.__new__(Decision)
    copied.__dict__.update(decision.__dict__, **changes)
    return copied


def _audit(decision: Decision, *, outcome: str, mode: Mode, allowed: bool) -> dict[str, str]:
    """Audit annotations: short keys (the API server prefixes the webhook name), JSON values."""
    audit = {"decision": outcome, "mode": mode}
    if decision.reason:
        audit["reason"] = decision.reason
    if decision.charge is not None:
        audit["charge"] = _json(decision.charge)
    if decision.committed is not None:
        audit["committed"] = _json(decision.committed)
    if decision.factor:
        audit["overcommit"] = decision.factor
    if decision.delta is not None:
        # A CREATE's delta is its charge: the same figures, encoded once.
        same = decision.charge is not None and decision.delta == decision.charge
        audit["delta"] = audit["charge"] if same else _json(decision.delta)
    if decision.pool:
        audit["pool"] = decision.pool
    if decision.reserved_after:
        audit["reserved-after"] = _json(decision.reserved_after)
        audit["budget"] = _json(decision.budget)
    if decision.digest:
        audit["contract-digest"] = decision.digest
    if not allowed and decision.message:
        audit["message"] = decision.message
    return audit


_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _json(resources: Mapping[str, Decimal]) -> str:
    """The figures as the stdlib's compact JSON, by orjson when it is the same (ASCII, no DEL)."""
    figures = rl.to_strings(resources)
    try:
        text = orjson.dumps(figures)
    except TypeError:  # a lone surrogate in a key
        text = b"\x7f"
    return text.decode() if text.isascii() and b"\x7f" not in text else _COMPACT.encode(figures)


def fit(text: str) -> str:
    """``text`` cut to what the API server passes on as one warning."""
    return text if len(text) <= WARNING_LIMIT else text[: WARNING_LIMIT - 3] + "..."


def usage_warning(
    charge: Mapping[str, Decimal],
    delta: Mapping[str, Decimal],
    pool: str,
    after: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
) -> str:
    """The warning every admitted write carries: what it adds, and the fullest key of its pool."""
    what = f"reserves {rl.format_resources(charge) or 'nothing'}"
    if delta != charge:
        grown = rl.positive_part(delta)
        what = f"adds {rl.format_resources(grown)}" if grown else "reserves no more"
    if not pool or not budget:
        return f"{what}; no tenant quota applies"
    shares = {k: int(after.get(k, _ZERO) * 100 / v) if v else 100 for k, v in budget.items()}
    key = max(shares, key=lambda k: (shares[k], k))
    used = f"{format_quantity(after.get(key, _ZERO))}/{format_quantity(budget[key])}"
    where = f"pool {pool} at {key} {used} ({shares[key]}%)"
    text = f"{what}; {where}"
    if len(text) > WARNING_TARGET:
        text = f"{what[: max(WARNING_TARGET - len(where) - 5, 20)]}...; {where}"
    return text


# -- named constructors ------------------------------------------------------------------------


def held_dry_run(decision: Decision, seconds: float) -> Decision:
    """An allowed dry run the ledger held as a write: say so instead of "nothing was reserved".

    An API server that ignores ``dryRun`` stores the object all the same (cozystack-api does),
    so the charge is held until the object is seen or ``seconds`` pass; the next write of the
    same object takes the hold over rather than adding to it.
    """
    note = (
        f"dry run: held like a write for up to {seconds:g}s (the API server may store it); "
        "the same write for real replaces the hold"
    )
    warnings = tuple(note if w == DRY_RUN_NOTE else w for w in decision.warnings)
    if note not in warnings:
        warnings = (*warnings, note)
    return replace(decision, warnings=warnings, audit={**decision.audit, "dry-run": "held"})


def skipped(message: str, *, mode: Mode = "enforce", kind: str = "") -> Decision:
    """Allowed without a reservation: nothing this webhook reads is at stake."""
    return Decision(
        allowed=True, outcome="skipped", reason="skipped", message=message, mode=mode, kind=kind
    )


def errored(code: int, status_reason: str, reason: str, message: str) -> Decision:
    """Refused with an HTTP status: the request cannot be decided, or may not be made."""
    return Decision(
        allowed=False,
        outcome="denied",
        reason=reason,
        code=code,
        status_reason=status_reason,
        message=message,
    )


def invalid(path: str, message: str) -> Decision:
    """Refused as 422 Invalid, naming the field at ``path`` (kubectl prints it as a cause)."""
    return Decision(
        allowed=False,
        outcome="denied",
        reason="invalid",
        code=422,
        status_reason="Invalid",
        message=message,
        causes=((path, message),),
    )


def quota_allowed(
    facts: Facts,
    pool: str,
    after: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
    charged: Mapping[str, Mapping[str, Decimal]],
) -> Decision:
    """The write fits: its figures, its warnings, and what it adds to each pool (the ledger's)."""
    warning = usage_warning(facts.charge, facts.delta, pool, after, budget)
    return Decision(
        allowed=True,
        outcome="allowed",
        reason="fits",
        warnings=tuple(fit(w) for w in (warning, *facts.warnings)),
        charged_pools=charged,
        expected=facts.charge if facts.expected is None else facts.expected,
        **_figures(facts, pool, after, budget),
    )


def quota_denied(
    message: str,
    facts: Facts,
    pool: str,
    after: Mapping[str, Decimal],
    budget: Mapping[str, Decimal],
    *,
    reason: str = "exceeded",
) -> Decision:
    """The write does not fit (or cannot be shown to): a 403 with the pool's figures."""
    return Decision(
        allowed=False,
        outcome="denied",
        reason=reason,
        code=403,
        status_reason="Forbidden",
        message=message,
        **_figures(facts, pool, after, budget),
    )


def _figures(
    facts: Facts, pool: str, after: Mapping[str, Decimal], budget: Mapping[str, Decimal]
) -> dict[str, Any]:
    """What every quota decision reports, allowed or not."""
    return {
        "kind": facts.kind,
        "pool": pool,
        "charge": facts.charge,
        "committed": facts.committed,
        "factor": facts.factor,
        "delta": facts.delta,
        "reserved_after": after,
        "budget": budget,
        "digest": facts.digest,
        "admitting": facts.admitted,
    }


CHARGE_POINTER: Final = CHARGE_ANNOTATION.replace("~", "~0").replace("/", "~1")
OVERCOMMIT_POINTER: Final = OVERCOMMIT_ANNOTATION.replace("~", "~0").replace("/", "~1")


def set_annotation(
    obj: Mapping[str, object], value: str, *, key: str = CHARGE_ANNOTATION
) -> dict[str, object]:
    """The JSONPatch operation that sets annotation ``key`` to ``value``."""
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    pointer = key.replace("~", "~0").replace("/", "~1")
    if isinstance(annotations, Mapping):
        return {"op": "add", "path": f"/metadata/annotations/{pointer}", "value": value}
    return {"op": "add", "path": "/metadata/annotations", "value": {key: value}}

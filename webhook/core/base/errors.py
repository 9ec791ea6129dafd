"""The errors the core raises, one tree, each naming where the problem is.

``ReservationError`` is the root. Every subclass carries the pieces an operator or a tenant needs
to act: which kind, which values path, which contract file and field, and why.

- ``QuantityError``: a string or number is not a Kubernetes quantity (reason only; callers add
  the path).
- ``EvaluationError``: an application's values cannot be evaluated under its contract (unknown
  instance type or preset, bad quantity, missing required value, too many items). Fail closed.
- ``ContractError``: a reservation contract is malformed; names the source and the path in it.
- ``ManifestError``: a manifest in a state directory is malformed; names the file and the path.
"""

from __future__ import annotations

__all__ = [
    "UNEVALUABLE",
    "ContractError",
    "EvaluationError",
    "ManifestError",
    "QuantityError",
    "ReservationError",
]


class ReservationError(Exception):
    """Root of every error the reservation core raises."""


class QuantityError(ReservationError, ValueError):
    """A value is not a Kubernetes quantity; the message is the reason alone."""


class EvaluationError(ReservationError):
    """An application's values cannot be evaluated; admission of that object fails closed."""

    def __init__(self, path: str, reason: str, *, kind: str = "") -> None:
        self.path = path
        self.reason = reason
        self.kind = kind
        super().__init__(self.message)

    @property
    def message(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{where}{self.reason}"

    def for_kind(self, kind: str) -> EvaluationError:
        """The same error, attributed to ``kind``."""
        return EvaluationError(self.path, self.reason, kind=kind)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}" if self.kind else self.message


class ContractError(ReservationError):
    """A reservation contract cannot be loaded."""

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = path
        self.reason = reason
        where = f"{path}: " if path else ""
        super().__init__(f"{source}: {where}{reason}")


class ManifestError(ReservationError):
    """A manifest in a state directory cannot be used."""

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = path
        self.reason = reason
        where = f"{path}: " if path else ""
        super().__init__(f"{source}: {where}{reason}")


# What evaluating hostile values can raise: an EvaluationError, or, from values that got past
# every bound into a library, nesting deeper than Python recurses, arithmetic past a context, a
# value of a type no branch expected. Callers that must never fail on one object (the state, the
# decision) catch exactly these and treat the object as unevaluable.
UNEVALUABLE: tuple[type[Exception], ...] = (
    EvaluationError,
    RecursionError,
    ArithmeticError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
)

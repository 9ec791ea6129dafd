"""Kubernetes quantities as exact decimals.

A quantity such as ``500m``, ``8Gi`` or ``1e3`` is parsed into a :class:`~decimal.Decimal`
following the grammar of apimachinery's ``resource.Quantity`` (the same regular expression
Cozystack's values schemas use as their ``pattern``), and formatted back to a short canonical
string for messages. Floats never enter quota arithmetic.

Quantities are bounded before any arithmetic, because every one of them is tenant input: at most
:data:`MAX_DIGITS` digits, an exponent of at most two digits, and a magnitude of at most
:data:`MAX_QUANTITY` (apimachinery's ``resource.Quantity``: "no quantity may represent a number
greater than 2^63-1 in magnitude"; ``maxAllowed`` in quantity.go). Anything else is a
:class:`QuantityError`, never a ``decimal`` or ``int`` conversion error, and formatting never
fails, whatever value it is given.

The Kubernetes Python client ships ``parse_quantity``, but it accepts strings that the API server
rejects (``1_000``, ``NaN``, ``Infinity``, a bare ``K``) and importing it loads the whole client,
which the pure core must not do; the tests cross-check this parser against it on valid input.
"""

from __future__ import annotations

import json
import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation, localcontext
from functools import lru_cache
from typing import Final

from webhook.core.base.errors import QuantityError

__all__ = ["MAX_DIGITS", "MAX_QUANTITY", "format_quantity", "parse_quantity"]

# apimachinery pkg/api/resource/quantity.go: <signedNumber><suffix>, where suffix is a binary SI
# suffix, a decimal SI suffix, or a decimal exponent. The exponent is an integer in practice:
# the API server fails "1e1.5" with "unable to parse quantity's suffix".
_QUANTITY: Final = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)

_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

# Quantities are exact to the nanounit; the API server rounds finer values up (quantity.go).
_NANO: Final = Decimal("1e-9")
# Wide enough for 2^63 * 1024^6 with nano precision: every value the API server can hold.
_PRECISION: Final = 60
# The largest magnitude a Kubernetes quantity holds (apimachinery quantity.go, maxAllowed).
MAX_QUANTITY: Final = Decimal(2**63 - 1)
# Significant digits a tenant may write: 2^63-1 has 19, a nanounit adds 9; a few more for
# leading zeros and spelling. 40 keeps every parse far inside _PRECISION.
MAX_DIGITS: Final = 40
# Formatting: beyond this many integer digits a value prints in exponent form (never str(int)
# of a huge integer, which Python refuses past 4300 digits).
_FORMAT_DIGITS: Final = 40

# Formatting: the largest suffix that represents the value exactly.
_FORMAT_BINARY: Final = [
    ("Ei", 1024**6),
    ("Pi", 1024**5),
    ("Ti", 1024**4),
    ("Gi", 1024**3),
    ("Mi", 1024**2),
    ("Ki", 1024),
]
_FORMAT_DECIMAL: Final = [
    ("E", 10**18),
    ("P", 10**15),
    ("T", 10**12),
    ("G", 10**9),
    ("M", 10**6),
    ("k", 10**3),
]
_FORMAT_FRACTION: Final = [("m", Decimal("1e-3")), ("u", Decimal("1e-6")), ("n", Decimal("1e-9"))]


def parse_quantity(value: object) -> Decimal:
    """Parse a quantity from a string or a JSON number, exactly.

    Raises :class:`QuantityError` (whose message is the reason, without a path) for anything the
    API server would reject: booleans, NaN, infinities, unknown suffixes, stray characters.
    """
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if abs(value) > MAX_QUANTITY:  # compared as integers: no conversion of a huge one
            raise QuantityError(f"{_short_number(value)} is out of range ({_RANGE})")
        return Decimal(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a quantity")
        return _bounded(_round_nano(_in_range(Decimal(repr(value)), value)), value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise QuantityError(f"{value!r} is not a quantity")
        return _bounded(_round_nano(_in_range(value, value)), value)
    if not isinstance(value, str):
        raise QuantityError(f"{_short(value)} is not a quantity")
    if type(value) is str:  # a subclass could compare equal to a text it does not read as
        return _parse_text(value)
    return _parse_text.__wrapped__(value)


# A cluster writes few distinct quantity texts (sizes, presets, records), each many times: the
# parse of a text is a function of the text alone (every step runs in its own 60-digit context),
# so it is kept; texts are at most MAX_DIGITS + 8 characters, so the cache is bounded in bytes
# too. An error is not kept: it is raised again, as before, on every call.
@lru_cache(maxsize=16_384)
def _parse_text(value: str) -> Decimal:
    if len(value) > MAX_DIGITS + 8:  # sign, point, suffix or exponent: checked before matching
        raise QuantityError(f"{_short(value)} has more than {MAX_DIGITS} digits")
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise QuantityError(f"{_short(value)} is not a quantity")
    digits = sum(c.isdigit() for c in match["number"])
    if digits > MAX_DIGITS:
        raise QuantityError(f"{_short(value)} has more than {MAX_DIGITS} digits")
    exponent_text = match["exponent"]
    if exponent_text is not None and len(exponent_text.lstrip("+-").lstrip("0")) > 2:
        raise QuantityError(f"{_short(value)} is out of range ({_RANGE})")
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        try:
            number = Decimal(match["number"])
            if match["binary"]:
                number *= Decimal(1024) ** _BINARY[match["binary"]]
            elif match["decimal"]:
                number = number.scaleb(_DECIMAL[match["decimal"]])
            elif exponent_text is not None:
                number = number.scaleb(int(exponent_text))
        except (InvalidOperation, ValueError) as exc:  # pragma: no cover - bounded above
            raise QuantityError(f"{_short(value)} is not a quantity") from exc
        return _bounded(_round_nano(_in_range(number, value)), value)


_RANGE: Final = "a Kubernetes quantity holds at most 2^63-1"


def _in_range(number: Decimal, raw: object) -> Decimal:
    if number.copy_abs() > MAX_QUANTITY:
        raise QuantityError(f"{_short(raw)} is out of range ({_RANGE})")
    return number


def _bounded(number: Decimal, raw: object) -> Decimal:
    """Rounding up to a nanounit may not carry a value past the bound either."""
    return _in_range(number, raw)


@lru_cache(maxsize=4096)
def format_quantity(value: Decimal) -> str:
    """Format a value as a short canonical quantity: ``8Gi``, ``500m``, ``2``, ``10G``.

    Integers take the shortest exact form among plain digits, the largest binary suffix and the
    largest decimal suffix (binary on a tie); fractions use ``m``, ``u`` or ``n``. The result
    always parses back to the same value.
    """
    if not value.is_finite():
        return str(value)
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    if magnitude.adjusted() >= _FORMAT_DIGITS:
        return sign + f"{magnitude.normalize():E}".replace("E+", "e")
    if magnitude.adjusted() < -_FORMAT_DIGITS:
        return f"{sign}1n"  # finer than a nanounit: rounds up, like the API server
    if magnitude == magnitude.to_integral_value():
        whole = int(magnitude)
        candidates = []
        for table in (_FORMAT_BINARY, _FORMAT_DECIMAL):
            for suffix, unit in table:
                if whole % unit == 0:
                    candidates.append(f"{whole // unit}{suffix}")
                    break
        candidates.append(str(whole))
        # The shortest exact form; on a tie the first: binary (memory reads best in Mi/Gi).
        return sign + min(candidates, key=len)
    for suffix, step in _FORMAT_FRACTION:
        scaled = magnitude / step
        if scaled == scaled.to_integral_value():
            return f"{sign}{int(scaled)}{suffix}"
    # Finer than a nanounit cannot come out of parse_quantity; round up like the API server.
    return f"{sign}{int((magnitude / _NANO).to_integral_value(ROUND_CEILING))}n"


def _round_nano(number: Decimal) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        if number == number.to_integral_value():
            return number.to_integral_value()
        rounded = number.quantize(_NANO, rounding=ROUND_CEILING)
        return rounded.normalize()


def _short(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return _short_number(value)
    if isinstance(value, str):
        text = json.dumps(value[:64])
    else:
        try:
            text = repr(value)
        except ValueError:  # a repr past Python's integer digit limit
            text = f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def _short_number(value: int) -> str:
    """An integer for a message, without converting a huge one to text."""
    if abs(value) < 10**30:
        return str(value)
    return f"a {value.bit_length()}-bit integer"

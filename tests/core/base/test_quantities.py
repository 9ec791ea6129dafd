"""Quantities parse exactly as the API server reads them, and format back canonically."""

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

from webhook.core.base.errors import QuantityError
from webhook.core.base.quantities import MAX_QUANTITY, format_quantity, parse_quantity

VALID = [
    pytest.param("0", Decimal(0), id="zero"),
    pytest.param("2", Decimal(2), id="plain-integer"),
    pytest.param("500m", Decimal("0.5"), id="milli"),
    pytest.param("250m", Decimal("0.25"), id="quarter-cpu"),
    pytest.param("1.5", Decimal("1.5"), id="decimal-point"),
    pytest.param(".5", Decimal("0.5"), id="leading-point"),
    pytest.param("5.", Decimal(5), id="trailing-point"),
    pytest.param("+3", Decimal(3), id="explicit-plus"),
    pytest.param("1k", Decimal(1000), id="kilo"),
    pytest.param("1M", Decimal(10**6), id="mega"),
    pytest.param("10G", Decimal(10**10), id="giga"),
    pytest.param("1T", Decimal(10**12), id="tera"),
    pytest.param("1P", Decimal(10**15), id="peta"),
    pytest.param("1E", Decimal(10**18), id="exa"),
    pytest.param("1Ki", Decimal(1024), id="kibi"),
    pytest.param("128Mi", Decimal(128 * 1024**2), id="mebi"),
    pytest.param("8Gi", Decimal(8 * 1024**3), id="gibi"),
    pytest.param("1Ti", Decimal(1024**4), id="tebi"),
    pytest.param("1Pi", Decimal(1024**5), id="pebi"),
    pytest.param("1Ei", Decimal(1024**6), id="exbi"),
    pytest.param("1.5Gi", Decimal(3 * 512 * 1024**2), id="fractional-gibi"),
    pytest.param("100u", Decimal("0.0001"), id="micro"),
    pytest.param("7n", Decimal("0.000000007"), id="nano"),
    pytest.param("1e3", Decimal(1000), id="exponent"),
    pytest.param("1E3", Decimal(1000), id="capital-exponent"),
    pytest.param("12e-3", Decimal("0.012"), id="negative-exponent"),
    pytest.param("-1", Decimal(-1), id="negative"),
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_parses_every_suffix_exactly(text: str, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_agrees_with_the_kubernetes_client_on_valid_input(text: str, expected: Decimal) -> None:
    assert parse_quantity(text) == client_parse_quantity(text)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(4, Decimal(4), id="json-integer"),
        pytest.param(0.5, Decimal("0.5"), id="json-float-is-read-by-its-shortest-text"),
        pytest.param(0.1, Decimal("0.1"), id="no-binary-float-noise"),
    ],
)
def test_json_numbers_are_quantities(value: object, expected: Decimal) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("12Gx", id="unknown-suffix"),
        pytest.param("1_000", id="underscore-digits"),
        pytest.param("NaN", id="nan-text"),
        pytest.param("Infinity", id="infinity-text"),
        pytest.param("K", id="bare-suffix"),
        pytest.param("1ki", id="lowercase-binary"),
        pytest.param("1Mb", id="bytes-suffix"),
        pytest.param(" 1", id="leading-space"),
        pytest.param("1 Gi", id="inner-space"),
        pytest.param("", id="empty"),
        pytest.param("1e1.5", id="fractional-exponent"),
        pytest.param(True, id="boolean"),
        pytest.param(None, id="null"),
        pytest.param([1], id="list"),
        pytest.param(float("nan"), id="float-nan"),
        pytest.param(float("inf"), id="float-infinity"),
    ],
)
def test_rejects_what_the_api_server_rejects(value: object) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(value)


def test_error_quotes_the_offending_text_like_json() -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity("12Gx")
    assert str(caught.value) == '"12Gx" is not a quantity'


def test_rounds_below_a_nanounit_up_like_the_api_server() -> None:
    assert parse_quantity("0.0000000001") == Decimal("1e-9")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(Decimal(0), "0", id="zero"),
        pytest.param(Decimal(2), "2", id="small-integer"),
        pytest.param(Decimal("0.5"), "500m", id="milli"),
        pytest.param(Decimal("2.25"), "2250m", id="milli-above-one"),
        pytest.param(Decimal(8 * 1024**3), "8Gi", id="gibi"),
        pytest.param(Decimal(1536 * 1024**2), "1536Mi", id="mebi-when-not-whole-gibi"),
        pytest.param(Decimal(10**10), "10G", id="decimal-giga"),
        pytest.param(Decimal(2000), "2k", id="decimal-kilo"),
        pytest.param(Decimal(1234), "1234", id="no-exact-suffix"),
        pytest.param(Decimal("0.0001"), "100u", id="micro"),
        pytest.param(Decimal("-0.5"), "-500m", id="negative"),
    ],
)
def test_formats_canonically(value: Decimal, text: str) -> None:
    assert format_quantity(value) == text
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", [p.values[0] for p in VALID])
def test_format_round_trips(text: str) -> None:
    value = parse_quantity(text)
    assert parse_quantity(format_quantity(value)) == value


# -- hostile quantities: bounded before any arithmetic, every failure a QuantityError ----------


def test_a_sixty_digit_storage_is_a_quantity_error_not_a_decimal_crash() -> None:
    with pytest.raises(QuantityError, match="more than 40 digits"):
        parse_quantity("9" * 60 + ".5")


def test_an_exponent_of_4301_digits_is_a_quantity_error_not_an_int_crash() -> None:
    with pytest.raises(QuantityError, match="more than 40 digits"):
        parse_quantity("1e" + "0" * 4301)


def test_a_4400_digit_integer_is_a_quantity_error_that_never_prints_it() -> None:
    with pytest.raises(QuantityError, match="out of range") as caught:
        parse_quantity(10**4400)
    assert len(str(caught.value)) < 120


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("8Ei", id="binary-past-2^63-1"),
        pytest.param("9223372036854775808", id="one-past-int64"),
        pytest.param("10E", id="decimal-suffix-past-int64"),
        pytest.param("1e19", id="exponent-past-int64"),
        pytest.param(2**63, id="json-integer-past-int64"),
        pytest.param(1e300, id="json-float-past-int64"),
        pytest.param(Decimal("1e100000"), id="huge-decimal"),
    ],
)
def test_magnitudes_past_what_a_kubernetes_quantity_holds_are_refused(value: object) -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity(value)


def test_a_long_exponent_is_out_of_range_before_it_is_converted() -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("1e+999")
    assert parse_quantity("1e005") == Decimal(100000)


def test_the_largest_quantity_kubernetes_holds_still_parses() -> None:
    assert parse_quantity(str(2**63 - 1)) == Decimal(2**63 - 1)
    assert parse_quantity("7Ei") == Decimal(7 * 1024**6)


@given(
    st.text(max_size=80)
    | st.from_regex(
        r"[+-]?[0-9]{0,70}(\.[0-9]{0,70})?([eE][+-]?[0-9]{1,6}|[KMGTPE]i|[numkMGTPE])?",
        fullmatch=True,
    )
)
@settings(max_examples=400, derandomize=True, database=None)
def test_any_text_is_a_bounded_decimal_or_a_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert abs(value) <= MAX_QUANTITY
    assert parse_quantity(format_quantity(value)) == value


@given(
    st.integers()
    | st.floats()
    | st.decimals()
    | st.booleans()
    | st.none()
    | st.lists(st.integers())
)
@settings(max_examples=300, derandomize=True, database=None)
def test_any_json_value_is_a_bounded_decimal_or_a_quantity_error(value: object) -> None:
    try:
        parsed = parse_quantity(value)
    except QuantityError:
        return
    assert abs(parsed) <= MAX_QUANTITY


@given(st.decimals(allow_nan=False, allow_infinity=False))
@settings(max_examples=300, derandomize=True, database=None)
def test_formatting_never_fails_whatever_the_value(value: Decimal) -> None:
    assert format_quantity(value)


def test_formatting_a_value_past_python_s_integer_digit_limit_does_not_raise() -> None:
    assert format_quantity(Decimal(10) ** 4400) == "1e4400"


QUANTITY_TEXT = st.text(alphabet="0123456789.+-eEKMGTPEimunk ", max_size=12)


@settings(max_examples=500, deadline=None)
@given(st.lists(QUANTITY_TEXT, min_size=1, max_size=6))
def test_a_remembered_parse_is_the_parse_of_the_text(texts: list[str]) -> None:
    from webhook.core.base.quantities import _parse_text

    for text in [*texts, *texts]:  # the second time from the cache when it parsed
        try:
            expected: object = _parse_text.__wrapped__(text)
        except QuantityError as exc:
            expected = ("error", str(exc))
        try:
            found: object = parse_quantity(text)
        except QuantityError as exc:
            found = ("error", str(exc))
        assert found == expected
        assert type(found) is type(expected)
        if isinstance(found, Decimal) and isinstance(expected, Decimal):
            assert found.as_tuple() == expected.as_tuple()  # the same digits, not only value


def test_a_text_that_only_compares_equal_to_a_parsed_one_is_parsed_as_itself() -> None:
    class Lookalike(str):  # equal to, and hashed as, a text it does not read as
        def __eq__(self, other: object) -> bool:
            return other == "1Gi" or str.__eq__(self, other)

        def __hash__(self) -> int:
            return hash("1Gi")

    assert parse_quantity("1Gi") == 1024**3
    assert parse_quantity(Lookalike("1Ti")) == 1024**4
    assert parse_quantity(Lookalike("1Pi")) == 1024**5  # not the first lookalike's parse

"""Counts read from values: whole numbers from 0 to MAX_COUNT, refused as the tenant typed them."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.core.base.errors import EvaluationError
from webhook.core.pricing.evaluation import MAX_COUNT, count


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("1e12", '"1e12" is not a whole number', id="exponent-as-yaml-reads-it"),
        pytest.param("1E18", '"1E18" is not a whole number', id="capital-exponent"),
        pytest.param("1Ei", '"1Ei" is not a whole number', id="binary-suffix"),
        pytest.param("3k", '"3k" is not a whole number', id="decimal-suffix"),
        pytest.param(10**24, f"1000000000000000000000000 is more than {MAX_COUNT:,}", id="huge"),
        pytest.param(2.5, "2.5 is not a whole number", id="fraction-quoted-not-2500m"),
        pytest.param(True, "true is not a whole number", id="boolean-as-yaml-writes-it"),
        pytest.param(-1, "-1 must not be negative", id="negative"),
        pytest.param(1e100, "1e+100 is not a whole number", id="float-overflow"),
        pytest.param("", '"" is not a whole number', id="empty"),
        pytest.param("x" * 100, '"' + "x" * 36 + "... is not", id="long-input-shortened"),
    ],
)
def test_a_count_that_is_not_a_sane_whole_number_is_refused_as_typed(
    raw: object, message: str
) -> None:
    with pytest.raises(EvaluationError) as caught:
        count(raw, "replicas")
    assert caught.value.path == "replicas"
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(3, 3), ("3", 3), (3.0, 3), (0, 0), (MAX_COUNT, MAX_COUNT)],
)
def test_whole_numbers_up_to_the_maximum_are_counts(raw: object, expected: int) -> None:
    assert count(raw, "replicas") == Decimal(expected)


@given(st.integers())
def test_an_integer_is_a_count_exactly_when_it_is_within_bounds(number: int) -> None:
    if 0 <= number <= MAX_COUNT:
        assert count(number, "n") == number
        assert count(str(number), "n") == number
    else:
        with pytest.raises(EvaluationError):
            count(number, "n")


@given(st.text(max_size=30))
def test_any_text_is_a_count_only_when_it_is_ascii_digits_within_bounds(text: str) -> None:
    sane = text.isascii() and text.isdigit() and int(text) <= MAX_COUNT
    if sane:
        assert count(text, "n") == int(text)
    else:
        with pytest.raises(EvaluationError, match=r"^n: .* (is not a whole number|is more than)"):
            count(text, "n")

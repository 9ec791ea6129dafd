"""The ledger's timestamps, formatted once a second: byte for byte what strftime wrote.

Expiries are compared as strings by every replica (older ones wrote them with ``strftime``), and
conditions carry metav1.Time: the cached formatting must write exactly the same strings.
"""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.admission.ledger.entries import _EXPIRY, expiry
from webhook.admission.ledger.status import _TIME, Status

moments = st.floats(min_value=0, max_value=2**34, allow_nan=False) | st.integers(0, 2**34)


@settings(max_examples=1000)
@given(moments)
def test_an_expiry_is_what_strftime_writes(seconds: float) -> None:
    assert expiry(seconds) == datetime.fromtimestamp(seconds, UTC).strftime(_EXPIRY)


@given(st.integers(0, 2**34), st.lists(st.integers(0, 999_999), min_size=1, max_size=20))
def test_expiries_within_one_second_each_keep_their_microseconds(
    second: int, micros: list[int]
) -> None:
    for micro in micros:  # the second's prefix cached, each fraction its own
        seconds = second + micro / 1e6
        assert expiry(seconds) == datetime.fromtimestamp(seconds, UTC).strftime(_EXPIRY)


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _Book:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock


@settings(max_examples=500)
@given(moments)
def test_a_condition_time_is_what_strftime_writes(seconds: float) -> None:
    status = Status(_Book(_Clock(seconds)))  # type: ignore[arg-type]
    written = status._condition_time()
    assert written == datetime.fromtimestamp(seconds, UTC).strftime(_TIME)

"""A pool's recent admissions: the decaying rate a slice is sized from, forgotten when idle."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.admission.ledger.recent import RATE_SECONDS, YOUNGEST_SECONDS, RecentAdmissions

GI = Decimal(1024**3)


def test_a_rate_decays_with_its_time_constant() -> None:
    recent = RecentAdmissions(idle_seconds=30)
    recent.note("p", {"memory": GI}, "VMInstance", now=0.0)
    first = recent.rate("p", 0.0)["memory"]
    assert first == float(GI) / RATE_SECONDS
    later = recent.rate("p", RATE_SECONDS)["memory"]
    assert math.isclose(later, first / math.e)
    assert recent.kinds("p") == {"VMInstance"}
    assert recent.last("p") == {"memory": GI}


def test_a_pool_no_admission_fed_for_the_idle_time_is_forgotten() -> None:
    recent = RecentAdmissions(idle_seconds=30)
    recent.note("p", {"memory": GI}, "VMInstance", now=0.0)
    for moment in range(1, 31):  # brought up to date every second, as the duty does
        assert recent.rate("p", float(moment))
    assert recent.rated() == {"p"}
    assert recent.rate("p", 30.5) == {}
    assert recent.rated() == set()
    assert recent.kinds("p") == frozenset()


@given(st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=40))
def test_a_pool_is_rated_exactly_while_an_admission_fed_it_within_the_idle_time(
    gaps: list[float],
) -> None:
    recent = RecentAdmissions(idle_seconds=30)
    now, fed = 0.0, 0.0
    recent.note("p", {"cpu": Decimal(1)}, "Thing", now)
    for index, gap in enumerate(gaps):
        now += gap * 10
        if index % 3 == 0:
            recent.note("p", {"cpu": Decimal(1)}, "Thing", now)
            fed = now
        else:
            recent.rate("p", now)
        assert ("p" in recent.rated()) == (now - fed <= 30)


def test_a_young_rate_is_warmed_up_and_an_old_one_is_not() -> None:
    recent = RecentAdmissions(idle_seconds=30)
    recent.note("p", {"memory": GI}, "VMInstance", now=100.0)
    youngest = 1 - math.exp(-YOUNGEST_SECONDS / RATE_SECONDS)
    assert recent.warmth("p", 100.0) == pytest.approx(youngest), "never younger than a round"
    assert recent.warmth("p", 100.0 + YOUNGEST_SECONDS / 2) == pytest.approx(youngest)
    assert recent.warmth("p", 101.0) == pytest.approx(1 - math.exp(-1 / RATE_SECONDS))
    assert recent.warmth("p", 100.0 + 5 * RATE_SECONDS) > 0.99
    assert recent.warmth("never", 0.0) > 0.99


def test_sub_tenants_created_and_deleted_leave_no_rate_entries() -> None:
    # A tenant creating and deleting sub-tenants, one admission into each: every pool's rate
    # went idle, and yet each kept its entries, walked by every duty round from then on.
    recent = RecentAdmissions(idle_seconds=30.0)
    for index in range(1_000):
        recent.note(f"tenant-acme-x{index}", {"memory": Decimal(1)}, "VMInstance", float(index))
    later = 1_000.0 + 31.0
    assert recent.rated(later) == set()
    kept = (recent._rates, recent._noted, recent._admitted, recent._since, recent._kinds)
    assert all(not entries for entries in kept), "nothing kept of an idle pool"
    assert recent._last == {}
    assert recent.rate("tenant-acme-x1", later) == {}


def test_a_young_sum_estimates_a_steady_rate_as_it_is() -> None:
    # Five creates a second for a second: the decayed sum holds a fifth of that rate, the
    # estimate the whole of it; long after, the two agree.
    recent = RecentAdmissions(idle_seconds=30)
    now = 100.0
    for _ in range(5):
        recent.note("p", {"memory": GI}, "VMInstance", now)
        now += 0.2
    assert recent.rate("p", now)["memory"] < float(GI)
    assert recent.estimate("p", now)["memory"] == pytest.approx(5 * float(GI), rel=0.15)
    for _ in range(200):
        recent.note("p", {"memory": GI}, "VMInstance", now)
        now += 0.2
    assert recent.estimate("p", now) == recent.rate("p", now)
    assert recent.rate("p", now)["memory"] == pytest.approx(5 * float(GI), rel=0.15)

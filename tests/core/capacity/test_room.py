"""The admission warning on room: sizes only, from the last snapshot, never a guess."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import FIXTURES
from webhook.capacity.snapshot import load_snapshot
from webhook.core.capacity.room import coarse_room, largest_free, room_warning

Gi = Decimal(1024**3)
SEED = str(FIXTURES / "capacity" / "seed-snapshot.yaml")


def test_the_seeds_largest_free_node_is_worker_blue_not_the_cordoned_one() -> None:
    # 31026Mi allocatable - 1072Mi of agents - 2 x 8476Mi of launchers = 13002Mi.
    assert largest_free(load_snapshot(SEED)) == 13002 * 1024**2


def test_a_16Gi_vm_is_told_the_platform_must_make_room() -> None:
    largest = largest_free(load_snapshot(SEED))
    warning = room_warning("VMInstance", {"cpu": Decimal(1), "memory": 16 * Gi}, largest)
    # 16685Mi needed; 13002Mi free rounds up to 16Gi, still short.
    assert warning == (
        "fits your quota, but no node has the 16685Mi this VM needs free right now; "
        "the platform will need to make room before it can start"
    )


def test_the_figure_answers_rest_on_is_a_power_of_two_rounded_up() -> None:
    Mi = 1024**2
    assert coarse_room(13002 * Mi) == 16384 * Mi
    assert coarse_room(16384 * Mi) == 16384 * Mi
    assert coarse_room(16384 * Mi + 1) == 32768 * Mi
    assert coarse_room(0) == coarse_room(-5) == Mi
    assert coarse_room(None) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**44), st.integers(min_value=0, max_value=2**44))
def test_two_clusters_in_one_power_of_two_interval_answer_every_vm_alike(a: int, b: int) -> None:
    if coarse_room(a) != coarse_room(b):
        return
    for gib in (1, 2, 4, 8, 15, 16, 31, 64, 500):
        charge = {"cpu": Decimal(1), "memory": gib * Gi}
        assert room_warning("VMInstance", charge, a) == room_warning("VMInstance", charge, b)


def test_a_warning_is_only_given_when_no_node_can_take_the_vm() -> None:
    # 20Gi free rounds up to 32Gi: a 24Gi VM would not fit, but the coarse answer gives no
    # warning rather than a finer figure.
    assert room_warning("VMInstance", {"memory": 24 * Gi}, 20 * 1024**3) is None
    assert room_warning("VMInstance", {"memory": 40 * Gi}, 20 * 1024**3) is not None


def test_a_vm_that_fits_a_node_gets_no_warning() -> None:
    largest = largest_free(load_snapshot(SEED))
    assert room_warning("VMInstance", {"cpu": Decimal(1), "memory": 8 * Gi}, largest) is None


def test_unknown_room_or_other_kinds_get_no_warning() -> None:
    assert room_warning("VMInstance", {"memory": 16 * Gi}, None) is None
    assert room_warning("Postgres", {"memory": 64 * Gi}, 1024) is None


def test_a_hostile_cpu_count_is_bounded() -> None:
    warning = room_warning("VMInstance", {"cpu": Decimal("1e30"), "memory": Gi}, 0)
    assert warning is not None
    assert "no node has the " in warning

"""The admission warning on room: sizes only, from the last snapshot, never a guess."""

from __future__ import annotations

from decimal import Decimal

from tests.builders import FIXTURES
from webhook.cluster_snapshot import load_snapshot
from webhook.core.room import largest_free, room_warning

Gi = Decimal(1024**3)
SEED = str(FIXTURES / "capacity" / "seed-snapshot.yaml")


def test_the_seeds_largest_free_node_is_worker_blue_not_the_cordoned_one() -> None:
    # 31026Mi allocatable - 1072Mi of agents - 2 x 8476Mi of launchers = 13002Mi.
    assert largest_free(load_snapshot(SEED)) == 13002 * 1024**2


def test_a_16Gi_vm_is_told_the_platform_must_make_room() -> None:
    largest = largest_free(load_snapshot(SEED))
    warning = room_warning("VMInstance", {"cpu": Decimal(1), "memory": 16 * Gi}, largest)
    assert warning == (
        "fits your quota, but no node has 16685Mi free right now (largest: 13002Mi); "
        "the platform will need to make room"
    )


def test_a_vm_that_fits_a_node_gets_no_warning() -> None:
    largest = largest_free(load_snapshot(SEED))
    assert room_warning("VMInstance", {"cpu": Decimal(1), "memory": 8 * Gi}, largest) is None


def test_unknown_room_or_other_kinds_get_no_warning() -> None:
    assert room_warning("VMInstance", {"memory": 16 * Gi}, None) is None
    assert room_warning("Postgres", {"memory": 64 * Gi}, 1024) is None


def test_a_hostile_cpu_count_is_bounded() -> None:
    warning = room_warning("VMInstance", {"cpu": Decimal("1e30"), "memory": Gi}, 0)
    assert warning is not None
    assert "largest: 0" in warning

"""The charge cache keys on a digest of the values and is bounded by bytes and by entries."""

from __future__ import annotations

import tracemalloc

from tests.builders import FIXTURES
from webhook.core.pricing.platform import CHARGE_CACHE_BYTES, CHARGE_CACHE_SIZE, PlatformBuilder
from webhook.defaults import default_contracts, default_presets
from webhook.state.manifests import read_manifests


def fresh_platform() -> PlatformBuilder:
    builder = PlatformBuilder(default_contracts(), default_presets())
    for manifest in read_manifests([FIXTURES / "cozystack"]):
        builder.add(manifest.body, source=manifest.source)
    return builder


def test_dry_runs_with_1mb_of_cloud_init_each_do_not_keep_their_values() -> None:
    platform = fresh_platform().build()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for index in range(40):
            spec = {"instanceType": "u1.micro", "cloudInit": f"#{index}\n" + "x" * 1_000_000}
            platform.charge("VMInstance", spec, namespace="tenant-acme")
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    kept = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert kept < 2_000_000  # 40 MB of values went through; what stays is a few charges
    cache = platform._charges
    # The contract reads no cloudInit: the 40 specs share one entry, keyed by what it reads.
    assert len(cache) == 1
    assert all(len(key[2]) == 32 for key in cache)  # a sha256 digest, not the values


def test_the_cache_is_bounded_by_entries_and_by_bytes() -> None:
    platform = fresh_platform().build()
    cache = platform._charges
    for index in range(CHARGE_CACHE_SIZE + 100):
        platform.charge("VMDisk", {"storage": f"{index + 1}Mi"}, namespace="tenant-acme")
    assert len(cache) <= CHARGE_CACHE_SIZE
    assert cache.currsize <= CHARGE_CACHE_BYTES

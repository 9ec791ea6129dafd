"""The tenant tree's names: whose share of a pool a write in a namespace takes."""

from __future__ import annotations

import pytest

from webhook.core.tenancy.tenants import below_toward


@pytest.mark.parametrize(
    ("pool", "namespace", "holder"),
    [
        ("tenant-acme", "tenant-acme", "tenant-acme"),  # the pool's own applications
        ("tenant-acme", "tenant-acme-dev", "tenant-acme-dev"),
        ("tenant-acme", "tenant-acme-dev-ci", "tenant-acme-dev"),  # sub-tenants are their tenant's
        ("tenant-root", "tenant-acme-dev", "tenant-acme"),
        ("tenant-acme", "tenant-other", "tenant-other"),  # not beneath the pool
    ],
)
def test_a_write_takes_the_share_of_the_tenant_directly_below_the_pool(
    pool: str, namespace: str, holder: str
) -> None:
    assert below_toward(pool, namespace) == holder

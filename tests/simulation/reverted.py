"""The settle rule the ledger must not use, put back on purpose to show the simulation finds it.

PLACEHOLDER until the newer-observation rule lands: on the current code the matching-value rule
is the one in place, so there is nothing to revert yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def reverted_settle_rule(enabled: bool = True) -> Iterator[None]:
    yield

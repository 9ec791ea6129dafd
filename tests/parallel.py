"""How the suite is spread over parallel workers (pytest-xdist, ``-n auto``).

Tests go one at a time to whichever worker is free, except the modules whose tests share real
servers started once for the module (a module-scoped fixture starting etcd, kube-apiserver and
maybe cozystack-api and replicas): those all go to one worker, which runs them one after the
other. Split, every worker would start each module's servers again; side by side, several such
process trees would starve a small machine, and the other tests' waits with it. That worker
waits on servers most of the time, so ``-n auto`` takes one worker more than the cores.
The largest unit (the shared-server modules) is handed out first, then the tests marked
``slow``, so that neither is left for the end of the run.
"""

from __future__ import annotations

from typing import Final

from xdist.scheduler import LoadScopeScheduling

# Modules whose tests share real servers started once per module. A new one belongs here.
SHARED_SERVERS: Final = (
    "tests/cozystack_api/",
    "tests/core/tenancy/test_budget_keys_kubernetes.py",
    "tests/test_kubernetes_limits.py",
)
SHARED_SERVERS_UNIT: Final = "real servers shared by a module's tests"


class SharedServerScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
    """xdist's load distribution, with the shared-server modules kept in one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return SHARED_SERVERS_UNIT if module.startswith(SHARED_SERVERS) else nodeid

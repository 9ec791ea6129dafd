"""An emulated cluster holding N applications, for benchmarks.sync (run in its own process).

Prints its kubeconfig path when it is ready, then serves until stdin closes.

Run: python -m benchmarks.emulated_cluster APPLICATIONS DIR
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.cluster import app, cluster, tenant

TENANTS = 1_000
TYPES = ("u1.micro", "u1.small", "u1.medium", "u1.large", "cx1.medium", "m1.large")


async def main() -> None:
    count, directory = int(sys.argv[1]), Path(sys.argv[2])
    async with cluster(directory, bookmark_interval=5.0) as (server, kubeconfig):
        for index in range(TENANTS):
            server.create(tenant("tenant-root", f"t{index}", {"memory": "100000Gi"}))
        for index in range(count):
            namespace = f"tenant-t{index % TENANTS}"
            spec = {"instanceType": TYPES[index % len(TYPES)]}
            server.create(app("VMInstance", namespace, f"vm{index:06d}", spec))
        print(kubeconfig, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main())

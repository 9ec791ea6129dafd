"""The pure core: every rule the webhook applies, as functions from values to values.

One package per capability: ``pricing`` decides what an application reserves, ``admission``
decides whether a write fits its pools, ``capacity`` decides whether what was admitted can run
and how to make room, ``audit`` reviews what was admitted. Under them ``tenancy`` holds what
tenants own and write (tenant names and budgets, budget keys, applications and their signed
charge records, overcommit factors) and ``base`` the shared value types (quantities, resource
lists, errors). Nothing in here performs I/O or imports an HTTP or Kubernetes client, asyncio,
files or sockets; import-linter contracts in ``pyproject.toml`` keep the core pure and its
packages layered (audit > admission > pricing | capacity > tenancy > base).
"""

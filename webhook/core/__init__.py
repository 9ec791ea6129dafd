"""The pure core: quantities, contracts, evaluation, tenants, pools and decisions.

Nothing in here performs I/O or imports an HTTP or Kubernetes client (an import-linter contract
in ``pyproject.toml`` keeps it so): every function takes values and returns values.
"""

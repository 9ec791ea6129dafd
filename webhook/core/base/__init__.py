"""Shared value types under every capability: no policy.

Exact Kubernetes quantities, resource lists (the charge, budget and usage maps of quota
arithmetic), the one tree of errors that names where a problem is, and the near-miss hints
("did you mean ...?"). It decides nothing about tenants or applications and may use only the
standard library; every other package of the core may use it.
"""

"""Shared value types and codecs under every capability: no policy.

Exact Kubernetes quantities, resource lists (the charge, budget and usage maps of quota
arithmetic), the one tree of errors that names where a problem is, the near-miss hints
("did you mean ...?") and the JSON codec every adapter reads and writes with. It decides
nothing about tenants or applications and may use only the standard library and orjson; every
other package of the core may use it.
"""

"""Cozystack tenant quotas as reservation limits: an admission webhook."""

__version__ = "0.2.0"

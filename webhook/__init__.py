"""Cozystack tenant quotas as reservation limits: an admission webhook."""

__version__ = "0.3.0"

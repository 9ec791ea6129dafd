"""Fixtures shared with the live-server tests."""

from tests.test_live import caller, certs

__all__ = ["caller", "certs"]

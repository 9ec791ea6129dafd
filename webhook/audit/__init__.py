"""Audit review's adapter: reading audit events from files and pages out; the logic is pure.

``reader`` streams events from logs in every shape the API server writes; ``command`` is the
``webhook audit`` command line; ``render`` and ``html`` draw the results. The folds themselves
(summary, replay, verify) live in ``webhook.core.audit``.
"""

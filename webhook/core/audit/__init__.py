"""Audit review, pure: what the API server's audit events say about the webhook's decisions.

Events arrive as decoded mappings (reading files is the ``webhook.audit`` adapter's job).
:mod:`.events` turns one into an :class:`~.events.AuditWrite`; :mod:`.summary`, :mod:`.replay`
and :mod:`.verify` fold a stream of them into reports, reusing ``decide`` and the contracts'
evaluation unchanged.
"""

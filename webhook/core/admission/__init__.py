"""Whether a write is admitted: the decision and the pools it is checked against.

AdmissionReviews in and out, the admission modes, the reservation state and the tenant pools it
adds up in, pending charges held until observed, warn-mode carve-outs, the decision itself and
each tenant namespace's policy report. It may use ``pricing``, ``tenancy``, ``base`` and the
``capacity`` guard (for the policy reports); the ledger and the server that feed it are
adapters (``webhook.admission``, ``webhook.server``).
"""

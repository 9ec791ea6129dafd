"""What an application reserves: its charge, from its kind's contract.

Reservation contracts and their schema, evaluation of a contract over an application's
defaulted values, the size catalog (KubeVirt instance types and Cozystack presets), application
kinds and the platform assembled from them, the bounds on values, the values keys a schema does
not know, and which resource keys may become metric labels. It may use ``tenancy`` and
``base``; it knows nothing of pools, decisions, capacity or audit review.
"""

"""The admission adapters around ``webhook.core.admission``.

``admit`` takes an AdmissionReview through the decision and back, and never lets an exception
escape; ``ledger`` shares pending charges between replicas through TenantReservations so no
pool overshoots; ``report`` turns pools and charges into data and tables for people. They may
use the core, the Kubernetes adapter and the plumbing; the rules themselves live in the core.
"""

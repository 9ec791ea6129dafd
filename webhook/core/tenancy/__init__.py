"""What tenants own and write, and what the webhook trusts back.

Cozystack's tenant naming and budgets, which keys a budget may carry (the count keys among
them), applications in every form they arrive in, the signed charge record each carries, and
the overcommit factor the platform sets per tenant and per application. It decides how these
are read and verified, never whether a write is admitted; it may use ``base`` only, and pricing,
admission, capacity and audit build on it.
"""

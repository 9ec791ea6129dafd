"""The tenancy adapter: where the key that signs charge records comes from.

``record_keys`` reads it from its Secret, a file, or makes one per process; the records it signs
and verifies are ``webhook.core.tenancy.records``. It may use the core and the Kubernetes
adapter.
"""

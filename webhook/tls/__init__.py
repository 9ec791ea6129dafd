"""TLS for the webhook server: certificates it can issue itself, and contexts that reload them.

The API server only talks to admission webhooks over HTTPS, and the serving certificate is
rotated underneath a running pod (a Secret update, a cert-manager renewal), so the server keeps
one SSL context and swaps the pair inside it instead of restarting.
"""

from webhook.tls.certificates import (
    Bundle,
    CertificateError,
    CertificateInfo,
    certificate_info,
    check_pair,
    generate,
    read_certificate,
)
from webhook.tls.contexts import CertificateReloader, client_context, server_context

__all__ = [
    "Bundle",
    "CertificateError",
    "CertificateInfo",
    "CertificateReloader",
    "certificate_info",
    "check_pair",
    "client_context",
    "generate",
    "read_certificate",
    "server_context",
]

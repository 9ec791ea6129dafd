"""The webhook configurations' ``caBundle``: reading what each webhook trusts, and setting it.

The API server trusts the webhook through the ``caBundle`` of every webhook of its mutating and
validating configurations; :class:`~webhook.tls.rotation.CertificateRotator` publishes the
Secret's ``ca.crt`` there, and treats a bundle as published only once every webhook of every
configuration shows it. A configuration is written with the resourceVersion it was read at, so
a write by someone else (``kubectl apply``, a cainjector) is a conflict, retried from a fresh read.
"""

from __future__ import annotations

import base64
import binascii
import copy
from dataclasses import dataclass
from typing import Any, Final

from webhook.kube.client import ResourceRef

__all__ = [
    "CONFLICT_RETRIES",
    "MUTATING_WEBHOOKS",
    "VALIDATING_WEBHOOKS",
    "Configuration",
    "with_ca_bundle",
]

Obj = dict[str, Any]

MUTATING_WEBHOOKS: Final = ResourceRef(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", namespaced=False
)
VALIDATING_WEBHOOKS: Final = ResourceRef(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", namespaced=False
)
# Retries after a 409 on a webhook configuration, which others (kubectl apply, a cainjector)
# may write too; each retry reads the configuration again.
CONFLICT_RETRIES: Final = 3


@dataclass(frozen=True, slots=True)
class Configuration:
    """A webhook configuration as read; ``obj`` is None when it does not exist."""

    ref: ResourceRef
    name: str
    obj: Obj | None

    def shows(self, bundle: bytes) -> bool:
        """Every webhook trusts exactly ``bundle`` (a missing configuration trusts nothing that
        could break)."""
        if self.obj is None:
            return True
        return all(ca_bundle_of(webhook) == bundle for webhook in webhooks_of(self.obj))


def webhooks_of(configuration: Obj) -> list[Obj]:
    webhooks = configuration.get("webhooks")
    if not isinstance(webhooks, list):
        return []
    return [webhook for webhook in webhooks if isinstance(webhook, dict)]


def ca_bundle_of(webhook: Obj) -> bytes | None:
    client_config = webhook.get("clientConfig")
    value = client_config.get("caBundle") if isinstance(client_config, dict) else None
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        return None


def with_ca_bundle(configuration: Obj, bundle: bytes) -> Obj:
    """``configuration`` with every webhook trusting ``bundle``; resourceVersion as read."""
    updated = copy.deepcopy(configuration)
    encoded = base64.b64encode(bundle).decode("ascii")
    for webhook in webhooks_of(updated):
        client_config = webhook.get("clientConfig")
        if not isinstance(client_config, dict):
            client_config = webhook["clientConfig"] = {}
        client_config["caBundle"] = encoded
    return updated

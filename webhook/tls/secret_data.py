"""The TLS Secret's data: ``tls.crt``, ``tls.key``, ``ca.crt`` and ``ca.key`` as bytes, and back.

The Secret is of type ``kubernetes.io/tls``, so the kubelet mounts it under the file names the
reloader reads; a value that does not decode is treated as absent (the rotator then issues what
is missing), and a Secret is written back with the metadata, and so the resourceVersion, it was
read with.
"""

from __future__ import annotations

import base64
import binascii
import copy
from collections.abc import Mapping
from typing import Any, Final

from webhook.kube.client import ResourceRef

__all__ = ["SECRETS", "SECRET_TYPE", "encode_data", "secret_data", "with_data"]

Obj = dict[str, Any]

SECRETS: Final = ResourceRef("", "v1", "secrets")
SECRET_TYPE: Final = "kubernetes.io/tls"


def secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """The Secret's data, decoded; a value that is not base64 is left out."""
    data = secret.get("data")
    decoded: dict[str, bytes] = {}
    if not isinstance(data, Mapping):
        return decoded
    for name, value in data.items():
        if isinstance(value, str):
            try:
                decoded[str(name)] = base64.b64decode(value, validate=True)
            except binascii.Error:
                continue
    return decoded


def encode_data(data: Mapping[str, bytes]) -> dict[str, str]:
    """``data`` as a Secret's ``data`` holds it (base64)."""
    return {name: base64.b64encode(value).decode("ascii") for name, value in data.items()}


def with_data(secret: Obj, data: Mapping[str, bytes]) -> Obj:
    """``secret`` with new data; metadata (and its resourceVersion) and type as read."""
    updated = copy.deepcopy(secret)
    updated["data"] = encode_data(data)
    return updated

"""What Kubernetes itself stores at most, in the bytes it counts them in.

The webhook refuses what the API server would refuse after it, in its own words and before
anything is held: a tenant is told what does not fit and by how much, instead of meeting the
API server's message about a write it could not know the webhook had changed, or a pool
holding a charge for an object that could never be stored.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ANNOTATIONS_LIMIT_BYTES", "ETCD_MAX_REQUEST_BYTES"]

# etcd refuses a request over 1.5 MiB (its default --max-request-bytes), so no stored object is
# larger: an object etcd holds as JSON (every custom resource, every application) is its JSON.
ETCD_MAX_REQUEST_BYTES: Final = 1_572_864
# All of an object's annotations, keys and values, in UTF-8 bytes
# (k8s.io/apimachinery/pkg/api/validation: TotalAnnotationSizeLimitB).
ANNOTATIONS_LIMIT_BYTES: Final = 256 * 1024

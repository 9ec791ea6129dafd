"""A pool's ledger object whose metadata takes more than its share of the object's bound.

``MAX_OBJECT_BYTES`` is the sum of what each part of a ``TenantReservation`` may take, and
leaves some 40 KiB for "the rest": its metadata. Nothing keeps the metadata within that:
Kubernetes allows 256 KiB of annotations, and labels without a total bound (the real
kube-apiserver of ``../shared/kube`` stored 760 KB of labels on one; so does anyone who may
update the object: an operator's tool, a GitOps controller, a label propagator). The entries
were still let in up to their own bound, so the pool's next write passed the whole object's
bound and was not sent (``Book.write``'s ``TooLarge``): every tenant of the pool was told the
ledger "cannot be written right now" (503), counted as a failed write, for as long as the
entries it held kept it over, with nothing saying why. The metadata past its share is taken
from what the entries may hold instead, so the pool answers "full, try again" (429) before
any write would pass the bound, and says how much the object's metadata takes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from tests.admission.test_ledger import POOL, Cluster, Replica
from tests.admission.test_ledger_bytes import (
    NAME,
    grow,
    longest_name,
    longest_namespace,
    longest_uid,
)
from webhook.admission.ledger.bounds import MAX_OBJECT_BYTES
from webhook.core.base.json_codec import encode_json

LABELS = 500_000  # bytes of labels (the real kube-apiserver stored 760 KB of them on one)


def labelled(pool: str, size: int) -> dict[str, Any]:
    """``pool``'s ledger object as someone stored it, with ``size`` bytes of labels."""
    labels: dict[str, str] = {}
    index = 0
    while len(encode_json(labels)) < size:
        labels[f"p{index:04d}.{'a' * 240}/{'n' * 60}"] = "v" * 63
        index += 1
    return {
        "apiVersion": "reservation.cozystack.io/v1alpha1",
        "kind": "TenantReservation",
        "metadata": {"name": pool, "namespace": pool, "resourceVersion": "1", "labels": labels},
        "spec": {"pool": pool},
    }


async def test_a_ledger_object_with_500_kb_of_labels_answers_its_pool_full_never_unavailable() -> (
    None
):
    cluster = Cluster()
    cluster.objects[POOL] = labelled(POOL, LABELS)
    ns = longest_namespace(0)
    a = Replica(cluster, "r" * NAME, {POOL: {"memory": "1000000Gi"}, ns: None}, namespace_share=1.0)
    a.deliver()
    answers = await asyncio.gather(
        *(a.admit(grow(ns, longest_name(i), longest_uid(0, i))) for i in range(1000))
    )
    outcomes = Counter((d.allowed, d.code, d.reason) for d in answers)
    refused = [d for d in answers if not d.allowed]
    assert refused, outcomes
    # Refused as a full pool, cleanly, never as a ledger that cannot be written.
    assert {(d.code, d.reason) for d in refused} == {(429, "ledger-full")}, outcomes
    assert all("try again" in d.message for d in refused)
    assert "metadata" in refused[0].message, refused[0].message
    assert a.ledger.failures == 0
    stored = cluster.objects[POOL]
    assert len(encode_json(stored)) <= MAX_OBJECT_BYTES
    assert stored["status"]["pending"], "what fits beside the labels is still admitted"
    assert outcomes[(True, 200, "fits")] == len(stored["status"]["pending"])


async def test_a_ledger_object_whose_metadata_leaves_no_room_says_so_and_writes_nothing() -> None:
    # 760 KB of labels (as the real kube-apiserver stored them) leave the entries nothing once
    # every other part is given its share: each request is refused alone, saying why.
    cluster = Cluster()
    cluster.objects[POOL] = labelled(POOL, 760_000)
    a = Replica(cluster, "a", {POOL: {"memory": "100Gi"}})
    a.deliver()
    answer = await a.admit(grow(POOL, "vm", longest_uid(0, 0)))
    assert (answer.allowed, answer.code, answer.reason) == (False, 429, "ledger-full"), answer
    assert f"TenantReservation {POOL}/{POOL} takes" in answer.message
    assert a.ledger.failures == 0
    assert cluster.writes == 0

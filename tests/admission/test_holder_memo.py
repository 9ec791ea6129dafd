"""Whose share an entry takes, remembered: the same answer, and nothing kept of huge names.

Every batch counts the holder of every entry its pool's ledger lists, so the answer (a pure
function of the pool and the namespace) is remembered for the names asked last; a ledger
object is written by replicas, and perhaps by a tenant able to write it, so a name longer than
Kubernetes allows is answered but never kept.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from webhook.admission.ledger.shares import _holder, _remembered_holder, holder

names = st.lists(st.sampled_from(["a", "b", "c", "root", "x1"]), min_size=0, max_size=4).map(
    lambda parts: "-".join(["tenant", *parts]) if parts else "tenant-root"
)


@given(names, names | st.text(max_size=300))
def test_the_remembered_holder_is_the_computed_one(pool: str, namespace: str) -> None:
    assert holder(pool, namespace) == _holder(pool, namespace)
    assert holder(pool, namespace) == _holder(pool, namespace)  # asked again: remembered


def test_a_hand_written_entry_with_a_huge_namespace_is_never_remembered() -> None:
    """A megabyte namespace in each of thousands of writes would otherwise stay in memory."""
    _remembered_holder.cache_clear()
    for index in range(50):
        huge = f"tenant-a-{index}-" + "x" * 100_000
        assert holder("tenant-a", huge) == _holder("tenant-a", huge)
        assert holder(huge, "tenant-a") == _holder(huge, "tenant-a")
    assert _remembered_holder.cache_info().currsize == 0
    holder("tenant-a", "tenant-a-b")
    assert _remembered_holder.cache_info().currsize == 1

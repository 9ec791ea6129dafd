"""One tenant's caps take at most its share of a pool's ``MAX_CAPS_BYTES``.

A sub-Tenant admitted in warn beyond what fits is recorded as a cap in the pool's
``status.capped``, which lists the keys it caps twice (declared, counted): with a quota of the
64 longest keys a budget may name, one cap takes some 42 KB, and five took all of the caps'
218,600 bytes. One tenant with that many sub-tenants (or carve-outs) then had every other
tenant's over-budget Tenant refused (429) in warn mode, though each tenant's caps were bounded
by its share of ``MAX_CAPS`` in count. Its share is bounded in bytes as well now, as its
entries' share of ``MAX_PENDING_BYTES`` is.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.admission.test_ledger import POOL, Cluster, Replica
from tests.admission.test_ledger_escrow_slice_bytes import KEYS
from tests.builders import review
from webhook.admission.ledger.bounds import MAX_CAP_BYTES, MAX_CAPS_BYTES, LedgerSettings
from webhook.admission.ledger.entries import size
from webhook.admission.ledger.shares import cap_refusal, listed_cap_size
from webhook.core.admission.decisions import Decision, Policy
from webhook.core.admission.reviews import parse_review

WARN = Policy(per_kind={"Tenant": "warn"})  # the README's order: Tenant enforced last
HOSTILE, OTHER = f"{POOL}-a", f"{POOL}-b"
# Over the pool's memory (so admitted in warn beyond what fits), and 19 of the longest keys a
# budget may name besides: a cap of some 13 KB, so that a tenant's share holds one, not two.
FAT = {"memory": "1000Ti", **dict.fromkeys(KEYS[1:20], "1000000")}


async def sub_tenant(replica: Replica, parent: str, name: str) -> Decision:
    body = review("Tenant", parent, name, {"resourceQuotas": FAT}, uid=f"uid-{parent}-{name}")
    return await replica.ledger.admit(parse_review(body), WARN)


def capped(cluster: Cluster) -> dict[str, Any]:
    return dict((cluster.objects[POOL].get("status") or {}).get("capped") or {})


async def test_one_tenants_caps_take_at_most_its_share_of_MAX_CAPS_BYTES() -> None:
    cluster = Cluster()
    a = Replica(cluster, "a", {POOL: {"memory": "64Gi"}, HOSTILE: None, OTHER: None})
    settings_ = a.ledger.settings
    flood = [await sub_tenant(a, HOSTILE, f"x{index}") for index in range(8)]
    assert flood[0].allowed, flood[0].message
    assert flood[0].outcome == "warned"
    refused = [answer for answer in flood if not answer.allowed]
    assert refused, "one tenant's fat caps are bounded by its share in bytes"
    assert {(d.code, d.reason) for d in refused} == {(429, "ledger-share")}
    message = refused[0].message
    assert HOSTILE in message
    assert f"{settings_.cap_share_bytes_limit} bytes" in message, message
    assert "fix their quotas, then try again" in message
    caps = capped(cluster)
    mine = sum(listed_cap_size(owned, raw) for owned, raw in caps.items())
    assert mine <= settings_.cap_share_bytes_limit < MAX_CAPS_BYTES
    # Another tenant of the pool still has its over-budget Tenant warned, and its cap written.
    other = await sub_tenant(a, OTHER, "y")
    assert other.allowed, other.message
    assert f"{OTHER}-y" in capped(cluster)
    assert size(capped(cluster)) <= MAX_CAPS_BYTES


def test_five_tenants_within_their_cap_byte_shares_leave_room_for_another_tenants_cap() -> None:
    # Each a sub-tenant with a quota of 60 of the longest keys: some 43,700 bytes a cap, which
    # a floor of one cap at its largest let in as each tenant's share.
    settings_ = LedgerSettings(replica="a")
    caps: dict[str, Any] = {}
    for tenant in "abcde":
        who = f"{POOL}-{tenant}"
        fat = {f"{who}-s": {"digest": "d" * 32, "padding": "p" * 43_500}}
        if cap_refusal(POOL, {**caps, **fat}, who, settings_) is None:
            caps.update(fat)
    first = {f"{POOL}-f-s": {"digest": "d" * 32, "padding": "p" * 100}}
    assert cap_refusal(POOL, {**caps, **first}, f"{POOL}-f", settings_) is None
    assert sum(listed_cap_size(owned, raw) for owned, raw in caps.items()) <= (
        5 * settings_.cap_share_bytes_limit
    )
    # The shares divide the pool's caps: however many tenants fill theirs, all of them fit.
    assert 10 * settings_.cap_share_bytes_limit <= MAX_CAPS_BYTES


def test_a_cap_larger_than_a_tenants_share_is_refused_to_that_tenant_only() -> None:
    settings_ = LedgerSettings(replica="a")
    who = f"{POOL}-a"
    raw = {"digest": "d" * 32, "padding": ""}
    raw["padding"] = "p" * (MAX_CAP_BYTES - size(raw))
    refused = cap_refusal(POOL, {f"{who}-s": raw}, who, settings_)
    assert refused is not None
    assert (refused.code, refused.reason) == (429, "ledger-share")
    assert f"{who} already has 21860 bytes" in refused.message
    small = {"digest": "d" * 32}
    assert (
        cap_refusal(POOL, {f"{who}-s": raw, f"{POOL}-b-s": small}, f"{POOL}-b", settings_) is None
    )


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(min_value=0, max_value=MAX_CAP_BYTES - 64)),
        max_size=40,
    ),
    share=st.sampled_from([0.001, 0.01, 0.1, 0.5, 1.0]),
)
def test_what_caps_let_in_never_passes_the_pools_bytes_nor_a_tenants_share(
    sizes: list[tuple[str, int]], share: float
) -> None:
    settings_ = LedgerSettings(replica="a", namespace_share=share)
    caps: dict[str, Any] = {}
    for index, (tenant, grown) in enumerate(sizes):
        who = f"{POOL}-{tenant}"
        written = {**caps, f"{who}-s{index}": {"digest": "d", "padding": "p" * grown}}
        if cap_refusal(POOL, written, who, settings_) is None:
            caps = written
    assert size(caps) <= MAX_CAPS_BYTES
    for tenant in "abc":
        who = f"{POOL}-{tenant}"
        mine = sum(
            listed_cap_size(owned, raw) for owned, raw in caps.items() if owned.startswith(who)
        )
        assert mine <= settings_.cap_share_bytes_limit

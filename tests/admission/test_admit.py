"""Admission adds "no node has room right now" to an allowed VM write, never to a denial."""

from __future__ import annotations

from tests.builders import request, state
from webhook.admission.admit import Admission
from webhook.core.admission.decisions import Policy
from webhook.core.capacity.room import RoomBook

Mi = 1024**2
VM = {"instanceType": "", "resources": {"cpu": "1", "sockets": 1, "memory": "16Gi"}}


async def test_an_allowed_vm_no_node_can_hold_is_warned_with_its_own_size_only() -> None:
    admission = Admission(
        state({"tenant-acme": {"memory": "32Gi", "cpu": "8"}}), Policy(), room=RoomBook(13002 * Mi)
    )
    decision = await admission.validate(request("VMInstance", "tenant-acme", "big", VM))
    assert decision.allowed
    assert decision.warnings[-1] == (
        "fits your quota, but no node has the 16685Mi this VM needs free right now; "
        "the platform will need to make room before it can start"
    )


async def test_dry_running_vms_of_every_size_tells_a_tenant_no_finer_than_a_power_of_two() -> None:
    # Before, the warning named the largest free node memory (13002Mi), and where the answers
    # turned from "fits" to "no room" gave it to the MiB: a dry-run sweep read the cluster.
    async def sweep(largest: int) -> tuple[str | None, ...]:
        admission = Admission(
            state({"tenant-acme": {"memory": "64Gi", "cpu": "8"}}),
            Policy(),
            room=RoomBook(largest),
        )
        answers = []
        for size in range(512, 40 * 1024, 256):
            resources = {"cpu": "1", "sockets": 1, "memory": f"{size}Mi"}
            values = {"instanceType": "", "resources": resources}
            probe = request("VMInstance", "tenant-acme", f"probe-{size}", values, dry_run=True)
            decision = await admission.validate(probe)
            assert decision.allowed
            warned = [w for w in decision.warnings if "no node has" in w]
            answers.append(warned[0] if warned else None)
        return tuple(answers)

    seen = {await sweep(largest * Mi) for largest in (8300, 9000, 13002, 16384)}
    assert len(seen) == 1  # four different clusters, one set of answers
    answers = seen.pop()
    assert any(answers)
    assert not all(answers)
    assert not any("13002" in a or "largest" in a for a in answers if a)

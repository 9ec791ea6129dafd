"""Admission adds "no node has room right now" to an allowed VM write, never to a denial."""

from __future__ import annotations

from tests.builders import request, state
from webhook.admission import Admission
from webhook.core.decisions import Policy
from webhook.core.room import RoomBook

Mi = 1024**2
VM = {"instanceType": "", "resources": {"cpu": "1", "sockets": 1, "memory": "16Gi"}}


async def test_an_allowed_vm_no_node_can_hold_is_warned_in_sizes_only() -> None:
    admission = Admission(
        state({"tenant-acme": {"memory": "32Gi", "cpu": "8"}}), Policy(), room=RoomBook(13002 * Mi)
    )
    decision = await admission.validate(request("VMInstance", "tenant-acme", "big", VM))
    assert decision.allowed
    assert decision.warnings[-1] == (
        "fits your quota, but no node has 16685Mi free right now (largest: 13002Mi); "
        "the platform will need to make room"
    )


async def test_no_warning_when_room_is_unknown_or_the_write_is_denied() -> None:
    unknown = Admission(state({"tenant-acme": {"memory": "32Gi"}}), Policy(), room=RoomBook())
    decision = await unknown.validate(request("VMInstance", "tenant-acme", "big", VM))
    assert not any("no node has" in w for w in decision.warnings)
    denied = Admission(state({"tenant-acme": {"memory": "8Gi"}}), Policy(), room=RoomBook(0))
    decision = await denied.validate(request("VMInstance", "tenant-acme", "big", VM))
    assert not decision.allowed
    assert not any("no node has" in w for w in decision.warnings)

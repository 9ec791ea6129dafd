"""Five ways past a pool's budget, and two mis-decisions, each played as a hostile tenant plays it.

Every write goes through the shipped webhook configurations (their ``matchConditions`` evaluated
with a CEL library), ``/mutate`` then ``/validate`` over TLS, and is stored: on a webhook server
running on a manifest state, and on a live replica of the emulated API server (two replicas for
the key rotation). ``tests/core/pricing/test_volumes.py`` and ``tests/commands/test_cli.py`` play
the same attacks through the pure decision and ``webhook review``.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.attacks import ADMIN, REMOVE, ApiServer, tls_post
from tests.builders import FIXTURES
from tests.cluster import cluster, tenant
from tests.test_live import READ_TIMEOUT
from tests.waiting import eventually
from webhook.core.admission.annotation_room import ANNOTATIONS_LIMIT_BYTES
from webhook.core.tenancy.applications import (
    CHARGE_ANNOTATION,
    USER_PREFIX,
    application_from_object,
)
from webhook.core.tenancy.overcommit import OVERCOMMIT_ANNOTATION
from webhook.core.tenancy.records import parse_recorded_charge
from webhook.kube.client import KubeClient
from webhook.server import LiveServices, WebhookServer
from webhook.settings import Settings
from webhook.state.manifests import load_state
from webhook.tenancy.record_keys import RECORD_KEY_SECRET, keys_from_file
from webhook.tls.certificates import generate

GI = 1024**3
NS = "tenant-acme"
BUDGET = {"memory": "16Gi", "storage": "100Gi", "cpu": "64"}
MICRO = {"instanceType": "u1.micro"}  # KubeVirt u1.micro: 1 vCPU, 1Gi
XLARGE = {"instanceType": "u1.xlarge"}  # KubeVirt u1.xlarge: 4 vCPU, 16Gi
LIVE = {"watch_read_timeout": READ_TIMEOUT, "namespace": "cozy-reservation", "listen_port": 0}


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    out = tmp_path / "certs"
    generate(out, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    return out


@asynccontextmanager
async def on_manifests(
    tmp_path: Path, certs: Path, name: str = "state", **policy: Any
) -> AsyncIterator[ApiServer]:
    """The webhook server on a manifest state; the store is this test's, the watch emulated.
    Servers started on one ``tmp_path`` share one record key, as replicas share the Secret."""
    key = tmp_path / "record.key"
    if not key.exists():
        key.write_text("k" * 40 + "\n")
    (tmp_path / name).mkdir()
    tenants = tmp_path / name / "tenants.yaml"
    tenants.write_text(
        "apiVersion: apps.cozystack.io/v1alpha1\nkind: Tenant\n"
        "metadata: {name: acme, namespace: tenant-root}\n"
        f"spec: {{resourceQuotas: {BUDGET}}}\n".replace("'", "")
    )
    state_dirs = (str(FIXTURES / "cozystack"), str(tenants))
    settings = Settings(
        state=state_dirs,
        cert_dir=str(certs),
        listen_port=0,
        metrics_port=0,
        record_key_file=str(key),
        **policy,
    )
    server = WebhookServer(load_state(settings.state, keys=keys_from_file(key)), settings)
    await server.start()
    post, close = tls_post(lambda path: server.port, certs)
    counter = iter(range(1, 1_000_000))

    async def store(key: tuple[str, str, str], obj: dict[str, Any] | None) -> dict[str, Any] | None:
        state = server.admission.state
        if obj is None:
            state.forget(key)
            return None
        stored = copy.deepcopy(obj)
        revision = next(counter)
        stored["metadata"].setdefault("uid", f"uid-{key[2]}-{revision}")
        stored["metadata"]["resourceVersion"] = str(revision)
        state.observe(application_from_object({**stored, "kind": key[0]}))
        return stored

    try:
        yield ApiServer(post, store)
    finally:
        await close()
        server.stop()
        await server.wait()


@asynccontextmanager
async def replicas(
    tmp_path: Path, certs: Path, count: int = 1, **overrides: Any
) -> AsyncIterator[tuple[ApiServer, list[WebhookServer], Any]]:
    """Live replicas on the emulated API server; writes alternate /mutate and /validate across
    them when there are two (the API server picks any endpoint)."""
    async with cluster(tmp_path) as (api, kubeconfig):
        api.create(tenant("tenant-root", "acme", BUDGET))
        servers = []
        for index in range(count):
            settings = Settings(
                cert_dir=str(certs),
                replica=f"replica-{index}",
                metrics_port=0,
                **{**LIVE, **overrides},
            )
            services = LiveServices(KubeClient.from_kubeconfig(str(kubeconfig)), settings)
            server = WebhookServer(None, settings, services=services)
            await server.start()
            servers.append(server)
        try:
            for server in servers:
                assert server.services is not None
                await eventually(_synced(server.services), timeout=20)
            route = {"/mutate": 0, "/validate": count - 1}
            post, close = tls_post(lambda path: servers[route[path]].port, certs)

            async def store(
                key: tuple[str, str, str], obj: dict[str, Any] | None
            ) -> dict[str, Any] | None:
                plural = {"VMInstance": "vminstances", "VMDisk": "vmdisks"}[key[0]]
                if obj is None:
                    api.delete("apps.cozystack.io", plural, key[1], key[2])
                    stored = None
                elif api.get("apps.cozystack.io", plural, key[1], key[2]) is None:
                    stored = api.create(obj)
                else:
                    stored = api.update(obj)
                await _observed(servers, key, stored)
                return stored

            try:
                yield ApiServer(post, store), servers, api
            finally:
                await close()
        finally:
            for server in servers:
                server.stop()
                await server.wait()


def _synced(services: LiveServices) -> Callable[[], bool]:
    return lambda: services.live.state.synced


async def _observed(
    servers: list[WebhookServer], key: tuple[str, str, str], stored: dict[str, Any] | None
) -> None:
    """Wait until every replica's state shows the stored object (or its deletion)."""
    version = int(stored["metadata"]["resourceVersion"]) if stored is not None else 0

    def seen() -> bool:
        for server in servers:
            assert server.services is not None
            state = server.services.live.state
            record = state.record(key)
            if stored is None and (record is not None or key in state.unknown()):
                return False
            if stored is not None and (record is None or record.version < version):
                return False
        return True

    await eventually(seen, timeout=10)


BACKENDS = ["manifests", "emulated-api-server"]


@asynccontextmanager
async def backend(name: str, tmp_path: Path, certs: Path) -> AsyncIterator[ApiServer]:
    if name == "manifests":
        async with on_manifests(tmp_path, certs) as api:
            yield api
    else:
        async with replicas(tmp_path, certs) as (api, _, _):
            yield api


# -- 1. volumes that cannot shrink -------------------------------------------------------------


@pytest.mark.parametrize("where", BACKENDS)
async def test_shrinking_a_volume_to_refill_the_budget_is_priced_at_its_high_mark(
    tmp_path: Path, certs: Path, where: str
) -> None:
    """100Gi of storage: a 100Gi VMDisk lowered to 1Gi keeps its 100Gi PVC, so a second 99Gi
    disk would make the PVCs hold 199Gi on a 100Gi budget (and +99Gi per cycle)."""
    async with backend(where, tmp_path, certs) as api:
        assert (await api.write("VMDisk", NS, "d1", {"storage": "100Gi"})).allowed
        shrink = await api.write("VMDisk", NS, "d1", {"storage": "1Gi"})
        assert shrink.allowed  # the decrease is allowed; the volume is held at its high mark
        second = await api.write("VMDisk", NS, "d2", {"storage": "99Gi"})
        assert not second.allowed
        assert "storage" in second.reason
        assert any("held at its high mark" in w for w in shrink.warnings)
        record = parse_recorded_charge(api.annotation("VMDisk", NS, "d1", CHARGE_ANNOTATION))
        assert record is not None
        assert record.resources["storage"] == 100 * GI


# -- 1b. a record left off in warn mode ---------------------------------------------------------


async def test_crowding_out_the_record_in_warn_mode_does_not_drop_a_shrunk_volumes_high_mark(
    tmp_path: Path, certs: Path
) -> None:
    """VMDisk in warn, the rest enforced: a 100Gi disk lowered to 1Gi by a write that also
    drops its record and fills the annotations so a new one cannot fit is stored without a
    record (warn blocks nothing). Its PVC still holds 100Gi: an enforced 99Gi Postgres volume
    must not fit the 100Gi of storage."""
    async with on_manifests(tmp_path, certs, mode_for={"VMDisk": "warn"}) as api:
        assert (await api.write("VMDisk", NS, "d1", {"storage": "100Gi"})).allowed
        # Within the limit on the object and on its HelmRelease (key under apps.cozystack.io-),
        # with no room for a record beside it.
        note = "x" * (ANNOTATIONS_LIMIT_BYTES - len(USER_PREFIX) - len("note") - 10)
        dropped = {"note": note, CHARGE_ANNOTATION: REMOVE}
        shrink = await api.write("VMDisk", NS, "d1", {"storage": "1Gi"}, annotations=dropped)
        if shrink.allowed:  # stored: then only with a record that keeps the high mark
            record = shrink.record()
            assert record is not None, "stored without a record, its high mark lost"
        else:  # refused as in enforce, naming the annotations (what the API server answered)
            assert "does not fit beside the object's other annotations" in shrink.reason
        pg = {"replicas": 1, "size": "99Gi", "resourcesPreset": "nano"}
        second = await api.write("Postgres", NS, "pg", pg)
        assert not second.allowed, "the 100Gi PVC is still held: 199Gi on a 100Gi budget"
        assert "storage" in second.reason


async def test_an_update_past_the_values_bound_in_warn_mode_does_not_drop_a_volumes_high_mark(
    tmp_path: Path, certs: Path
) -> None:
    """As above with no annotations: the 1Gi write carries values past their 20,000-entry bound
    (any map the kind's schema allows: Postgres' users), which warn let through unpriced and
    record-less. Its volume is held at 100Gi and only a record keeps that: refused in warn too.
    Were it stored, the replica that priced the disk before keeps counting 100Gi; one that
    starts after never priced it."""
    async with on_manifests(tmp_path, certs, mode_for={"VMDisk": "warn"}) as api:
        assert (await api.write("VMDisk", NS, "d1", {"storage": "100Gi"})).allowed
        padded = {"storage": "1Gi", "optional": {f"k{i}": 0 for i in range(20_001)}}
        shrink = await api.write("VMDisk", NS, "d1", padded)
        assert not shrink.allowed
        assert "refused in warn too: its volumes are held at their high marks" in shrink.reason
        assert "20000 entries" in shrink.reason  # why it cannot be priced comes first
        pg = {"replicas": 1, "size": "99Gi", "resourcesPreset": "nano"}
        second = await api.write("Postgres", NS, "pg", pg)
        assert not second.allowed, "the 100Gi PVC is still held: 199Gi on a 100Gi budget"


async def test_unpadding_an_update_past_the_values_bound_does_not_launder_a_volumes_high_mark(
    tmp_path: Path, certs: Path
) -> None:
    """As above, the padded write stored record-less all the same (with no webhook in its way:
    made while the webhook was off, or before it refused such writes), then the padding taken
    off again: the 1Gi values now price, but the stored object they replace carries no record
    and does not evaluate, so unless the state's kept charge lends its marks the disk is priced
    at 1Gi and the PVC's 100Gi goes to the pool's enforced kinds after all."""
    async with on_manifests(tmp_path, certs, mode_for={"VMDisk": "warn"}) as api:
        assert (await api.write("VMDisk", NS, "d1", {"storage": "100Gi"})).allowed
        padded = {"storage": "1Gi", "optional": {f"k{i}": 0 for i in range(20_001)}}
        assert not (await api.write("VMDisk", NS, "d1", padded)).allowed  # held: refused
        key = ("VMDisk", NS, "d1")
        unrecorded = copy.deepcopy(api.objects[key])
        unrecorded["spec"] = padded
        del unrecorded["metadata"]["annotations"][CHARGE_ANNOTATION]
        stored = await api.store(key, unrecorded)
        assert stored is not None
        api.objects[key] = stored
        unpadded = await api.write("VMDisk", NS, "d1", {"storage": "1Gi"})
        assert unpadded.allowed  # a decrease always passes
        pg = {"replicas": 1, "size": "99Gi", "resourcesPreset": "nano"}
        second = await api.write("Postgres", NS, "pg", pg)
        assert not second.allowed, "the 100Gi PVC is still held: 199Gi on a 100Gi budget"


# -- 2. a factor the tenant planted ------------------------------------------------------------


@pytest.mark.parametrize("where", BACKENDS)
async def test_a_planted_factor_sent_back_by_an_admin_resize_never_becomes_real(
    tmp_path: Path, certs: Path, where: str
) -> None:
    """memory 16Gi: a tenant plants memory=1.1 on its VM; an admin resizes the VM to 16Gi with
    a manifest carrying the planted factor back unchanged; a further 1Gi VM must not fit."""
    async with backend(where, tmp_path, certs) as api:
        assert (await api.write("VMInstance", NS, "vm1", MICRO)).allowed
        planted = await api.write(
            "VMInstance", NS, "vm1", MICRO, annotations={OVERCOMMIT_ANNOTATION: "memory=1.1"}
        )
        assert not planted.allowed  # decided now, and refused: only the platform sets factors
        assert "reserved to the platform" in planted.reason
        await api.plant("VMInstance", NS, "vm1", {OVERCOMMIT_ANNOTATION: "memory=1.1"})
        resize = await api.write("VMInstance", NS, "vm1", XLARGE, who=ADMIN)
        assert resize.allowed
        record = parse_recorded_charge(api.annotation("VMInstance", NS, "vm1", CHARGE_ANNOTATION))
        assert record is not None
        assert record.resources["memory"] == 16 * GI
        assert record.own is None
        # The mutating side removed the unvouched factor from the stored object.
        assert api.annotation("VMInstance", NS, "vm1", OVERCOMMIT_ANNOTATION) is None
        assert not (await api.write("VMInstance", NS, "vm2", MICRO)).allowed


# -- 3. replaying an old signed record ---------------------------------------------------------


@pytest.mark.parametrize("where", BACKENDS)
async def test_replaying_an_old_signed_record_is_refused_and_never_believed(
    tmp_path: Path, certs: Path, where: str
) -> None:
    """A record carrying a factor the platform has since revoked, put back by an annotation-only
    update; then a record a dry run minted; then a deleted object's record on a new object of
    the same name. None of them counts."""
    async with backend(where, tmp_path, certs) as api:
        granted = await api.write(
            "VMInstance",
            NS,
            "vm1",
            XLARGE,
            annotations={OVERCOMMIT_ANNOTATION: "memory=1.1"},
            who=ADMIN,
        )
        assert granted.allowed
        old = api.annotation("VMInstance", NS, "vm1", CHARGE_ANNOTATION)
        assert old is not None
        revoked = await api.write(
            "VMInstance", NS, "vm1", XLARGE, annotations={OVERCOMMIT_ANNOTATION: REMOVE}, who=ADMIN
        )
        assert revoked.allowed
        replay = await api.write(
            "VMInstance", NS, "vm1", XLARGE, annotations={CHARGE_ANNOTATION: old}
        )
        if replay.allowed:  # the mutating side replaced it: what is stored is today's record
            assert api.annotation("VMInstance", NS, "vm1", CHARGE_ANNOTATION) != old
        record = parse_recorded_charge(api.annotation("VMInstance", NS, "vm1", CHARGE_ANNOTATION))
        assert record is not None
        assert record.own is None
        assert record.resources["memory"] == 16 * GI
        assert not (await api.write("VMInstance", NS, "vm2", MICRO)).allowed
        # A dry run's record (the response carries it) on the real write: replaced.
        assert (await api.write("VMDisk", NS, "d1", {"storage": "50Gi"})).allowed
        dry = await api.write("VMDisk", NS, "d1", {"storage": "1Gi"}, dry_run=True)
        assert dry.allowed
        minted = dry.record()
        assert minted is not None
        assert minted.dry
        real = await api.write(
            "VMDisk", NS, "d1", {"storage": "1Gi"}, annotations={CHARGE_ANNOTATION: minted.text}
        )
        assert real.allowed
        stored = parse_recorded_charge(api.annotation("VMDisk", NS, "d1", CHARGE_ANNOTATION))
        assert stored is not None
        assert not stored.dry
        assert stored.resources["storage"] == 50 * GI  # and the volume is held at 50Gi
        # A deleted object's record, on a new object of the same name.
        await api.delete("VMInstance", NS, "vm1")
        again = await api.write(
            "VMInstance", NS, "vm1", XLARGE, annotations={CHARGE_ANNOTATION: old}
        )
        assert again.allowed
        now = parse_recorded_charge(api.annotation("VMInstance", NS, "vm1", CHARGE_ANNOTATION))
        assert now is not None
        assert now.own is None
        assert now.resources["memory"] == 16 * GI


# -- off mode and creation ---------------------------------------------------------------------


async def test_a_deleted_objects_record_does_not_survive_off_mode_on_a_new_object_of_its_name(
    tmp_path: Path, certs: Path
) -> None:
    async with on_manifests(tmp_path, certs) as api:
        first = await api.write(
            "VMInstance",
            NS,
            "vm1",
            XLARGE,
            annotations={OVERCOMMIT_ANNOTATION: "memory=1.1"},
            who=ADMIN,
        )
        assert first.allowed
        old = api.annotation("VMInstance", NS, "vm1", CHARGE_ANNOTATION)
        await api.delete("VMInstance", NS, "vm1")
    async with on_manifests(tmp_path, certs, "off", mode="off") as api:
        again = await api.write(
            "VMInstance", NS, "vm1", XLARGE, annotations={CHARGE_ANNOTATION: old}
        )
        assert again.allowed
        assert api.annotation("VMInstance", NS, "vm1", CHARGE_ANNOTATION) is None


@pytest.mark.parametrize("where", BACKENDS)
async def test_creating_an_application_with_a_factor_inside_the_bounds_needs_no_steps(
    tmp_path: Path, certs: Path, where: str
) -> None:
    async with backend(where, tmp_path, certs) as api:
        created = await api.write(
            "VMInstance",
            NS,
            "vm1",
            XLARGE,
            annotations={OVERCOMMIT_ANNOTATION: "memory=1.5"},
            who=ADMIN,
        )
        assert created.allowed, created.reason
        record = parse_recorded_charge(api.annotation("VMInstance", NS, "vm1", CHARGE_ANNOTATION))
        assert record is not None
        assert record.own == {"memory": Decimal("1.5")}


# -- 4. key rotation ---------------------------------------------------------------------------


async def test_a_key_rotation_refuses_no_ordinary_write_across_two_replicas(
    tmp_path: Path, certs: Path
) -> None:
    """Two replicas re-read the key Secret at different times: /mutate on the one holding the
    new key, /validate on the one that has not re-read yet; then the other way round."""
    async with replicas(tmp_path, certs, count=2) as (api, servers, emulated):
        first, second = (s.services for s in servers)
        assert first is not None
        assert second is not None
        assert (await api.write("VMInstance", NS, "vm0", MICRO)).allowed
        # The operator rotates without publishing first (the worst case): a new current key.
        # The key Secret (the replicas' TLS Secret may be stored beside it by now).
        (secret,) = (
            s for s in emulated.objects("", "secrets") if s["metadata"]["name"] == RECORD_KEY_SECRET
        )
        new_key = base64.b64encode(b"n" * 32).decode()
        secret["data"] = {"current": new_key, "previous": secret["data"]["current"]}
        emulated.update(secret)
        await first.reload_record_keys()  # staggered: only the mutating replica has re-read
        assert first.live.keys.current == b"n" * 32
        assert second.live.keys.current != b"n" * 32
        created = await api.write("VMInstance", NS, "vm1", MICRO)
        assert created.allowed, created.reason
        assert second.live.keys.current == b"n" * 32  # it re-read on meeting the unknown key id
        # The record signed with the old key (vm0) still verifies within the window.
        grown = await api.write("VMInstance", NS, "vm0", {"instanceType": "u1.small"})
        assert grown.allowed, grown.reason


async def test_a_published_key_is_accepted_before_any_replica_signs_with_it(
    tmp_path: Path, certs: Path
) -> None:
    async with replicas(tmp_path, certs, count=2) as (api, servers, emulated):
        first, second = (s.services for s in servers)
        assert first is not None
        assert second is not None
        published = await first.record_keys.publish()
        await first.reload_record_keys()  # one round of re-reads: both replicas have read it
        await second.reload_record_keys()
        assert first.live.keys.current_id != published  # published, not signing
        assert first.live.keys.knows(published)
        assert (await api.write("VMInstance", NS, "vm1", MICRO)).allowed
        promoted = await second.record_keys.promote(window_seconds=3600)
        assert promoted == published
        await first.reload_record_keys()  # the mutating replica signs with it; the other not yet
        assert first.live.keys.current_id == promoted
        assert second.live.keys.knows(promoted)  # published earlier, so nothing to re-read
        assert (await api.write("VMInstance", NS, "vm2", MICRO)).allowed
        # Once the window has ended the retired key verifies nothing any more.
        promoted_again = await second.record_keys.publish()
        await second.record_keys.promote(window_seconds=-1)
        await second.reload_record_keys()
        assert second.live.keys.current_id == promoted_again
        assert second.live.keys.previous == ()
        del emulated


# -- 5. a Tenant the state has not seen yet ----------------------------------------------------


@pytest.mark.parametrize("where", BACKENDS)
async def test_filling_a_new_tenants_namespace_before_the_watch_shows_its_tenant_is_refused(
    tmp_path: Path, certs: Path, where: str
) -> None:
    """Tenant newco (16Gi) was just created under the unbounded root; its namespace exists, but
    no replica's watch shows the Tenant yet. Charged to no pool, 16 u1.xlarge VMs (256Gi) would
    be admitted in tenant-newco before its budget is known."""
    async with backend(where, tmp_path, certs) as api:
        grab = await api.write("VMInstance", "tenant-newco", "vm0", XLARGE)
        assert not grab.allowed
        assert "tenant-newco is not known yet" in grab.reason
        assert "try again" in grab.reason
        assert (await api.write("VMInstance", NS, "vm0", MICRO)).allowed


async def test_a_create_past_the_values_bound_in_warn_mode_does_not_hide_a_volume(
    tmp_path: Path, certs: Path
) -> None:
    """The update above refused, the tenant creates the disk padded instead (or deletes it and
    creates it again so): past the values bound, warn stored it unpriced and record-less, so it
    counted nothing while its chart still made a 100Gi PVC, whose room went to the pool's
    enforced kinds. A CREATE has no marks to lose; its volume is the same room."""
    async with on_manifests(tmp_path, certs, mode_for={"VMDisk": "warn"}) as api:
        padded = {"storage": "100Gi", "optional": {f"k{i}": 0 for i in range(20_001)}}
        created = await api.write("VMDisk", NS, "d1", padded)
        if created.allowed:
            pg = {"replicas": 1, "size": "99Gi", "resourcesPreset": "nano"}
            second = await api.write("Postgres", NS, "pg", pg)
            assert not second.allowed, "the 100Gi PVC is held: 199Gi on a 100Gi budget"
        else:  # refused as an update held at its marks is
            assert "20000 entries" in created.reason

"""The rebalancer against the emulated API server, with a fake KubeVirt moving the VMs."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.apiserver.server import EmulatedAPIServer
from tests.builders import FIXTURES
from tests.capacity.objects import hostile_mixed_cluster, node_object, vm_objects
from tests.waiting import eventually, loop_gaps
from webhook.capacity.rebalance import Rebalancer, RebalanceSettings
from webhook.core.capacity.rebalance import Goal, fair_order, find_goals, for_tenant, tenant_of
from webhook.kube.client import KubeClient

Obj = dict[str, Any]
LLAMA = "tenant-demo/rhel7-red-llama"
KUBEVIRT = "kubevirt.io"


def seed_objects() -> list[Obj]:
    document = yaml.safe_load((FIXTURES / "capacity" / "seed-snapshot.yaml").read_text())
    return [copy.deepcopy(item) for item in document["items"]]


def register(api: EmulatedAPIServer) -> None:
    api.resource("", "v1", "nodes", "Node", namespaced=False)
    api.resource("", "v1", "pods", "Pod")
    api.resource("", "v1", "events", "Event")
    api.resource(KUBEVIRT, "v1", "virtualmachineinstances", "VirtualMachineInstance")
    api.resource(
        KUBEVIRT, "v1", "virtualmachineinstancemigrations", "VirtualMachineInstanceMigration"
    )


class FakeKubeVirt:
    """Plays virt-controller: a new migration moves its VMI (and launcher) to the target."""

    def __init__(self, api: EmulatedAPIServer, result: str = "Succeeded") -> None:
        self.api = api
        self.result = result
        self.after: Callable[[Obj], None] = lambda _: None
        self.seen: list[Obj] = []

    async def run(self) -> None:
        while True:
            for migration in self.api.objects(KUBEVIRT, "virtualmachineinstancemigrations"):
                if migration.get("status", {}).get("phase"):
                    continue
                self.seen.append(migration)
                if self.result == "Succeeded":
                    self._move(migration)
                migration["status"] = {"phase": self.result}
                self.api.update(migration)
                self.after(migration)
            await asyncio.sleep(0.01)

    def _move(self, migration: Obj) -> None:
        namespace = migration["metadata"]["namespace"]
        name = migration["spec"]["vmiName"]
        hostname = migration["spec"]["addedNodeSelector"]["kubernetes.io/hostname"]
        node = next(
            n["metadata"]["name"]
            for n in self.api.objects("", "nodes")
            if n["metadata"]["labels"].get("kubernetes.io/hostname") == hostname
        )
        vmi = self.api.get(KUBEVIRT, "virtualmachineinstances", namespace, name)
        assert vmi is not None
        vmi["status"]["nodeName"] = node
        self.api.update(vmi)
        for pod in self.api.objects("", "pods", namespace):
            if pod["metadata"].get("labels", {}).get("vm.kubevirt.io/name") == name:
                pod["spec"]["nodeName"] = node
                self.api.update(pod)


@asynccontextmanager
async def cluster(
    tmp_path: Path, objects: list[Obj], *, result: str = "Succeeded"
) -> AsyncIterator[tuple[EmulatedAPIServer, KubeClient, FakeKubeVirt]]:
    async with EmulatedAPIServer() as api:
        register(api)
        for obj in objects:
            api.create(obj)
        kubevirt = FakeKubeVirt(api, result)
        task = asyncio.create_task(kubevirt.run())
        client = KubeClient.from_kubeconfig(str(api.kubeconfig(tmp_path / "kubeconfig")))
        try:
            yield api, client, kubevirt
        finally:
            task.cancel()
            await client.close()


def settings(**kw: Any) -> RebalanceSettings:
    return RebalanceSettings(all_vms=True, interval=0.01, poll=0.01, **kw)


def events(api: EmulatedAPIServer) -> list[tuple[str, str, str]]:
    return [
        (e["involvedObject"]["name"], e["reason"], e["type"])
        for e in sorted(api.objects("", "events"), key=lambda e: e["metadata"]["name"])
    ]


def counter(rebalancer: Rebalancer, name: str, **labels: str) -> float:
    value = rebalancer.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def test_dry_run_only_reports_the_plan_once(tmp_path: Path) -> None:
    async with cluster(tmp_path, seed_objects()) as (api, client, _kubevirt):
        rebalancer = Rebalancer(client, settings())
        assert await rebalancer.round() == [(Goal("place", LLAMA), "planned")]
        assert await rebalancer.round() == [(Goal("place", LLAMA), "planned")]
        assert events(api) == [("rhel7-red-llama", "MakeRoomPlan", "Normal")]
        message = api.objects("", "events")[0]["message"]
        assert message.startswith("dry run: 1 live migration(s): 1. tenant-demo/")
        assert api.objects(KUBEVIRT, "virtualmachineinstancemigrations") == []


async def test_apply_migrates_one_vm_and_the_pending_vm_then_fits(tmp_path: Path) -> None:
    async with cluster(tmp_path, seed_objects()) as (api, client, kubevirt):
        rebalancer = Rebalancer(client, settings(apply=True))
        assert await rebalancer.round() == [(Goal("place", LLAMA), "done")]
        assert len(kubevirt.seen) == 1
        assert [r for _, r, _ in events(api)] == ["MakeRoomStarted", "MakeRoomDone"]
        assert counter(rebalancer, "reservation_rebalance_plans_total", outcome="done") == 1
        # The next round finds room already made: nothing left to move.
        assert await rebalancer.round() == [(Goal("place", LLAMA), "nothing")]


async def test_a_failed_migration_stops_the_plan_and_says_so(tmp_path: Path) -> None:
    async with cluster(tmp_path, seed_objects(), result="Failed") as (api, client, _kubevirt):
        rebalancer = Rebalancer(client, settings(apply=True))
        assert await rebalancer.round() == [(Goal("place", LLAMA), "failed")]
        failed = [e for e in api.objects("", "events") if e["reason"] == "MakeRoomFailed"]
        assert len(failed) == 1
        assert failed[0]["type"] == "Warning"
        assert failed[0]["involvedObject"]["kind"] == "VirtualMachineInstance"
        assert "stopped at step 1" in failed[0]["message"]
        assert counter(rebalancer, "reservation_rebalance_migrations_total", result="Failed") == 1


def two_move_cluster() -> list[Obj]:
    """a holds x and y (8Gi each); the 20Gi VM needs both gone; b and c take one each."""
    return [
        node_object("a", 24 * 1024, 16_000),
        node_object("b", 10 * 1024, 16_000),
        node_object("c", 10 * 1024, 16_000),
        *vm_objects("t", "x", 8 * 1024, 0, "a"),
        *vm_objects("t", "y", 8 * 1024, 0, "a"),
        *vm_objects("t", "big", 20 * 1024, 0, None),
    ]


async def test_a_new_pod_on_a_step_target_invalidates_the_rest_of_the_plan(tmp_path: Path) -> None:
    async with cluster(tmp_path, two_move_cluster()) as (api, client, kubevirt):

        def squat(migration: Obj) -> None:
            # After step 1 someone else schedules a pod on the node step 2 needs.
            taken = {
                m["spec"]["addedNodeSelector"]["kubernetes.io/hostname"] for m in kubevirt.seen
            }
            free = ({"b", "c"} - taken).pop()
            api.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "squatter", "namespace": "other"},
                    "spec": {
                        "nodeName": free,
                        "containers": [{"name": "c", "resources": {"requests": {"memory": "4Gi"}}}],
                    },
                    "status": {"phase": "Running"},
                }
            )

        kubevirt.after = squat
        rebalancer = Rebalancer(client, RebalanceSettings(interval=0.01, poll=0.01, apply=True))
        assert await rebalancer.round() == [(Goal("place", "t/big"), "invalidated")]
        assert len(kubevirt.seen) == 1  # step 2 was never started
        invalid = [e for e in api.objects("", "events") if e["reason"] == "MakeRoomInvalidated"]
        assert len(invalid) == 1
        assert "stopped before step 2: the cluster changed under the plan" in invalid[0]["message"]
        assert "no longer has room" in invalid[0]["message"]


async def test_the_loop_survives_a_failing_api_call_and_stops_on_request(tmp_path: Path) -> None:
    async with cluster(tmp_path, seed_objects()) as (api, client, _kubevirt):
        rebalancer = Rebalancer(client, settings())
        api.fail_next(1, 500)
        stop = asyncio.Event()
        task = asyncio.create_task(rebalancer.run(stop))
        await eventually(lambda: api.objects("", "events"), 30)
        stop.set()
        await asyncio.wait_for(task, 5)
        assert counter(rebalancer, "reservation_rebalance_errors_total") == 1
        assert events(api) == [("rhel7-red-llama", "MakeRoomPlan", "Normal")]


def test_goals_are_opt_in_per_vm_unless_enabled_for_all() -> None:
    objects = two_move_cluster()
    assert find_goals(objects, all_vms=False) == [Goal("place", "t/big")]
    for obj in objects:
        obj["metadata"].pop("annotations", None)
    assert find_goals(objects, all_vms=False) == []
    assert find_goals(objects, all_vms=True) == [Goal("place", "t/big")]


def test_a_cordoned_node_with_vms_is_a_drain_goal() -> None:
    objects = seed_objects()
    for obj in objects:
        if obj["metadata"]["name"] == "worker-red.shift.toca.local":
            obj["spec"]["unschedulable"] = True
    goals = find_goals(objects, all_vms=True)
    assert Goal("drain", "worker-red.shift.toca.local") in goals
    # The seed's cordoned worker-yellow runs no VM: nothing to drain there.
    assert Goal("drain", "worker-yellow.shift.toca.local") not in goals


VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


async def test_every_call_it_makes_is_granted_by_its_role(tmp_path: Path) -> None:
    from tests.deploy.test_rebalancer import CALLS

    async with cluster(tmp_path, seed_objects()) as (api, client, _kubevirt):
        await Rebalancer(client, settings(apply=True)).round()
        made = set()
        for method, path, query, _ in api.requests:
            parts = path.strip("/").split("/")
            group = "" if parts[0] == "api" else parts[1]
            rest = parts[2:] if parts[0] == "api" else parts[3:]
            if rest[:1] == ["namespaces"]:
                rest = rest[2:]
            verb = VERBS[method]
            if verb == "get" and len(rest) == 1:
                verb = "watch" if query.get("watch") else "list"
            made.add((group, rest[0], verb))
        assert made
        assert made <= CALLS, made - CALLS


async def test_a_slow_goal_neither_holds_the_event_loop_nor_delays_other_goals(
    tmp_path: Path,
) -> None:
    # tenant-evil's pending VM (the older goal) needs memory and cpu freed among mixed VMs: its
    # search runs to its deadline. tenant-good's needs two moves found at once.
    objects = hostile_mixed_cluster()
    objects += [
        node_object("a", 24 * 1024, 1000),
        node_object("b", 10 * 1024, 1000),
        node_object("c", 10 * 1024, 1000),
        *vm_objects("tenant-good", "x", 8 * 1024, 0, "a"),
        *vm_objects("tenant-good", "y", 8 * 1024, 0, "a"),
        *vm_objects("tenant-good", "big", 20 * 1024, 0, None),
    ]
    objects[-1]["metadata"]["creationTimestamp"] = "2026-11-30T01:00:00Z"
    async with cluster(tmp_path, objects) as (api, client, _kubevirt):
        rebalancer = Rebalancer(
            client,
            settings(max_moves=5, max_candidates=10**9, plan_seconds=2.0, planners=2),
        )
        try:
            async with loop_gaps(0.01) as gaps:
                outcomes = await rebalancer.round()
        finally:
            rebalancer.close()
        assert outcomes == [
            (Goal("place", "tenant-good/big"), "planned"),
            (Goal("place", "tenant-evil/pending"), "over-bound"),
        ]
        # The loop kept serving while the slow goal was planned (a GIL switch is 5 ms).
        assert max(gaps) < 1.5, max(gaps)
        slow = [e for e in api.objects("", "events") if e["involvedObject"]["name"] == "pending"]
        assert slow[0]["reason"] == "MakeRoomNoPlan"
        assert slow[0]["message"].startswith(
            "no plan within the bound: stopped at the time limit after considering "
        )
        assert counter(rebalancer, "reservation_rebalance_plans_total", outcome="over-bound") == 1


async def test_one_tenants_pending_vms_cannot_migrate_others_beyond_its_share(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, two_move_cluster()) as (api, client, kubevirt):
        rebalancer = Rebalancer(client, settings(apply=True, tenant_migrations=1))
        try:
            assert await rebalancer.round() == [(Goal("place", "t/big"), "limited")]
        finally:
            rebalancer.close()
        assert kubevirt.seen == []
        assert api.objects(KUBEVIRT, "virtualmachineinstancemigrations") == []
        limited = [e for e in api.objects("", "events") if e["reason"] == "MakeRoomLimited"]
        assert limited[0]["type"] == "Warning"
        assert limited[0]["message"] == (
            "waiting: the pending VMs of t caused 0 live migrations in the last 3600s "
            "(at most 1); this plan needs 2"
        )
        assert counter(rebalancer, "reservation_rebalance_plans_total", outcome="limited") == 1


async def test_a_tenants_share_counts_its_sub_tenants_and_refills_after_the_period(
    tmp_path: Path,
) -> None:
    now = [0.0]
    objects = seed_objects()
    async with cluster(tmp_path, objects) as (_api, client, kubevirt):
        rebalancer = Rebalancer(
            client,
            settings(apply=True, tenant_migrations=1, tenant_period=100.0),
            clock=lambda: now[0],
        )
        try:
            assert await rebalancer.round() == [(Goal("place", LLAMA), "done")]
            assert len(kubevirt.seen) == 1
            # A sub-tenant's pending VM draws on the same share as its top-level tenant.
            sub = Goal("place", "tenant-demo-dev/other")
            assert "caused 1 live migrations" in rebalancer._over_tenant_limit(sub, 1)
            assert rebalancer._over_tenant_limit(Goal("place", "tenant-else/vm"), 1) == ""
            now[0] = 100.5
            assert rebalancer._over_tenant_limit(sub, 1) == ""
        finally:
            rebalancer.close()


def test_one_tenants_many_pending_vms_do_not_queue_ahead_of_another_tenants() -> None:
    goals = [
        Goal("place", "tenant-a/1"),
        Goal("place", "tenant-a-dev/2"),
        Goal("place", "tenant-a/3"),
        Goal("place", "tenant-b/1"),
        Goal("drain", "node-1"),
    ]
    assert fair_order(goals) == [
        Goal("place", "tenant-a/1"),
        Goal("place", "tenant-b/1"),
        Goal("place", "tenant-a-dev/2"),
        Goal("place", "tenant-a/3"),
        Goal("drain", "node-1"),
    ]
    assert [tenant_of(n) for n in ("tenant-a-b-c", "tenant-root", "default", "tenant-")] == [
        "tenant-a",
        "tenant-root",
        "default",
        "tenant-",
    ]


def test_a_hundred_pending_vms_of_one_tenant_cost_a_round_only_its_share_of_goals() -> None:
    many = [Goal("place", f"tenant-a/vm-{i}") for i in range(100)]
    goals = [*many, Goal("place", "tenant-b/one"), Goal("drain", "node-1")]
    first = fair_order(goals, per_tenant=2, turn=0)
    assert first == [many[0], Goal("place", "tenant-b/one"), many[1], Goal("drain", "node-1")]
    # Round after round, every one of them gets its turn, and tenant-b's goal every round.
    planned = set()
    for turn in range(50):
        chosen = fair_order(goals, per_tenant=2, turn=turn)
        assert Goal("place", "tenant-b/one") in chosen
        assert len(chosen) == 4
        planned.update(chosen)
    assert set(many) <= planned


@pytest.mark.parametrize(
    "flag",
    [
        ["--max-candidates", "0"],
        ["--plan-seconds", "nan"],
        ["--planners", "0"],
        ["--tenant-migrations", "-1"],
        ["--tenant-period", "nan"],
        ["--tenant-goals", "0"],
    ],
)
def test_bounds_that_would_not_bound_are_refused_at_start(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from webhook.commands.cli import main

    assert main(["rebalance", "--kubeconfig", "/nonexistent", *flag]) == 2
    assert flag[0] in capsys.readouterr().err


async def test_a_tenant_asking_for_room_is_never_told_which_vms_of_others_would_move(
    tmp_path: Path,
) -> None:
    # Tenant t-big opts its own pending VM in and reads the Events on it: the plan moves the
    # VMs of tenant-acme and tenant-bank, which must not be named there.
    objects = [
        node_object("a", 24 * 1024, 16_000),
        node_object("b", 10 * 1024, 16_000),
        node_object("c", 10 * 1024, 16_000),
        *vm_objects("tenant-acme-dev", "payroll", 8 * 1024, 0, "a"),
        *vm_objects("tenant-bank", "ledger", 8 * 1024, 0, "a"),
        *vm_objects("tenant-big", "vm", 20 * 1024, 0, None),
    ]
    async with cluster(tmp_path, objects) as (api, client, _kubevirt):
        rebalancer = Rebalancer(client, settings())
        try:
            assert await rebalancer.round() == [(Goal("place", "tenant-big/vm"), "planned")]
        finally:
            rebalancer.close()
        (event,) = api.objects("", "events")
        assert event["metadata"]["namespace"] == "tenant-big"
        message = event["message"]
        assert message.startswith("dry run: 2 live migration(s): 1. a VM of another tenant "), (
            message
        )
        for secret in ("payroll", "ledger", "tenant-acme", "tenant-bank"):
            assert secret not in message, message
        assert "2. a VM of another tenant" in message


def test_only_other_tenants_vms_are_left_unnamed() -> None:
    keys = ["tenant-a/vm", "tenant-a-dev/db", "tenant-b/vm", "tenant-b/vm-2", "kube-system/x"]
    text = "1. tenant-b/vm-2 a -> b; 2. tenant-b/vm a -> c; 3. tenant-a-dev/db c -> b; "
    text += "kube-system/x"
    shown = for_tenant(text, "tenant-a", keys)
    assert shown == (
        "1. a VM of another tenant a -> b; 2. a VM of another tenant a -> c; "
        "3. tenant-a-dev/db c -> b; a VM of another tenant"
    )

"""``webhook rebalance``: make room automatically, one live migration at a time.

A controller of its own (its own Deployment and RBAC, never part of admission). Every
``--interval`` seconds it lists nodes, pods and VMIs, finds the goals (a VMI the scheduler
refused for lack of resources; a cordoned node that still runs VMs; opt-in per VMI or for all),
and plans each with the pure planner. In dry-run mode it only emits an Event with the plan on
the VMI (or the node). With ``--apply`` it carries out **one plan at a time**: before each step
it reads the cluster again and replays the rest of the plan on it; it creates one
``VirtualMachineInstanceMigration`` pinned to the step's target and waits for it to succeed
before the next. It stops and reports (an Event, a log line, a metric) when a migration fails or
times out, or when the cluster changed under the plan; the next round plans afresh.

It reads by listing rather than watching: a round is three LIST calls, bounded, and a lost
watch can never leave it acting on a stale view. One bad goal is reported and the loop goes on.

Pending VMs are a tenant's doing, so planning never holds the controller: every goal is planned
in a worker thread (``--planners`` at once, off the event loop that serves ``/metrics`` and
``/healthz``), each within its own budget of candidates and wall-clock deadline, submitted in
turn across tenants (one tenant's many goals do not queue ahead of another's; at most
``--tenant-goals`` of one tenant's per round, taken in rotation), and handled as each plan is
ready, so a slow goal delays no other. The migrations one tenant's pending VMs may
cause are limited per period; a plan beyond that waits, with an Event that says so.

Over 400 lines, and kept whole: it is one controller, whose rounds, plan execution, limits and
reports share the per-goal state it keeps between rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest

from webhook.capacity.snapshot import NODES, PODS, VMIS
from webhook.core.base.errors import ReservationError
from webhook.core.capacity.plan_limits import (
    DEFAULT_MAX_CANDIDATES,
    DEFAULT_PLAN_SECONDS,
    DEFAULT_PLANNERS,
    DEFAULT_TENANT_GOALS,
    DEFAULT_TENANT_MIGRATIONS,
    DEFAULT_TENANT_PERIOD,
)
from webhook.core.capacity.planner import (
    DEFAULT_MAX_MOVES,
    MAX_MOVES_CAP,
    Bound,
    Move,
    Plan,
    plan_drain,
    plan_placement,
    replay,
)
from webhook.core.capacity.rebalance import Goal, fair_order, find_goals, for_tenant, tenant_of
from webhook.core.capacity.snapshot import HOSTNAME, Snapshot
from webhook.core.capacity.snapshot_objects import snapshot_from_objects
from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.waits import sleep_unless_stopped

__all__ = ["RebalanceSettings", "Rebalancer", "run"]

log = logging.getLogger("webhook.capacity.rebalance")

MIGRATIONS: Final = ResourceRef("kubevirt.io", "v1", "virtualmachineinstancemigrations")
EVENTS: Final = ResourceRef("", "v1", "events")
COMPONENT: Final = "reservation-rebalancer"
PLAN_ANNOTATION: Final = "reservation.cozystack.io/plan-step"

Outcome = Literal[
    "planned", "done", "failed", "invalidated", "no-plan", "over-bound", "limited", "nothing"
]


@dataclass(frozen=True)
class RebalanceSettings:
    apply: bool = False
    all_vms: bool = False
    interval: float = 30.0
    max_moves: int = DEFAULT_MAX_MOVES
    migration_timeout: float = 900.0
    poll: float = 2.0
    max_candidates: int = DEFAULT_MAX_CANDIDATES
    plan_seconds: float = DEFAULT_PLAN_SECONDS
    planners: int = DEFAULT_PLANNERS
    tenant_migrations: int = DEFAULT_TENANT_MIGRATIONS
    tenant_period: float = DEFAULT_TENANT_PERIOD
    tenant_goals: int = DEFAULT_TENANT_GOALS


@dataclass
class _Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.plans = Counter(
            "reservation_rebalance_plans",
            "Plans by outcome: planned (dry run), done, failed, invalidated, no-plan, over-bound "
            "(the search stopped at its bound), limited (the tenant's migrations per period).",
            ["outcome"],
            registry=self.registry,
        )
        self.migrations = Counter(
            "reservation_rebalance_migrations",
            "Migrations created by the rebalancer, by result.",
            ["result"],
            registry=self.registry,
        )
        self.errors = Counter(
            "reservation_rebalance_errors",
            "Rounds or goals that failed with an error (the loop went on).",
            registry=self.registry,
        )
        self.candidates = Counter(
            "reservation_rebalance_plan_candidates",
            "Candidates the planner considered, summed over goals.",
            registry=self.registry,
        )


class Rebalancer:
    def __init__(
        self,
        client: KubeClient,
        settings: RebalanceSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = settings
        self.metrics = _Metrics()
        self._clock = clock
        # The last message reported per goal: a plan that did not change is not re-announced.
        self._reported: dict[Goal, str] = {}
        self._vm_keys: frozenset[str] = frozenset()  # the VMs of the round's snapshot
        # When each migration a tenant's pending VMs caused was created, within the period.
        self._caused: dict[str, deque[float]] = {}
        self._turn = 0  # which of a tenant's pending VMs come first this round
        self._planners = ThreadPoolExecutor(
            max_workers=max(1, settings.planners), thread_name_prefix="planner"
        )

    def close(self) -> None:
        """Stop the planner threads (a plan under way ends at its next deadline check)."""
        self._planners.shutdown(wait=False, cancel_futures=True)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self.round()
                except Exception:  # a round that fails is logged; the next one starts afresh
                    self.metrics.errors.inc()
                    log.exception("rebalance round failed")
                if await sleep_unless_stopped(self.settings.interval, stop):
                    return
        finally:
            self.close()

    async def round(self) -> list[tuple[Goal, Outcome]]:
        """One pass: plan every goal off the event loop, handle each plan as it is ready; in
        apply mode carry out the first plan that has moves, then stop planning the rest."""
        objects = await self._objects()
        snapshot = await asyncio.to_thread(snapshot_from_objects, objects)
        self._vm_keys = frozenset(vm.key for vm in snapshot.vms)
        goals = fair_order(
            find_goals(objects, all_vms=self.settings.all_vms),
            per_tenant=self.settings.tenant_goals,
            turn=self._turn,
        )
        self._turn += 1
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        futures = [
            loop.run_in_executor(self._planners, self._plan, goal, snapshot, stop) for goal in goals
        ]
        outcomes: list[tuple[Goal, Outcome]] = []
        try:
            for ready in asyncio.as_completed(futures):
                goal, plan = await ready
                try:
                    outcome = await self._handle(goal, plan, stop)
                except (ApiError, ReservationError) as exc:
                    self.metrics.errors.inc()
                    log.warning("goal failed", extra={"goal": str(goal), "error": str(exc)})
                    continue
                outcomes.append((goal, outcome))
                if outcome in ("done", "failed", "invalidated"):
                    break  # one plan in flight per round; the cluster has changed, re-read it
        finally:
            stop.set()  # plans still under way end at their next deadline check
            await asyncio.gather(*futures, return_exceptions=True)
        return outcomes

    async def _handle(
        self, goal: Goal, plan: Plan | BaseException, stop: threading.Event
    ) -> Outcome:
        if isinstance(plan, BaseException):
            raise ReservationError(f"planning failed: {plan}")
        self.metrics.candidates.inc(plan.candidates)
        if plan.over_bound:
            await self._report(goal, "MakeRoomNoPlan", plan.reason, warning=True)
            self.metrics.plans.labels("over-bound").inc()
            return "over-bound"
        if not plan.feasible:
            message = f"no plan within {self.settings.max_moves} moves: {plan.reason}"
            await self._report(goal, "MakeRoomNoPlan", message, warning=True)
            self.metrics.plans.labels("no-plan").inc()
            return "no-plan"
        if not plan.moves:
            return "nothing"
        text = describe(plan)
        if not self.settings.apply:
            await self._report(goal, "MakeRoomPlan", f"dry run: {text}")
            self.metrics.plans.labels("planned").inc()
            return "planned"
        limited = self._over_tenant_limit(goal, len(plan.moves))
        if limited:
            await self._report(goal, "MakeRoomLimited", limited, warning=True)
            self.metrics.plans.labels("limited").inc()
            return "limited"
        stop.set()  # one plan in flight: the others would be planned on a cluster about to change
        return await self._execute(goal, plan, text)

    def _plan(
        self, goal: Goal, snapshot: Snapshot, stop: threading.Event
    ) -> tuple[Goal, Plan | BaseException]:
        """In a planner thread: the goal's plan within its budget and deadline."""
        deadline = time.monotonic() + self.settings.plan_seconds
        bound = Bound(
            candidates=self.settings.max_candidates,
            expired=lambda: stop.is_set() or time.monotonic() > deadline,
        )
        try:
            if goal.kind == "place":
                return goal, plan_placement(
                    snapshot, goal.key, max_moves=self.settings.max_moves, bound=bound
                )
            return goal, plan_drain(
                snapshot, goal.key, max_moves=self.settings.max_moves, bound=bound
            )
        except Exception as exc:  # a bug in one goal's plan is that goal's error, not the round's
            log.exception("planning failed", extra={"goal": str(goal)})
            return goal, exc

    def _over_tenant_limit(self, goal: Goal, moves: int) -> str:
        """Why a plan of ``moves`` for ``goal`` must wait, or "": a drain is the platform's."""
        if goal.kind != "place":
            return ""
        tenant = tenant_of(goal.key.split("/", 1)[0])
        caused = self._caused.setdefault(tenant, deque())
        horizon = self._clock() - self.settings.tenant_period
        while caused and caused[0] <= horizon:
            caused.popleft()
        limit = self.settings.tenant_migrations
        if len(caused) + moves <= limit:
            return ""
        return (
            f"waiting: the pending VMs of {tenant} caused {len(caused)} live migrations in the "
            f"last {self.settings.tenant_period:g}s (at most {limit}); this plan needs {moves}"
        )

    def _count_caused(self, goal: Goal) -> None:
        if goal.kind == "place":
            tenant = tenant_of(goal.key.split("/", 1)[0])
            self._caused.setdefault(tenant, deque()).append(self._clock())

    async def _execute(self, goal: Goal, plan: Plan, text: str) -> Outcome:
        await self._report(goal, "MakeRoomStarted", text, force=True)
        log.info("carrying out plan", extra={"goal": str(goal), "plan": text})
        for step, move in enumerate(plan.moves, start=1):
            fresh = snapshot_from_objects(await self._objects())
            broken = replay(
                fresh,
                plan.moves[step - 1 :],
                pending=goal.key if goal.kind == "place" else None,
                target=plan.target,
                drain=goal.key if goal.kind == "drain" else None,
            )
            if broken:
                message = f"stopped before step {step}: the cluster changed under the plan: "
                await self._stop(goal, "MakeRoomInvalidated", message + broken, "invalidated")
                return "invalidated"
            hostname = next(
                (n.labels.get(HOSTNAME, n.name) for n in fresh.nodes if n.name == move.target),
                move.target,
            )
            self._count_caused(goal)
            result = await self._migrate(move, hostname, step, len(plan.moves))
            self.metrics.migrations.labels(result).inc()
            if result != "Succeeded":
                message = f"stopped at step {step}: migrating {move.vm} to {move.target}: {result}"
                await self._stop(goal, "MakeRoomFailed", message, "failed")
                return "failed"
        await self._report(goal, "MakeRoomDone", f"done: {text}", force=True)
        self.metrics.plans.labels("done").inc()
        return "done"

    async def _stop(self, goal: Goal, reason: str, message: str, outcome: Outcome) -> None:
        log.warning("plan stopped", extra={"goal": str(goal), "reason": message})
        await self._report(goal, reason, message, warning=True, force=True)
        self.metrics.plans.labels(outcome).inc()

    async def _migrate(self, move: Move, hostname: str, step: int, steps: int) -> str:
        namespace, name = move.vm.split("/", 1)
        migration = _migration_name(name)
        body = {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstanceMigration",
            "metadata": {
                "name": migration,
                "namespace": namespace,
                "annotations": {PLAN_ANNOTATION: f"{step}/{steps}"},
                "labels": {"app.kubernetes.io/managed-by": COMPONENT},
            },
            "spec": {"vmiName": name, "addedNodeSelector": {HOSTNAME: hostname}},
        }
        created = await self.client.create(MIGRATIONS, body)
        created_name = str(_map(created.get("metadata")).get("name") or migration)
        deadline = time.monotonic() + self.settings.migration_timeout
        while time.monotonic() < deadline:
            current = await self.client.get(MIGRATIONS, namespace, created_name)
            phase = _map(current.get("status")).get("phase")
            if phase in ("Succeeded", "Failed"):
                return str(phase)
            await asyncio.sleep(self.settings.poll)
        return f"no result within {self.settings.migration_timeout:g}s"

    async def _objects(self) -> list[Mapping[str, Any]]:
        objects: list[Mapping[str, Any]] = []
        for ref, kind in ((NODES, "Node"), (PODS, "Pod"), (VMIS, "VirtualMachineInstance")):
            listed = await self.client.request("GET", ref.path())
            items = listed.get("items")
            for item in items if isinstance(items, list) else []:
                if isinstance(item, Mapping):
                    objects.append({**item, "kind": kind})
        return objects

    async def _report(
        self, goal: Goal, reason: str, message: str, *, warning: bool = False, force: bool = False
    ) -> None:
        if not force and self._reported.get(goal) == message:
            return
        self._reported[goal] = message
        if goal.kind == "place":
            namespace, name = goal.key.split("/", 1)
            # An Event the tenant reads: other tenants' VMs are not named (the log names them).
            shown = for_tenant(message, tenant_of(namespace), self._vm_keys)
            if shown != message:
                log.info("make-room event", extra={"goal": str(goal), "message": message})
            message = shown
            involved = {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "namespace": namespace,
                "name": name,
            }
        else:
            namespace, name = "default", goal.key
            involved = {"apiVersion": "v1", "kind": "Node", "name": name}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            # Events hold at most 1 KiB of message in practice; the plan is short by design.
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        log.info("event", extra={"goal": str(goal), "reason": reason, "event_message": message})
        try:
            await self.client.create(EVENTS, event)
        except ApiError as exc:  # an Event is a report, never a reason to stop
            log.warning("event not recorded", extra={"error": str(exc)})


def describe(plan: Plan) -> str:
    steps = "; ".join(
        f"{i}. {m.vm} {m.source} -> {m.target}" for i, m in enumerate(plan.moves, start=1)
    )
    where = f" then start on {plan.target}" if plan.target else ""
    return f"{len(plan.moves)} live migration(s): {steps}{where}"


def _migration_name(vmi: str) -> str:
    return f"make-room-{vmi}"[:240].rstrip("-.") + f"-{time.time_ns() % 10**8:08d}"


def _map(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


class RebalanceInputError(ReservationError):
    """Bad arguments to ``webhook rebalance``."""


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.max_moves <= MAX_MOVES_CAP:
        raise RebalanceInputError(f"--max-moves: {args.max_moves} is not between 1 and 5")
    if args.interval <= 0 or args.migration_timeout <= 0:
        raise RebalanceInputError("--interval and --migration-timeout must be positive")
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        raise RebalanceInputError(f"--listen: {args.listen!r} is not HOST:PORT")
    if args.max_candidates < 1 or not args.plan_seconds > 0 or args.planners < 1:
        raise RebalanceInputError(
            "--max-candidates and --planners must be at least 1, --plan-seconds positive"
        )
    if args.tenant_migrations < 0 or not args.tenant_period > 0 or args.tenant_goals < 1:
        raise RebalanceInputError(
            "--tenant-migrations must be 0 or more, --tenant-period positive and "
            "--tenant-goals at least 1"
        )
    settings = RebalanceSettings(
        apply=args.apply,
        all_vms=args.all_vms,
        interval=args.interval,
        max_moves=args.max_moves,
        migration_timeout=args.migration_timeout,
        max_candidates=args.max_candidates,
        plan_seconds=args.plan_seconds,
        planners=args.planners,
        tenant_migrations=args.tenant_migrations,
        tenant_period=args.tenant_period,
        tenant_goals=args.tenant_goals,
    )
    logging.basicConfig(level=logging.INFO)
    return asyncio.run(_main(args.kubeconfig, settings, host, int(port), once=args.once))


async def _main(
    kubeconfig: str | None, settings: RebalanceSettings, host: str, port: int, *, once: bool
) -> int:
    client = KubeClient.from_kubeconfig(kubeconfig) if kubeconfig else KubeClient.in_cluster()
    rebalancer = Rebalancer(client, settings)
    try:
        if once:
            try:
                for goal, outcome in await rebalancer.round():
                    print(f"{goal}: {outcome}")
            finally:
                rebalancer.close()
            return 0
        app = web.Application()

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(
                body=generate_latest(rebalancer.metrics.registry),
                content_type="text/plain",
                charset="utf-8",
            )

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host or "0.0.0.0", port).start()
        stop = asyncio.Event()
        try:
            await rebalancer.run(stop)
        finally:
            await runner.cleanup()
        return 0
    finally:
        await client.close()

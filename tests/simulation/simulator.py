"""The simulator: replicas, clients and an API server, every choice drawn from one seed.

A run sets up tenants with budgets and a few applications, starts 2 or 3 replicas, then takes
a few dozen steps. Each step is one choice of the seeded generator among what can happen now:

- a client asks a random replica to admit a create, grow, shrink or budget change (sometimes
  the scripted stale-settle sequence: shrink an application, grow it back through one replica,
  create another through a different one);
- in half the runs applications are updated as cozystack-api updates them, with no
  resourceVersion precondition: clients then also label an application from a copy they read
  earlier, and sometimes run the scripted stale-write sequence (label from a copy, shrink, fill
  the room the shrink seems to free, and only then store the label, which writes the old size
  back);
- the API server stores an admitted change (or a later admission step rejects it), or a client
  deletes an application;
- a pending API call is answered (or fails), a watch delivers its next event (in order within
  its resource, in any order across resources and replicas), sends a bookmark, ends with
  ``410 Gone``, or stays silent until the read timeout;
- the clock moves (a little, past a grace period, or past a read timeout);
- a replica restarts, the Lease moves, or someone else writes a TenantReservation (so the next
  ledger write conflicts).

After every step the oracle recomputes every pool from the stored objects and fails the run if
a step pushed one past its budget. Then the run quiesces (everything delivered, every grace
period passed) and every replica must be synced, hold nothing, see exactly the stored charges
and budgets, and decide at the exact edge of every pool as the stored objects say.

The trace records every choice; :func:`run` returns it with the verdict, and a failing seed
replays exactly with ``python -m tests.simulation --seed N``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import gc
import json
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from tests import builders
from tests.builders import THING_DEFINITION
from tests.simulation import replica as replica_module
from tests.simulation.apiserver import SimAPI
from tests.simulation.loop import VirtualLoop
from tests.simulation.oracle import THINGS, Figures, lowered, overshoots, pools
from tests.simulation.replica import READ_TIMEOUT, Replica
from webhook.core.admission.decisions import Decision, Policy, mutate
from webhook.core.admission.reviews import parse_review
from webhook.core.admission.state import ReservationState
from webhook.core.pricing import kinds as kinds_module
from webhook.core.pricing.contracts import Contract, compile_contract
from webhook.core.tenancy.applications import application_from_object
from webhook.core.tenancy.records import MIN_KEY_BYTES, RecordKeys
from webhook.core.tenancy.tenants import parent_namespace
from webhook.kube import reflector as reflector_module
from webhook.kube.client import ApiError
from webhook.settings import Settings
from webhook.state import live as live_module
from webhook.waits import sleep_unless_stopped

Obj = dict[str, Any]
SCHEDULED = {"tenants", "things", "tenantreservations", "helmreleases"}
ROOT = Path(__file__).resolve().parents[2]
TENANT_DEFINITION = ROOT / "fixtures/cozystack/applicationdefinitions/tenant.yaml"
NAMES = ("x", "y", "z")
GI = 1024**3
POLICY = Policy(mode="enforce")
HEARTBEAT_SECONDS = 10.0
# The API server's side of the contract the grace period relies on: a webhook call answered
# after timeoutSeconds (10 s by default) fails the request, and an admitted request is stored
# within kube-apiserver's --request-timeout (60 s by default) of its answer or not at all.
WEBHOOK_TIMEOUT = 10.0
STORE_DEADLINE = Settings().api_request_timeout_seconds
QUIESCE_STEP = 5.0
EPOCH = 1_800_000_000.0  # the wall clock at virtual time 0 (2027): entries carry wall times


@dataclass
class Admitted:
    """A change a replica allowed, waiting for the API server to store it (or not)."""

    uid: str
    operation: str
    plural: str
    obj: Obj  # as the mutating webhook left it: what the API server stores
    old_version: str  # the resourceVersion the client read; "" for a create
    sent: float  # when the API server called the webhook
    told: int = 0  # the newest Tenant version the deciding replica had been sent
    answered: float = 0.0  # when the webhook allowed it
    version: int = 0  # the resourceVersion it was stored at
    # What was stored when it was sent: an unconditioned update that writes back the stored
    # spec it read adds nothing, so it may land above a lowered budget up to the pools then.
    read_spec: Obj | None = None
    read_pools: Figures = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


@dataclass
class Outcome:
    seed: int
    ok: bool
    problem: str
    trace: list[str]
    steps: int
    admitted: int = 0
    stored: int = 0
    paths: dict[str, int] = field(default_factory=dict)  # admissions by the path that took them

    def report(self, command: str) -> str:
        lines = [f"seed {self.seed}: {self.problem}", *self.trace, f"replay: {command}"]
        return "\n".join(lines)


class Violation(Exception):
    pass


@dataclass
class Workload:
    """The tenants and namespaces one seed draws."""

    tenants: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)


class Simulation:
    """One seeded run."""

    def __init__(self, seed: int, *, steps: int | None = None, escrow: bool = False) -> None:
        self.seed = seed
        self.escrow = escrow  # the replicas admit from escrowed slices (docs/escrow.md)
        self.rng = random.Random(seed)
        self.trace: list[str] = []
        self.loop = VirtualLoop()
        # Drawn apart, so the runs with preconditions draw exactly what they drew before.
        self.unconditioned = random.Random(f"unconditioned-{seed}").random() < 0.5
        self.api = SimAPI(
            SCHEDULED,
            self._log,
            unconditioned=frozenset({"things"}) if self.unconditioned else frozenset(),
        )
        self.copies: dict[tuple[str, str], list[Obj]] = {}  # versions of each thing, as read
        self.slow: set[str] = set()  # admitted, kept from storage until the script says
        self.replicas: dict[str, Replica] = {}
        self.leader = "r1"
        self.admitting: dict[str, tuple[str, asyncio.Task[Decision]]] = {}
        self.admitted: list[Admitted] = []
        # The scripted client: each step, when it is ready to run.
        self.script: list[tuple[Callable[[], bool], Callable[[], None]]] = []
        self.versions: dict[str, int] = {}  # uid -> resourceVersion it was stored at
        self.allowed_uids: set[str] = set()
        self.scripted: set[tuple[str, str, str]] = set()  # what the scripted client works on
        self.requests = 0
        self.allowed = 0
        self.stored = 0
        self.restarts = 0
        self.taken = 0
        self.steps = steps if steps is not None else self.rng.randint(20, 45)
        self.workload = Workload()
        self._figures: Figures = {}
        self.checked: Figures = {}  # the oracle's figures at the last check
        self._figures_at = -1
        self.landing: Admitted | None = None  # the change the current step stored
        self.lowered: dict[tuple[str, str], int] = {}  # (pool, key) -> version that lowered it
        # How eagerly each (replica, resource) stream is fed: a slow one lags behind the others.
        self.lag: dict[tuple[str, str], float] = {}
        self.heartbeat = self.rng.choice((1.0, 0.9, 0.6))
        self.keys = RecordKeys(self.rng.randbytes(MIN_KEY_BYTES))  # the record-key Secret

    # -- clocks and trace ----------------------------------------------------------------

    def monotonic(self) -> float:
        return self.loop.time()

    def wall(self) -> float:
        return EPOCH + self.loop.time()

    def _log(self, line: str) -> None:
        self.trace.append(f"{self.loop.time():9.3f} {line}")

    def _is_leader(self, name: str) -> bool:
        return name == self.leader

    # -- setup ---------------------------------------------------------------------------

    def _setup(self) -> None:
        rng = self.rng
        self.api.create("applicationdefinitions", _tenant_definition())
        self.api.create("applicationdefinitions", THING_DEFINITION)
        tenants = self.workload.tenants
        # With escrow, pools roomy enough to split (else every admission takes the exact path).
        scale = 2 if self.escrow else 1
        tenants[("tenant-root", "a")] = {
            "memory": f"{rng.choice((8, 12, 16)) * scale}Gi",
            "cpu": str(rng.choice((4, 8)) * scale),
        }
        # Half the runs also count a's things; drawn apart so the other draws stay as they were.
        counts = random.Random(f"counts-{self.seed}")
        if counts.random() < 0.5 and not self.escrow:
            tenants[("tenant-root", "a")][THINGS] = str(counts.randint(2, 6))
        namespaces = ["tenant-a"]
        if rng.random() < 0.6:
            tenants[("tenant-a", "b")] = rng.choice(
                ({"memory": f"{rng.choice((2, 4, 6))}Gi"}, {"cpu": "2"}, {})
            )
            namespaces.append("tenant-a-b")
        if rng.random() < 0.3:
            tenants[("tenant-root", "c")] = {"memory": f"{rng.choice((4, 8))}Gi"}
            namespaces.append("tenant-c")
        self.workload.namespaces = namespaces
        for (namespace, name), quotas in tenants.items():
            spec = {"resourceQuotas": dict(quotas)} if quotas else {}
            self.api.create("tenants", _app("Tenant", namespace, name, spec))
        annotated = rng.random() < 0.7
        setup_state = ReservationState(builders.platform(), keys=self.keys)
        for _ in range(rng.randint(0, 3)):
            namespace, name = rng.choice(namespaces), rng.choice(NAMES)
            obj = _app("Thing", namespace, name, {"memory": f"{rng.randint(1, 4)}Gi"})
            if annotated:  # admitted through the webhook; else stored before it was installed
                obj = _mutated(_review("setup", "CREATE", obj, None), setup_state)
            trial = {**self.api.objects, ("things", namespace, name): obj}
            if ("things", namespace, name) not in self.api.objects and not overshoots(
                {}, pools(trial)
            ):
                self.api.create("things", obj)
        count = rng.choice((2, 3))
        for index in range(1, count + 1):
            for plural in sorted(SCHEDULED):
                self.lag[(f"r{index}", plural)] = rng.choice((1.0, 1.0, 0.3, 0.05))
        self._log(
            f"setup  tenants {sorted((f'{n}/{t}', q) for (n, t), q in tenants.items())} "
            f"replicas {count} steps {self.steps}"
            + (" unconditioned updates" if self.unconditioned else "")
        )
        for (plural, namespace, name), obj in sorted(self.api.objects.items()):
            if plural in ("tenants", "things"):
                self._log(f"stored {plural} {namespace}/{name} {obj.get('spec')}")
        for index in range(1, count + 1):
            self._start(f"r{index}")
        self._warm_up()

    def _start(self, name: str) -> None:
        self.replicas[name] = Replica(
            self.api,
            name,
            monotonic=self.monotonic,
            wall=self.wall,
            is_leader=self._is_leader,
            keys=self.keys,
            escrow=self.escrow,
        )

    def _warm_up(self) -> None:
        """Answer and deliver everything until every replica has synced once."""
        for _ in range(400):
            self.loop.run_until_idle()
            if all(r.synced for r in self.replicas.values()) and not self.api.calls:
                return
            for call in list(self.api.calls):
                self.api.answer(call)
            for stream in list(self.api.streams):
                while self.api.pending(stream) > 0 and not stream.closed:
                    self.api.deliver(stream)
            self.loop.advance(0.25)
        raise Violation("the replicas never synced at start")

    # -- the steps -----------------------------------------------------------------------

    def _choices(self) -> list[tuple[float, Callable[[], None]]]:
        api = self.api
        choices: list[tuple[float, Callable[[], None]]] = [
            (1.5, self._tick_small),
            (0.25, self._tick_grace),
            (0.08, self._tick_read_timeout),
        ]
        if len(self.admitting) < 4:
            choices.append((3.0, self._client))
        if self.admitted:
            choices.append((2.5, self._store))
        if any(p == "things" for p, _, _ in api.objects):
            choices.append((0.3, self._delete))
        if api.calls:
            choices.append((5.0, self._answer))
        for stream in api.streams:
            weight = self.lag.get((stream.replica, stream.plural), 1.0)
            if api.pending(stream) > 0:
                choices.append((2.0 * weight, lambda s=stream: api.deliver(s)))  # type: ignore[misc]
            else:
                choices.append((0.3 * weight, lambda s=stream: api.bookmark(s)))  # type: ignore[misc]
        if api.streams:
            choices.append((0.1, self._gone))
        choices.append((0.04, self._restart))
        choices.append((0.08, self._move_lease))
        choices.append((0.15, self._touch))
        return choices

    def _step(self) -> None:
        take(self.rng, self._choices())

    def _tick_small(self) -> None:
        self._advance(self.rng.choice((0.05, 0.2, 0.5, 1.0, 2.0)))

    def _tick_grace(self) -> None:
        # Around the grace period the replicas hold entries for: the edge a rule must get right.
        self._advance(replica_module.GRACE_SECONDS + self.rng.uniform(-2.0, 4.0))

    def _tick_read_timeout(self) -> None:
        self._advance(READ_TIMEOUT + self.rng.uniform(-5.0, 5.0))

    def _advance(self, seconds: float) -> None:
        """Move the clock; on a long wait the server heartbeats most caught-up watches (a
        bookmark), and the others stay silent into their read timeout."""
        self._log(f"tick   +{seconds:.3f}s")
        # The API server finishes what it admitted within its request deadline: a change due
        # before the clock gets there is stored now (or, rarely, fails in storage).
        due = self.loop.time() + seconds
        for change in [c for c in self.admitted if c.answered + STORE_DEADLINE <= due]:
            self.admitted.remove(change)
            if self.rng.random() < 0.05:
                self._log(f"store  {change.uid}: the request timed out before it was stored")
            else:
                self._persist(change)
                self._check()
        while seconds > HEARTBEAT_SECONDS:
            for stream in list(self.api.streams):
                if self.api.pending(stream) == 0 and self.rng.random() < self.heartbeat:
                    self.api.bookmark(stream)
            self.loop.advance(HEARTBEAT_SECONDS)
            seconds -= HEARTBEAT_SECONDS
        self.loop.advance(seconds)

    def _answer(self) -> None:
        call = self.rng.choice(self.api.calls)
        roll = self.rng.random()
        if roll < 0.04:
            self.api.answer(call, fail=ApiError(0, "Unreachable", "connection reset"))
        else:
            self.api.answer(call)

    def _gone(self) -> None:
        self.api.gone(self.rng.choice(self.api.streams))

    def _restart(self) -> None:
        if self.restarts >= 2:
            return
        self.restarts += 1
        name = self.rng.choice(sorted(self.replicas))
        self._log(f"restart {name}")
        self.replicas.pop(name).stop()
        for uid, (replica, task) in list(self.admitting.items()):
            if replica == name:
                task.cancel()
                self.admitting.pop(uid)
                self._log(f"lost   {uid}: the webhook call failed (replica restarted)")
        self.loop.run_until_idle()
        self._start(name)

    def _move_lease(self) -> None:
        self.leader = self.rng.choice(sorted(self.replicas))
        self._log(f"lease  -> {self.leader}")

    def _touch(self) -> None:
        """Someone else (kubectl label, another controller) writes a TenantReservation."""
        stored = [k for k in sorted(self.api.objects) if k[0] == "tenantreservations"]
        if not stored:
            return
        key = self.rng.choice(stored)
        obj = self.api.get(*key)
        assert obj is not None
        labels = dict(obj["metadata"].get("labels") or {})
        labels["touched"] = str(int(labels.get("touched", "0")) + 1)
        obj["metadata"]["labels"] = labels
        written = self.api.replace("tenantreservations", obj)
        self._log(f"touch  {key[1]}/{key[2]} rv {written['metadata']['resourceVersion']}")

    # -- clients -------------------------------------------------------------------------

    def _things(self) -> list[tuple[str, str, str]]:
        return [k for k in sorted(self.api.objects) if k[0] == "things"]

    def _client(self) -> None:
        rng = self.rng
        if not self.script and rng.random() < 0.15:
            self._plan_stale_settle()
        if self.unconditioned and not self.script and rng.random() < 0.25:
            self._plan_stale_write()
        if self.script:
            ready, op = self.script[0]
            if ready():
                self.script.pop(0)
                op()
                return
            if rng.random() < 0.85:
                return  # the scripted client waits; others may still come in
        if self.escrow and rng.random() < 0.5:
            self._burst()
            return
        roll = rng.random()
        things = [k for k in self._things() if not self.script or k not in self.scripted]
        if self.unconditioned and things and rng.random() < 0.2:
            _, namespace, name = rng.choice(things)
            current = self.api.get("things", namespace, name)
            copies = self.copies.get((namespace, name)) or ([current] if current else [])
            if copies:
                self._op_label(namespace, name, rng.choice(copies), self._any_replica())
            return
        if roll < 0.4 or not things:
            namespace, name = rng.choice(self.workload.namespaces), rng.choice(NAMES)
            if ("things", namespace, name) in self.scripted and self.script:
                return
            self._op_create(namespace, name, rng.randint(1, 6), self._any_replica())
        elif roll < 0.65:
            _, namespace, name = rng.choice(things)
            self._op_resize(namespace, name, +rng.randint(1, 4), self._any_replica())
        elif roll < 0.85:
            _, namespace, name = rng.choice(things)
            self._op_resize(namespace, name, -rng.randint(1, 4), self._any_replica())
        else:
            self._op_budget(self._any_replica())

    def _burst(self) -> None:
        """A few small creates through one replica at one instant: the rate a slice is granted
        for, and then spent from."""
        replica = self._any_replica()
        namespace = self.rng.choice(self.workload.namespaces)
        for _ in range(self.rng.randint(2, 6)):
            if len(self.admitting) >= 10:
                return
            name = f"b{self.requests + 1}"  # a new name each: a burst fills its pool
            self._op_create(namespace, name, self.rng.randint(1, 3), replica)

    def _decided_(self, uids: dict[str, str | None], step: str) -> Callable[[], bool]:
        """Ready once the scripted request ``step`` has been answered by its replica."""
        return lambda: uids.get(step) is None or uids[step] not in self.admitting

    def _stored_(self, uids: dict[str, str | None], step: str) -> Callable[[], bool]:
        """Ready once the scripted request ``step`` is stored (or will never be)."""
        return lambda: (
            self._decided_(uids, step)() and all(c.uid != uids[step] for c in self.admitted)
        )

    def _went_through(self, uid: str | None) -> bool:
        """Whether a request was allowed (and, when stored by now, stored)."""
        return uid is not None and (uid in self.versions or uid in self.allowed_uids)

    def _any_replica(self) -> str:
        return self.rng.choice(sorted(self.replicas))

    def _plan_stale_settle(self) -> None:
        """The order of events that lets a stale copy settle another replica's entry: replica
        B's application watch falls behind; an application is shrunk, then grown back through
        replica A; B counts A's entry while it still shows the old size; B catches up with the
        shrink (and not yet the growth) and is asked for a create that fits only if A's growth
        is forgotten."""
        things = [k for k in self._things() if _gib_of(self.api.objects[k]) >= 2]
        if not things or len(self.replicas) < 2:
            return
        _, namespace, name = self.rng.choice(things)
        first, second = self.rng.sample(sorted(self.replicas), 2)
        amount = self.rng.randint(1, _gib_of(self.api.objects[("things", namespace, name)]) - 1)
        small, big = self.rng.sample([n for n in NAMES if n != name], 2)
        lag = self.lag.get((second, "things"), 1.0)
        uids: dict[str, str | None] = {}
        self.scripted = {("things", namespace, n) for n in (name, small, big)}

        def set_lag(value: float) -> None:
            self.lag[(second, "things")] = value
            self._log(f"lag    {second} things {value}")

        def told_shrink(replica: str) -> Callable[[], bool]:
            """Ready once ``replica`` has been sent the shrink (or it never happened)."""

            def ready() -> bool:
                version = self.versions.get(uids.get("shrink") or "", 0)
                return self.api.told.get((replica, "things"), 0) >= version

            return ready

        def step(key: str, op: Callable[[], str | None], needs: str = "") -> Callable[[], None]:
            def run() -> None:
                if needs and not self._went_through(uids.get(needs)):
                    self.script.clear()  # the sequence broke down: give up on it
                    set_lag(lag)
                    self._log(f"script abandoned: {needs} did not go through")
                    return
                uids[key] = op()

            return run

        def synced() -> bool:
            return all(r.synced for r in self.replicas.values())

        def always() -> bool:
            return True

        self.script = [
            (synced, lambda: set_lag(0.0)),
            (always, step("shrink", lambda: self._op_resize(namespace, name, -amount, first))),
            (
                lambda: self._stored_(uids, "shrink")() and told_shrink(first)(),
                step("grow", lambda: self._op_resize(namespace, name, +amount, first), "shrink"),
            ),
            (
                self._decided_(uids, "grow"),
                step("count", lambda: self._op_create(namespace, small, 1, second), "grow"),
            ),
            (self._decided_(uids, "count"), lambda: set_lag(lag)),
            (
                told_shrink(second),
                step("fill", lambda: self._op_fill(namespace, big, amount, second)),
            ),
        ]
        self._log(f"script stale-settle on {namespace}/{name} via {first} then {second}")

    def _plan_stale_write(self) -> None:
        """cozystack-api's lost update, as tenants met it: a label patch of an application reads
        it and is admitted; a shrink of it is admitted, stored and observed; a create as large
        as the room the shrink seems to free is asked for; only then is the label patch stored,
        and with no precondition it writes the old size back."""
        things = [k for k in self._things() if _gib_of(self.api.objects[k]) >= 2]
        if not things:
            return
        _, namespace, name = self.rng.choice(things)
        read = self.api.get("things", namespace, name)
        assert read is not None
        labeller, shrinker, filler = (self._any_replica() for _ in range(3))
        amount = self.rng.randint(1, _gib_of(read) - 1)
        big = self.rng.choice([n for n in NAMES if n != name])
        uids: dict[str, str | None] = {}
        self.scripted = {("things", namespace, n) for n in (name, big)}

        def step(key: str, op: Callable[[], str | None], needs: str = "") -> Callable[[], None]:
            def run() -> None:
                if needs and not self._went_through(uids.get(needs)):
                    self.script.clear()
                    self.slow.clear()
                    self._log(f"script abandoned: {needs} did not go through")
                    return
                uids[key] = op()

            return run

        def label() -> str | None:
            uid = self._op_label(namespace, name, read, labeller)
            if uid is not None:
                self.slow.add(uid)  # the API server takes its time to write it
            return uid

        def told_shrink() -> bool:
            version = self.versions.get(uids.get("shrink") or "", 0)
            return self.api.told.get((filler, "things"), 0) >= version

        def release() -> None:
            self.slow.clear()
            self._log("script the label patch may be stored now")

        self.script = [
            (lambda: all(r.synced for r in self.replicas.values()), step("label", label)),
            (
                self._decided_(uids, "label"),
                step(
                    "shrink", lambda: self._op_resize(namespace, name, -amount, shrinker), "label"
                ),
            ),
            (
                lambda: self._stored_(uids, "shrink")() and told_shrink(),
                step(
                    "fill",
                    lambda: self._op_fill(namespace, big, 0, filler, count_coming=False),
                    "shrink",
                ),
            ),
            (self._decided_(uids, "fill"), release),
        ]
        self._log(f"script stale-write on {namespace}/{name} via {labeller}, {shrinker}, {filler}")

    def _op_label(self, namespace: str, name: str, read: Obj, replica: str) -> str | None:
        """``kubectl label`` of an application, as cozystack-api applies it to the copy ``read``
        (perhaps long since replaced): its spec and annotations, one label changed."""
        labels = dict(read["metadata"].get("labels") or {})
        labels["touched"] = str(int(labels.get("touched", "0")) + 1)
        return self._admit(
            replica,
            "UPDATE",
            "Thing",
            namespace,
            name,
            dict(read["spec"]),
            read,
            metadata={"labels": labels, "annotations": read["metadata"].get("annotations")},
        )

    def _op_fill(
        self, namespace: str, name: str, extra: int, replica: str, *, count_coming: bool = True
    ) -> str | None:
        """A create as large as the room left in the namespace's memory pool, plus ``extra``
        (less what admitted changes not stored yet will add, when ``coming``)."""
        pool = _bounder(self._pools(), namespace, "memory")
        if pool is None:
            return None
        usage, budget = self._pools()[(pool, "memory")]
        if not count_coming:
            gib = int((budget - usage) // GI) + extra
            return self._op_create(namespace, name, gib, replica) if gib > 0 else None
        coming = 0  # admitted, not stored yet: growth the replica rightly counts
        for change in self.admitted:
            if (
                change.plural == "things"
                and _bounder(self._pools(), change.namespace, "memory") == pool
            ):
                old = self.api.get("things", change.namespace, change.name)
                coming += max(0, _gib_of(change.obj) - (_gib_of(old) if old else 0))
        gib = int((budget - usage) // GI) - coming + extra
        return self._op_create(namespace, name, gib, replica) if gib > 0 else None

    def _op_create(self, namespace: str, name: str, gib: int, replica: str) -> str | None:
        spec = {"memory": f"{gib}Gi"}
        if self.rng.random() < 0.3:
            spec["cpu"] = str(self.rng.randint(1, 2))
        return self._admit(replica, "CREATE", "Thing", namespace, name, spec, None)

    def _op_resize(self, namespace: str, name: str, change: int, replica: str) -> str | None:
        old = self.api.get("things", namespace, name)
        if old is None:
            return None
        spec = {**old["spec"], "memory": f"{max(1, _gib_of(old) + change)}Gi"}
        return self._admit(replica, "UPDATE", "Thing", namespace, name, spec, old)

    def _op_budget(self, replica: str) -> str | None:
        key = self.rng.choice(sorted(self.workload.tenants))
        old = self.api.get("tenants", *key)
        quotas = dict(((old or {}).get("spec") or {}).get("resourceQuotas") or {})
        if old is None or not quotas:
            return None
        resource = self.rng.choice(sorted(quotas))
        value = Decimal(_gib(quotas[resource]))
        value = max(Decimal(1), value + self.rng.choice((-2, -1, 1, 2)))
        quotas[resource] = f"{value}Gi" if resource == "memory" else str(value)
        spec = {**old["spec"], "resourceQuotas": quotas}
        return self._admit(replica, "UPDATE", "Tenant", key[0], key[1], spec, old)

    def _admit(
        self,
        replica: str,
        operation: str,
        kind: str,
        namespace: str,
        name: str,
        spec: Obj,
        old: Obj | None,
        *,
        metadata: Obj | None = None,
    ) -> str | None:
        """The API server's admission of one request: the mutating webhook records the charge
        annotation, then the validating webhook (the ledger) decides."""
        if replica not in self.replicas:
            return None
        self.requests += 1
        uid = f"u{self.requests}"
        obj = _app(kind, namespace, name, spec)
        for field_name, value in (metadata or {}).items():
            if value is not None:
                obj["metadata"][field_name] = copy.deepcopy(value)
        if old is not None:
            obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        ledger = self.replicas[replica].ledger
        obj = _mutated(_review(uid, operation, obj, old), ledger.live.state)
        request = parse_review(_review(uid, operation, obj, old))
        before = f" from {old['spec']} rv {old['metadata']['resourceVersion']}" if old else ""
        self._log(
            f"admit  {uid} via {replica}: {operation} {kind} {namespace}/{name} {spec}{before}"
        )
        task = asyncio.ensure_future(ledger.admit(request, POLICY), loop=self.loop)
        self.admitting[uid] = (replica, task)
        change = Admitted(
            uid,
            operation,
            kind.lower() + "s",
            obj,
            str(old["metadata"]["resourceVersion"]) if old else "",
            sent=self.loop.time(),
            told=self.api.told.get((replica, "tenants"), 0),
        )
        if operation == "UPDATE" and self.unconditioned:
            current = self.api.get(change.plural, namespace, name)
            change.read_spec = copy.deepcopy(current["spec"]) if current else None
            change.read_pools = self._pools()
        task.add_done_callback(lambda t: self._decided(change, t))
        return uid

    def _decided(self, change: Admitted, task: asyncio.Task[Decision]) -> None:
        if self.admitting.pop(change.uid, None) is None or task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._log(f"crash  {change.uid}: {error!r}")
            self.errors.append(f"admission {change.uid} raised {error!r}")
            return
        decision = task.result()
        verdict = "allowed" if decision.allowed else f"denied ({decision.reason})"
        late = self.loop.time() - change.sent > WEBHOOK_TIMEOUT
        self._log(
            f"decide {change.uid}: {verdict}{' too late: the call timed out' if late else ''}"
        )
        if decision.allowed and not late:
            self.allowed += 1
            self.allowed_uids.add(change.uid)
            change.answered = self.loop.time()
            self.admitted.append(change)

    errors: list[str]

    def _store(self) -> None:
        ready = [c for c in self.admitted if c.uid not in self.slow]
        if not ready:
            return
        change = ready[self.rng.randrange(len(ready))]
        self.admitted.remove(change)
        if self.rng.random() < 0.08:
            self._log(f"reject {change.uid}: a later admission step refused it")
            return
        self._persist(change)

    def _persist(self, change: Admitted) -> None:
        api = self.api
        if self.loop.time() - change.answered > STORE_DEADLINE:
            self._log(f"store  {change.uid}: the request timed out before it was stored")
            return
        try:
            if change.operation == "CREATE":
                stored = api.create(change.plural, change.obj)
            else:
                body = copy.deepcopy(change.obj)
                body["metadata"]["resourceVersion"] = change.old_version
                stored = api.replace(change.plural, body)
        except ApiError as exc:
            self._log(f"store  {change.uid}: {exc.status} {exc.reason}")
            return
        self.stored += 1
        self.landing = change
        if change.plural == "things":
            kept = self.copies.setdefault((change.namespace, change.name), [])
            kept[:] = [*kept[-3:], stored]  # the last few versions a client may have read
        change.version = int(stored["metadata"]["resourceVersion"])
        self.versions[change.uid] = change.version
        self._log(
            f"store  {change.uid}: {change.plural} {change.namespace}/{change.name} "
            f"{change.obj['spec']} rv {change.version}"
        )

    def _delete(self) -> None:
        things = [k for k in self._things() if not self.script or k not in self.scripted]
        if not things:
            return
        _, namespace, name = self.rng.choice(things)
        deleted = self.api.delete("things", namespace, name)
        assert deleted is not None
        self.copies.pop((namespace, name), None)
        self._log(f"delete things {namespace}/{name} rv {deleted['metadata']['resourceVersion']}")

    # -- checks --------------------------------------------------------------------------

    def _pools(self) -> Figures:
        """The oracle's figures for the stored objects (recomputed only after a write)."""
        if self._figures_at != self.api.version:
            self._figures, self._figures_at = pools(self.api.objects), self.api.version
        return self._figures

    def _check(self) -> None:
        """Judge the stored objects now against what they were at the previous check."""
        before = self.checked
        after = self._pools()
        self.checked = after
        landing, self.landing = self.landing, None
        for key in lowered(before, after):
            self.lowered[key] = landing.version if landing else self.api.version
        found = overshoots(before, after)
        if landing is not None:
            # Decided before the replica could know of a lowered budget: allowed, the lowering
            # went below what was (about to be) used. Once told, nothing new may land there.
            found = {k: v for k, v in found.items() if self.lowered.get(k, 0) <= landing.told}
            if landing.read_spec is not None and landing.obj.get("spec") == landing.read_spec:
                # Stored last with no precondition, it writes back the spec stored when it was
                # sent: it restores a pool no larger than it was then (overcommitted only by a
                # lowered budget), and nothing it carries was admitted as growth.
                then = landing.read_pools
                found = {
                    k: v for k, v in found.items() if k not in then or after[k][0] > then[k][0]
                }
        if found:
            raise Violation("pool over budget: " + "; ".join(found.values()))
        if self.errors:
            raise Violation(self.errors[0])
        for replica in self.replicas.values():
            for error in replica.failures():
                raise Violation(f"{replica.name}: a background task died: {error!r}")

    def _quiesce(self) -> None:
        """Deliver everything, let every grace period pass, then wait for convergence."""
        self._log("quiesce")
        deadline = self.loop.time() + replica_module.GRACE_SECONDS + 4 * READ_TIMEOUT
        quiet_since = self.loop.time()
        while True:
            # A read (a periodic resync, a consistent read) changes nothing: only what may
            # (writes, stores, events) keeps the grace period from running.
            progressed = bool(self.admitted) or any(c.method != "GET" for c in self.api.calls)
            for call in list(self.api.calls):
                self.api.answer(call)
            for stream in list(self.api.streams):
                while self.api.pending(stream) > 0 and not stream.closed:
                    self.api.deliver(stream)
                    progressed = True
            while self.admitted:
                self._persist(self.admitted.pop(0))
                self._check()
            self.loop.run_until_idle()
            self._check()
            if progressed:
                quiet_since = self.loop.time()
                continue
            settled = self.loop.time() > quiet_since + replica_module.GRACE_SECONDS + 5
            if settled and not self.admitting and self._converged() is None:
                return
            if self.loop.time() > deadline:
                raise Violation(f"no convergence after quiescing: {self._converged()}")
            for stream in list(self.api.streams):
                self.api.bookmark(stream)
            self.loop.advance(QUIESCE_STEP)

    def _converged(self) -> str | None:
        """Why the replicas' views do not match the stored objects yet (None: they do)."""
        for name, replica in sorted(self.replicas.items()):
            state = replica.live.state
            if not replica.synced:
                return f"{name} is not synced"
            if len(state.pending):
                holds = [f"{h.id}:{h.key}" for h in state.pending.holds()]
                return f"{name} still holds {holds}"
            fresh = ReservationState(state.platform)
            for (plural, _, _), obj in sorted(self.api.objects.items()):
                if plural in ("tenants", "things"):
                    fresh.observe(application_from_object(obj))
            mine = {k: dict(r.resources) for k, r in state.records()}
            stored = {k: dict(r.resources) for k, r in fresh.records()}
            if mine != stored:
                return f"{name} sees {mine}, stored {stored}"
            budgets = {n.namespace: n.budget for n in state.tree.nodes() if n.budget}
            expected = {n.namespace: n.budget for n in fresh.tree.nodes() if n.budget}
            if budgets != expected:
                return f"{name} sees budgets {budgets}, stored {expected}"
        for (plural, namespace, _), obj in sorted(self.api.objects.items()):
            if plural == "tenantreservations" and (obj.get("status") or {}).get("pending"):
                return f"the ledger of {namespace} still lists {obj['status']['pending']}"
            if plural == "tenantreservations" and (obj.get("status") or {}).get("slices"):
                # Idle holders give their slices back and remove them; dead lives' are
                # reclaimed once their lease and the store bound have passed.
                return f"the ledger of {namespace} still lists slices {obj['status']['slices']}"
        return None

    def _probe(self) -> None:
        """At rest, every replica decides at the exact edge of every pool as stored."""
        figures = pools(self.api.objects)
        for (pool, key), (usage, budget) in sorted(figures.items()):
            if key not in ("memory", THINGS) or usage > budget:
                continue
            room = budget - usage
            # A probe is one more thing: where the count is full, only a denial can be probed.
            counted = _bounder(figures, pool, THINGS)
            full = (
                counted is not None
                and figures[(counted, THINGS)][0] >= figures[(counted, THINGS)][1]
            )
            edge = (
                [(room, True), (room + 1, False)] if key == "memory" else [(Decimal(0), room > 0)]
            )
            for name, replica in sorted(self.replicas.items()):
                for amount, fits in edge:
                    if (amount <= 0 and key == "memory") or (key == "memory" and fits and full):
                        continue
                    self.requests += 1
                    obj = _app("Thing", pool, "probe", {"memory": str(amount)})
                    review = _review(f"probe{self.requests}", "CREATE", obj, None, dry_run=True)
                    task = asyncio.ensure_future(
                        replica.ledger.admit(parse_review(review), POLICY), loop=self.loop
                    )
                    self.loop.run_until_idle()
                    if not task.done():
                        raise Violation(f"{name}: a dry run did not answer at rest")
                    decision = task.result()
                    self._log(
                        f"probe  {name} {pool} {key} {amount}: "
                        f"{'allowed' if decision.allowed else decision.reason}"
                    )
                    if decision.allowed != fits:
                        what = f"{amount} bytes of memory" if key == "memory" else "one more thing"
                        raise Violation(
                            f"{name} at rest {'denies' if fits else 'allows'} {what} "
                            f"in {pool}, where {usage} of {budget} is used: its view "
                            "did not converge"
                        )

    # -- the run -------------------------------------------------------------------------

    def run(self) -> Outcome:
        self.errors = []
        asyncio.set_event_loop(self.loop)
        try:
            with _deterministic(self.rng):
                try:
                    self._setup()
                    self.checked = pools(self.api.objects)
                    self._check()
                    index = 0
                    while index < self.steps or (self.script and index < self.steps + 60):
                        index += 1
                        self.taken = index
                        self._log(f"step {index}")
                        self._step()
                        self.loop.run_until_idle()
                        self._check()
                    self._quiesce()
                    self._probe()
                except Violation as exc:
                    return self._outcome(False, str(exc))
                return self._outcome(True, "")
        finally:
            self._shutdown()

    def _outcome(self, ok: bool, problem: str) -> Outcome:
        return Outcome(
            self.seed, ok, problem, list(self.trace), self.taken, self.allowed, self.stored
        )

    def _shutdown(self) -> None:
        for replica in self.replicas.values():
            replica.stop()
        for _, task in self.admitting.values():
            task.cancel()
        with contextlib.suppress(Exception):
            self.loop.run_until_idle()
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            self.loop.run_until_idle()
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        self.loop.close()


LIVE_POLL_SECONDS = 5.0


def take(rng: random.Random, choices: list[tuple[float, Callable[[], None]]]) -> None:
    """Do one of ``choices``, each drawn with the chance of its weight."""
    pick = rng.random() * sum(w for w, _ in choices)
    for weight, action in choices:
        pick -= weight
        if pick < 0:
            action()
            return
    choices[-1][1]()


@functools.cache
def _compile_once(kind: str, text: str, source: str) -> Contract:
    return compile_contract(kind, json.loads(text), source=source)


def _compiled(kind: str, document: Any, *, source: str) -> Contract:
    return _compile_once(kind, json.dumps(document, sort_keys=True), source)


async def _slow_poll(seconds: float, stop: asyncio.Event) -> bool:
    return await sleep_unless_stopped(max(seconds, LIVE_POLL_SECONDS), stop)


@contextlib.contextmanager
def _deterministic(rng: random.Random) -> Iterator[None]:
    """Route the reflectors' backoff jitter through the seed and quiet the production logs.

    Two costs that would dominate a run are cut without changing behaviour: the live state's
    50 ms bookkeeping poll (it only notes the first sync; rebuilds are triggered by the lists)
    runs every 5 s, and the test kind's contract, a pure function of its definition, is
    compiled once instead of at every replica's platform build."""
    patches = [
        (reflector_module, "random", rng),
        (live_module, "sleep_unless_stopped", _slow_poll),
        (kinds_module, "compile_contract", _compiled),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    logger = logging.getLogger("webhook")
    level = logger.level
    for module, name, value in patches:
        setattr(module, name, value)
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        logger.setLevel(level)


def _review(uid: str, operation: str, obj: Obj, old: Obj | None, *, dry_run: bool = False) -> Obj:
    """The AdmissionReview the API server sends for ``obj``."""
    kind = str(obj["kind"])
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": kind},
            "resource": {
                "group": "apps.cozystack.io",
                "version": "v1alpha1",
                "resource": kind.lower() + "s",
            },
            "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"]["name"],
            "operation": operation,
            "dryRun": dry_run,
            "userInfo": {"username": "tenant"},
            "object": obj,
            "oldObject": old,
        },
    }


def _mutated(review: Obj, state: ReservationState) -> Obj:
    """The object as the mutating webhook leaves it (its JSONPatch applied)."""
    obj: Obj = copy.deepcopy(review["request"]["object"])
    for operation in mutate(parse_review(review), state, POLICY).patch:
        assert operation["op"] == "add", operation
        *parents, leaf = [
            p.replace("~1", "/").replace("~0", "~") for p in str(operation["path"]).split("/")[1:]
        ]
        target = obj
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = copy.deepcopy(operation["value"])
    return obj


@functools.cache
def _tenant_definition() -> Obj:
    loaded: Obj = yaml.safe_load(TENANT_DEFINITION.read_text())
    return loaded


def _app(kind: str, namespace: str, name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def _gib_of(obj: Obj) -> int:
    """The memory of a stored Thing, in whole GiB (the simulation sizes in GiB)."""
    return int(Decimal(_gib(str((obj.get("spec") or {}).get("memory", "0")))))


def _bounder(figures: Figures, namespace: str, key: str) -> str | None:
    """The pool that bounds ``key`` for an application in ``namespace``."""
    while namespace:
        if (namespace, key) in figures:
            return namespace
        namespace = parent_namespace(namespace)
    return None


def _gib(value: str) -> str:
    return str(value).removesuffix("Gi")


def run(seed: int, *, steps: int | None = None, escrow: bool = False) -> Outcome:
    """One seeded run, from setup to the convergence check (``escrow``: the replicas admit from
    escrowed slices)."""
    outcome = Simulation(seed, steps=steps, escrow=escrow).run()
    gc.collect()  # its cycles die here, not in a pause during a later, timed test
    return outcome


@dataclass
class Summary:
    """What a batch of seeds explored, and the first failure if any."""

    seeds: int = 0
    steps: int = 0
    admitted: int = 0
    stored: int = 0
    paths: dict[str, int] = field(default_factory=dict)
    failure: Outcome | None = None

    def describe(self, elapsed: float) -> str:
        verdict = f"seed {self.failure.seed} failed" if self.failure else "all passed"
        paths = "".join(f", {count} {path}" for path, count in sorted(self.paths.items()))
        return (
            f"{self.seeds} seeds, {self.steps} steps, {self.admitted} admitted{paths}, "
            f"{self.stored} stored in {elapsed:.1f}s: {verdict}"
        )


def explore(
    seeds: Iterable[int],
    *,
    stop_at_first: bool = True,
    simulate: Callable[[int], Outcome] | None = None,
) -> Summary:
    """Run every seed (with ``simulate``, else this simulation) until the first failure; the
    totals and that failure."""
    summary = Summary()
    for seed in seeds:
        outcome = simulate(seed) if simulate is not None else Simulation(seed).run()
        summary.seeds += 1
        summary.steps += outcome.steps
        summary.admitted += outcome.admitted
        summary.stored += outcome.stored
        for path, count in outcome.paths.items():
            summary.paths[path] = summary.paths.get(path, 0) + count
        if not outcome.ok and summary.failure is None:
            summary.failure = outcome
            if stop_at_first:
                break
    gc.collect()  # the runs' cycles die here, not in a pause during a later, timed test
    return summary


def replay_command(seed: int, reverted: bool = False) -> str:
    flag = " --revert-settle" if reverted else ""
    return f".venv/bin/python -m tests.simulation --seed {seed}{flag}"

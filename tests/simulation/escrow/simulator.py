"""The escrow simulation: replicas holding slices, clients, faults and an API server, by seed.

A run sets up one or two pools (a Tenant's memory budget each, a TenantReservation, a few
applications) and two or three replicas, then takes a few dozen steps, each one choice of the
seeded generator among what can happen now:

- a client asks a replica to admit a create, a growth or a shrink (the replica answers from its
  slice at once, or queues it for the exact path); the API server stores an admitted change,
  late or early but before its request deadline (``store_seconds`` after the webhook was
  called), or a later step refuses it; a client deletes an application or changes a budget;
- in half the runs applications are updated as cozystack-api updates them, with no
  resourceVersion precondition: an update admitted long ago may be stored last;
- a replica runs its duty for a pool (one write: folds, refills, renewals, returns, entries,
  reclaims); a write is answered, refused with 409 (someone else wrote the object first, or a
  ``touch``), or fails with its outcome unknown (reset before it was stored, or stored and the
  answer lost);
- a watch delivers its next event (each stream at its own pace, some slow), sends a bookmark,
  or is lost (410: the replica lists again);
- time passes (a little, a lease, past the store bound); a replica crashes and comes back under
  the same name or a new one (a new incarnation), hangs, or is cut off from the API server
  while the API server still calls it.

After every step the judge recomputes every pool from the stored objects, the admitted changes
not stored yet and what each record's holder spent (never from the replicas' own books):

- **committed room never passes the budget**: stored usage (the largest of an application's
  stored charge and every update of it that may still be stored) + admitted creates not stored
  yet + every record's unspent room (``granted - returned - spent``) <= budget, unless the step
  did not raise it (a lowered budget);
- **no slice is spent twice**: what was spent from a record <= ``granted - returned``;
- **a spend is made only from a stored record of the spender's own incarnation, within its
  lease** (before the recorded expiry by the spender's clock);
- **a lowered budget reaches slices**: a growth spent by a replica told the current budget
  never takes stored and unstored usage past it;
- **a replica counts at least what is committed** whenever it decides a grant or an entry on
  the current copy of the pool's object.

Then the run quiesces (faults healed, everything delivered, the lease and the store bound
passed): no record of a dead life is left, nothing departed or fenced is still counted, and
every replica counts exactly the stored usage plus the records' outstanding room.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tests.simulation import simulator as simulation
from tests.simulation.apiserver import SimAPI
from tests.simulation.escrow.replica import (
    BOUNDS,
    ENTRY,
    PLURALS,
    TRS,
    UID,
    Call,
    M,
    Replica,
    Request,
    records_of,
    version_of,
)
from tests.simulation.simulator import Outcome, Summary
from webhook.kube.client import ApiError

Obj = dict[str, Any]
ZERO = Decimal(0)
NAMES = ("x", "y", "z", "w")


class Violation(Exception):
    pass


@dataclass
class _Pool:
    budget_version: int = 0  # the version of the Tenant that last lowered the budget
    committed: Decimal = ZERO


@dataclass
class EscrowSimulation:
    seed: int
    steps: int = 0
    trace: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"escrow-{self.seed}")
        self.now = 0.0
        self.unconditioned = self.rng.random() < 0.5
        self.api = SimAPI(
            {"things", "tenants", TRS},
            self._log,
            unconditioned=frozenset({"things"}) if self.unconditioned else frozenset(),
        )
        self.replicas: dict[str, Replica] = {}
        self.calls: list[Call] = []
        self.unstored: list[Request] = []  # admitted, not stored yet, may still be
        self.slow: set[str] = set()  # of those, the ones stored (if at all) at their deadline
        self.spent: dict[tuple[str, str], Decimal] = {}  # (pool, incarnation) -> spent from it
        self.pools: dict[str, _Pool] = {}
        self.stale: set[str] = set()  # pools a write decided on an older budget changed
        self.lives = 0
        self.requests = 0
        self.answered_spent = 0
        self.answered_exact = 0
        self.taken = 0
        self.stored = 0
        if not self.steps:
            self.steps = self.rng.randint(30, 70)

    def _log(self, line: str) -> None:
        self.trace.append(f"{self.now:9.3f} {line}")

    # -- setup ---------------------------------------------------------------------------

    def _setup(self) -> None:
        rng = self.rng
        names = ["a"] if rng.random() < 0.6 else ["a", "c"]
        for name in names:
            pool = f"tenant-{name}"
            budget = rng.choice((6, 10, 16, 24, 40, 64))
            tenant: Obj = {
                "metadata": {"name": name, "namespace": "tenant-root"},
                "spec": {"resourceQuotas": {M: str(budget)}},
            }
            self.api.create("tenants", tenant)
            self.api.create(TRS, {"metadata": {"name": pool, "namespace": pool}, "status": {}})
            self.pools[pool] = _Pool()
            used = 0
            for thing in rng.sample(NAMES, rng.randint(0, 2)):
                memory = rng.randint(1, 3)
                if used + memory <= budget:
                    used += memory
                    self.api.create("things", self._thing(pool, thing, memory, "setup"))
        self.settled = self.api.version
        count = rng.choice((2, 3))
        self._log(
            f"setup  pools {[(p, self._budget(p)) for p in sorted(self.pools)]} replicas {count}"
            f" steps {self.steps}" + (" unconditioned updates" if self.unconditioned else "")
        )
        for index in range(1, count + 1):
            self._start(f"r{index}")
        self.lag = {
            (name, plural): rng.choice((1.0, 1.0, 0.3, 0.05))
            for name in self.replicas
            for plural in PLURALS
        }
        for pool in self.pools:
            self.pools[pool].committed = self._committed(pool)

    def _thing(self, pool: str, name: str, memory: Decimal | int, uid: str) -> Obj:
        return {
            "kind": "Thing",
            "metadata": {"name": name, "namespace": pool, "annotations": {UID: uid}},
            "spec": {M: str(memory)},
        }

    def _start(self, name: str) -> None:
        self.lives += 1
        listed = None
        if self.lives > 3 and self.rng.random() < 0.5:
            # An earlier list, but never one before the setup's objects, which no replica
            # admitted (nothing in any ledger covers them).
            listed = self.rng.randint(max(self.settled, self.api.version - 8), self.api.version)
        self.replicas[name] = Replica(
            self.api,
            name,
            f"{name}.life{self.lives}",
            offset=self.rng.uniform(-2.0, 2.0),
            rate=Decimal(self.rng.choice((1, 2, 4))),
            now=self.now,
            listed_things=listed,
        )
        self._log(
            f"start  {name} as {name}.life{self.lives}"
            + (f" (applications listed at rv {listed})" if listed else "")
        )

    # -- the judge -------------------------------------------------------------------------

    def _budget(self, pool: str) -> Decimal:
        tenant = self.api.get("tenants", "tenant-root", pool.removeprefix("tenant-"))
        assert tenant is not None
        return Decimal(tenant["spec"]["resourceQuotas"][M])

    def _usage(self, pool: str) -> Decimal:
        """Stored usage, and what admitted changes not stored yet may make it."""
        charges: dict[str, Decimal] = {}
        for (plural, namespace, name), obj in self.api.objects.items():
            if plural == "things" and namespace == pool:
                charges[name] = Decimal(obj["spec"][M])
        creates = ZERO
        for request in self.unstored:
            if request.namespace != pool:
                continue
            if request.operation == "CREATE":
                creates += request.memory
            else:  # stored last with no precondition, it may overwrite a later write, or
                # one of a name deleted and created again
                charges[request.name] = max(charges.get(request.name, ZERO), request.memory)
        return sum(charges.values(), ZERO) + creates

    def _records(self, pool: str) -> dict[str, Any]:
        return records_of(self.api.get(TRS, pool, pool))

    def _committed(self, pool: str) -> Decimal:
        unspent = ZERO
        for incarnation, record in self._records(pool).items():
            if incarnation.startswith(ENTRY):
                continue  # its request is answered by now: admitted (unstored) or refused
            room = record.granted.get(M, ZERO) - record.returned.get(M, ZERO)
            unspent += max(ZERO, room - self.spent.get((pool, incarnation), ZERO))
        return self._usage(pool) + unspent

    def _check(self) -> None:
        for pool, figures in sorted(self.pools.items()):
            committed, budget = self._committed(pool), self._budget(pool)
            # A write decided before its replica was sent a lowered budget may go past it:
            # the budget was lowered below what was (about to be) committed.
            stale = pool in self.stale
            if committed > budget and committed > figures.committed and not stale:
                raise Violation(
                    f"committed room past the budget in {pool}: {committed} of {budget} "
                    f"(was {figures.committed}; stored and unstored {self._usage(pool)})"
                )
            figures.committed = committed
            self.stale.discard(pool)
            for incarnation, record in self._records(pool).items():
                room = record.granted.get(M, ZERO) - record.returned.get(M, ZERO)
                if self.spent.get((pool, incarnation), ZERO) > room:
                    raise Violation(
                        f"slice {incarnation} in {pool} spent twice: "
                        f"{self.spent[(pool, incarnation)]} spent of {room} granted and kept"
                    )

    def _spent(self, replica: Replica, request: Request) -> None:
        """``replica`` answered ``request`` from its slice: judge the spend."""
        pool = request.namespace
        record = self._records(pool).get(request.incarnation)
        if record is None:
            raise Violation(f"{replica.name} spent {request.incarnation}, which is not stored")
        if replica.wall(self.now) >= record.expires:
            raise Violation(
                f"{replica.name} spent {request.incarnation} past its lease "
                f"(expires {record.expires:.3f}, its clock {replica.wall(self.now):.3f})"
            )
        key = (pool, request.incarnation)
        self.spent[key] = self.spent.get(key, ZERO) + request.memory
        self._admitted(replica, request)

    def _admitted(self, replica: Replica, request: Request) -> None:
        self.unstored.append(request)
        if not request.grows:
            # A decrease is never refused (as the replica saw it): of an application deleted
            # meanwhile, it holds its charge until it can no longer be stored.
            self.stale.add(request.namespace)
        if self.rng.random() < 0.2:
            self.slow.add(request.uid)  # the API server takes its time: stored at its deadline
        pool = request.namespace
        told = request.told >= self.pools[pool].budget_version
        if request.increase > 0 and told and self._usage(pool) > self._budget(pool):
            raise Violation(
                f"{replica.name} admitted {request.uid} past {pool}'s lowered budget: "
                f"{self._usage(pool)} of {self._budget(pool)}"
            )

    def _judge_view(self, replica: Replica, pool: str) -> None:
        """Before ``replica`` decides grants or entries on the current copy: it counts at
        least what is committed."""
        stored = self.api.get(TRS, pool, pool)
        copied = replica.copies.get(pool)
        if stored is None or copied is None or version_of(copied) != version_of(stored):
            return
        if replica.count.fenced(pool):
            return
        if replica.view(pool) < self._committed(pool):
            raise Violation(
                f"{replica.name} counts {replica.view(pool)} in {pool}, where "
                f"{self._committed(pool)} is committed"
            )

    # -- steps -----------------------------------------------------------------------------

    def _live(self) -> list[Replica]:
        return [self.replicas[n] for n in sorted(self.replicas)]

    def _choices(self) -> list[tuple[float, Callable[[], None]]]:
        choices: list[tuple[float, Callable[[], None]]] = [
            (3.0, self._client),
            (3.0, self._duty),
            (1.5, lambda: self._advance(self.rng.choice((0.05, 0.3, 1.0, 2.0)))),
            (0.3, lambda: self._advance(self.rng.uniform(8.0, 35.0))),
            (0.12, lambda: self._advance(self.rng.uniform(55.0, 100.0))),
            (0.4, self._budget_change),
            (0.15, self._touch),
            (0.08, self._crash),
            (0.1, self._hang),
            (0.08, self._partition),
        ]
        if any(r.uid not in self.slow for r in self.unstored):
            choices.append((2.5, self._store))
        if any(p == "things" for p, _, _ in self.api.objects):
            choices.append((0.3, self._delete))
        if self.calls:
            choices.append((4.0, self._answer))
        for replica in self._live():
            if replica.partitioned(self.now):
                continue
            for plural in PLURALS:
                weight = self.lag.get((replica.name, plural), 1.0)
                if replica.pending(plural) and not replica.hung(self.now):
                    choices.append(
                        (1.5 * weight, functools.partial(self._deliver, replica, plural))
                    )
            choices.append((0.3, functools.partial(self._bookmark, replica)))
            choices.append((0.05, functools.partial(self._gone, replica)))
        return choices

    def _step(self) -> None:
        simulation.take(self.rng, self._choices())

    def _advance(self, seconds: float) -> None:
        """Move the clock; the API server stores or drops what is due before it gets there."""
        self._log(f"tick   +{seconds:.3f}s")
        end = self.now + seconds
        for request in sorted(self.unstored, key=lambda r: r.sent):
            deadline = request.sent + BOUNDS.store_seconds
            if deadline <= end:
                self.now = max(self.now, deadline - 0.001)
                if self.rng.random() < 0.5:
                    self._persist(request)  # stored at the very last moment
                else:
                    self.unstored.remove(request)
                    self._log(f"store  {request.uid}: the request timed out before it was stored")
                self._check()
        self.now = end

    def _client(self) -> None:
        rng = self.rng
        live = self._live()
        if not live:
            return
        replica = rng.choice(live)
        pool = rng.choice(sorted(self.pools))
        things = [
            (ns, n) for (p, ns, n) in sorted(self.api.objects) if p == "things" and ns == pool
        ]
        self.requests += 1
        uid = f"u{self.requests}"
        if things and rng.random() < 0.55:
            namespace, name = rng.choice(things)
            old = self.api.get("things", namespace, name)
            assert old is not None
            before = Decimal(old["spec"][M])
            memory = max(Decimal(1), before + rng.choice((-2, -1, 1, 1, 2, 3)))
            request = Request(
                uid,
                "UPDATE",
                namespace,
                name,
                memory,
                before,
                old["metadata"]["resourceVersion"],
                self.now,
            )
        else:
            name = rng.choice(NAMES)
            memory = Decimal(rng.randint(1, 4))
            request = Request(uid, "CREATE", pool, name, memory, ZERO, "", self.now)
        what = f"{request.operation} {pool}/{request.name} {request.memory}"
        if replica.hung(self.now):
            self._log(f"admit  {uid} via {replica.name}: {what}: no answer (hung)")
            return
        verdict = replica.admit(request, self.now)
        self._log(f"admit  {uid} via {replica.name}: {what} from {request.old}: {verdict}")
        if verdict == "spent":
            self.answered_spent += 1
            self._spent(replica, request)

    def _duty(self) -> None:
        live = [r for r in self._live() if not r.hung(self.now)]
        if not live:
            return
        replica = self.rng.choice(live)
        pool = self.rng.choice(sorted(self.pools))
        self._judge_view(replica, pool)
        call = replica.duty(pool, self.now)
        if call is None:
            return
        self.calls.append(call)
        record = call.write.record if call.write else None
        self._log(
            f"write  {replica.name} {pool} on rv {call.body['metadata']['resourceVersion']}: "
            + (
                f"record {dict(record.granted)}/{dict(record.folded)}/{dict(record.returned)}"
                if record
                else "no record"
            )
            + f" entries {[r.uid for r in call.added]} removes {call.removed}"
        )

    def _answer(self) -> None:
        call = self.rng.choice(self.calls)
        self.calls.remove(call)
        replica = call.replica
        alive = self.replicas.get(replica.name) is replica
        roll = self.rng.random()
        cut = replica.partitioned(self.now)
        if cut or roll < 0.04:
            self._log(f"fail   {replica.name} {call.pool}: reset before it was stored")
            if alive:
                replica.unknown(call)
            return
        try:
            stored = self.api.replace(TRS, call.body, status=True)
        except ApiError as exc:
            current = self.api.get(TRS, call.pool, call.pool)
            if exc.status != 409 or current is None:
                raise
            self._log(f"answer {replica.name} {call.pool}: 409")
            if alive:
                replica.conflict(call, current)
            return
        for incarnation in call.removed:
            self.spent.pop((call.pool, incarnation), None)
        if call.told < self.pools[call.pool].budget_version:
            self.stale.add(call.pool)
        if roll < 0.08 or not alive:
            self._log(f"answer {replica.name} {call.pool}: stored rv {version_of(stored)}, lost")
            if alive:
                replica.unknown(call)
            return
        self._log(f"answer {replica.name} {call.pool}: stored rv {version_of(stored)}")
        replica.stored(call, stored, self.now)

    def _answers(self) -> None:
        """Hand the exact path's answers back to the API server."""
        for replica in self._live():
            answers, replica.answers = replica.answers, []
            for request, allowed, reason in answers:
                self._log(f"decide {request.uid} via {replica.name}: {reason}")
                if allowed:
                    self.answered_exact += 1
                    key = (request.namespace, request.incarnation)
                    self.spent[key] = self.spent.get(key, ZERO) + request.memory
                    self._admitted(replica, request)

    def _store(self) -> None:
        request = self.rng.choice([r for r in self.unstored if r.uid not in self.slow])
        if self.rng.random() < 0.08:
            self.unstored.remove(request)
            self._log(f"reject {request.uid}: a later admission step refused it")
            return
        self._persist(request)

    def _persist(self, request: Request) -> None:
        self.unstored.remove(request)
        body = self._thing(request.namespace, request.name, request.memory, request.uid)
        try:
            if request.operation == "CREATE":
                stored = self.api.create("things", body)
            else:
                body["metadata"]["resourceVersion"] = request.old_version
                stored = self.api.replace("things", body)
        except ApiError as exc:
            self._log(f"store  {request.uid}: {exc.status} {exc.reason}")
            return
        self.stored += 1
        self._log(
            f"store  {request.uid}: {request.namespace}/{request.name} {request.memory} "
            f"rv {version_of(stored)}"
        )

    def _delete(self) -> None:
        things = [k for k in sorted(self.api.objects) if k[0] == "things"]
        _, namespace, name = self.rng.choice(things)
        deleted = self.api.delete("things", namespace, name)
        assert deleted is not None
        self._log(f"delete {namespace}/{name} rv {version_of(deleted)}")

    def _budget_change(self) -> None:
        pool = self.rng.choice(sorted(self.pools))
        name = pool.removeprefix("tenant-")
        tenant = self.api.get("tenants", "tenant-root", name)
        assert tenant is not None
        before = self._budget(pool)
        after = max(Decimal(1), before + self.rng.choice((-8, -4, -2, -1, 1, 2, 4)))
        tenant["spec"]["resourceQuotas"][M] = str(after)
        stored = self.api.replace("tenants", tenant)
        if after < before:
            self.pools[pool].budget_version = version_of(stored)
        self._log(f"budget {pool} {before} -> {after} rv {version_of(stored)}")

    def _touch(self) -> None:
        pool = self.rng.choice(sorted(self.pools))
        obj = self.api.get(TRS, pool, pool)
        assert obj is not None
        labels = dict(obj["metadata"].get("labels") or {})
        labels["touched"] = str(int(labels.get("touched", "0")) + 1)
        obj["metadata"]["labels"] = labels
        stored = self.api.replace(TRS, obj)
        self._log(f"touch  {pool} rv {version_of(stored)}")

    def _deliver(self, replica: Replica, plural: str) -> None:
        self._log(f"event  {replica.name} {plural} {replica.deliver(plural, self.now)}")

    def _bookmark(self, replica: Replica) -> None:
        if replica.partitioned(self.now) or replica.hung(self.now):
            return
        self._log(f"mark   {replica.name} rv {self.api.version}")
        replica.bookmark()

    def _gone(self, replica: Replica) -> None:
        plural = self.rng.choice(PLURALS)
        self._log(f"gone   {replica.name} {plural}: lists again at rv {self.api.version}")
        replica.relist(plural, self.now)

    def _crash(self) -> None:
        if self.lives >= 6 or not self.replicas:
            return
        name = self.rng.choice(sorted(self.replicas))
        del self.replicas[name]  # what it queued is lost with it: those webhook calls fail
        self._log(f"crash  {name}")
        again = name if self.rng.random() < 0.5 else f"r{self.lives + 10}"
        self._start(again)
        for plural in PLURALS:
            self.lag.setdefault((again, plural), self.rng.choice((1.0, 0.3)))

    def _hang(self) -> None:
        replica = self.rng.choice(self._live())
        replica.hung_until = self.now + self.rng.uniform(5.0, 120.0)
        self._log(f"hang   {replica.name} until {replica.hung_until:.3f}")

    def _partition(self) -> None:
        replica = self.rng.choice(self._live())
        replica.partitioned_until = self.now + self.rng.uniform(5.0, 120.0)
        self._log(f"cut    {replica.name} off the API server until {replica.partitioned_until:.3f}")

    # -- the end ---------------------------------------------------------------------------

    def _quiesce(self) -> None:
        self._log("quiesce")
        for replica in self._live():
            replica.hung_until = replica.partitioned_until = 0.0
        rounds = int((BOUNDS.lease_seconds + BOUNDS.store_seconds) / 5.0) + 30
        for _ in range(rounds):
            while self.calls:
                self.rng.shuffle(self.calls)
                self._answer()
                self._answers()
                self._check()
            while self.unstored:
                self._persist(self.unstored[0])
                self._check()
            for replica in self._live():
                for plural in PLURALS:
                    while replica.pending(plural):
                        replica.deliver(plural, self.now)
                replica.bookmark()
            if self._converged() is None:
                return
            for replica in self._live():
                for pool in sorted(self.pools):
                    self._judge_view(replica, pool)
                    call = replica.duty(pool, self.now)
                    if call is not None:
                        self.calls.append(call)
            self._answers()
            self._check()
            self.now += 5.0
        raise Violation(f"no convergence after quiescing: {self._converged()}")

    def _converged(self) -> str | None:
        living = {r.incarnation for r in self._live()}
        for pool in sorted(self.pools):
            for incarnation in self._records(pool):
                holder = incarnation.removeprefix(ENTRY).rsplit(".", 1)[0]
                if not incarnation.startswith(ENTRY) and incarnation not in living:
                    return f"{pool} still lists {incarnation}, a dead life's slice"
                if incarnation.startswith(ENTRY) and holder not in self.replicas:
                    return f"{pool} still lists {incarnation}, a dead replica's entry"
            stored = self._usage(pool) + sum(
                (r.outstanding().get(M, ZERO) for r in self._records(pool).values()), ZERO
            )
            for replica in self._live():
                if replica.count.fenced(pool) or replica.count.departed(pool):
                    return f"{replica.name} still counts departed room in {pool}"
                if replica.view(pool) != stored:
                    return f"{replica.name} counts {replica.view(pool)} in {pool}, stored {stored}"
        return None

    def run(self) -> Outcome:
        try:
            self._setup()
            self._check()
            for index in range(1, self.steps + 1):
                self.taken = index
                self._log(f"step {index}")
                self._step()
                self._answers()
                self._check()
            self._quiesce()
        except Violation as exc:
            return self._outcome(False, str(exc))
        return self._outcome(True, "")

    def _outcome(self, ok: bool, problem: str) -> Outcome:
        answered = self.answered_spent + self.answered_exact
        paths = {"from slices": self.answered_spent, "by the exact path": self.answered_exact}
        return Outcome(
            self.seed, ok, problem, list(self.trace), self.taken, answered, self.stored, paths
        )


def run(seed: int) -> Outcome:
    """One seeded run, from setup to the convergence check."""
    return EscrowSimulation(seed).run()


def explore(seeds: Iterable[int]) -> Summary:
    """Run every seed until the first failure; the totals and that failure."""
    return simulation.explore(seeds, simulate=run)


def replay_command(seed: int, broken: str = "") -> str:
    flag = f" --broken {broken}" if broken else " --escrow"
    return f"{simulation.replay_command(seed)}{flag}"

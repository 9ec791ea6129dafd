"""One replica of the escrow simulation: what it has read, the slices it holds, how it decides.

A replica reads three resources through watches the simulator moves one event at a time
(Tenants for budgets, Things for usage, TenantReservations for slices and entries), counts
each pool as the escrow rules say (observed usage + every record's outstanding room + departed
room, :class:`SliceCount`), and admits a request either from its slice in memory
(:class:`Escrow`) or by the exact path: an *entry* (a record of one request, granted its whole
charge, spent when answered) added by a write conditional on the copy it decided on. Its
duties, one write per pool at a time, fold, refill, renew and return its slice, remove its
settled entries and reclaim expired records. Every rule it applies comes from
``webhook.core.admission.escrow``, looked up at call time so that :mod:`.broken` can break one.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tests.simulation.apiserver import SimAPI
from webhook.core.admission import escrow as core
from webhook.core.admission.escrow import records as escrow_records
from webhook.core.admission.escrow.records import refill_wanted, surplus

Obj = dict[str, Any]
KIND = "Thing"
M = "memory"
TRS = "tenantreservations"
PLURALS = ("tenants", "things", TRS)
UID = "sim/uid"  # the annotation naming the request that stored an object (its signed record)
WEBHOOK_TIMEOUT = 30.0  # the API server gives up on a webhook call after this long
BOUNDS = core.EscrowBounds()
ENTRY = "entry."
ZERO = Decimal(0)


@dataclass
class Request:
    """An admission the API server asked a replica for."""

    uid: str
    operation: str  # CREATE or UPDATE
    namespace: str
    name: str
    memory: Decimal  # the charge the object carries if stored
    old: Decimal  # the charge of the object the client read (0 for a create)
    old_version: str
    sent: float  # when the API server called the webhook
    replica: str = ""
    incarnation: str = ""  # the record it was charged to
    told: int = 0  # the newest Tenant version the replica had been sent when it decided
    grows: bool = True  # whether it grew the pool as the deciding replica counted it

    @property
    def increase(self) -> Decimal:
        return self.memory - self.old


@dataclass
class Call:
    """One write of a pool's TenantReservation, waiting for the simulator to answer it."""

    replica: Replica
    pool: str
    body: Obj
    write: core.Write | None
    added: list[Request] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # records it removes (entries, reclaims)
    told: int = 0  # the newest Tenant version the replica had been sent when it decided


def records_of(obj: Mapping[str, Any] | None) -> dict[str, core.SliceRecord]:
    """The records a TenantReservation lists, by incarnation."""
    found = {}
    for incarnation, raw in sorted(((obj or {}).get("status") or {}).get("slices", {}).items()):
        found[incarnation] = core.SliceRecord(
            incarnation=incarnation,
            holder=str(raw["holder"]),
            kinds=frozenset(raw["kinds"]),
            granted={k: Decimal(v) for k, v in raw["granted"].items()},
            folded={k: Decimal(v) for k, v in raw["folded"].items()},
            returned={k: Decimal(v) for k, v in raw["returned"].items()},
            expires=float(raw["expires"]),
        )
    return found


def record_json(record: core.SliceRecord) -> Obj:
    return {
        "holder": record.holder,
        "kinds": sorted(record.kinds),
        "granted": {k: str(v) for k, v in record.granted.items()},
        "folded": {k: str(v) for k, v in record.folded.items()},
        "returned": {k: str(v) for k, v in record.returned.items()},
        "expires": repr(record.expires),
    }


def removals_of(obj: Mapping[str, Any] | None) -> int:
    return int(((obj or {}).get("status") or {}).get("removals", 0))


def version_of(obj: Mapping[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


class Replica:
    """A running replica (until the simulator crashes it)."""

    def __init__(
        self,
        api: SimAPI,
        name: str,
        incarnation: str,
        *,
        offset: float,
        rate: Decimal,
        now: float,
        listed_things: int | None = None,
    ) -> None:
        self.api = api
        self.name = name
        self.offset = offset  # its wall clock's skew
        self.rate = rate  # GiB a second it expects to admit
        self.escrow = core.Escrow(name, incarnation, BOUNDS)
        self.count = core.SliceCount()
        self.things: dict[tuple[str, str], tuple[Decimal, str]] = {}  # (ns, name) -> mem, uid
        self.budgets: dict[str, Decimal] = {}
        self.copies: dict[str, Obj] = {}
        self.cursor: dict[str, int] = {}
        self.seen: dict[str, int] = {}
        self.entries: dict[str, Request] = {}  # exact-path entries written (or maybe written)
        self.queue: dict[str, list[Request]] = {}
        self.inflight: dict[str, Call] = {}
        self.hung_until = 0.0
        self.partitioned_until = 0.0
        self.answers: list[tuple[Request, bool, str]] = []  # exact-path answers to hand back
        for plural in PLURALS:
            self.relist(plural, now, upto=listed_things if plural == "things" else None)

    @property
    def incarnation(self) -> str:
        return self.escrow.incarnation

    def wall(self, now: float) -> float:
        return now + self.offset

    def hung(self, now: float) -> bool:
        return now < self.hung_until

    def partitioned(self, now: float) -> bool:
        return now < self.partitioned_until

    # -- reading -------------------------------------------------------------------------

    def relist(self, plural: str, now: float, *, upto: int | None = None) -> None:
        """List ``plural`` (at the current version, or at ``upto``: an earlier list), then
        watch from there."""
        log = self.api.logs.get(plural, [])
        at = self.api.version if upto is None else upto
        objects: dict[tuple[str, str], Obj] = {}
        for version, event, obj in log:
            if version > at:
                break
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if event == "DELETED":
                objects.pop(key, None)
            else:
                objects[key] = obj
        self.cursor[plural] = sum(1 for version, _, _ in log if version <= at)
        if plural == "things":
            self.things = {}
        for obj in objects.values():
            self._apply(plural, "ADDED", obj, now)
        self.seen[plural] = at
        self.catch_up()

    def pending(self, plural: str) -> int:
        return len(self.api.logs.get(plural, [])) - self.cursor[plural]

    def deliver(self, plural: str, now: float) -> str:
        version, event, obj = self.api.logs[plural][self.cursor[plural]]
        self.cursor[plural] += 1
        self._apply(plural, event, obj, now)
        self.seen[plural] = version
        self.catch_up()
        return (
            f"{event} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']} rv {version}"
        )

    def bookmark(self) -> None:
        for plural in PLURALS:
            if self.pending(plural) == 0:
                self.seen[plural] = self.api.version
        self.catch_up()

    def catch_up(self) -> None:
        things = self.seen.get("things", 0)
        self.count.catch_up(lambda kind: things)

    def _apply(self, plural: str, event: str, obj: Obj, now: float) -> None:
        namespace = obj["metadata"].get("namespace", "")
        name = obj["metadata"]["name"]
        if plural == "tenants":
            quotas = (obj.get("spec") or {}).get("resourceQuotas") or {}
            if M in quotas:
                self.budgets[f"tenant-{name}"] = Decimal(quotas[M])
        elif plural == "things":
            if event == "DELETED":
                self.things.pop((namespace, name), None)
                return
            uid = str((obj["metadata"].get("annotations") or {}).get(UID, ""))
            self.things[(namespace, name)] = (Decimal(obj["spec"][M]), uid)
            self.escrow.observed(uid)
        else:
            self.remember(obj)

    def remember(self, obj: Obj) -> None:
        """A copy of a pool's TenantReservation (an event, a list, or a write's answer)."""
        pool = obj["metadata"]["namespace"]
        version = version_of(obj)
        known = self.copies.get(pool)
        if known is not None and version_of(known) >= version:
            return
        self.copies[pool] = obj
        listed = records_of(obj)
        self.count.track(pool, listed, removals=removals_of(obj), version=version)
        self.escrow.recorded(pool, listed.get(self.incarnation), version)
        self.catch_up()

    # -- counting ------------------------------------------------------------------------

    def observed(self, pool: str) -> Decimal:
        return sum((m for (ns, _), (m, _) in self.things.items() if ns == pool), ZERO)

    def view(self, pool: str) -> Decimal:
        """What this replica counts in ``pool``: observed, every record whole, departed."""
        return self.observed(pool) + self.count.counted(pool).get(M, ZERO)

    def grant_basis(self, pool: str) -> Decimal:
        """What a grant is decided against: the whole count."""
        return self.view(pool)

    def over_budget(self, pool: str) -> bool:
        """Whether this replica counts ``pool`` past its budget (spending stops)."""
        return not core.within({M: self.budgets[pool]}, {M: self.view(pool)})

    def increase(self, request: Request) -> Decimal:
        """What ``request`` adds to the pool as this replica counts it: its charge, less the
        application's charge as both the request (its oldObject) and this replica saw it."""
        seen = self.things.get((request.namespace, request.name))
        if request.operation == "CREATE" or seen is None:
            return request.memory
        return request.memory - min(request.old, seen[0])

    def decidable(self, pool: str) -> bool:
        return pool in self.budgets and pool in self.copies and not self.count.fenced(pool)

    # -- admitting -----------------------------------------------------------------------

    def admit(self, request: Request, now: float) -> str:
        """``spent`` (answered from the slice), ``queued`` (the exact path) or ``denied``."""
        pool = request.namespace
        if not self.decidable(pool):
            return "denied"
        growth = self.increase(request) > 0
        request.grows = growth
        if not (growth and self.over_budget(pool)) and self.escrow.spend(
            request.uid,
            {pool: {M: request.memory}},
            kind=KIND,
            now=now,
            update=request.operation == "UPDATE",
        ):
            request.replica, request.incarnation = self.name, self.incarnation
            request.told = self.seen.get("tenants", 0)
            return "spent"
        self.queue.setdefault(pool, []).append(request)
        return "queued"

    # -- duties: one write of a pool's object --------------------------------------------

    def duty(self, pool: str, now: float) -> Call | None:
        """Compose the next write of ``pool``'s object, if anything is to be written."""
        copied = self.copies.get(pool)
        if copied is None or pool in self.inflight or pool not in self.budgets:
            return None
        listed = records_of(copied)
        slices = dict(listed)
        removed: list[str] = []
        wall = self.wall(now)
        for incarnation, record in listed.items():
            mine = incarnation == self.incarnation or incarnation.startswith(f"{ENTRY}{self.name}.")
            if not mine and escrow_records.reclaimable(record, wall, BOUNDS):
                del slices[incarnation]
                removed.append(incarnation)
        for uid, request in list(self.entries.items()):
            key = f"{ENTRY}{self.name}.{uid}"
            settled = request.operation == "CREATE" and any(
                u == uid for _, u in self.things.values()
            )
            if key in slices and (settled or now > request.sent + BOUNDS.store_seconds):
                del slices[key]
                removed.append(key)
        added = self._decide_queued(pool, now, slices, wall)
        write = None
        fenced = self.count.fenced(pool)
        available = self.escrow.available(pool)
        grow: dict[str, Decimal] = {}
        give: dict[str, Decimal] = {}
        # Decided with the entries this write adds: they are counted once it is stored.
        counted = self.grant_basis(pool) + sum((r.memory for r in added), ZERO)
        if not fenced and core.within({M: self.budgets[pool]}, {M: counted}):
            wanted = refill_wanted({M: self.rate}, available, BOUNDS)
            if wanted:
                grow = core.grant_size(
                    budget={M: self.budgets[pool]},
                    counted={M: counted},
                    want=wanted,
                    bounds=BOUNDS,
                )
        if (self.over_budget(pool) or self.escrow.idle(pool, now)) and available.get(M):
            give = dict(available)
        elif not grow and self.escrow.renew_due(pool, now):
            give = surplus({M: self.rate}, available, BOUNDS)
        write = self.escrow.plan(
            pool,
            now=now,
            wall=wall,
            version=version_of(copied),
            grow=grow,
            give_back=give,
            kinds=frozenset({KIND}),
        )
        if write is not None:
            slices[self.incarnation] = write.record
        if write is None and not added and not removed:
            return None
        body = copy.deepcopy(copied)
        body["status"] = {
            "slices": {i: record_json(r) for i, r in sorted(slices.items())},
            "removals": removals_of(copied) + len(removed),
        }
        call = Call(self, pool, body, write, added, removed, self.seen.get("tenants", 0))
        self.inflight[pool] = call
        return call

    def _decide_queued(
        self, pool: str, now: float, slices: dict[str, core.SliceRecord], wall: float
    ) -> list[Request]:
        """Decide the exact-path requests waiting on ``pool`` against the count, in order; the
        allowed ones become entries of this write, the others are answered at once."""
        added = []
        running = self.view(pool)
        for request in self.queue.pop(pool, []):
            if now > request.sent + WEBHOOK_TIMEOUT:
                continue  # the API server gave up on the call
            increase = self.increase(request)
            request.grows = increase > 0
            fits = increase <= 0 or (
                not self.count.fenced(pool) and running + increase <= self.budgets[pool]
            )
            if not fits:
                self.answers.append((request, False, "exceeded"))
                continue
            running += request.memory
            request.told = self.seen.get("tenants", 0)
            key = f"{ENTRY}{self.name}.{request.uid}"
            slices[key] = core.SliceRecord(
                key,
                self.name,
                frozenset({KIND}),
                {M: request.memory},
                expires=wall + BOUNDS.lease_seconds,
            )
            self.entries[request.uid] = request
            added.append(request)
        return added

    # -- outcomes --------------------------------------------------------------------------

    def stored(self, call: Call, obj: Obj, now: float) -> None:
        self.inflight.pop(call.pool, None)
        if call.write is not None:
            mine = records_of(obj).get(self.incarnation)
            self.escrow.stored(call.write, mine, version_of(obj))
        self.remember(obj)
        for key in call.removed:
            if key.startswith(f"{ENTRY}{self.name}."):
                self.entries.pop(key.removeprefix(f"{ENTRY}{self.name}."), None)
        for request in call.added:
            late = now > request.sent + WEBHOOK_TIMEOUT
            request.replica = self.name
            request.incarnation = f"{ENTRY}{self.name}.{request.uid}"
            self.answers.append((request, not late, "allowed" if not late else "too late"))

    def conflict(self, call: Call, current: Obj) -> None:
        """409: nothing was stored; the current object is read at once (as the ledger does)."""
        self.inflight.pop(call.pool, None)
        if call.write is not None:
            self.escrow.refused(call.write)
        for request in call.added:
            self.entries.pop(request.uid, None)
            self.answers.append((request, False, "conflict: try again"))
        self.remember(current)

    def unknown(self, call: Call) -> None:
        """The write failed without saying whether it was stored."""
        self.inflight.pop(call.pool, None)
        if call.write is not None:
            self.escrow.unknown(call.write)
        for request in call.added:  # perhaps stored: removed once it can no longer be
            self.answers.append((request, False, "unavailable"))

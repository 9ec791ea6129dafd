"""Fair queuing by tenant: whose admission the event loop decides next.

Every tenant's writes are decided on one event loop, one at a time, so a tenant sending many
costly reviews would otherwise delay everyone's decision behind all of its own. As
kube-apiserver's API Priority and Fairness does per flow (KEP-1040, ``util/flowcontrol`` in
``k8s.io/apiserver``: fair queuing by virtual start time, the estimate corrected by what the
request actually took, no banked credit), each request is queued in its **flow**, the tenant
subtree it writes in (:func:`flow_of`), and the next request dispatched is the head of the
flow whose virtual start is least. A flow's virtual start advances by the estimated cost of
each request it sends (seconds of CPU, from the body's size) and by whatever more the decision
really took (an estimate above it is not refunded); a flow idle for a while starts again at the
current virtual time, never below it, so idleness banks nothing. A tenant with one cheap
request waiting is therefore served before the next of another tenant's many, and no
backlogged flow waits behind more than one request of each other flow.

A flow holding ``queue_length`` waiting requests is refused its next one (the others are
untouched); the wait limit is the adapter's timer, which withdraws a ticket that waited too
long. Pure: no clock is read here, ``now`` is passed in.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from webhook.core.tenancy.tenants import ROOT_NAMESPACE, ancestors, is_tenant_namespace

__all__ = [
    "BASE_SECONDS",
    "CLUSTER_FLOW",
    "DEFAULT_FAIR_LIMITS",
    "UNREAD_FLOW",
    "FairLimits",
    "FairQueue",
    "Ticket",
    "estimate_seconds",
    "flow_of",
]

CLUSTER_FLOW: Final = "(cluster)"  # cluster-scoped objects: no namespace
UNREAD_FLOW: Final = "(unread)"  # a namespace the cheap scan could not read
# A Kubernetes namespace is a DNS label; anything else read from a body is not one.
_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

# What one decision costs before it is measured, from the body's size: a fixed part (decode,
# parse, the answer and its log line: about 0.3 ms for a u1.micro VMInstance) and a part per
# byte (a 743 KB body of 45,000 made-up keys took about 65 ms, some 90 ns a byte). Only the
# order of requests not yet measured depends on it: each is corrected by what it really took.
BASE_SECONDS: Final = 0.0003
SECONDS_PER_BYTE: Final = 90e-9
_LEAST: Final = 1e-6  # every request advances its flow: a free one would tie with newcomers


def estimate_seconds(body_bytes: int) -> float:
    """The CPU a review of ``body_bytes`` is expected to take, before it is decided."""
    return BASE_SECONDS + max(body_bytes, 0) * SECONDS_PER_BYTE


def flow_of(namespace: str | None) -> str:
    """The flow a write in ``namespace`` is queued in: the top-level tenant whose subtree holds
    it (``tenant-acme`` for ``tenant-acme-dev-x``), so a tenant cycling the namespaces of its
    subtree is still one flow. Derived from the name alone (a tenant namespace's parent is its
    name without the last ``-part``), as the tenant tree itself is; the root's own namespace,
    and a namespace no tenant owns, are flows of their own."""
    if namespace is None or namespace == "":
        return CLUSTER_FLOW
    if not _NAMESPACE.fullmatch(namespace):
        return UNREAD_FLOW
    if not is_tenant_namespace(namespace) or namespace == ROOT_NAMESPACE:
        return namespace
    chain = ancestors(namespace)  # [namespace, ..., top-level tenant, tenant-root]
    return chain[-2] if len(chain) >= 2 and chain[-1] == ROOT_NAMESPACE else namespace


@dataclass(frozen=True, slots=True)
class FairLimits:
    """How many decisions run at once, and how much one flow may have waiting."""

    seats: int = 1  # decisions on the loop at once: the loop runs one at a time anyway
    queue_length: int = 50  # waiting requests per flow, as APF's default queue length
    remembered_flows: int = 4096  # idle flows whose debt is kept; the oldest debt goes first


DEFAULT_FAIR_LIMITS: Final = FairLimits()


@dataclass(eq=False, slots=True)
class Ticket:
    """One request in the queue: its flow, its estimate, and when it arrived."""

    flow: str
    estimate: float
    arrived: float
    seq: int
    virtual_start: float = 0.0  # set when dispatched
    state: str = "waiting"  # waiting | seated | released | withdrawn


@dataclass(slots=True)
class _Flow:
    start: float = 0.0  # the virtual start of the flow's next request
    waiting: deque[Ticket] = field(default_factory=deque)
    seated: int = 0


class FairQueue:
    """The queue of requests waiting for a seat, by flow, dispatched by least virtual start."""

    def __init__(self, limits: FairLimits = DEFAULT_FAIR_LIMITS) -> None:
        if limits.seats < 1 or limits.queue_length < 1:
            raise ValueError("a fair queue needs at least one seat and one place per flow")
        self.limits = limits
        self.virtual_time = 0.0
        self._flows: dict[str, _Flow] = {}
        self._backlogged: dict[str, _Flow] = {}  # flows with a request waiting
        self._free = limits.seats
        self._seq = 0
        self.waiting = 0

    def arrive(
        self, flow: str, estimate: float, now: float, *, resumed: bool = False
    ) -> Ticket | None:
        """Queue a request of ``flow``; ``None`` when the flow already holds ``queue_length``
        waiting requests (that flow alone is refused; nothing else changes). A ``resumed``
        request (one under way, waiting for its turn again) is never refused."""
        state = self._flows.get(flow)
        if state is None:
            self._forget_beyond_bound()
            state = self._flows[flow] = _Flow(start=self.virtual_time)
        elif len(state.waiting) >= self.limits.queue_length and not resumed:
            return None
        if not state.waiting:
            state.start = max(state.start, self.virtual_time)  # no banked credit
            self._backlogged[flow] = state
        self._seq += 1
        ticket = Ticket(flow, max(estimate, _LEAST), now, self._seq)
        state.waiting.append(ticket)
        self.waiting += 1
        return ticket

    def dispatch(self) -> Ticket | None:
        """The next request to run, seated, when a seat is free and a request waits."""
        if self._free <= 0 or not self._backlogged:
            return None
        if len(self._backlogged) == 1:  # the common case: one flow waits, nothing to choose
            name, state = next(iter(self._backlogged.items()))
        else:
            name, state = min(
                self._backlogged.items(), key=lambda item: (item[1].start, item[1].waiting[0].seq)
            )
        ticket = state.waiting.popleft()
        self.waiting -= 1
        if not state.waiting:
            del self._backlogged[name]
        ticket.virtual_start = state.start
        self.virtual_time = max(self.virtual_time, state.start)
        state.start += ticket.estimate
        state.seated += 1
        self._free -= 1
        ticket.state = "seated"
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Free the seat ``ticket`` held (its costly part is over); idempotent."""
        if ticket.state != "seated":
            return
        ticket.state = "released"
        self._free += 1
        state = self._flows.get(ticket.flow)
        if state is not None:
            state.seated -= 1

    def charge(self, ticket: Ticket, spent: float) -> None:
        """Charge the flow what the request took beyond its estimate: the next requests of a
        flow whose decisions cost more start later. An estimate above what was spent is not
        refunded, so no flow banks credit: every waiting flow's virtual start stays at or
        above the virtual time, which is what keeps a newcomer ahead of others' second."""
        self.release(ticket)
        state = self._flows.get(ticket.flow)
        if state is None:
            return
        state.start += max(spent - ticket.estimate, 0.0)
        self._forget_if_even(ticket.flow, state)

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a waiting ticket out (it waited too long, or its client left); ``False`` when it
        was dispatched meanwhile and must run."""
        if ticket.state != "waiting":
            return False
        state = self._flows[ticket.flow]
        state.waiting.remove(ticket)
        self.waiting -= 1
        ticket.state = "withdrawn"
        if not state.waiting:
            self._backlogged.pop(ticket.flow, None)
        self._forget_if_even(ticket.flow, state)
        return True

    def waiting_in(self, flow: str) -> int:
        state = self._flows.get(flow)
        return len(state.waiting) if state is not None else 0

    def retry_after(self, flow: str) -> int:
        """Whole seconds after which the flow's queue is expected to have room again: its
        waiting work, shared with every other backlogged flow (at least 1)."""
        state = self._flows.get(flow)
        if state is None:
            return 1
        own = sum(ticket.estimate for ticket in state.waiting)
        return max(1, math.ceil(own * max(len(self._backlogged), 1)))

    def _forget_if_even(self, name: str, state: _Flow) -> None:
        if not state.waiting and not state.seated and state.start <= self.virtual_time:
            del self._flows[name]  # owes nothing: the same as a flow never seen

    def _forget_beyond_bound(self) -> None:
        """Past ``remembered_flows``, forget the idle flow owing least (its start nearest the
        virtual time): it loses at most that debt. Flows with work are never forgotten."""
        if len(self._flows) < self.limits.remembered_flows:
            return
        idle = [(s.start, n) for n, s in self._flows.items() if not s.waiting and not s.seated]
        if idle:
            del self._flows[min(idle)[1]]

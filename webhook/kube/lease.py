"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Several replicas of the webhook run at once, and some work must be done by one of them only.
The replicas agree through one Lease, the way client-go's ``leaderelection`` package does it,
because its rules are what make the agreement safe without synchronised clocks:

- A follower never compares the holder's ``renewTime`` with its own wall clock (replicas'
  clocks differ). It remembers when, on its own monotonic clock, it last saw the record change,
  and treats the Lease as expired only after ``lease_duration`` without a change.
- Every write carries the resourceVersion that was read, so of two followers taking over the
  same expired Lease only one succeeds; the other gets ``409 Conflict`` and stays a follower.
- A leader believes in its leadership only until ``renew_deadline`` after it sent its last
  renewal that succeeded. Since ``renew_deadline < lease_duration``, it has stepped down before
  any follower can see the Lease as expired (the tolerance to clock-rate skew is the ratio of
  the two, as client-go's package documentation explains).
- On a clean stop the leader releases the Lease (empty holder), so a rolling update hands over
  at once instead of after ``lease_duration``. A replica that dies without releasing is replaced
  once the Lease has stayed unchanged for ``lease_duration``.

API errors, timeouts and unreachable servers are logged and retried: leader election degrades
to "nobody leads for a while", never to an exception in the caller.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from webhook.kube.client import ApiError, KubeClient, ResourceRef
from webhook.waits import sleep_unless_stopped

__all__ = ["JITTER_FACTOR", "LEASES", "MICROTIME_FORMAT", "LeaderElector"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]

LEASES: Final = ResourceRef("coordination.k8s.io", "v1", "leases")
# client-go's leaderelection.JitterFactor: a follower waits between retry_period and
# (1 + 1.2) * retry_period between attempts, so replicas started together spread out.
JITTER_FACTOR: Final = 1.2
# metav1.MicroTime's wire format (RFC 3339 with microseconds, always UTC).
MICROTIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
# What client-go writes on release: the Lease is free, and anyone may take it at once.
RELEASED_LEASE_SECONDS: Final = 1


class LeaderElector:
    """Competes for one Lease; :attr:`is_leader` says whether this replica holds it now.

    ``on_change`` is called with the new value each time leadership flips (also settable as an
    attribute); :attr:`transitions` counts those flips. :attr:`leader` is the holder identity
    last seen on the Lease ("" when free or not read yet).
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        # The same checks as client-go's NewLeaderElector: each one is what keeps a leader
        # from outliving its lease in the eyes of the followers.
        if not identity:
            raise ValueError("identity must not be empty")
        if retry_period <= 0:
            raise ValueError("retry_period must be greater than zero")
        if lease_duration <= renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if renew_deadline <= JITTER_FACTOR * retry_period:
            raise ValueError(
                f"renew_deadline must be greater than retry_period * {JITTER_FACTOR:g}"
            )
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.on_change = on_change
        self.leader = ""
        self.transitions = 0
        self._leading = False
        self._deadline = 0.0  # by self.clock: leadership is believed until then
        self._lease: Obj | None = None  # the Lease as last read or written
        self._observed: Obj | None = None  # its spec, to notice changes
        self._observed_at = 0.0  # by self.clock: when the spec last changed

    @property
    def is_leader(self) -> bool:
        """Holding the Lease, and within ``renew_deadline`` of the last successful renewal.

        The deadline is checked here too, so the answer is right even between two turns of
        :meth:`run` (which calls ``on_change(False)`` once it notices).
        """
        return self._leading and self.clock() < self._deadline

    async def run(self, stop: asyncio.Event) -> None:
        """Acquire or renew every retry period until ``stop`` is set, then release the Lease.

        Cancelling the task instead ends leadership locally without releasing: the others
        take over once the Lease has gone unchanged for ``lease_duration``.
        """
        try:
            while not stop.is_set():
                await self._attempt()
                await sleep_unless_stopped(self._delay(), stop)
            await self._release()
        finally:
            self._set_leading(False)

    # --- one round ---------------------------------------------------------------------------

    async def _attempt(self) -> None:
        started = self.clock()
        if self._leading and started >= self._deadline:
            self._step_down("renew deadline passed")
        # A round never outlives the leader's deadline; a follower's round is bounded the same
        # way, since leadership won later than that would be past its deadline on arrival.
        budget = self._deadline - started if self._leading else self.renew_deadline
        try:
            async with asyncio.timeout(budget):
                acquired = await self._try_acquire_or_renew()
        except TimeoutError:
            self._warn("lease request timed out", f"no answer within {budget:.3g}s")
            acquired = False
        except ApiError as exc:
            self._warn("lease request failed", str(exc), status=exc.status)
            acquired = False
        if acquired:
            self._deadline = started + self.renew_deadline
            self._set_leading(True)
        elif self._leading and self.clock() >= self._deadline:
            self._step_down("renew deadline passed")

    async def _try_acquire_or_renew(self) -> bool:
        now = _microtime()
        if self._leading and self._lease is not None:
            # client-go's optimistic renewal: the Lease we wrote last is current unless someone
            # else wrote since, and then the PUT gets 409 and we read it again below.
            try:
                lease = self._record(self._lease, renew_time=now)
                self._written(await self.client.replace(LEASES, lease))
                return True
            except ApiError as exc:
                if exc.status != 409:
                    raise
        try:
            current = await self.client.get(LEASES, self.namespace, self.name)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return await self._create(now)
        self._observe(current)
        holder = str(_spec(current).get("holderIdentity") or "")
        if holder and holder != self.identity:
            if self._leading:
                self._step_down(f"lease taken by {holder}")
            if self.clock() - self._observed_at < self.lease_duration:
                return False
        try:
            self._written(await self.client.replace(LEASES, self._record(current, renew_time=now)))
        except ApiError as exc:
            if exc.status != 409:
                raise
            log.info("lost the race for the lease", extra={"fields": self._fields()})
            return False
        return True

    async def _create(self, now: str) -> bool:
        lease: Obj = {
            "apiVersion": LEASES.api_version,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self._lease_seconds(),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            self._written(await self.client.create(LEASES, lease))
        except ApiError as exc:
            if exc.status != 409:  # AlreadyExists: another replica created it first
                raise
            log.info("lost the race for the lease", extra={"fields": self._fields()})
            return False
        return True

    async def _release(self) -> None:
        lease = self._lease
        if lease is None or _spec(lease).get("holderIdentity") != self.identity:
            return
        self._set_leading(False)  # stop believing first, then give it away
        now = _microtime()
        released = copy.deepcopy(lease)
        released["spec"] = {
            **_spec(lease),
            "holderIdentity": "",
            "leaseDurationSeconds": RELEASED_LEASE_SECONDS,
            "acquireTime": now,
            "renewTime": now,
        }
        try:
            async with asyncio.timeout(self.renew_deadline):
                self._observe(await self.client.replace(LEASES, released))
        except TimeoutError:
            self._warn("lease not released", f"no answer within {self.renew_deadline:g}s")
            return
        except ApiError as exc:  # 409: someone else already wrote it, nothing to give away
            self._warn("lease not released", str(exc), status=exc.status)
            return
        log.info("lease released", extra={"fields": self._fields()})

    # --- the record --------------------------------------------------------------------------

    def _record(self, lease: Obj, *, renew_time: str) -> Obj:
        """``lease`` held by us, renewed at ``renew_time``; a change of holder is a transition."""
        spec = _spec(lease)
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire_time = spec.get("acquireTime") or renew_time
        if spec.get("holderIdentity") != self.identity:
            transitions += 1
            acquire_time = renew_time
        record = copy.deepcopy(lease)  # keeps metadata.resourceVersion: optimistic concurrency
        record["spec"] = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._lease_seconds(),
            "acquireTime": acquire_time,
            "renewTime": renew_time,
            "leaseTransitions": transitions,
        }
        return record

    def _lease_seconds(self) -> int:
        # The field is whole seconds and must be positive. Rounding up never tells another
        # elector to take over sooner than this one would; expiry here uses lease_duration.
        return max(1, math.ceil(self.lease_duration))

    def _observe(self, lease: Obj) -> None:
        spec = _spec(lease)
        if spec != self._observed:
            self._observed = spec
            self._observed_at = self.clock()
        self._lease = lease
        self.leader = str(spec.get("holderIdentity") or "")

    def _written(self, lease: Obj) -> None:
        self._observe(lease)
        self._observed_at = self.clock()

    # --- leadership ----------------------------------------------------------------------------

    def _step_down(self, reason: str) -> None:
        if self._leading:
            log.warning("leadership lost", extra={"fields": {**self._fields(), "reason": reason}})
            self._set_leading(False)

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        self.transitions += 1
        if leading:
            log.info("leadership acquired", extra={"fields": self._fields()})
        if self.on_change is not None:
            try:
                self.on_change(leading)
            except Exception:
                log.exception("leadership hook failed", extra={"fields": self._fields()})

    def _delay(self) -> float:
        if self._leading:
            # Wake up at the deadline at the latest, to step down on time.
            return max(0.0, min(self.retry_period, self._deadline - self.clock()))
        return self.retry_period * (1 + random.random() * JITTER_FACTOR)

    def _fields(self) -> dict[str, object]:
        return {"lease": f"{self.namespace}/{self.name}", "identity": self.identity}

    def _warn(self, message: str, error: str, *, status: int | None = None) -> None:
        fields: dict[str, object] = {**self._fields(), "error": error, "leading": self._leading}
        if status is not None:
            fields["status"] = status
        log.warning(message, extra={"fields": fields})


def _spec(lease: Obj) -> Obj:
    spec = lease.get("spec")
    return dict(spec) if isinstance(spec, dict) else {}


def _microtime() -> str:
    return datetime.now(UTC).strftime(MICROTIME_FORMAT)

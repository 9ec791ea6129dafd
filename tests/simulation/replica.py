"""One webhook replica as production wires it: live state, ledger, and the leader's duties.

The same pieces :class:`webhook.server.LiveServices` assembles (a :class:`LiveState`, a
:class:`Ledger` whose readiness the state requires, the periodic duty that expires holds and,
on the replica holding the Lease, reconciles every pool), built on a :class:`SimClient` and
the simulator's clocks. Leadership is the simulator's choice (``is_leader``), which is what the
Lease decides in production; the HTTP layer is left out: admissions call
:meth:`Ledger.admit` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from tests.simulation.apiserver import SimAPI, SimClient
from webhook.admission.ledger import Ledger, LedgerSettings
from webhook.core.tenancy.records import RecordKeys
from webhook.settings import Settings
from webhook.state.live import LiveSettings, LiveState
from webhook.waits import sleep_unless_stopped

# The shipped default (the store bound plus the skew): what is proved is what runs.
GRACE_SECONDS = Settings().grace_seconds
READ_TIMEOUT = 90.0
WATCH_TIMEOUT = 300
RECONCILE_SECONDS = 2.0


class Replica:
    """A running replica; :meth:`stop` ends it the way a killed pod ends (nothing flushed)."""

    def __init__(
        self,
        api: SimAPI,
        name: str,
        *,
        monotonic: Callable[[], float],
        wall: Callable[[], float],
        is_leader: Callable[[str], bool],
        keys: RecordKeys,
        escrow: bool = False,
    ) -> None:
        self.name = name
        self.wall = wall
        self.is_leader = is_leader
        client = SimClient(api, name)
        self.live = LiveState(
            client,
            LiveSettings(read_timeout=READ_TIMEOUT, watch_timeout=WATCH_TIMEOUT),
            clock=monotonic,
        )
        self.ledger = Ledger(
            client,
            self.live,
            LedgerSettings(
                replica=name,
                grace_seconds=GRACE_SECONDS,
                reconcile_seconds=RECONCILE_SECONDS,
                read_timeout=READ_TIMEOUT,
                watch_timeout=WATCH_TIMEOUT,
                # The simulated API server honours dry runs, and the at-rest probe decides with
                # them: nothing is stored, so nothing is held.
                dry_run_holds=False,
                escrow=escrow,
            ),
            clock=wall,
        )
        # The ledger builds its reflector on the default clock; readiness compares that clock
        # with itself only, so the simulator's monotonic clock is swapped in.
        self.ledger.reflector.clock = monotonic
        self.ledger.reflector.started = monotonic()
        self.live.required["ledger (tenantreservations)"] = lambda: self.ledger.synced
        self.live.use_keys(keys)  # the record-key Secret every replica reads
        self._stop = asyncio.Event()
        self._tasks = [
            asyncio.ensure_future(self.live.run(self._stop)),
            asyncio.ensure_future(self.ledger.reflector.run(self._stop)),
            asyncio.ensure_future(self._duties()),
        ]
        if escrow:
            self._tasks.append(asyncio.ensure_future(self._escrow()))

    @property
    def synced(self) -> bool:
        return self.live.state.synced

    async def _duties(self) -> None:
        """LiveServices._duties without certificates and drift: expiry and the leader's pass."""
        while not self._stop.is_set():
            self.ledger.sweep()
            state = self.live.state
            if state.synced and self.is_leader(self.name):
                await self.ledger.reconcile()
            await sleep_unless_stopped(self.ledger.settings.reconcile_seconds, self._stop)

    async def _escrow(self) -> None:
        """LiveServices' escrow duty: fold, refill, renew, return and reclaim slices."""
        while not self._stop.is_set():
            if self.live.state.synced:
                await self.ledger.escrow()
            await self.ledger.escrow_rest(self._stop)

    def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()

    def failures(self) -> list[BaseException]:
        """Exceptions that ended a background task (a production loop that died)."""
        found = []
        for task in self._tasks:
            if task.done() and not task.cancelled():
                with contextlib.suppress(asyncio.CancelledError):
                    error = task.exception()
                    if error is not None:
                        found.append(error)
        return found

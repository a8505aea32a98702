"""The lease keeper: proves to other processes that the runs this process executes are alive.

Every open run this process executes is *held*. While it holds any, one background task renews
all their leases in one store statement every third of the lease's length (ADR 0009), so a
crash, ``kill -9`` or power cut lets another process close them after at most one lease length.

If a renewal finds a held run that is no longer ours -- this process stalled past its lease
(a suspended laptop, a debugger) and another process closed the run as interrupted -- the task
executing it is cancelled: the run has ended, so we stop spending tokens and tool calls on it
(the store would refuse its events anyway).
"""

from __future__ import annotations

import asyncio
import logging
import time

from thoughtgate.store.leases import DEFAULT_LEASE_TTL_S, LOST_LEASE, Owner
from thoughtgate.store.run_index import RunIndex

__all__ = ["LeaseKeeper"]

log = logging.getLogger("thoughtgate.leases")


class LeaseKeeper:
    """Holds and renews the leases of the runs one process executes against one store."""

    def __init__(
        self, store: RunIndex, owner: Owner | None = None, *, ttl_s: float = DEFAULT_LEASE_TTL_S
    ) -> None:
        self.store = store
        self.owner = owner or Owner.current()
        self.ttl_s = ttl_s
        self.renew_every = ttl_s / 3
        self._held: dict[str, asyncio.Task[object] | None] = {}
        self._renewer: asyncio.Task[None] | None = None
        self._failing = False

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def lease_until(self) -> float:
        """The expiry a new run's lease starts with."""
        return time.time() + self.ttl_s

    def hold(self, run_id: str, task: asyncio.Task[object] | None = None) -> None:
        """Keep ``run_id``'s lease alive; ``task`` is cancelled if the run is lost."""
        self._held[run_id] = task
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_forever(), name="thoughtgate lease renewal"
            )

    def release(self, run_id: str) -> None:
        """Stop renewing ``run_id`` (call it before ending the run, so a renewal racing the end
        can never mistake the run for a lost one)."""
        self._held.pop(run_id, None)
        if not self._held and self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None

    async def renew(self) -> None:
        """Renew now; cancel the tasks of held runs that another process closed."""
        held = dict(self._held)
        if not held:
            return
        still = set(await self.store.renew_leases(self.owner.owner_id, self.ttl_s))
        for run_id, task in held.items():
            if run_id in still or run_id not in self._held:
                continue
            log.warning("run %s: %s; stopping its execution here", run_id, LOST_LEASE)
            self._held.pop(run_id, None)
            if task is not None and not task.done():
                task.cancel(LOST_LEASE)

    async def _renew_forever(self) -> None:
        while self._held:
            try:
                await self.renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is down: say so once per outage, keep trying
                if not self._failing:
                    log.warning("cannot renew run leases (runs stay open meanwhile): %s", exc)
                self._failing = True
            else:
                self._failing = False
            await asyncio.sleep(self.renew_every)

"""The lease keeper: proves to other processes that the runs this process executes are alive.

Every open run this process executes is *held*. While it holds any, one background task renews
their leases -- theirs only, not every open run this process started -- in one store statement
every third of the lease's length (ADR 0009), so a crash, ``kill -9`` or power cut lets another
process close them after at most one lease length. A run this process stops executing without
recording its end (the store refused it for longer than the retries) is renewed no more, so its
lease expires and a sweep closes it, this process's own included (ADR 0060).

While a run's end is being recorded its lease is still renewed (:meth:`LeaseKeeper.ending`): no
sweep can take the run from under the ending its own process is recording, however slowly the
store answers, and the lease runs out only once that process gave up.

If a renewal finds a held run that is no longer ours -- this process stalled past its lease
(a suspended laptop, a debugger) and another process closed the run as interrupted -- the task
executing it is cancelled: the run has ended, so we stop spending tokens and tool calls on it
(the store would refuse its events anyway), and whoever asked (:meth:`LeaseKeeper.on_lost`: a
daemon's waiting line) forgets it.

A run this process admitted as its own is renewed from its admission (:meth:`LeaseKeeper.admit`)
until its execution holds it or it goes elsewhere (ADR 0065): the create-to-execute window is
milliseconds, but a run whose execution is slow to begin must not lose its lease meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from thoughtgate.store.leases import DEFAULT_LEASE_TTL_S, LOST_LEASE, Owner
from thoughtgate.store.run_index import RunIndex

__all__ = ["ADMITTED_FOR_LEASES", "LeaseKeeper"]

log = logging.getLogger("thoughtgate.leases")

ADMITTED_FOR_LEASES = 4
"""How many lease lengths a run admitted here is renewed for at most before its execution holds
it (a minute by default): its execution begins within milliseconds, or a few seconds on a busy
host; one that has not begun by then never will (its caller was cancelled before it ran), and
the run is left to its lease and the sweep, as any run this process stopped executing."""


class LeaseKeeper:
    """Holds and renews the leases of the runs one process executes against one store."""

    def __init__(
        self, store: RunIndex, owner: Owner | None = None, *, ttl_s: float = DEFAULT_LEASE_TTL_S
    ) -> None:
        self.store = store
        self.owner = owner or Owner.current()
        self.ttl_s = ttl_s
        self.renew_every = ttl_s / 3
        self.admitted_for_s = ttl_s * ADMITTED_FOR_LEASES
        self._held: dict[str, asyncio.Task[object] | None] = {}
        self._ending: dict[str, int] = {}
        """Runs whose end is being recorded, and by how many callers at once."""
        self._admitted: dict[str, float] = {}
        """Runs this process admitted as its own whose execution has not begun, and when
        (``time.monotonic()``, ADR 0065)."""
        self._lost: list[Callable[[str], None]] = []
        self._renewer: asyncio.Task[None] | None = None
        self._failing = False

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def __contains__(self, run_id: object) -> bool:
        """Whether this process renews ``run_id``'s lease: it executes the run (or holds it
        waiting for a slot), or is recording its end. Any other open run it owns is one it no
        longer executes, which the lease sweep closes once its lease has expired
        (``store.leases.close_orphaned_runs``, asking this as it looks at each run)."""
        return run_id in self._held or run_id in self._ending or run_id in self._admitted

    def lease_until(self) -> float:
        """The expiry a new run's lease starts with."""
        return time.time() + self.ttl_s

    def hold(self, run_id: str, task: asyncio.Task[object] | None = None) -> None:
        """Keep ``run_id``'s lease alive; ``task`` is cancelled if the run is lost."""
        self._admitted.pop(run_id, None)
        self._held[run_id] = task
        self._renewing()

    def admit(self, run_id: str) -> None:
        """Renew the lease of a run this process is admitting as its own until its execution
        holds it (:meth:`hold`) or it goes elsewhere (:meth:`unadmit`, :meth:`release`). Called
        before the admission commits: a renewal meanwhile finds nothing and changes nothing.
        One that began ``renew_every`` after the admission and does not find the run drops it
        -- it ended, or another process took it, before its execution began (a caller that
        never executed it) -- with nothing to cancel: nothing of it executes here; and so does
        the first one ``admitted_for_s`` after it (its execution never began)."""
        self._admitted[run_id] = time.monotonic()
        self._renewing()

    def is_admitted(self, run_id: str) -> bool:
        """Whether ``run_id`` was admitted here and its execution has not begun (not held yet,
        nor given up): a cancel now would end nothing by itself (ADR 0072)."""
        return run_id in self._admitted

    def unadmit(self, run_id: str) -> None:
        """An admitted run will not be executed here after all (its admission failed, it went
        to a queue, its execution gave up before it began): renewed no more, unless held."""
        self._admitted.pop(run_id, None)
        self._stop_when_idle()

    def release(self, run_id: str, task: asyncio.Task[object] | None = None) -> None:
        """Stop renewing ``run_id``: this process no longer executes it. Its lease then expires
        within one lease length, and a sweep closes it if it is still open.

        ``task``: the execution letting go (as it :meth:`hold` the run): nothing changes when
        another task holds the run now -- a later execution of it in this process, which this
        process's own queue took back while the first one stalled (ADR 0093)."""
        if task is not None and self._held.get(run_id, task) is not task:
            return
        self._held.pop(run_id, None)
        self._admitted.pop(run_id, None)
        self._stop_when_idle()

    def release_waiting(self, run_id: str) -> None:
        """:meth:`release` the hold of a run that waited in a daemon's line (held with no
        task), unless an execution (a task) holds the run now: this process's own queue took
        it back and claimed it while it waited (ADR 0094)."""
        if self._held.get(run_id) is None:
            self.release(run_id)

    def on_lost(self, forget: Callable[[str], None]) -> None:
        """Call ``forget(run_id)`` when a renewal finds a held run no longer ours (a daemon's
        waiting line drops it: another process took it, ADR 0065)."""
        self._lost.append(forget)

    @contextmanager
    def ending(self, run_id: str, task: asyncio.Task[object] | None = None) -> Iterator[None]:
        """While the block records ``run_id``'s end: its lease is still renewed, but a renewal
        that no longer finds the run (it has just ended) is not a lost run -- so a renewal
        racing the end never cancels the task recording it. When the block is over the run is
        released: if its end could not be recorded, its lease expires and a sweep closes it.

        ``task``: the execution recording the end (``None``: none -- a daemon ending a run of
        its waiting line, or one it admitted). Its own hold only is taken out: while another
        task holds the run -- a later execution of it in this process, whose claim superseded
        this one (the end is then refused) -- that hold is left as it is (ADR 0094), as
        :meth:`release` leaves it."""
        if self._held.get(run_id) is task:
            self._held.pop(run_id, None)
        self._admitted.pop(run_id, None)
        self._ending[run_id] = self._ending.get(run_id, 0) + 1
        self._renewing()
        try:
            yield
        finally:
            left = self._ending.pop(run_id) - 1
            if left:
                self._ending[run_id] = left
            self._stop_when_idle()

    def _renewing(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_forever(), name="thoughtgate lease renewal"
            )

    def _stop_when_idle(self) -> None:
        if not (self._held or self._ending or self._admitted) and self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None

    async def renew(self) -> None:
        """Renew now; cancel the tasks of held runs that another process closed."""
        held = dict(self._held)
        admitted = dict(self._admitted)
        renewing = held.keys() | self._ending.keys() | admitted.keys()
        if not renewing:
            return
        began = time.monotonic()
        still = set(await self.store.renew_leases(self.owner.owner_id, self.ttl_s, renewing))
        for run_id, since in admitted.items():
            gone = run_id not in still and since <= began - self.renew_every
            if (gone or since <= began - self.admitted_for_s) and (
                self._admitted.get(run_id) == since  # not admitted again or held since
            ):
                del self._admitted[run_id]
        for run_id, task in held.items():
            if run_id in still or run_id not in self._held or self._held[run_id] is not task:
                continue  # renewed, or released (or held anew) while the renewal was under way
            log.warning("run %s: %s; stopping its execution here", run_id, LOST_LEASE)
            self._held.pop(run_id, None)
            if task is not None and not task.done():
                task.cancel(LOST_LEASE)
            for forget in self._lost:
                forget(run_id)

    async def _renew_forever(self) -> None:
        while self._held or self._ending or self._admitted:
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

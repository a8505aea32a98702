"""When a daemon starts a new durable run itself, and when it leaves it to the work queue (ADR 0025).

A run that waits for DBOS's queue poll waits up to ``durability.poll_interval_s`` (0.5 s) before
its first event, and a daemon whose runs all go through the queue starts at most
``durability.concurrency`` of them per poll. So a daemon starts a new run for its own queue **at
once**, as a workflow of this process, when

* fewer than ``durability.concurrency`` runs of its queue execute here, and
* no run it put on its queue still waits there (a new run never overtakes a queued one).

Otherwise the run goes on the queue, as before, for this daemon or any replica on the queue -- or,
when only the first condition fails, waits in the daemon for a slot (``DurableEngine.reserve``,
ADR 0031).

The limit counts both kinds the same way DBOS counts its own: a run started at once takes a slot in
DBOS's registry of this process's workflows *under the queue's name* before its workflow is
written, so DBOS's queue worker, which dequeues only while that count is under the queue's
``worker_concurrency``, sees it, and two starts never take the same slot (the check and the
reservation run without a suspension point between them). A run started at once is a workflow of
this executor from its first instant, holding the run's lease from its creation: killed, it
resumes exactly like a dequeued run (the lease sweep releases it and ``resume_workflow`` puts it on
the queue).

While runs of this daemon wait in its queue, the queue is polled every ``poll_interval_s / 10``
(a backlog drains at the speed runs end, not one batch per poll); once none has waited for
``10 * poll_interval_s``, at ``poll_interval_s`` again. (The linger is for DBOS's worker, which
comes down from a slow interval to a fast one only a tenth per poll: a queue that went slow
between two bursts would drain the next one slowly; ADR 0029.) Once no run of the queue has
started, begun, ended or executed here for that long either, the daemon is idle and polls every
``idle_poll_interval_s`` (ADR 0057): each poll of DBOS's worker is three transactions on the
system database, the largest part of an idle daemon's CPU. The first run that starts or begins
here (a new run starts at once, without the queue) brings it back to ``poll_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from typing import Any, Protocol

from dbos import DBOS

__all__ = ["BACKLOG_POLL_DIVISOR", "Slot", "Starts"]

log = logging.getLogger("thoughtgate.durable")

BACKLOG_POLL_DIVISOR = 10
"""A queue with runs of this daemon waiting is polled this many times as often."""


class Slot(Protocol):
    """A place among the queue's running workflows in DBOS's registry (released once)."""

    def release(self) -> None: ...


class Starts:
    """The admission of one daemon's new runs to its own queue (see the module docstring)."""

    def __init__(
        self,
        queue: str,
        concurrency: int,
        poll_interval_s: float,
        idle_poll_interval_s: float | None = None,
    ) -> None:
        self.queue = queue
        self.concurrency = concurrency
        self.poll_interval_s = poll_interval_s
        self.idle_poll_interval_s = max(poll_interval_s, idle_poll_interval_s or poll_interval_s)
        self.waiting: set[str] = set()
        """Runs this daemon put on its queue that have not begun here (nor, as far as it last
        looked, anywhere else)."""
        self._pruned_at = 0.0
        self._interval = poll_interval_s
        """The interval last written to the queue's row (the queue is registered with this)."""
        self._waited_at = -float("inf")
        """When a run of this daemon last waited in its queue (``time.monotonic()``)."""
        self._used_at = time.monotonic()
        """When a run of the queue last started, began, ended or was seen executing here (the
        daemon's start counts: it may resume its own runs from the queue right away)."""
        self._recheck: asyncio.TimerHandle | None = None
        self._closed = False
        self._pace_lock = asyncio.Lock()
        self._pacers: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ slots
    def reserve(self, run_id: str) -> Slot | None:
        """A slot for ``run_id`` when it may start at once; ``None`` when it must queue. No
        suspension point between the check and the reservation: starts never share a slot."""
        active = _registry()
        if self.waiting or active.count_for_queue(self.queue) >= self.concurrency:
            return None
        slot: Slot = active.add(run_id, self.queue)
        self.used()
        return slot

    async def look_again(self, *, always: bool = False) -> None:
        """Forget waiting runs that are no longer on the queue (another replica took them, or
        they ended). Before a start: at most once per poll interval, and only when a slot is
        free; ``always``: now (the daemon's periodic sweep, so a stale entry never keeps the
        queue polling fast)."""
        if not self.waiting:
            return
        if not always and (
            time.monotonic() - self._pruned_at < self.poll_interval_s
            or _registry().count_for_queue(self.queue) >= self.concurrency
        ):
            return
        self._pruned_at = time.monotonic()
        ids = list(self.waiting)
        found = await DBOS.list_workflows_async(
            workflow_ids=ids, status=["ENQUEUED"], load_input=False, load_output=False
        )
        still = {w.workflow_id for w in found}
        self.waiting.difference_update(set(ids) - still)
        self.pace()

    # ------------------------------------------------------------------ waiting runs
    def queued(self, run_id: str) -> None:
        """``run_id`` was put on this daemon's queue (new, or to resume)."""
        self.waiting.add(run_id)
        self.pace()

    def began(self, run_id: str) -> None:
        """``run_id``'s workflow began in this process (from the queue or at once), or it waits
        nowhere after all."""
        if run_id in self.waiting:
            self.waiting.discard(run_id)
            self._waited_at = time.monotonic()
            self.pace()
        self.used()

    def used(self) -> None:
        """A run of the queue started, began or ended here: the daemon is in use, so the queue
        is polled at ``poll_interval_s`` (at least) for the next ``linger_s``. Costs a pace
        check only when the queue is idle: otherwise the pending re-check sees the new time."""
        self._used_at = time.monotonic()
        if self._recheck is None or self._interval == self.idle_poll_interval_s:
            self.pace()

    # ------------------------------------------------------------------ polling pace
    @property
    def interval_s(self) -> float:
        """The poll interval this daemon last settled on for its queue (written to the queue's
        row unless another replica had changed the row since, see :meth:`_write_pace`)."""
        return self._interval

    def pace(self) -> None:
        """Poll fast while runs of this daemon wait and for ``linger_s`` after the last began; at
        ``poll_interval_s`` while the daemon is in use and for ``linger_s`` after; at
        ``idle_poll_interval_s`` once idle (in the background: the change is one write to the
        queue's row, which DBOS's worker reads every poll)."""
        if self._closed or self._wanted_interval() == self._interval:
            return
        # An empty context: this may be called inside a workflow, whose DBOS context must not
        # follow the write.
        task = asyncio.get_running_loop().create_task(
            self._set_pace(), context=contextvars.Context()
        )
        self._pacers.add(task)
        task.add_done_callback(self._pacers.discard)

    @property
    def linger_s(self) -> float:
        """How long the queue stays fast after its backlog drained (ADR 0029): DBOS's worker
        comes down from a slow interval to a fast one by a tenth per poll (about 4.5 s from
        0.5 s to 0.05 s), so a queue that went slow between two bursts would take that long
        again to drain the next one. Also how long a daemon stays in use after its last run."""
        return self.poll_interval_s * BACKLOG_POLL_DIVISOR

    def _wanted_interval(self) -> float:
        """The interval the queue should be polled at now; while it is not the idle one, a
        re-check is scheduled for when it would change (nothing is scheduled once idle)."""
        now = time.monotonic()
        if self.waiting:
            self._waited_at = now
        if self.waiting or _registry().count_for_queue(self.queue) > 0:
            self._used_at = now
        if now < self._waited_at + self.linger_s:
            self._look_again_at(self._waited_at + self.linger_s - now)
            return self.poll_interval_s / BACKLOG_POLL_DIVISOR
        if now < self._used_at + self.linger_s:
            self._look_again_at(self._used_at + self.linger_s - now)
            return self.poll_interval_s
        return self.idle_poll_interval_s

    def _look_again_at(self, left: float) -> None:
        if self._recheck is None:
            self._recheck = asyncio.get_running_loop().call_later(left, self._look_again_later)

    def _look_again_later(self) -> None:
        self._recheck = None
        self.pace()

    async def _set_pace(self) -> None:
        try:
            await self._write_pace()
        except Exception as exc:  # the next change tries again; runs start either way
            log.warning("could not change the poll interval of queue %s: %s", self.queue, exc)

    async def _write_pace(self) -> None:
        async with self._pace_lock:
            interval = self._wanted_interval()
            if interval == self._interval:
                return
            found = await DBOS.retrieve_queue_async(self.queue)
            if found is None:
                return
            if interval > self._interval and found.polling_interval_sec != self._interval:
                # The row is shared by every replica on the queue, and another one changed it
                # since we did (its backlog, its start): it slows it down again itself. Never
                # slow the queue down under it.
                self._interval = interval
                return
            await found.set_polling_interval_sec_async(interval)
            self._interval = interval

    async def close(self) -> None:
        """Wait for a pace change under way, and change it no more (DBOS is about to stop; runs
        it cancels end after this)."""
        self._closed = True
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        for task in list(self._pacers):
            with contextlib.suppress(Exception):
                await task


def _registry() -> Any:
    """DBOS's registry of the workflows executing in this process, with their queues: what its
    queue worker counts against ``worker_concurrency`` (``dbos._core.ActiveWorkflowById``, read
    through ``dbos_private``)."""
    from thoughtgate.orchestration import dbos_private

    return dbos_private.active_workflows()

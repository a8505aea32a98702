"""The run index: run and task records, run leases (ADR 0009), and the run list.

What the log's events say about a run, kept where it can be found without replaying them: its
request and resolved modes, its status, usage and error, its tasks, which process executes it
and until when (its lease), and the live run list (``store.listing``). The fields the log
decides are a projection of it (``store.projection``, ADR 0020): every backend applies what an
append's lifecycle events change to the index in that append's transaction, so the index never
says a task or run has ended before the event that says so is stored, nor the other way round.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TypedDict, Unpack

from thoughtgate.events.payloads import RunStatus
from thoughtgate.store.listing import RUN_LIST_WAKEUP, RunListing
from thoughtgate.store.log import Holder, RunWakeups
from thoughtgate.store.records import RunRecord, TaskRecord

__all__ = ["OpenRun", "OpenRuns", "RunChange", "RunIndex"]


class RunChange(TypedDict, total=False):
    """What ``RunIndex.update_run`` changes; a field left out (or ``None``) stays as it is."""

    status: RunStatus | None
    usage: dict[str, int] | None
    error: str | None
    metadata: dict[str, object] | None
    """Merged into the run's metadata (a key set to ``None`` stays, holding ``None``)."""


@dataclass(frozen=True, slots=True)
class OpenRun:
    """A run that has not ended yet, with the lease of the process executing it."""

    run_id: str
    owner: str | None
    lease_expires_at: float | None
    queued_at: float | None = None
    """Since when it waits on a work queue for a replica (a durable run's spec, ADR 0013);
    ``None`` for a run that is not queued -- executing, or suspended until someone resumes it --
    and in a store that keeps no specs. A sweep decides with it which runs may be lost on their
    way to a queue, before it reads any spec (ADR 0066)."""


@dataclass(frozen=True, slots=True)
class OpenRuns:
    """``open_runs`` answer: the runs, and the store's clock when it read them (PostgreSQL uses
    the server's clock, so replicas on hosts whose clocks disagree still agree on expiry)."""

    runs: list[OpenRun]
    now: float


class RunIndex(RunListing):
    """Run and task records, their leases, and the run list (``RunListing``)."""

    #: How often a reader of the run list's changes (``wait_for_run_changes``) re-reads: a list
    #: may lag another process's change by this much, and each idle reader costs one read a poll.
    list_poll_interval: float = 1.0
    wakeups: RunWakeups

    @abc.abstractmethod
    async def create_run(self, run: RunRecord) -> None:
        """Insert a new run together with its tasks."""

    @abc.abstractmethod
    async def get_run(self, run_id: str, *, apart: bool = True) -> RunRecord:
        """The run with its tasks in index order; raises ``RunNotFoundError``. ``apart=False``:
        for a reader who may see none of a task's fields kept apart
        (``access.filter.reads_task_apart``, ADR 0160): those are left unread (``None``)."""

    @abc.abstractmethod
    async def list_runs(
        self, *, limit: int = 50, offset: int = 0, apart: bool = True
    ) -> list[RunRecord]:
        """Most recent first; ``apart``: as for ``query_runs``."""

    @abc.abstractmethod
    async def update_run(
        self, run_id: str, *, held_by: Holder | None = None, **change: Unpack[RunChange]
    ) -> None:
        """Change the given fields only (``metadata`` is merged); raises ``RunNotFoundError``.

        ``held_by``: the execution writing (ADR 0094), fenced as its appends are
        (:meth:`Holder.check`, in the write's own transaction): refused with
        ``RunTakenOverError`` while another execution holds the open run, ``RunClosedError``
        once it has ended; nothing changes then. ``None``: not fenced (a sweep, an operator)."""

    @abc.abstractmethod
    async def save_task(self, task: TaskRecord, *, held_by: Holder | None = None) -> None:
        """Insert or replace a task of an existing run. ``held_by``: as for ``update_run``."""

    @abc.abstractmethod
    async def find_run_ids(self, prefix: str, *, limit: int = 10) -> list[str]:
        """Ids of runs starting with ``prefix`` (sorted, at most ``limit``): ``git``-style short
        ids for the command line."""

    @abc.abstractmethod
    async def renew_leases(self, owner: str, ttl_s: float, run_ids: Collection[str]) -> list[str]:
        """Extend to ``ttl_s`` from now (the store's clock) the lease of each of ``run_ids`` that
        is open and held by ``owner``, in one statement; returns those runs' ids, so the owner
        learns which runs it no longer holds.

        Only the runs named: an owner renews the runs it executes, never every open run it
        started, so a run it stopped executing without recording its end (its end refused by a
        store outage) sees its lease expire and the sweep close it (ADR 0060)."""

    @abc.abstractmethod
    async def open_runs(
        self,
        *,
        limit: int = 1000,
        after: str | None = None,
        expired: bool = False,
        run_ids: Collection[str] | None = None,
    ) -> OpenRuns:
        """Runs still ``pending`` or ``running`` and not closed, with their owners, leases and
        ``queued_at``, in run id order: at most ``limit``, those after ``after`` (a keyset
        cursor: the last id of the page before), so a reader pages through every open run
        however many there are (ADR 0074). ``expired``: only those held by a process (an
        owner) whose lease has expired on the store's clock (``OpenRuns.now``) -- a read that
        visits the held runs only, never the queued or suspended ones (ADR 0082); ``run_ids``:
        only those among these."""

    async def clock(self) -> float:
        """The store's clock (seconds since the epoch): the server's on PostgreSQL, as every
        time it keeps (ADR 0066, 0074); this process's otherwise."""
        return time.time()

    @abc.abstractmethod
    async def rebuild_run_index(self, run_id: str) -> RunRecord:
        """Recompute the run's projected index fields from its log alone
        (``store.projection.rebuilt``, ADR 0020) and store them, in one transaction; returns
        the rebuilt row. Raises ``RunNotFoundError``. For repairs: appends keep the index
        projected as they go."""

    async def wait_for_run_changes(self, after: int, *, poll_s: float | None = None) -> None:
        """Block until a run may have changed after change number ``after`` (or a poll interval:
        ``poll_s``, else ``list_poll_interval``). In-process changes wake it at once; other
        processes' changes are seen at the next poll."""
        armed = self.wakeups.arm(RUN_LIST_WAKEUP)
        if await self.latest_run_change() > after:
            return
        await self.wakeups.wait(
            RUN_LIST_WAKEUP, self.list_poll_interval if poll_s is None else poll_s, armed=armed
        )

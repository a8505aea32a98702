"""The ``EventStore`` interface every backend implements, and the shared live-tail logic.

Backends: memory (tests), SQLite (the embedded default), PostgreSQL (scale-out). One conformance
suite (``tests/support/store_conformance.py``) checks them all. Appends are atomic per call; a run's
sequence numbers start at 1 and increase by exactly one, also under concurrent writers.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from thoughtgate.errors import StoreUnavailableError
from thoughtgate.events.payloads import RunStatus
from thoughtgate.events.schema import Event, NewEvent, is_run_terminal
from thoughtgate.store.listing import RUN_LIST_WAKEUP, RunListing
from thoughtgate.store.records import ApiKeyRecord, RunRecord, TaskRecord

__all__ = ["EventStore", "OpenRun", "OpenRuns", "RunListener", "RunWakeups"]

log = logging.getLogger(__name__)


class RunListener(Protocol):
    """A live reader of one run in this process (the daemon's per-run feed)."""

    def published(self, events: Sequence[Event]) -> None:
        """``events`` were just committed by an append in this process, in order."""

    def notified(self, last_seq: int | None) -> None:
        """The run may have new events up to ``last_seq`` (``None``: unknown) that were not
        published here: appended by another process, or news lost while disconnected."""


class RunWakeups:
    """In-process wake-ups for live tails, and the hand-off of committed events to listeners.

    Appenders ``publish`` what they committed: listeners get the events themselves, so a live
    reader in this process never reads back what was just written; tails (``EventStore.tail``)
    are woken to read. Signals from other processes (``notify``) only say that something may be
    new. Backends add their own cross-process signal (SQLite polls with a short interval,
    PostgreSQL uses LISTEN/NOTIFY).
    """

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._listeners: dict[str, list[RunListener]] = {}

    def _event(self, run_id: str) -> asyncio.Event:
        ev = self._events.get(run_id)
        if ev is None:
            ev = self._events[run_id] = asyncio.Event()
        return ev

    def listen(self, run_id: str, listener: RunListener) -> Callable[[], None]:
        """Hand ``listener`` this run's news until the returned function is called."""
        self._listeners.setdefault(run_id, []).append(listener)

        def unlisten() -> None:
            mine = self._listeners.get(run_id)
            if mine is not None and listener in mine:
                mine.remove(listener)
                if not mine:
                    del self._listeners[run_id]

        return unlisten

    def publish(self, run_id: str, events: Sequence[Event]) -> None:
        """After a commit in this process: the events to the run's listeners, then wake tails."""
        for listener in tuple(self._listeners.get(run_id, ())):
            listener.published(events)
        self._wake(run_id)

    def notify(self, run_id: str, last_seq: int | None = None) -> None:
        """Something may be new in ``run_id`` (up to ``last_seq`` when known)."""
        for listener in tuple(self._listeners.get(run_id, ())):
            listener.notified(last_seq)
        self._wake(run_id)

    def _wake(self, run_id: str) -> None:
        ev = self._events.pop(run_id, None)
        if ev is not None:
            ev.set()

    def notify_all(self) -> None:
        """Wake every waiting tail and listener (e.g. after a lost cross-process signal may have
        hidden news)."""
        for listeners in list(self._listeners.values()):
            for listener in tuple(listeners):
                listener.notified(None)
        events, self._events = self._events, {}
        for ev in events.values():
            ev.set()

    def arm(self, run_id: str) -> asyncio.Event:
        """The event the next ``notify(run_id)`` sets. Take it *before* re-checking the store and
        pass it to ``wait``: a notify landing between the check and the wait is then not lost."""
        return self._event(run_id)

    async def wait(
        self,
        run_id: str,
        timeout: float | None,  # noqa: ASYNC109 (a poll interval, not a call deadline)
        *,
        armed: asyncio.Event | None = None,
    ) -> None:
        ev = armed if armed is not None else self._event(run_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout)


@dataclass(frozen=True, slots=True)
class OpenRun:
    """A run that has not ended yet, with the lease of the process executing it."""

    run_id: str
    owner: str | None
    lease_expires_at: float | None


@dataclass(frozen=True, slots=True)
class OpenRuns:
    """``open_runs`` answer: the runs, and the store's clock when it read them (PostgreSQL uses
    the server's clock, so replicas on hosts whose clocks disagree still agree on expiry)."""

    runs: list[OpenRun]
    now: float


class EventStore(RunListing):
    """Append-only per-run event log plus run, task and API-key records, and the run list
    (:class:`~thoughtgate.store.listing.RunListing`)."""

    #: How often a tail re-reads when no in-process wake-up arrives (cross-process writers).
    poll_interval: float = 0.25
    #: The same for a reader of the run list's changes (``wait_for_run_changes``): a list may lag
    #: another process's change by this much, and each idle list reader costs one read per poll.
    list_poll_interval: float = 1.0
    #: A tail retries a read that failed with ``StoreUnavailableError`` after this many seconds,
    #: doubling from the first figure up to the second.
    tail_retry: tuple[float, float] = (0.05, 2.0)

    def __init__(self) -> None:
        self.wakeups = RunWakeups()

    # -- runs and tasks ------------------------------------------------------------------
    @abc.abstractmethod
    async def create_run(self, run: RunRecord) -> None:
        """Insert a new run together with its tasks."""

    @abc.abstractmethod
    async def get_run(self, run_id: str) -> RunRecord:
        """The run with its tasks in index order; raises ``RunNotFoundError``."""

    @abc.abstractmethod
    async def list_runs(self, *, limit: int = 50, offset: int = 0) -> list[RunRecord]:
        """Most recent first."""

    @abc.abstractmethod
    async def update_run(
        self,
        run_id: str,
        *,
        status: RunStatus | None = None,
        usage: dict[str, int] | None = None,
        error: str | None = None,
        metadata: dict[str, object] | None = None,
    ) -> None:
        """Change the given fields only; raises ``RunNotFoundError``."""

    @abc.abstractmethod
    async def save_task(self, task: TaskRecord) -> None:
        """Insert or replace a task of an existing run."""

    @abc.abstractmethod
    async def find_run_ids(self, prefix: str, *, limit: int = 10) -> list[str]:
        """Ids of runs starting with ``prefix`` (sorted, at most ``limit``): ``git``-style short
        ids for the command line."""

    # -- ending runs, and leases (ADR 0009) ----------------------------------------------
    @abc.abstractmethod
    async def finish_run(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        *,
        status: RunStatus,
        usage: dict[str, int] | None = None,
        error: str | None = None,
        tasks: Sequence[TaskRecord] = (),
        lease_expired_by: float | None = None,
    ) -> list[Event]:
        """End an open run in one transaction: save ``tasks``, append ``events`` (the last is the
        run's terminal event), set its status and close it, so that every later ``append``
        raises ``RunClosedError``.

        Does nothing and returns ``[]`` when the run has already ended (another process closed
        it first), or, with ``lease_expired_by``, when its lease was renewed past that time (its
        owner is alive after all). Raises ``RunNotFoundError``.
        """

    @abc.abstractmethod
    async def renew_leases(self, owner: str, ttl_s: float) -> list[str]:
        """Extend the lease of every open run ``owner`` holds to ``ttl_s`` from now (the store's
        clock); returns those runs' ids, so the owner learns which runs it no longer holds."""

    @abc.abstractmethod
    async def open_runs(self, *, limit: int = 1000) -> OpenRuns:
        """Runs still ``pending`` or ``running`` and not closed, with their owners and leases,
        oldest lease first (runs without a lease last)."""

    # -- events --------------------------------------------------------------------------
    @abc.abstractmethod
    async def append(self, run_id: str, events: Sequence[NewEvent]) -> list[Event]:
        """Append all or nothing; returns them with their sequence numbers."""

    @abc.abstractmethod
    async def read(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events with ``seq > after`` in order, at most ``limit``; raises ``RunNotFoundError``."""

    async def append_one(self, run_id: str, event: NewEvent) -> Event:
        return (await self.append(run_id, [event]))[0]

    def live_poll_interval(self) -> float:
        """How long a live reader with nothing new may wait before it reads again anyway, for
        writers in other processes whose signal it may miss; starts whatever delivers those
        signals (PostgreSQL's LISTEN connection)."""
        return self.poll_interval

    async def wait_for_new(self, run_id: str, after: int) -> None:
        """Block until something may have been appended after ``after`` (or a poll interval).

        Arms the wake-up first and then re-checks the store, so an append that commits while the
        tail's last read was in flight wakes it at once instead of after a poll interval.
        """
        armed = self.wakeups.arm(run_id)
        if await self.read(run_id, after=after, limit=1):
            return
        await self.wakeups.wait(run_id, self.poll_interval, armed=armed)

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

    async def tail(
        self, run_id: str, *, after: int = 0, until_terminal: bool = True, batch: int = 500
    ) -> AsyncIterator[Event]:
        """Yield stored events after ``after``, then new ones as they are appended.

        Stops after a run-terminal event when ``until_terminal`` (the default); a finished run
        therefore replays and ends at once. Raises ``RunNotFoundError`` for an unknown run. While
        the store is unavailable (``StoreUnavailableError``) it keeps retrying with backoff.
        """
        cursor = after
        delay = self.tail_retry[0]
        while True:
            try:
                events = await self.read(run_id, after=cursor, limit=batch)
                if not events:
                    await self.wait_for_new(run_id, cursor)
            except StoreUnavailableError as exc:
                # Reads are safe to repeat: wait out a dropped connection or a restarting
                # server instead of ending every live stream at once (clients would all
                # reconnect together). Other store errors, and a closed store, end the tail.
                log.warning("tail of run %s: %s; retrying in %.2fs", run_id, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.tail_retry[1])
                continue
            delay = self.tail_retry[0]
            for event in events:
                cursor = event.seq
                yield event
                if until_terminal and is_run_terminal(event.type):
                    return

    # -- API keys ------------------------------------------------------------------------
    @abc.abstractmethod
    async def save_api_key(self, key: ApiKeyRecord) -> None: ...

    @abc.abstractmethod
    async def list_api_keys(self) -> list[ApiKeyRecord]: ...

    @abc.abstractmethod
    async def find_api_key(self, key_hash: str) -> ApiKeyRecord | None:
        """The active (not revoked) key with this hash, if any."""

    @abc.abstractmethod
    async def revoke_api_key(self, key_id: str) -> bool:
        """Revoke the active key with exactly this id (never by name: names are resolved to one
        id by ``access.keys.revoke_key``); ``False`` when no active key has it."""

    @abc.abstractmethod
    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        """A named server secret; the first caller's ``candidate`` wins (e.g. the ticket key)."""

    async def close(self) -> None:  # noqa: B027 (optional hook; the memory store has nothing to do)
        """Release connections; the store is unusable afterwards."""

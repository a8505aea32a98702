"""The event log: per-run append-only sequences, their live tail, and the one observation point.

A run's events are numbered from 1 without gaps, in commit order, also under concurrent writers
in several processes; an append is all or nothing. :meth:`EventLog.finish_run` is the log's last
append for a run: it closes the run's log (every later append raises ``RunClosedError``) and, in
the same transaction, records the run's ending in the run index (``store.run_index``). Every
append also projects its lifecycle events onto the run index in its transaction (ADR 0020).

Every batch a backend commits passes :meth:`RunWakeups.committed`, once (or its two halves,
``publish`` then ``observed``: SQLite publishes in the commit's hand-off, ADR 0028): in-process
live readers get the events themselves, tails are woken, and then every *observer*
(``EventLog.observe``: telemetry, a test's watch) sees them. Because the hand-off sits in the
log rather than in the callers, no write path -- a recorder, a run's end, a daemon closing runs
at shutdown, a sweep closing another process's runs -- can append past the observers.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Generator,
    Mapping,
    Sequence,
)
from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol

from thoughtgate.errors import (
    RunClosedError,
    RunNotFoundError,
    RunTakenOverError,
    StoreUnavailableError,
)
from thoughtgate.events.payloads import RunStatus
from thoughtgate.events.schema import RUN_TERMINAL_TYPES, Event, NewEvent, is_run_terminal
from thoughtgate.store.records import TaskRecord

__all__ = [
    "UNCLAIMED",
    "EventLog",
    "EventObserver",
    "Holder",
    "PageAhead",
    "QueuedAppend",
    "RunEnding",
    "RunListener",
    "RunWakeups",
    "TaskAhead",
    "abandon_task",
]

log = logging.getLogger(__name__)

EventObserver = Callable[[Sequence[Event]], Awaitable[None]]
"""Called with every batch right after it is durably appended (telemetry, live observers)."""


class RunListener(Protocol):
    """A live reader of one run in this process (the daemon's per-run feed)."""

    def published(self, events: Sequence[Event]) -> None:
        """``events`` were just committed by an append in this process, in order."""

    def notified(self, last_seq: int | None) -> None:
        """The run may have new events up to ``last_seq`` (``None``: unknown) that were not
        published here: appended by another process, or news lost while disconnected."""


def _tell(listener: RunListener, last_seq: int | None) -> None:
    try:
        listener.notified(last_seq)
    except Exception:  # one broken live reader must not hold up the others, or the listener
        log.exception("a live reader failed on a wake-up (up to seq %s)", last_seq)


class RunWakeups:
    """In-process wake-ups for live tails, and the hand-off of committed events to listeners.

    Appenders hand what they committed to :meth:`committed`: listeners get the events
    themselves, so a live reader in this process never reads back what was just written; tails
    (``EventLog.tail``) are woken to read; observers see every batch. Signals from other
    processes (``notify``) only say that something may be new. Backends add their own
    cross-process signal (SQLite polls with a short interval, PostgreSQL uses LISTEN/NOTIFY).
    """

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._listeners: dict[str, list[RunListener]] = {}
        self._observers: list[EventObserver] = []

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

    def observe(self, observer: EventObserver) -> Callable[[], None]:
        """Hand ``observer`` every batch of every run committed in this process (once, however
        often it is registered) until the returned function is called."""
        if observer not in self._observers:
            self._observers.append(observer)

        def unobserve() -> None:
            if observer in self._observers:
                self._observers.remove(observer)

        return unobserve

    async def committed(self, run_id: str, events: Sequence[Event]) -> None:
        """After a commit in this process: publish, then let every observer see the batch.

        An observer that raises is logged and skipped: the events are stored, so the append
        has succeeded whatever an observer makes of them.
        """
        if not events:
            return
        self.publish(run_id, events)
        await self.observed(run_id, events)

    async def observed(self, run_id: str, events: Sequence[Event]) -> None:
        """The second half of :meth:`committed`, for a backend that published ``events`` in its
        commit's hand-off already (SQLite, ADR 0028): every observer sees the batch."""
        if not events:
            return
        for observer in tuple(self._observers):
            try:
                await observer(events)
            except Exception:
                log.exception("an observer of run %s failed on %d events", run_id, len(events))

    def publish(self, run_id: str, events: Sequence[Event]) -> None:
        """The events to the run's listeners, then wake tails (observers: ``committed``).

        Called in a commit's hand-off (SQLite, ADR 0028): a listener that raises is logged and
        skipped, so it keeps neither the other readers from the events nor the appender from
        its result (the events are stored whatever a reader makes of them)."""
        for listener in tuple(self._listeners.get(run_id, ())):
            try:
                listener.published(events)
            except Exception:
                log.exception(
                    "a live reader of run %s failed on %d published events", run_id, len(events)
                )
        self._wake(run_id)

    def notify(self, run_id: str, last_seq: int | None = None) -> None:
        """Something may be new in ``run_id`` (up to ``last_seq`` when known). Tails wake
        first, and a listener that raises is logged and skipped, so it holds up nobody else."""
        self._wake(run_id)
        for listener in tuple(self._listeners.get(run_id, ())):
            _tell(listener, last_seq)

    def _wake(self, run_id: str) -> None:
        ev = self._events.pop(run_id, None)
        if ev is not None:
            ev.set()

    def notify_all(self) -> None:
        """Wake every waiting tail and listener (e.g. after a lost cross-process signal may have
        hidden news)."""
        events, self._events = self._events, {}
        for ev in events.values():
            ev.set()
        for listeners in list(self._listeners.values()):
            for listener in tuple(listeners):
                _tell(listener, None)

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
        # asyncio.timeout, not wait_for: on 3.11 wait_for returns normally when the event is set
        # in the same turn as the waiter is cancelled, and a cancelled reader went on reading
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await ev.wait()


class QueuedAppend(abc.ABC):
    """An append a store queued without the caller awaiting it (``EventLog.queue_append``)."""

    @abc.abstractmethod
    async def wait(self) -> list[Event]:
        """Its events once committed (and seen by the observers); raises its error."""

    @abc.abstractmethod
    def done(self) -> bool:
        """Whether it has committed or failed (``wait`` then returns without waiting for it)."""

    @abc.abstractmethod
    async def abandon(self) -> None:
        """Nobody will ``wait``: not stored if it has not run yet, and its outcome is moot (not
        reported as never retrieved)."""


@dataclass(frozen=True, slots=True)
class Holder:
    """The execution an ending comes from, as the store knows it (ADR 0072): the process that
    holds the run (its lease owner id) and, for a durable run, the attempt its claim counted
    (``DurableRunStore.claim_run``'s answer, a fencing token: every claim increments it, so a
    later execution of the same process is told apart from an earlier one).

    ``Holder(None, 0)`` (:data:`UNCLAIMED`) is a run nobody holds and nobody ever claimed: a new
    run on a work queue, ended by the process that admitted it when its start was cancelled
    before any replica took it (ADR 0082). A replica whose claim came first holds it then, and
    the end is refused."""

    owner: str | None
    attempt: int | None = None

    def holds(self, owner: str | None, attempts: int | None) -> bool:
        """Whether this execution holds a run whose owner is ``owner`` with ``attempts`` claims
        counted (``None``: a run without a spec): the one fence of its appends and its end."""
        return owner == self.owner and (self.attempt is None or attempts == self.attempt)

    def refused(
        self, run_id: str, owner: str | None, recording: str = "events"
    ) -> RunTakenOverError:
        """The error of a write this execution made to a run it no longer holds -- its events
        (ADR 0090), a task's record or the run's (ADR 0094) -- logged: nothing of it was
        stored, and the execution stops."""
        log.warning(
            "run %s: an execution that no longer holds it was refused its %s (this process "
            "stalled past its lease and the run was taken over); it stops here",
            run_id,
            recording,
        )
        return RunTakenOverError(run_id, owner, recording=recording)

    def check(self, run_id: str, found: Sequence[Any] | None, recording: str) -> None:
        """Raise unless this execution may write ``recording`` to the run whose ``(closed_at,
        owner, attempts)`` is ``found`` (``None``: no such run), read in the write's own
        transaction after the run's row is locked: ``RunNotFoundError``, ``RunClosedError``
        once it ended, ``RunTakenOverError`` (:meth:`refused`) while another execution holds
        it. The fence of the writes an execution makes outside ``append`` (ADR 0094)."""
        if found is None:
            raise RunNotFoundError(run_id)
        if found[0] is not None:
            raise RunClosedError(run_id)
        if not self.holds(found[1], found[2]):
            raise self.refused(run_id, found[1], recording)


def append_refused(run_id: str, found: Sequence[Any] | None, held_by: Holder | None) -> Exception:
    """Why an append found no open row of ``run_id`` it may number, from the run's
    ``(closed_at, owner)`` read after it (``None``: no such run): the run is missing, it has
    ended, or -- for an execution's append (``held_by``) to an open run -- another execution
    holds it now (ADR 0090). The one decision of every backend's append."""
    if found is None:
        return RunNotFoundError(run_id)
    if found[0] is None and held_by is not None:
        return held_by.refused(run_id, found[1])
    return RunClosedError(run_id)


UNCLAIMED = Holder(None, 0)
"""The holder of a queued run that no execution has claimed yet (see :class:`Holder`)."""


@dataclass(frozen=True, slots=True)
class RunEnding:
    """How :meth:`EventLog.finish_run` ends a run: the run index's side of its last append."""

    status: RunStatus
    _: KW_ONLY
    usage: Mapping[str, int] | None = None
    error: str | None = None
    tasks: Sequence[TaskRecord] = ()
    """Tasks to save with the ending (those it ends too)."""
    lease_expired_by: float | None = None
    """End the run only if its lease was not renewed past this time (ADR 0009)."""
    held_by: Holder | None = None
    """End the run only while this execution still holds it (ADR 0072): the run's owner is
    ``held_by.owner`` and, with an attempt, its claims counted no further. An end recorded by
    the process executing the run names itself; a sweep's (``lease_expired_by``) does not."""

    def lease_renewed(self, lease: float | None) -> bool:
        """Whether a run whose lease expires at ``lease`` was renewed past ``lease_expired_by``
        (its owner is alive after all: leave the run open)."""
        by = self.lease_expired_by
        return by is not None and lease is not None and lease > by

    def check_holder(self, run_id: str, owner: str | None, attempts: int | None) -> None:
        """Raise :class:`RunTakenOverError` (and log it) unless the run, open and held by
        ``owner`` with ``attempts`` claims counted (``None``: a run without a spec), is held by
        ``held_by``. Every backend calls it in the transaction that would end the run, after
        its row is locked, so a claim either commits before it (the end is refused) or waits
        for the end (and finds the run ended)."""
        held = self.held_by
        if held is None or held.holds(owner, attempts):
            return
        log.warning(
            "run %s: its end (%s) was refused: another execution holds the run now (this process "
            "stalled past its lease and the run was taken over); nothing of it was recorded",
            run_id,
            self.status,
        )
        raise RunTakenOverError(run_id, owner)


class PageAhead(Protocol):
    """A page being read ahead (``EventLog.read_ahead``): awaiting it gives its events."""

    def __await__(self) -> Generator[Any, None, list[Event]]: ...

    async def abandon(self) -> None:
        """Stop the read and wait until it has stopped; its outcome is moot."""


class TaskAhead:
    """A page read ahead by a task running ``EventLog.read``."""

    __slots__ = ("task",)

    def __init__(self, read: Coroutine[Any, Any, list[Event]]) -> None:
        self.task = asyncio.ensure_future(read)

    def __await__(self) -> Generator[Any, None, list[Event]]:
        return self.task.__await__()

    async def abandon(self) -> None:
        await abandon_task(self.task)


async def abandon_task(task: asyncio.Future[Any]) -> None:
    """Cancel a read nobody will take and wait for it to end; its outcome is taken, so that
    asyncio does not log an error nobody retrieved. A cancellation of the caller still
    propagates."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()


async def _abandon_all(ahead: deque[tuple[int, PageAhead]]) -> None:
    while ahead:
        await ahead.popleft()[1].abandon()


_READ_AHEAD = 2
"""Pages a replaying ``tail`` has being read while it hands one out: two, so the database reads
one while this process decodes the other."""


class EventLog(abc.ABC):
    """Append-only per-run event sequences, read back and followed live."""

    #: How often a tail re-reads when no in-process wake-up arrives (cross-process writers).
    poll_interval: float = 0.25
    #: A tail retries a read that failed with ``StoreUnavailableError`` after this many seconds,
    #: doubling from the first figure up to the second.
    tail_retry: tuple[float, float] = (0.05, 2.0)
    #: Events per page a tail reads (``tail(batch=...)`` overrides it).
    tail_batch: int = 500
    #: Whether ``read_ahead`` starts its read only when the loop runs it (a task), so a tail
    #: gives the loop a turn after starting reads ahead.
    read_ahead_needs_a_turn: bool = True
    wakeups: RunWakeups

    @abc.abstractmethod
    async def append(
        self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
    ) -> list[Event]:
        """Append all or nothing; returns them with their sequence numbers. Raises
        ``RunNotFoundError``, or ``RunClosedError`` once the run has ended.

        ``held_by``: the execution appending (ADR 0090), fenced as its end is
        (:meth:`Holder.holds`, in the append's own transaction): an append to an open run
        another execution holds now raises ``RunTakenOverError`` (:meth:`Holder.refused`) and
        stores nothing. ``None``: not fenced (a run's creator, a test)."""

    @abc.abstractmethod
    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        """Events with ``seq > after`` in order, at most ``limit``; raises ``RunNotFoundError``.

        ``apart=False``: a read for a reader who may see nothing a SQL store keeps apart
        (``access.filter.reads_apart``, ADR 0160): such a store leaves those fields unread, so
        their payloads lack them -- every one a field the filter, applied after, withholds
        from that reader. The events, their numbers and order are the same. The default, and a
        store that keeps nothing apart (memory), return payloads whole."""

    @abc.abstractmethod
    async def read_types(
        self,
        run_id: str,
        types: Collection[str],
        *,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Event]:
        """``read``, of the events whose type is one of ``types`` only: at most ``limit`` of
        them with ``seq > after``, in order (their sequence numbers have gaps where the others
        are). For a reader that needs a run's lifecycle and not its deltas -- an index check
        (ADR 0064) -- so a run of 10,000 deltas costs it its dozen lifecycle events, filtered
        in the database. Raises ``RunNotFoundError``."""

    @abc.abstractmethod
    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        """End an open run in one transaction: save ``ending.tasks``, append ``events`` (the last
        is the run's terminal event), set its status, usage and error and close it, so that
        every later ``append`` raises ``RunClosedError``.

        Does nothing and returns ``[]`` when the run has already ended (another process closed
        it first), or when ``ending.lease_renewed`` (its owner is alive after all). Raises
        ``RunNotFoundError``, and ``RunTakenOverError`` (storing nothing) when the ending names
        its execution (``ending.held_by``) and the open run is no longer held by it
        (:meth:`RunEnding.check_holder`, ADR 0072).
        """

    def queue_append(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        *,
        after: QueuedAppend | None = None,
        held_by: Holder | None = None,
    ) -> QueuedAppend | None:
        """``append`` queued now, its place in the run's order taken at this call, for a caller
        that goes on before it commits; with ``after`` (an append of the same run this store
        queued before), it is stored only if that one was, else fails with that one's error.
        ``held_by``: as for ``append``.

        ``None``: this store cannot queue appends (or not behind ``after``); the caller then
        awaits ``after`` and appends. Only a store whose writes commit in the order they are
        queued can (SQLite's single writer, ADR 0028).
        """
        return None

    def observe(self, observer: EventObserver) -> Callable[[], None]:
        """Let ``observer`` see every batch committed through this process from now on; the
        returned function stops it."""
        return self.wakeups.observe(observer)

    def read_ahead(self, run_id: str, *, after: int, limit: int, apart: bool = True) -> PageAhead:
        """``read`` started now, to be awaited later (``tail`` reads pages ahead). A backend may
        start the work itself at once rather than when a task first runs, and build the events
        only when they are awaited."""
        return TaskAhead(self.read(run_id, after=after, limit=limit, apart=apart))

    def read_now(
        self, run_id: str, *, after: int, limit: int, apart: bool = True
    ) -> list[Event] | None:
        """``read``'s events answered in this step, on the event loop, where the store can do
        that cheaply (SQLite's loop connection, ADR 0038); ``None``: ``read`` them instead (this
        store cannot, not now, or the answer needs more than one small query). For a few
        events only (a live stream's first page): the loop waits for the query."""
        return None

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
        if await self.read(run_id, after=after, limit=1, apart=False):  # (only whether there is)
            return
        await self.wakeups.wait(run_id, self.poll_interval, armed=armed)

    async def tail(
        self,
        run_id: str,
        *,
        after: int = 0,
        until_terminal: bool = True,
        batch: int | None = None,
        apart: bool = True,
    ) -> AsyncIterator[Event]:
        """Yield stored events after ``after``, then new ones as they are appended (``apart``:
        as :meth:`read`'s).

        Stops after a run-terminal event when ``until_terminal`` (the default); a finished run
        therefore replays and ends at once. Raises ``RunNotFoundError`` for an unknown run. While
        the store is unavailable (``StoreUnavailableError``) it keeps retrying with backoff.
        """
        batch = self.tail_batch if batch is None else batch
        cursor = after
        delay = self.tail_retry[0]
        ahead: deque[tuple[int, PageAhead]] = deque()
        try:
            while True:
                try:
                    if ahead:
                        events = await ahead.popleft()[1]
                    else:
                        events = await self.read(run_id, after=cursor, limit=batch, apart=apart)
                    if not events:
                        await self.wait_for_new(run_id, cursor)
                except StoreUnavailableError as exc:
                    # Reads are safe to repeat: wait out a dropped connection or a restarting
                    # server instead of ending every live stream at once (clients would all
                    # reconnect together). Other store errors, and a closed store, end the tail.
                    await _abandon_all(ahead)
                    log.warning("tail of run %s: %s; retrying in %.2fs", run_id, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.tail_retry[1])
                    continue
                delay = self.tail_retry[0]
                if not events:
                    await _abandon_all(ahead)
                    continue
                # One look for a terminal event per page, not a check per event handed out:
                # replay's cost is this loop. The types gathered by a comprehension (one
                # specialised slot read each): about a third fewer instructions than an
                # ``attrgetter`` mapped over the page (ADR 0101).
                ends = until_terminal and not RUN_TERMINAL_TYPES.isdisjoint(
                    [event.type for event in events]
                )
                last = events[-1].seq
                if ends or len(events) < batch or (ahead and ahead[0][0] != last):
                    # The end of what is stored (or of the run): what was read ahead is moot.
                    await _abandon_all(ahead)
                else:
                    # A full page: more is probably stored. Keep READ_AHEAD pages being read
                    # while this one is handed out, so the database (PostgreSQL's server,
                    # SQLite's reader thread) works while the consumer does. Pages still come
                    # in order; each is read after the last event the page before it would
                    # end with if full (sequences have no gaps), and is used only if it did.
                    start = ahead[-1][0] + batch if ahead else last
                    while len(ahead) < _READ_AHEAD:
                        ahead.append(
                            (start, self.read_ahead(run_id, after=start, limit=batch, apart=apart))
                        )
                        start += batch
                    if self.read_ahead_needs_a_turn:
                        # Let the reads send their queries now: a consumer that takes the
                        # page without awaiting anything would otherwise start them only
                        # when it has finished the page.
                        await asyncio.sleep(0)
                for event in events:
                    yield event
                    if ends and is_run_terminal(event.type):
                        return
                cursor = last
                # Let go of the page before the next is built: its events die young, and the
                # collector is not run (and does not promote them) for every page.
                del events
        finally:
            await _abandon_all(ahead)

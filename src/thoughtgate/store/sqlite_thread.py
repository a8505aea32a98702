"""One SQLite connection on one dedicated thread, group commit, and the one place sqlite3 errors
become StoreErrors.

Why a dedicated thread per connection rather than ``asyncio.to_thread``: a ``sqlite3.Connection``
belongs to one thread at a time, and SQLite admits one writer per database anyway. Giving the
store's writer connection its own single thread makes in-process writers queue in FIFO order on
that thread instead of spinning on ``SQLITE_BUSY``, keeps the connection (and its prepared
statement cache) alive between calls, and cannot be starved by unrelated blocking work in the
loop's default executor. Reads use a second connection on a second thread: in WAL mode readers
never wait for the writer, so a replay does not queue behind appends.

Group commit (``SQLiteThread.write``): with ``synchronous=FULL`` each commit is an fsync plus a
WAL write of every page it touched, and one transaction per write made the writer thread the
daemon's largest cost. Writes that queue while the thread is busy (the deltas of many concurrent
runs, their lifecycle updates) now share the next transaction. Each caller is still promised what
a transaction of its own would give it:

* all or nothing: one write that raises has only its own changes rolled back (it runs in a
  ``SAVEPOINT``, see below) and gets its error, the others commit;
* durable before the caller is told: its future resolves after ``COMMIT`` returned;
* order: writes run in the order they were queued, under ``BEGIN IMMEDIATE`` (the database's
  write lock, held for the whole group), so a run's sequence numbers stay gap-free and in commit
  order, with writers in other processes too;
* a ``COMMIT`` that fails (disk full, I/O error) fails every write of the group: none is stored;
  so does one whose file is no longer the one the path names (ADR 0149: removed -- its
  directory with it -- or replaced while open; SQLite would go on writing into the unlinked
  file, which nobody else can read and which is gone once the process exits); if SQLite
  abandons the whole transaction after one write's error (it may after ``SQLITE_FULL`` or an
  I/O error), that write fails and the others run again in a new transaction.

Fewer statements per group (ADR 0030): the stdlib driver lets go of the interpreter lock
around every statement it prepares, steps or resets. A release longer than the event loop
thread's wake-up (the ``COMMIT``'s fsync, a long statement) hands that thread the lock, and when
it is saturated the writer gets it back only when the 5 ms switch interval forces a switch; of
the hundreds of short releases a group of many writes made, some lost it that way too. Under
load that wait, not SQLite's work, was the price of a commit (0.5 ms of wall per write with 100
runs appending, for 0.1 ms of the thread's CPU). So:

* a group first runs without savepoints (two statements saved per write): when every write
  succeeds, as they nearly always do, that is the transaction committed. When one raises, the
  whole attempt is rolled back and the group runs again write by write, each in its savepoint as
  above, so a failing write still fails alone;
* a write may come as data as well (``queue_write``'s ``merge``): consecutive writes of a group
  that share a merge function are handed to it together, and it does their work in a handful of
  statements (the store's appends: one statement numbers every run's batch, one inserts up to
  128 rows; its run starts, claims and endings too, ADR 0033). It answers, per write, the value
  or the error that fails that write alone (having changed nothing of it), in queue order;
  anything it raises undoes the attempt as above.

The loop runs the statements, the thread the ``COMMIT`` (ADR 0036): even a handful of
statements per group made the writer thread take the interpreter lock back several times per
group, and with a saturated loop each of those waits could last the 5 ms switch interval (at 100
runs appending, 12-42 ms of wall per commit for 2-8 ms of the thread's CPU). So the writes of the
loop that started the thread wait on that loop (``_pending``), and once the thread has nothing
left of its own the loop runs the next group itself -- ``BEGIN IMMEDIATE`` and every statement,
holding the lock anyway -- and hands the thread only the ``COMMIT`` (the fsync), which it does
first, before any other job; its hand-off tells the loop that the connection is free again.

* the loop never waits for another connection's write lock: its ``BEGIN IMMEDIATE`` runs with no
  busy timeout, and when the database is locked the whole group goes to the thread, which waits
  as before (up to the busy timeout), with the writes queued after it behind it;
* when a write of the group raises, the loop undoes the attempt and the thread runs the group
  write by write, each in its savepoint;
* a write alone goes to the thread whole, as before (the loop's part saves nothing there, and
  the thread then starts while the loop goes on);
* while a large group (16 writes or more: a loaded loop) waits for its ``COMMIT``, the
  interpreter's switch interval is 0.5 ms instead of 5, so the thread's two takes of the lock
  (woken, and back from the fsync) wait at most that long; the process's own value comes back
  once the ``COMMIT`` returned;
* writes from another event loop (another thread's ``asyncio.run``) go to the thread's queue as
  before; a lock on the connection keeps its users one at a time.

The thread hands its results back to the loop that started it through a pipe that loop watches
(ADR 0053), so the hand-off -- callers told, live readers given the events, the next group run --
happens in the loop's I/O phase, after the callbacks of the turn in which the ``COMMIT``
returned, rather than near the front of the next turn (``call_soon_threadsafe``). The next group
then holds every write those callbacks queued: with 100 runs streaming, the deltas of the
provider reads woken in the turn before, which otherwise waited for the group after (a loop turn
more between a provider's bytes and a reader's frame). A loop that cannot watch a file
descriptor (a proactor loop) gets ``call_soon_threadsafe`` as before.

Exception mapping (``translate_error``)::

    sqlite3.Error
    ├── SQLITE_FULL                 → StoreError "database or disk is full" (write rolled back)
    ├── SQLITE_READONLY*            → StoreReadOnlyError
    ├── SQLITE_NOTADB               → NotOurDatabaseError
    ├── SQLITE_BUSY / SQLITE_LOCKED → StoreUnavailableError, an outage (locked past the busy timeout)
    ├── SQLITE_CANTOPEN / PERM      → StoreUnavailableError
    └── anything else               → StoreError (corruption, I/O errors, constraint failures)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import queue
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from thoughtgate.errors import (
    SAID,
    NotOurDatabaseError,
    StoreError,
    StoreReadOnlyError,
    StoreUnavailableError,
    quoting,
)
from thoughtgate.store.base import REFUSAL_HELD_S

__all__ = ["Merge", "QueuedWrite", "SQLiteThread", "in_write_transaction", "translate_error"]

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

Merge = Callable[[sqlite3.Connection, list[Any]], list[Any]]
"""Does the work of several writes, given their items in queue order, inside the group's
transaction: returns, for each item, the write's value or the exception that fails it alone
(and changed nothing of it); raises when anything else went wrong (the group then runs again
write by write, each write's ``fn`` in its savepoint)."""

# Primary result codes (https://sqlite.org/rescode.html); extended codes keep them in the low byte.
_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = (
    3,
    5,
    6,
    8,
    10,
    11,
    13,
    14,
    26,
)
_REFUSALS = frozenset({_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN})
"""The primary result codes that say the database refuses writes, rather than that one write
was wrong (a constraint, a bug): what :meth:`SQLiteThread.refusal` counts."""


def translate_error(
    exc: sqlite3.Error, path: Path | str, action: str, *, busy_timeout: float = 0.0
) -> StoreError:
    """Map a driver error into the thoughtgate tree; the message names the database and action.
    The driver's words it quotes are declared (:func:`quoting`): its ``public`` text has their
    class and SQLite error name there (ADR 0104)."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    where = f"SQLite database {path}"
    if primary == _FULL:
        return quoting(
            StoreError,
            f"cannot {action}: database or disk is full ({where}); the write was rolled back and "
            "nothing of it was stored",
            exc,
        )
    if primary == _READONLY:
        return quoting(
            StoreReadOnlyError,
            f"cannot {action}: {where} is read-only (the file or its directory is not writable); "
            f"nothing recorded was changed and it can still be read ({SAID})",
            exc,
        )
    if primary == _NOTADB:
        text = f"{where} is not a SQLite database ({SAID}); it was left untouched"
        return quoting(NotOurDatabaseError, text, exc)
    if primary in (_BUSY, _LOCKED):
        locked = quoting(
            StoreUnavailableError,
            f"cannot {action}: {where} stayed locked by another connection for more than "
            f"{busy_timeout:g}s ({SAID})",
            exc,
        )
        locked.outage = True  # the lock's holder lets go by itself (ADR 0152)
        return locked
    if primary in (_CANTOPEN, _PERM):
        return quoting(
            StoreUnavailableError,
            f"cannot {action}: cannot open {where} ({SAID}); check that the file and its "
            "directory exist and are readable and writable",
            exc,
        )
    if primary == _CORRUPT:
        return quoting(StoreError, f"cannot {action}: {where} is corrupt ({SAID})", exc)
    if primary == _IOERR:
        return quoting(StoreError, f"cannot {action}: I/O error on {where} ({SAID})", exc)
    return quoting(StoreError, f"cannot {action}: {SAID} ({where})", exc)


def in_write_transaction(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``body`` in ``BEGIN IMMEDIATE`` … ``COMMIT``: all of it is stored, or none of it.

    ``IMMEDIATE`` takes the database's write lock before the first read, so a value read inside
    (the run's last sequence number) cannot change before we commit, even with writers in other
    processes; waiting for that lock is bounded by the connection's busy timeout.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            # The original error is the one worth reporting; SQLite discards the txn anyway.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return result


class SQLiteThread:
    """Owns one connection on one thread; ``call`` runs a function with it there, ``write`` runs
    one inside a write transaction that it shares with every other write queued meanwhile.

    The thread takes whatever is queued when it wakes (up to ``max_group`` jobs) and runs it in
    order; the callers' results go back to their event loop in one hand-off per transaction (a
    group of writes, or one call), not one per job, and not after the whole batch. ``write`` is
    group commit: see the module docstring for what each caller is promised; ``write_then``
    also runs a callback on the loop in that hand-off (ADR 0028).
    """

    def __init__(
        self,
        name: str,
        path: Path | str,
        *,
        busy_timeout: float,
        max_group: int = 256,
        on_loop: bool = True,
    ) -> None:
        self.name = name
        self.path = path
        self.busy_timeout = busy_timeout
        self.max_group = max_group
        self.on_loop = on_loop
        """Whether the event loop that started the thread runs its own groups' statements (the
        thread then only commits them; ADR 0036)."""
        self.commits = 0
        """Write transactions committed (each one fsync): a figure for tests and benchmarks."""
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._conn: sqlite3.Connection | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop that started the thread: its writes wait in ``_pending``."""
        self._pending: list[_Job] = []
        """The loop's writes not run yet, in queue order (changed on that loop only; the
        thread only looks whether any are waiting)."""
        self._flush_soon = False
        self._handed: _Handed | None = None
        """A group the loop ran, waiting for the thread's ``COMMIT``."""
        self._conn_lock = threading.Lock()
        """Held by whichever thread is using the connection (the loop's never waits for it)."""
        self._put_lock = threading.Lock()
        self._queued = 0
        """Jobs put on the thread's queue (under ``_put_lock``) ..."""
        self._finished = 0
        """... and those the thread is done with (written by the thread only)."""
        self._busy_pragma = f"PRAGMA busy_timeout = {max(0, round(busy_timeout * 1000))}"
        self._wake: tuple[int, int] | None = None
        """The pipe (read end, write end) the thread wakes the loop that started it through,
        its hand-offs going to that loop's I/O phase (``_hand_back``); ``None``: they go by
        ``call_soon_threadsafe``."""
        self._wake_left: tuple[int, int] | None = None
        """A pipe a failed start stopped watching, for the thread to close when it stops."""
        self._handoffs: collections.deque[tuple[list[_Outcome], Callable[[], None] | None]]
        self._handoffs = collections.deque()
        self._file: tuple[str, int, int] | None = None
        """The database file the connection opened: its absolute path, device and inode (set
        once it is open; ``None`` for an in-memory database)."""
        self._refused_at: float | None = None
        """When (``time.monotonic``) a write was last refused by the database or its file (full,
        locked past the busy timeout, read-only, I/O error, removed), until a ``COMMIT`` holds
        again: what :meth:`refusal` goes by (ADR 0151). Set by whichever thread met the error;
        one float, read on the loop."""

    async def start(self, connect: Callable[[], sqlite3.Connection], action: str) -> None:
        """Start the thread and open the connection on it (``connect`` may check and migrate)."""

        def run(_: sqlite3.Connection | None) -> None:
            self._conn = connect()
            self._file = _opened_file(self.path)

        self._loop = asyncio.get_running_loop()
        if self.on_loop:
            self._wake = _wake_pair(self._loop, self._on_handoff)
        self._thread = threading.Thread(
            target=self._serve_then_release, name=self.name, daemon=True
        )
        self._thread.start()
        try:
            await self._submit(action, run, grouped=False, needs_connection=False)
        except BaseException:
            self._closed = True
            self._leave_wake_to_thread()  # before the ``None`` that lets the thread stop
            self._jobs.put(None)
            raise

    async def call(self, action: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the owning thread, alone; ``action`` names it in errors.

        If the awaiting task is cancelled once the call has started, it still finishes on the
        thread: a write either commits or rolls back as a whole, it is never cut in half.
        """
        return await self._submit(action, fn, grouped=False)

    async def write(
        self,
        action: str,
        fn: Callable[[sqlite3.Connection], T],
        *,
        merge: tuple[Merge, Any] | None = None,
        decided: Callable[[T], None] | None = None,
        committed: Callable[[T], None] | None = None,
    ) -> T:
        """Run ``fn(connection)`` inside a write transaction; returns once that is durable.

        ``fn`` must only touch the database (it may run again: when another write of its group
        raised, the group runs again write by write) and may raise to undo its own changes.
        ``merge``: as ``queue_write``'s. ``decided``: called on the loop with what ``fn``
        returned when the loop ran the write's group (ADR 0036) and handed its ``COMMIT`` to the
        thread, before that commit is known to hold (ADR 0040: a run's execution starts while
        its admission commits). Only then, and only in a group of fewer than 16 writes: a
        larger one is a loop with many runs to serve (ADR 0036), where work started early only
        waits for the loop. A write the thread runs is not told early; what ``fn`` returned is
        final once told (a ``COMMIT`` that fails then is not run again: the write fails, nothing
        of it stored). It must not raise; it never writes.

        ``committed``: called on the loop with what ``fn`` returned in the commit's hand-off,
        once the ``COMMIT`` held, before the caller resumes (a turn of the loop later), also when
        the caller was cancelled meanwhile (ADR 0091: a run's execution starts there). Like
        ``decided``, only in a group of fewer than 16 writes: in a larger one, work started a
        turn sooner only has its first results wait for a loop with many runs to serve. A
        callback that raises is logged; the caller still gets what ``fn`` returned.
        """
        return await self._submit(
            action, fn, grouped=True, merge=merge, decided=decided, committed=committed
        )

    def queue_call(self, action: str, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """:meth:`call`, queued on the thread now rather than when a task first runs: a read
        ahead starts while the caller goes on with what it has (``EventLog.read_ahead``)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._closed:
            future.set_exception(StoreError(f"cannot {action}: the store is closed ({self.path})"))
        else:
            self._put(_Job(action, fn, False, True, loop, future, None))
        return future

    async def write_then(
        self,
        action: str,
        fn: Callable[[sqlite3.Connection], T],
        then: Callable[[T], R],
        *,
        merge: tuple[Merge, Any] | None = None,
    ) -> R:
        """``write``, and ``then(fn's result)`` on the event loop in the commit's hand-off,
        before the caller resumes; returns what ``then`` returned.

        Why: the caller's task resumes one turn of the event loop after the hand-off, and a
        loaded loop's turn is long (every other run's work of that moment). What has to happen
        right after a commit -- live readers getting the events (ADR 0028) -- happens in the
        hand-off itself, in commit order; ``then`` also runs when the caller was cancelled
        meanwhile (the write committed all the same). It runs only after a successful commit.
        """
        return await self._submit(
            action,
            fn,  # type: ignore[arg-type]
            grouped=True,
            then=then,
            merge=merge,
        )

    def queue_write(
        self,
        action: str,
        fn: Callable[[sqlite3.Connection], T],
        then: Callable[[T], R],
        *,
        after: QueuedWrite | None = None,
        merge: tuple[Merge, Any] | None = None,
    ) -> QueuedWrite:
        """``write_then`` queued now, without awaiting (its ``future`` resolves to what ``then``
        returned): the write's place in the queue, and so in commit order, is taken at this
        call. With ``after`` (a write queued on this thread before), it runs only if that one
        was stored, else fails with that one's error: a caller may queue a write behind one it
        has not seen committed yet, and still never store it past a hole (ADR 0028). With
        ``merge`` (a merge function and this write's item), the write may be done by that
        function together with its neighbours in the queue that have the same one; ``fn`` must
        do the same work alone (it does, when the group runs write by write). Raises
        ``StoreError`` once the store is closed."""
        if self._closed:
            raise StoreError(f"cannot {action}: the store is closed ({self.path})")
        body = fn if after is None else _behind(after, action, fn)
        loop = asyncio.get_running_loop()
        job = _Job(action, body, True, True, loop, loop.create_future(), then, merge, after)
        self._enqueue(job)
        return job

    async def _submit(
        self,
        action: str,
        fn: Callable[[sqlite3.Connection], T],
        *,
        grouped: bool,
        needs_connection: bool = True,
        then: Callable[[Any], Any] | None = None,
        merge: tuple[Merge, Any] | None = None,
        decided: Callable[[Any], None] | None = None,
        committed: Callable[[Any], None] | None = None,
    ) -> T:
        if self._closed:
            raise StoreError(f"cannot {action}: the store is closed ({self.path})")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        job = _Job(action, fn, grouped, needs_connection, loop, future, then, merge)
        job.decided, job.committed = decided, committed
        self._enqueue(job)
        return await future

    def waiting(self) -> int:
        """Jobs not taken yet: on the thread's queue, and the loop's writes (tests' figure)."""
        return self._jobs.qsize() + len(self._pending)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def run(conn: sqlite3.Connection | None) -> None:
            self._conn = None
            if conn is not None:
                conn.close()

        self._spill()  # (the thread commits a group the loop handed it first)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._put(_Job("close the store", run, False, False, loop, future, None))
        self._jobs.put(None)
        thread, self._thread = self._thread, None
        await future
        if thread is not None:
            # The close job is the thread's last: once it has answered, the thread only takes
            # the ``None`` behind it and returns, so this join is over at once and a closed
            # store leaves no thread of its own running.
            thread.join()
        self._drop_wake()

    def _unwatch_wake(self) -> tuple[int, int] | None:
        """Stop watching ``_wake``; returns the pipe, for its caller to close (or ``None``)."""
        wake, self._wake = self._wake, None
        if wake is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError, ValueError, OSError):  # (a closed loop)
                self._loop.remove_reader(wake[0])
        return wake

    def _leave_wake_to_thread(self) -> None:
        """After a failed start: stop watching ``_wake`` and let the thread close it when it
        stops. It may still be opening the connection, and hand that job back through the pipe
        after this: closed here, its file descriptor could already belong to another file (a
        database) by the time the thread writes its byte."""
        self._wake_left = self._unwatch_wake()

    def _serve_then_release(self) -> None:
        try:
            self._serve()
        finally:
            _close_pipe(self._wake_left)
            self._wake_left = None

    def _drop_wake(self) -> None:
        """Stop watching ``_wake`` and close it (the thread has answered its last job)."""
        _close_pipe(self._unwatch_wake())

    def _put(self, job: _Job) -> None:
        """Queue ``job`` on the thread, counted: the loop runs a group only when the thread
        has nothing of its own left, so queue order stays commit order."""
        with self._put_lock:
            self._queued += 1
            self._jobs.put(job)

    def _enqueue(self, job: _Job) -> None:
        if job.loop is not self._loop or not self.on_loop:
            self._put(job)
        elif job.grouped:
            self._pending.append(job)
            self._flush_later()
        else:  # behind the loop's writes queued before it, as in one queue
            self._spill()
            self._put(job)

    def _spill(self) -> None:
        """The loop's waiting writes onto the thread's queue, in order (it runs them)."""
        pending, self._pending = self._pending, []
        for job in pending:
            self._put(job)

    # -- on the loop that started the thread (ADR 0036) --------------------------------------
    def _flush_later(self) -> None:
        """Run the pending writes once the loop has queued this turn's (they share a group)."""
        if not self._flush_soon and self._loop is not None:
            self._flush_soon = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Run the next group's statements here, when the connection is free: the thread has
        nothing queued (what it has goes first) and no group is waiting for its ``COMMIT``.
        Else the thread's hand-off calls this again once it is done."""
        self._flush_soon = False
        pending = self._pending
        while pending and self._handed is None and self._finished >= self._queued:
            if not self._conn_lock.acquire(blocking=False):  # a job of another loop's
                return
            try:
                group = pending[: self.max_group]
                del pending[: self.max_group]
                self._group_on_loop(group)
            finally:
                self._conn_lock.release()

    def _group_on_loop(self, jobs: list[_Job]) -> None:
        """``BEGIN IMMEDIATE`` and every statement of ``jobs`` on this loop, which holds the
        interpreter lock anyway, then the ``COMMIT`` (the fsync) handed to the thread: the
        thread takes the interpreter lock once or twice per group instead of at every
        statement. What this does not do goes to the thread, whole: a write alone (measured
        no better here), the group when the database is locked by another connection right
        now (the loop never waits for that lock) or when one of its writes raised (the
        thread then runs it write by write)."""
        conn = self._conn
        if conn is None:
            _settle([_Outcome(job, self._closed_error(job), None) for job in jobs])
            return
        pending = _not_cancelled(jobs)
        if len(pending) < 2:  # a write alone: the thread does all of it, as it did
            for job in pending:
                self._put(job)
            return
        try:
            conn.execute("PRAGMA busy_timeout = 0")
            try:
                conn.execute("BEGIN IMMEDIATE")
            finally:
                conn.execute(self._busy_pragma)
        except sqlite3.Error:  # locked right now: the thread waits for it, as long as it may
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:  # (only if setting the timeout back failed)
                    conn.execute("ROLLBACK")
            for job in pending:
                self._put(job)
            return
        failed: list[_Outcome] = []
        done: list[_Outcome] = []
        try:
            self._run_writes(conn, pending, failed, done)
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            if not isinstance(exc, Exception):
                _settle([_Outcome(job, exc, None) for job in pending])
                raise
            for job in pending:  # forget what the undone attempt found; run write by write
                job.error = None
                job.undone = True
                self._put(job)
            return
        if not done:  # every write failed, and was undone: nothing to make durable
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            _settle(failed)
            return
        hurry = len(pending) >= _HURRY_GROUP
        self._handed = _Handed(failed, done, hurry)
        if hurry:
            _hurry()
            _untold(pending)
        self._put(_WAKE)
        if not hurry:  # (while the thread commits; see ``write``'s ``decided``)
            _tell_decided(done)

    # -- on the owning thread ----------------------------------------------------------------
    def _serve(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            batch = [job]
            while len(batch) < self.max_group:
                try:
                    more = jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    jobs.put(None)  # stop after this batch
                    break
                batch.append(more)
            work = [job for job in batch if job is not _WAKE]
            last: list[_Outcome] = []
            with self._conn_lock:
                last = self._commit_handed()
                if last and work:
                    self._hand_back(last)
                    last = []
                i = 0
                while i < len(work):
                    # Each transaction's (or lone call's) results go back as soon as it is
                    # done, in one hand-off per loop: a caller early in a long batch (a reader
                    # thread's many small reads) does not wait for the whole batch.
                    j = i + 1
                    if work[i].grouped:
                        while j < len(work) and work[j].grouped:
                            j += 1
                    try:
                        if work[i].grouped:
                            outcomes = self._commit_group(work[i:j])
                        else:
                            outcomes = [self._run_alone(work[i])]
                    except BaseException as exc:  # a bug here must not leave callers waiting
                        outcomes = [_Outcome(job, exc, None) for job in work[i:j]]
                    if j < len(work):
                        self._hand_back(outcomes)
                    else:
                        last = outcomes
                    i = j
            self._finished += len(batch)
            # The last hand-off also tells the loop that the connection is free again, when it
            # has writes waiting: one wake-up of the loop for both.
            self._hand_back(last, wake=bool(self._pending))

    def _hand_back(self, outcomes: list[_Outcome], *, wake: bool = False) -> None:
        """Results back to their loops (with ``wake``, the loop that started the thread also
        runs its next group after them, even with none).

        To that loop they go through ``_wake``, read in the loop's I/O phase, which comes
        after the callbacks of the turn in which the ``COMMIT`` returned: the next group then
        holds every write those callbacks queued (the deltas of the provider reads woken in
        the turn before). ``call_soon_threadsafe`` put the hand-off near the front of the next
        turn, before the tasks woken by that turn's network reads, whose deltas then waited
        for the group after: a loop turn more between a provider's bytes and a reader's frame
        (ADR 0053)."""
        loop, pair = self._loop, self._wake
        if pair is None or loop is None:
            _settle_all(outcomes, loop if wake else None, self._flush)
            return
        mine = [outcome for outcome in outcomes if outcome.job.loop is loop]
        if len(mine) < len(outcomes):
            _settle_all([outcome for outcome in outcomes if outcome.job.loop is not loop])
        if not mine and not wake:
            return
        self._handoffs.append((mine, self._flush if wake else None))
        try:
            os.write(pair[1], b"\0")
        except (BlockingIOError, InterruptedError):  # full: the loop has a wake to read anyway
            pass
        except OSError:  # the pipe failed (it is closed only once this thread has stopped)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_handoff)

    def _on_handoff(self) -> None:
        """On the loop that started the thread, when ``_wake`` is readable: every hand-off
        queued so far, in order."""
        pair = self._wake
        if pair is not None:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                while os.read(pair[0], 4096):  # before the queue: a later hand-off wakes again
                    pass
        handoffs = self._handoffs
        while handoffs:  # each on its own, as callbacks of their own would be
            outcomes, then = handoffs.popleft()
            try:
                _settle(outcomes, then)
            except Exception:
                log.exception("a hand-off of the SQLite thread %s failed", self.name)

    def _commit_handed(self) -> list[_Outcome]:
        """The ``COMMIT`` of the group the loop ran, if one is waiting: first, before anything
        else touches the connection."""
        handed, self._handed = self._handed, None
        if handed is None:
            return []
        try:
            if self._conn is None:  # (closing runs after it: not seen)
                return handed.failed + [
                    _Outcome(o.job, self._closed_error(o.job), None) for o in handed.done
                ]
            return self._commit(self._conn, handed.failed, handed.done)
        except BaseException as exc:  # a bug here must not leave callers waiting
            return handed.failed + [_Outcome(o.job, exc, None) for o in handed.done]
        finally:
            if handed.hurry:
                _unhurry()

    def _translate(self, exc: BaseException, action: str) -> BaseException:
        if isinstance(exc, sqlite3.Error):
            code = getattr(exc, "sqlite_errorcode", None)
            if isinstance(code, int) and code & 0xFF in _REFUSALS:
                self._refused_at = time.monotonic()
            translated = translate_error(exc, self.path, action, busy_timeout=self.busy_timeout)
            translated.__cause__ = exc
            return translated
        return exc

    def _closed_error(self, job: _Job) -> StoreError:
        return StoreError(f"cannot {job.action}: the store is closed ({self.path})")

    def _run_alone(self, job: _Job) -> _Outcome:
        conn = self._conn
        if conn is None and job.needs_connection:
            return _Outcome(job, self._closed_error(job), None)
        try:
            return _Outcome(job, None, job.fn(conn))  # type: ignore[arg-type]
        except Exception as exc:
            return _Outcome(job, self._translate(exc, job.action), None)

    def _commit_group(self, jobs: list[_Job]) -> list[_Outcome]:
        """Run ``jobs`` in one ``BEGIN IMMEDIATE`` … ``COMMIT``: together (runs of writes that
        share a merge function merged), or, when a write failed in a way only a savepoint can
        undo, write by write, each in its own savepoint."""
        conn = self._conn
        if conn is None:
            return [_Outcome(job, self._closed_error(job), None) for job in jobs]
        pending = _not_cancelled(jobs)
        if len(pending) >= _HURRY_GROUP:
            _untold(pending)
        # (a write alone runs without a savepoint anyway; a write whose group the loop ran and
        # undone runs write by write at once)
        if len(pending) > 1 and not any(job.undone for job in pending):
            together = self._commit_together(conn, pending)
            if together is not None:
                return together
            for job in pending:  # forget what the undone attempt found
                job.error = None
        return self._commit_each(conn, pending)

    def _commit_together(
        self, conn: sqlite3.Connection, pending: list[_Job]
    ) -> list[_Outcome] | None:
        """``pending`` in one transaction without savepoints, merging what can be; ``None``
        when a write raised (or anything else went wrong): then all of it was undone, and the
        caller runs the group again write by write."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:  # the lock stayed taken past the busy timeout
            return [_Outcome(j, self._translate(exc, j.action), None) for j in pending]
        failed: list[_Outcome] = []
        done: list[_Outcome] = []
        try:
            self._run_writes(conn, pending, failed, done)
        except BaseException as exc:  # undo all of it; the group runs again write by write
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            if not isinstance(exc, Exception):
                raise
            return None
        return self._commit(conn, failed, done)

    def _run_writes(
        self,
        conn: sqlite3.Connection,
        pending: list[_Job],
        failed: list[_Outcome],
        done: list[_Outcome],
    ) -> None:
        """Every write of ``pending``, in order, without savepoints, merging what can be."""
        i, n = 0, len(pending)
        while i < n:
            job = pending[i]
            if job.merge is None:
                done.append(_Outcome(job, None, job.fn(conn)))
                i += 1
                continue
            merge = job.merge[0]
            j = i + 1
            while j < n and (more := pending[j].merge) is not None and more[0] is merge:
                j += 1
            self._run_merged(conn, merge, pending[i:j], failed, done)
            i = j

    def _run_merged(
        self,
        conn: sqlite3.Connection,
        merge: Merge,
        jobs: list[_Job],
        failed: list[_Outcome],
        done: list[_Outcome],
    ) -> None:
        members = []
        for job in jobs:
            first = job.after
            if first is not None and first.error is not None:  # known not stored: not run
                failed.append(_Outcome(job, _behind_error(first, job.action), None))
            else:
                members.append(job)
        if not members:
            return
        results = merge(conn, [job.merge[1] for job in members])  # type: ignore[index]
        if len(results) != len(members):
            raise RuntimeError(f"a merge function answered {len(results)} of {len(members)}")
        for job, result in zip(members, results, strict=True):
            first = job.after  # queued earlier in this merge, its error is known by now
            behind = first is not None and first.error is not None
            if isinstance(result, BaseException):
                error = _behind_error(first, job.action) if behind else result  # type: ignore[arg-type]
                failed.append(_Outcome(job, self._translate(error, job.action), None))
            elif behind:  # stored past a hole: never commit that
                raise RuntimeError(f"{job.action} was stored behind a write that was not")
            else:
                done.append(_Outcome(job, None, result))

    def _commit(
        self, conn: sqlite3.Connection, failed: list[_Outcome], done: list[_Outcome]
    ) -> list[_Outcome]:
        if not done:  # every write failed, and was undone: nothing to make durable
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return failed
        gone = self._file_gone()
        if gone is not None:  # what it committed would be kept nowhere anyone can read it
            self._refused_at = time.monotonic()
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return failed + [
                _Outcome(o.job, StoreError(f"cannot {o.job.action}: {gone}"), None) for o in done
            ]
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # nothing of the group is stored
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            return failed + [
                _Outcome(o.job, self._translate(exc, o.job.action), None) for o in done
            ]
        self.commits += 1
        self._refused_at = None
        return failed + done

    def refusal(self) -> str | None:
        """Why writes are refused now, as one word, or ``None`` (ADR 0151): the file the
        connection opened is gone from its path (``store_removed``, ``store_replaced``: one
        ``stat``), or a write was refused less than :data:`REFUSAL_HELD_S` ago and none was
        committed since (``store_refuses_writes``). Never a write: a store that refused one
        and is then left alone is taken for writable again after that long."""
        state = self._file_state()
        if state is not None:
            return f"store_{state}"
        at = self._refused_at
        if at is not None and time.monotonic() - at < REFUSAL_HELD_S:
            return "store_refuses_writes"
        return None

    def _file_state(self) -> str | None:
        """``removed`` or ``replaced`` when the path no longer names the file the connection
        opened, else ``None`` (also when it cannot tell)."""
        if self._file is None:
            return None
        path, device, inode = self._file
        try:
            now = os.stat(path)
        except FileNotFoundError:
            return "removed"
        except OSError:  # unreadable for another reason: a commit says what is wrong, if so
            return None
        return None if (now.st_dev, now.st_ino) == (device, inode) else "replaced"

    def _file_gone(self) -> str | None:
        """Why a commit now would be kept nowhere, or ``None`` when the path still names the
        file the connection opened. One ``stat`` per transaction, beside its fsync."""
        state = self._file_state()
        if state is None or self._file is None:
            return None
        path = self._file[0]
        what = "was replaced by another file"
        if state == "removed":
            what = "was removed (or its directory was)"
        return (
            f"SQLite database {path} {what} while this process had it open; the write was "
            "rolled back, as what is written to the unlinked file is lost when the process "
            "exits (restart it to open the store at that path again)"
        )

    def _commit_each(self, conn: sqlite3.Connection, pending: list[_Job]) -> list[_Outcome]:
        """``pending`` in one transaction, each write in its own savepoint."""
        failed: list[_Outcome] = []
        while pending:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:  # the lock stayed taken past the busy timeout
                return failed + [_Outcome(j, self._translate(exc, j.action), None) for j in pending]
            done: list[_Outcome] = []
            retry: list[_Job] | None = None
            alone = len(pending) == 1
            for k, job in enumerate(pending):
                try:
                    if not alone:
                        conn.execute("SAVEPOINT grouped")
                    value = job.fn(conn)
                    if not alone:
                        conn.execute("RELEASE grouped")
                except Exception as exc:
                    failed.append(_Outcome(job, self._translate(exc, job.action), None))
                    if not conn.in_transaction:
                        # SQLite gave up the whole transaction (it may, after SQLITE_FULL or an
                        # I/O error): run the others again in a new one.
                        retry = [o.job for o in done] + pending[k + 1 :]
                        break
                    if not alone:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK TO grouped")
                            conn.execute("RELEASE grouped")
                    else:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                else:
                    done.append(_Outcome(job, None, value))
            if retry is not None:
                pending = retry
                continue
            if not conn.in_transaction:  # a single job that failed was rolled back above
                return failed
            return self._commit(conn, failed, done)
        return failed


@dataclass(slots=True)
class _Job:
    action: str
    fn: Callable[[sqlite3.Connection], Any]
    grouped: bool
    needs_connection: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    then: Callable[[Any], Any] | None
    merge: tuple[Merge, Any] | None = None
    """The merge function that may do this write with its neighbours, and this write's item."""
    after: _Job | None = None
    """The write this one runs only behind (``queue_write``'s ``after``)."""
    error: BaseException | None = None
    """Set (on the owning thread, or the loop running a group) once this write is known not
    stored (a write queued ``after`` it then fails too)."""
    undone: bool = False
    """It ran in a group the loop undid (a write raised): the thread runs it write by write."""
    decided: Callable[[Any], None] | None = None
    """Told what ``fn`` returned once the loop ran it in a group, before the ``COMMIT``
    (``write``'s ``decided``)."""
    committed: Callable[[Any], None] | None = None
    """Told what ``fn`` returned in the hand-off of its ``COMMIT``, when its group had fewer than
    ``_HURRY_GROUP`` writes (``write``'s ``committed``)."""


_WAKE = _Job("commit", lambda conn: None, False, False, None, None, None)  # type: ignore[arg-type]
"""Put on the thread's queue when the loop hands it a group to commit (``_handed``)."""


_HURRY = 0.0005
"""The interpreter's switch interval, seconds, while a group waits for the thread's ``COMMIT``."""
_HURRY_GROUP = 16
"""... a group of this many writes or more (a loop with many runs to serve; below, the loop
blocks often enough, and a shorter interval measured worse)."""
_hurry_lock = threading.Lock()
_hurrying = 0
_switch_interval = 0.0


def _opened_file(path: Path | str) -> tuple[str, int, int] | None:
    """The absolute path, device and inode of the database file just opened at ``path``
    (``None``: an in-memory database, or nothing to compare with)."""
    if str(path) == ":memory:":
        return None
    absolute = os.path.abspath(path)
    try:
        st = os.stat(absolute)
    except OSError:
        return None
    return absolute, st.st_dev, st.st_ino


def _hurry() -> None:
    """From a group's hand-off to its ``COMMIT``'s return, a thread waiting for the interpreter
    lock asks for it after ``_HURRY`` instead of the usual 5 ms (ADR 0036): the writer thread,
    woken for the ``COMMIT`` and back from its fsync, waits that long at most for the busy
    loop to let go."""
    global _hurrying, _switch_interval
    with _hurry_lock:
        if _hurrying == 0:
            _switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_interval, _HURRY))
        _hurrying += 1


def _unhurry() -> None:
    global _hurrying
    with _hurry_lock:
        _hurrying -= 1
        if _hurrying == 0:
            sys.setswitchinterval(_switch_interval)


@dataclass(slots=True)
class _Handed:
    failed: list[_Outcome]
    done: list[_Outcome]
    hurry: bool


def _not_cancelled(jobs: list[_Job]) -> list[_Job]:
    """The writes to run; one cancelled before it ran is never run, nor one queued after it."""
    pending = []
    for job in jobs:
        if not job.future.cancelled():
            pending.append(job)
        elif job.error is None:
            job.error = StoreError(f"cannot {job.action}: it was cancelled before it ran")
    return pending


QueuedWrite = _Job
"""A write ``queue_write`` queued: its ``future``, and what a later write may follow."""


def _behind(
    first: _Job, action: str, fn: Callable[[sqlite3.Connection], T]
) -> Callable[[sqlite3.Connection], T]:
    """``fn``, run only if ``first`` (queued before it on the same thread, so settled by the
    time it runs, or earlier in the same transaction) was not known to have failed."""

    def body(conn: sqlite3.Connection) -> T:
        if first.error is not None:
            raise _behind_error(first, action)
        return fn(conn)

    return body


def _behind_error(first: _Job, action: str) -> StoreError:
    """Quotes the first write's error, which may quote its driver's words: declared."""
    assert first.error is not None
    text = f"cannot {action}: the write queued before it was not stored ({SAID})"
    return quoting(StoreError, text, first.error)


@dataclass(slots=True)
class _Outcome:
    job: _Job
    error: BaseException | None
    value: Any

    def __post_init__(self) -> None:
        if self.error is not None:
            self.job.error = self.error


def _untold(jobs: list[_Job]) -> None:
    """A large group's writes (``_HURRY_GROUP`` or more): not told in the hand-off."""
    for job in jobs:
        job.committed = None


def _tell_decided(done: list[_Outcome]) -> None:
    """Each write of a group the loop ran that asked to know (``write``'s ``decided``), told what
    it returned; a caller's mistake there is logged, never the group's failure."""
    for outcome in done:
        decided = outcome.job.decided
        if decided is not None:
            try:
                decided(outcome.value)
            except Exception:
                log.exception("a write's 'decided' callback failed (%s)", outcome.job.action)


def _close_pipe(pair: tuple[int, int] | None) -> None:
    if pair is not None:
        os.close(pair[0])
        os.close(pair[1])


def _wake_pair(
    loop: asyncio.AbstractEventLoop, on_wake: Callable[[], None]
) -> tuple[int, int] | None:
    """A non-blocking pipe whose read end ``loop`` watches with ``on_wake``; ``None`` where
    the loop cannot watch one (then hand-offs go by ``call_soon_threadsafe``). Plain file
    descriptors: a store dropped without ``close`` leaks them as it leaks its thread."""
    try:
        pair = os.pipe()
    except OSError:
        return None
    try:
        for end in pair:
            os.set_blocking(end, False)
        loop.add_reader(pair[0], on_wake)
    except (NotImplementedError, OSError, ValueError):  # e.g. a proactor loop, Windows pipes
        _close_pipe(pair)
        return None
    return pair


def _settle_all(
    outcomes: list[_Outcome],
    wake: asyncio.AbstractEventLoop | None = None,
    then: Callable[[], None] | None = None,
) -> None:
    """Hand the results back: one ``call_soon_threadsafe`` per event loop, not one per job;
    with ``wake``, that loop also runs ``then`` after its results (even with none)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome.job.loop, []).append(outcome)
    if wake is not None:
        by_loop.setdefault(wake, [])
    for loop, mine in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop has closed: nobody is waiting
            loop.call_soon_threadsafe(_settle, mine, then if loop is wake else None)


def _settle(outcomes: list[_Outcome], then: Callable[[], None] | None = None) -> None:
    try:
        _settle_each(outcomes)
    finally:
        if then is not None:
            then()


def _settle_each(outcomes: list[_Outcome]) -> None:
    for outcome in outcomes:
        job = outcome.job
        future = job.future
        error, value = outcome.error, outcome.value
        if error is None and job.committed is not None:
            try:  # (a cancelled caller's too: the write committed all the same)
                job.committed(value)
            except Exception:  # the write is durable all the same: its caller must hear so
                log.exception("a write's 'committed' callback failed (%s)", job.action)
        if error is None and job.then is not None:
            try:  # even for a cancelled caller: the write committed all the same
                value = job.then(value)
            except Exception as exc:
                error = exc
        if future.done():  # the caller was cancelled; the work itself still happened
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

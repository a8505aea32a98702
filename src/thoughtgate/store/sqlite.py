"""The embedded default store: one SQLite file in WAL mode, safe for several processes at once.

Durability and ordering:

* WAL with ``synchronous=FULL``: an append that returned survives a power cut.
* Every write runs in ``BEGIN IMMEDIATE``, which holds the database's single write lock from the
  first statement; writes queued together share one transaction (group commit, see
  ``sqlite_thread``), each stored or failed as if alone; a group's appends are made together
  with its run starts, claims and endings (``_merged_writes``, ADR 0030 and 0033). An append
  bumps ``runs.last_seq`` and inserts its events in that transaction, so sequence numbers are
  gap-free and in commit order even with writers in several processes, and a batch is stored
  all or nothing.
* Live tails in this process are woken by ``wakeups``; tails in other processes poll every
  ``poll_interval`` (an indexed range read that returns nothing when nothing is new).

Threads: one dedicated thread and connection for writes, one for reads (see ``sqlite_thread``).
A third, read-only connection answers the API-key lookup every request makes on the event loop
itself, so that authenticating a request never queues behind the event-page reads of the live
streams nor waits a loop turn for the answer (ADR 0028, amendment of 2026-12-02).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, TypeVar, Unpack

import orjson

from thoughtgate.errors import (
    RunClosedError,
    RunNotFoundError,
    RunTakenOverError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from thoughtgate.events.schema import EVENT_VERSION, Event, NewEvent
from thoughtgate.store import apart_backfill, codec, durable, listing
from thoughtgate.store.base import EventStore, Holder, OpenRun, OpenRuns, RunEnding
from thoughtgate.store.log import PageAhead, QueuedAppend, append_refused
from thoughtgate.store.private_files import (
    create_private_file,
    make_private_parents,
    read_secret_file,
    write_secret_file,
)
from thoughtgate.store.projection import IndexUpdate, batch_update, column_storable
from thoughtgate.store.records import OPEN_RUN_STATUSES, ApiKeyRecord, RunRecord, TaskRecord
from thoughtgate.store.run_index import RunChange
from thoughtgate.store.sqlite_schema import connect, open_checked, writable
from thoughtgate.store.sqlite_thread import QueuedWrite, SQLiteThread, translate_error

__all__ = ["SQLiteStore", "open_runs_query", "read_types_query"]

T = TypeVar("T")

_RUN_SELECT = f"SELECT {codec.RUN_COLUMNS} FROM runs"
_TASK_SELECT = f"SELECT {codec.TASK_COLUMNS} FROM tasks"
_TASK_SELECT_SHOWN = f"SELECT {codec.TASK_COLUMNS_SHOWN} FROM tasks"
_KEY_SELECT = f"SELECT {codec.KEY_COLUMNS} FROM api_keys"
_SECRET_NAME = re.compile(r"[a-z0-9_]{1,64}")
_INSERT_TASK = (
    f"INSERT INTO tasks ({codec.TASK_COLUMNS}) "
    f"VALUES ({','.join('?' * codec.TASK_COLUMN_COUNT)}) {codec.TASK_CONFLICT_UPDATE}"
)
"""A task row, inserted or written over the stored one in place (``codec.TASK_CONFLICT_UPDATE``)."""
_INSERT_RUN = (
    f"INSERT INTO runs ({codec.RUN_COLUMNS}, change_seq) "
    f"VALUES ({','.join('?' * (codec.RUN_COLUMN_COUNT + 1))})"
)
_INSERT_SPEC = (
    f"INSERT INTO run_specs ({codec.SPEC_COLUMNS}) "
    f"VALUES ({','.join(['?'] * codec.SPEC_COLUMN_COUNT)})"
)
_BUMP_CHANGE = "UPDATE run_changes SET last_change = last_change + 1 RETURNING last_change"


_BUSY_CODES = (5, 6)
"""SQLITE_BUSY, SQLITE_LOCKED: the lookup connection does not wait for a lock on the loop."""

_OPEN = codec.OPEN_RUN_PREDICATE
"""An open run; spelled as in the ``open_runs_by_id`` partial index so SQLite uses it."""


def _require_run(conn: sqlite3.Connection, run_id: str) -> None:
    if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        raise RunNotFoundError(run_id)


def _read_run(conn: sqlite3.Connection, run_id: str, apart: bool = True) -> RunRecord:
    """The run with its tasks in index order (inside the caller's transaction); ``apart``: as
    ``RunIndex.get_run``'s."""
    row = conn.execute(f"{_RUN_SELECT} WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        raise RunNotFoundError(run_id)
    select = _TASK_SELECT if apart else _TASK_SELECT_SHOWN
    tasks = conn.execute(f"{select} WHERE run_id = ? ORDER BY idx", (run_id,)).fetchall()
    return codec.run_from_row(row, map(codec.task_from_row, tasks))


_PAGE_ROWS = 1000
"""Events per aggregate query: a read of a whole run is several, so no aggregated value comes
near SQLite's length limit (a page of 1 MB reasoning traces is already a large one)."""
_NO_LIMIT = 2**62
_STAMP_SCALE = 4194304
"""2**22. A double in [2**30, 2**41) (every time since 2004) has no bit below 2**-22, so ``ts``
times this is an exact integer below 2**63: it crosses the aggregate as integer text exactly,
where SQLite writes a REAL into JSON with 15 digits. A page with a stamp outside that range (a
test's 0.1) is read row by row."""
_EXACT_STAMPS = (2.0**30, 2.0**41)
_UNSCALE = 1.0 / _STAMP_SCALE


def read_types_query(
    run_id: str, types: Collection[str], *, after: int, limit: int | None
) -> tuple[str, tuple[Any, ...]]:
    """``read_types``' statement and parameters. A check's names its index (ADR 0066):
    without statistics SQLite would rather walk the run's every event in the primary key, which
    holds every column, than look up the few ``lifecycle_events`` lists."""
    hint = f" INDEXED BY {codec.LIFECYCLE_INDEX}"
    return codec.typed_read_sql("?", run_id, types, after=after, limit=limit, hint=hint)


def open_runs_query(
    *, limit: int, after: str | None, expired: bool, run_ids: str | None, now: float
) -> tuple[str, tuple[Any, ...]]:
    """``open_runs``' statement and parameters (``run_ids``: a JSON array). It names
    ``open_runs_by_id`` (ADR 0079): a page is a range read of it in run id order from the cursor,
    where SQLite's planner would read every open run by status (``runs_by_status``) and sort them;
    and a missing index, or a ``WHERE`` that no longer holds its predicate, is an error rather
    than a silent sort. The expired read names ``leased_runs_by_id`` (ADR 0082): it visits the
    runs a process holds, not the queued and suspended ones."""
    where = codec.open_runs_where(
        "?",
        after=after is not None,
        run_ids=None if run_ids is None else "run_id IN (SELECT value FROM json_each(?))",
        expired="?" if expired else None,
    )
    index = codec.LEASED_RUNS_BY_ID if expired else codec.OPEN_RUNS_BY_ID
    query = (
        "SELECT run_id, owner, lease_expires_at, queued_at "
        f"FROM runs INDEXED BY {index} "
        f"LEFT JOIN run_specs USING (run_id) WHERE {where} ORDER BY run_id LIMIT ?"
    )
    params = (after, run_ids, now if expired else None)
    return query, (*(p for p in params if p is not None), limit)


def _read_page(payload: str) -> str:
    return (
        "SELECT count(*), min(v), max(v), min(ts), max(ts), "
        f"CAST(group_concat({payload}, ',') AS BLOB), max(seq), "
        f"group_concat(coalesce(task_id, ''), '{codec.UNIT}'), count(task_id), "
        f"group_concat(type, '{codec.UNIT}'), "
        f"json_group_array(CAST(ts * {_STAMP_SCALE} AS INTEGER)) "
        "FROM events WHERE run_id = ? AND seq > ? AND seq <= ?"
    )


_READ_PAGE = {True: _read_page(codec.SQLITE_PAYLOAD_SQL), False: _read_page("payload")}
"""A page as one row of columns (``codec.events_from_columns``): Python touches a handful of
values per page instead of six per event, and SQLite builds them without the interpreter lock.
A range of sequence numbers, not ``LIMIT``: sequences have no gaps. ``events`` is a table
without rowid clustered on ``(run_id, seq)`` and has no other index, so the aggregates take
its rows in that order; the page is all of ``after + 1 .. after + count`` when its largest
number is ``after + count`` (numbers are unique), which the codec checks. (An array of the
numbers, read back and compared, cost SQLite and the loop about a tenth of a page: ADR 0037.)
Task ids and types come as texts joined by ``codec.UNIT``, as PostgreSQL's do (ADR 0039): a
``NULL`` task id as ``''``, and how many are not ``NULL`` (ADR 0095). Keyed by whether the
reader reads what is kept apart (``codec.event_select``, ADR 0160)."""
_READ_ROWS = {
    apart: f"{codec.event_select(apart=apart, sqlite=True)} "
    "WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
    for apart in (True, False)
}


_WINDOW_END, _INLINE_ROWS_TO, _INLINE_ROWS = apart_backfill.window_sql("?")


def _inline_window(
    conn: sqlite3.Connection, after: apart_backfill.Cursor
) -> tuple[apart_backfill.Cursor | None, list[apart_backfill.Cursor]]:
    """On the reader: the window's last row (``None``: the log ends inside it) and the rows in
    it that may hold reasoning inline."""
    end = conn.execute(_WINDOW_END, (*after, apart_backfill.WINDOW - 1)).fetchone()
    types = codec.apart_types()
    if end is None:
        rows = conn.execute(_INLINE_ROWS, (*after, *types)).fetchall()
        return None, [(str(r[0]), int(r[1])) for r in rows]
    rows = conn.execute(_INLINE_ROWS_TO, (*after, *end, *types)).fetchall()
    return (str(end[0]), int(end[1])), [(str(r[0]), int(r[1])) for r in rows]


_INLINE_ROW = "SELECT type, payload FROM events WHERE run_id = ? AND seq = ? AND apart IS NULL"
_MOVE_ROW = (
    "UPDATE events SET payload = ?, apart = 1 WHERE run_id = ? AND seq = ? AND apart IS NULL"
)
_MOVE_PART = "INSERT INTO events_apart (run_id, seq, apart) VALUES (?, ?, ?)"


def _move_rows(
    conn: sqlite3.Connection, keys: Sequence[apart_backfill.Cursor], *, dry_run: bool
) -> apart_backfill.Batch:
    """In one transaction (the writer's; the reader's for ``dry_run``): the rows of ``keys`` in
    order, each still whole moved apart, until the batch's byte budget is spent."""
    batch = apart_backfill.Batch()
    for run_id, seq in keys:
        if not batch.takes():
            break
        row = conn.execute(_INLINE_ROW, (run_id, seq)).fetchone()
        if row is None:  # moved meanwhile (another backfill): nothing left to do
            continue
        split = batch.split((run_id, seq), row[0], row[1])
        if split is not None and not dry_run:
            conn.execute(_MOVE_ROW, (split[0], run_id, seq))
            conn.execute(_MOVE_PART, (run_id, seq, split[1]))
    return batch


_Page = tuple[int, tuple[Any, ...] | list[tuple[Any, ...]]]
"""``(after, row of _READ_PAGE)``, or ``(after, rows of _READ_ROWS)`` for a page too long to
aggregate: a page fetched by the reader thread, not yet decoded."""
_TOOBIG = 18
"""SQLITE_TOOBIG: a value longer than the connection's length limit (1e9 bytes by default)."""


def _fetch_pages(
    conn: sqlite3.Connection, run_id: str, after: int, limit: int | None, apart: bool = True
) -> list[_Page]:
    """In the reader thread: the pages of up to ``limit`` events after ``after``, one query
    (one row) per :data:`_PAGE_ROWS` events; raises ``RunNotFoundError`` when there are none
    because the run does not exist."""
    pages: list[_Page] = []
    left = _NO_LIMIT if limit is None else max(limit, 0)
    cursor = max(after, 0)
    while left > 0:
        want = min(left, _PAGE_ROWS)
        page: tuple[Any, ...] | list[tuple[Any, ...]]
        try:
            row: tuple[Any, ...] = conn.execute(
                _READ_PAGE[apart], (run_id, cursor, codec.seq_page_end(cursor, want))
            ).fetchone()
            count, page = int(row[0]), row
        except sqlite3.DataError as exc:
            if getattr(exc, "sqlite_errorcode", None) != _TOOBIG:
                raise
            # The page's payloads are longer than SQLite's longest value: read its rows.
            page = conn.execute(_READ_ROWS[apart], (run_id, cursor, want)).fetchall()
            count = len(page)
        if not count:
            break
        pages.append((cursor, page))
        if count < want:
            break
        left -= want
        cursor += want  # every sequence number in the range is there
    if not pages:  # runs are never deleted, so checking afterwards is race-free
        _require_run(conn, run_id)
    return pages


def _events_from_page(
    run_id: str, after: int, row: tuple[Any, ...] | list[tuple[Any, ...]]
) -> list[Event] | None:
    """The events of one aggregate row (or of the rows read instead); ``None`` for a page to
    read row by row (mixed vocabulary versions, a stamp outside :data:`_EXACT_STAMPS`,
    sequence numbers not in order, a task id of ``''`` beside a ``NULL`` one)."""
    if isinstance(row, list):
        return codec.events_from_rows(run_id, row)
    count, v_min, v_max, ts_min, ts_max, payloads, last, joined_ids, present, types, stamps = row
    low, high = _EXACT_STAMPS
    if v_min != v_max or ts_min < low or ts_max >= high:
        return None
    seqs = codec.page_range(after, count, last)
    if seqs is None:
        return None
    task_ids = codec.counted_task_ids(joined_ids, count, present)
    if task_ids is None:
        return None
    return codec.events_from_columns(
        run_id,
        after + 1,
        seqs,
        task_ids,
        codec.split_column(types, count),
        [stamp * _UNSCALE for stamp in orjson.loads(stamps)],
        payloads,
        v_min,
    )


def _rows_reader(
    run_id: str, after: int, n: int, apart: bool
) -> Callable[[sqlite3.Connection], list[Event]]:
    """The ``n`` events after ``after`` read row by row, for a page ``_events_from_page`` left."""

    def work(conn: sqlite3.Connection) -> list[Event]:
        return codec.events_from_rows(
            run_id, conn.execute(_READ_ROWS[apart], (run_id, after, n)).fetchall()
        )

    return work


class _FetchedAhead:
    """A page being fetched by the reader thread (``SQLiteStore.read_ahead``)."""

    __slots__ = ("apart", "fetched", "run_id", "store")

    def __init__(
        self, store: SQLiteStore, run_id: str, fetched: asyncio.Future[list[_Page]], apart: bool
    ) -> None:
        self.store, self.run_id, self.fetched, self.apart = store, run_id, fetched, apart

    def __await__(self) -> Generator[Any, None, list[Event]]:
        return self.store._decoded(self.run_id, self.fetched, self.apart).__await__()

    async def abandon(self) -> None:
        # The thread's job runs to its end anyway (a read, nothing to undo); its result or
        # error is dropped, and taken so that asyncio does not log it.
        if not self.fetched.cancel() and not self.fetched.cancelled():
            self.fetched.exception()


def _not_appendable(
    conn: sqlite3.Connection, run_id: str, held_by: Holder | None = None
) -> Exception:
    """Why an append found no open row: no such run, the run has ended, or (``held_by``) another
    execution holds it now (ADR 0090)."""
    row = conn.execute("SELECT closed_at, owner FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return append_refused(run_id, row, held_by)


_HELD_BY = (
    "SELECT closed_at, owner, (SELECT attempts FROM run_specs s WHERE s.run_id = runs.run_id) "
    "FROM runs WHERE run_id = ?"
)
"""Whether a run is open, and who holds it: what ``Holder.check`` decides a write by."""


def _check_held(
    conn: sqlite3.Connection, run_id: str, held_by: Holder | None, recording: str
) -> None:
    """Inside a write transaction (one writer: no claim commits before the write does): the
    fence of an execution's write to a run's rows outside ``append`` (ADR 0094); without
    ``held_by``, only that the run exists."""
    if held_by is None:
        _require_run(conn, run_id)
    else:
        held_by.check(run_id, conn.execute(_HELD_BY, (run_id,)).fetchone(), recording)


def _refusal(conn: sqlite3.Connection, run_id: str) -> type[RunNotFoundError | RunClosedError]:
    row = conn.execute("SELECT closed_at FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return RunNotFoundError if row is None else RunClosedError


def _next_change(conn: sqlite3.Connection) -> int:
    """Inside a write transaction: the number of the change being made to a run (listing.py)."""
    return int(conn.execute(_BUMP_CHANGE).fetchone()[0])


_BUMP_SEQ = (
    "UPDATE runs SET last_seq = last_seq + ? WHERE run_id = ? AND closed_at IS NULL "
    "RETURNING last_seq"
)
_BUMP_HELD_SEQ = _BUMP_SEQ.replace(
    "AND closed_at IS NULL",
    "AND closed_at IS NULL AND owner = ? AND (? IS NULL OR "
    "(SELECT attempts FROM run_specs s WHERE s.run_id = runs.run_id) = ?)",
)
"""``_BUMP_SEQ`` for an execution's append, fenced in the same statement as its end is
(``Holder.holds``, ADR 0090): numbered only while the run's owner is the execution's and, for a
claimed run, its spec's claims counted no further than the execution's own. Its parameters:
``_BUMP_SEQ``'s, then the owner and the attempt twice."""
_BUMP_SEQS = (
    "UPDATE OR ROLLBACK runs SET last_seq = last_seq + j.value FROM json_each(?) AS j "
    "WHERE runs.run_id = j.key AND runs.closed_at IS NULL RETURNING runs.run_id, last_seq"
)
"""Numbers the batches of several open runs at once (a JSON object: run id -> events), one
statement whatever their number. SQLite makes every change in the first step; the rows it
returns after that are short steps (ADR 0030: what costs under load is a long one)."""
_ROW_PARAMS = 7
_INSERT_CHUNK = 128
"""Event rows per insert statement: 896 parameters, under SQLite's oldest limit (999)."""


def _insert_statement(rows: int) -> str:
    if rows == 1:  # (one row: the plain statement is the cheaper one for SQLite)
        return (
            "INSERT INTO events (run_id, seq, task_id, type, ts, payload, v, apart) "
            f"VALUES (?,?,NULLIF(?,0),?,?,?,{EVENT_VERSION},NULLIF(?,0))"
        )
    values = ",".join(["(?,?,?,?,?,?,?)"] * rows)
    return (
        "INSERT OR ROLLBACK INTO events (run_id, seq, task_id, type, ts, payload, v, apart) "
        "SELECT column1, column2, CASE WHEN column3 = 0 THEN NULL ELSE column3 END, column4, "
        f"column5, column6, {EVENT_VERSION}, CASE WHEN column7 = 0 THEN NULL ELSE column7 END "
        f"FROM (VALUES {values}) WHERE column2 > 0"
    )


_INSERTS = {size: _insert_statement(size) for size in (2**k for k in range(8))}
"""Multi-row inserts of 1, 2, 4, ... 128 (``_INSERT_CHUNK``) rows: a chunk is padded up to the
next size with rows of zeros (sequence numbers start at 1: the ``WHERE`` drops them), so a
handful of statements stay prepared in the connection's cache whatever the batch sizes, and
each chunk costs one step. ``OR ROLLBACK``: a statement that writes many rows and may stop
half way keeps a statement journal, a copy of every page it changes (spilled to a temporary
file past 64 KiB: a chunk of 100 runs' rows took 1 ms, not 0.3); a constraint failure, which
only a bug could cause, abandons the whole transaction instead, and the writer then runs the
group again write by write (``SQLiteThread``). No parameter is ``None``: the driver binds a
``None`` twenty times slower than a number or a string (it looks for an adapter first), so a
missing task id is bound as 0 and stored as NULL (a task id is text, never the integer 0; a
``CASE``, as ``NULLIF`` brought the statement journal back). One row is a plain ``INSERT``:
it keeps no statement journal, and costs SQLite less than a ``SELECT`` of one row."""
_PAD = (0,) * _ROW_PARAMS


def _insert_events(conn: sqlite3.Connection, params: list[Any]) -> None:
    """Insert event rows given as one flat list of ``_ROW_PARAMS`` values per row."""
    step = _INSERT_CHUNK * _ROW_PARAMS
    for start in range(0, len(params), step):
        chunk = params[start : start + step]
        rows = len(chunk) // _ROW_PARAMS
        size = 1 << (rows - 1).bit_length()
        if size > rows:
            chunk += _PAD * (size - rows)
        conn.execute(_INSERTS[size], chunk)


def _event_params(params: list[Any], run_id: str, first: int, columns: codec.EncodedEvents) -> None:
    """Append the insert parameters of ``columns``, numbered from ``first``, to ``params``."""
    payloads, task_ids, types, ts, aparts = columns
    for k in range(len(payloads)):
        task_id = task_ids[k]
        apart = aparts[k]
        params += (
            run_id,
            first + k,
            0 if task_id is None else task_id,
            types[k],
            ts[k],
            payloads[k],
            0 if apart is None else 1,  # (its text: ``_insert_aparts``)
        )


def _uniform_statement(rows: int, *, apart: bool = False) -> str:
    values = ",".join(f"(?{4 + 3 * r},?{5 + 3 * r},?{6 + 3 * r})" for r in range(rows))
    flag = ", apart" if apart else ""
    return (
        f"INSERT OR ROLLBACK INTO events (run_id, seq, task_id, type, ts, payload, v{flag}) "
        f"SELECT ?1, column1, ?2, ?3, column2, column3, {EVENT_VERSION}{', 1' if apart else ''} "
        f"FROM (VALUES {values}) WHERE column1 > 0"
    )


_UNIFORM_CHUNK = 256
"""Rows per uniform insert: 771 parameters, under SQLite's oldest limit (999)."""
_UNIFORM_INSERTS = {size: _uniform_statement(size) for size in (2**k for k in range(9))}
"""Inserts of 1, 2, 4, ... 256 rows of one run, one task and one type (a model turn's deltas):
the three are bound once (``?1``-``?3``) and each row binds its number, time and payload, padded
up to the size with rows of zeros as ``_INSERTS`` are. Each text bound is copied by SQLite into
memory of its own (``SQLITE_TRANSIENT``): a row of ``_INSERTS`` binds four, one here (ADR 0096)."""
_UNIFORM_APART_INSERTS = {
    size: _uniform_statement(size, apart=True) for size in (2**k for k in range(9))
}
"""The same for a batch whose every event keeps a part apart (``reasoning.delta``, ADR 0160):
each row is marked (its ``apart``), the parts are inserted by ``_insert_aparts``."""
_UNIFORM_PAD = (0, 0, 0)


def _insert_uniform(
    conn: sqlite3.Connection, run_id: str, first: int, columns: codec.EncodedEvents
) -> bool:
    """Insert ``columns``, numbered from ``first``, with ``_UNIFORM_INSERTS`` when every event
    has the same task and type; whether it did (otherwise nothing was inserted)."""
    payloads, task_ids, types, ts, aparts = columns
    n = len(payloads)
    if n < 2 or task_ids.count(task_ids[0]) != n or types.count(types[0]) != n:
        return False
    inserts = _UNIFORM_INSERTS
    if aparts.count(None) != n:
        if None in aparts:
            return False  # (some of the batch apart, some not: row by row)
        inserts = _UNIFORM_APART_INSERTS
    task_id, type_ = task_ids[0], types[0]
    for start in range(0, n, _UNIFORM_CHUNK):
        end = min(n, start + _UNIFORM_CHUNK)
        rows = end - start
        size = 1 << (rows - 1).bit_length()
        params: list[Any] = [run_id, task_id, type_]
        params += chain.from_iterable(
            zip(range(first + start, first + end), ts[start:end], payloads[start:end], strict=True)
        )
        if size > rows:
            params += _UNIFORM_PAD * (size - rows)
        conn.execute(inserts[size], params)
    return True


def _append_rows(
    conn: sqlite3.Connection,
    run_id: str,
    columns: codec.EncodedEvents,
    held_by: Holder | None = None,
) -> int:
    """Inside a write transaction: number and insert encoded events; returns the first seq.
    ``held_by``: the execution appending, which must hold the run (ADR 0090)."""
    n = len(columns[0])
    if held_by is None:
        row = conn.execute(_BUMP_SEQ, (n, run_id)).fetchall()
    else:
        fence = (held_by.owner, held_by.attempt, held_by.attempt)
        row = conn.execute(_BUMP_HELD_SEQ, (n, run_id, *fence)).fetchall()
    if not row:
        raise _not_appendable(conn, run_id, held_by)
    first = int(row[0][0]) - n + 1
    if not _insert_uniform(conn, run_id, first, columns):
        params: list[Any] = []
        _event_params(params, run_id, first, columns)
        _insert_events(conn, params)
    _insert_aparts(conn, run_id, first, columns)
    return first


_INSERT_APART = "INSERT OR ROLLBACK INTO events_apart (run_id, seq, apart) VALUES (?, ?, ?)"


def _insert_aparts(
    conn: sqlite3.Connection, run_id: str, first: int, columns: codec.EncodedEvents
) -> None:
    """The parts kept apart of events numbered from ``first`` (ADR 0160): one row each in
    ``events_apart``, for the few events that have one (a turn's record, a reasoning delta)."""
    aparts = columns[4]
    if aparts.count(None) == len(aparts):
        return
    conn.executemany(
        _INSERT_APART,
        [(run_id, first + k, a) for k, a in enumerate(aparts) if a is not None],
    )


_NO_EVENTS: codec.EncodedEvents = ([], [], [], [], [])


@dataclass(frozen=True, slots=True)
class _Append:
    """An append as data: its run, its columns and what its events change in the run index
    (``None`` for deltas and the like, which change nothing there)."""

    run_id: str
    columns: codec.EncodedEvents
    update: IndexUpdate | None
    held_by: Holder | None = None
    """The execution appending (ADR 0090), checked by ``_check_holders``."""


@dataclass(frozen=True, slots=True)
class _Start:
    """``create_run`` (no ``spec``) or ``admit_run`` as data."""

    run_id: str
    row: tuple[Any, ...]
    """``codec.run_row`` of the run (its change number is the merge's to add)."""
    tasks: list[tuple[Any, ...]]
    open: bool
    """Whether the run counts among its key's open runs once stored (its status is open)."""
    spec: durable.RunSpecRecord | None = None
    quota: durable.Quota | None = None
    columns: codec.EncodedEvents = _NO_EVENTS
    update: IndexUpdate | None = None


@dataclass(frozen=True, slots=True)
class _End:
    """``finish_run`` as data: its events, the rows of the tasks it ends, the run columns it
    sets (with ``closed_at``) and the ending, for its lease check."""

    run_id: str
    columns: codec.EncodedEvents
    update: IndexUpdate | None
    tasks: list[tuple[Any, ...]]
    sets: dict[str, Any]
    ending: RunEnding


@dataclass(frozen=True, slots=True)
class _Claim:
    """``claim_run`` as data."""

    run_id: str
    owner: str
    ttl_s: float
    attempt: int | None = None
    columns: codec.EncodedEvents = _NO_EVENTS
    update: IndexUpdate | None = None


_Merged = _Append | _Start | _End | _Claim


def _merged_writes(conn: sqlite3.Connection, items: list[_Merged]) -> list[Any]:
    """The writer's merge function (``SQLiteThread``; ADR 0030 for appends, ADR 0033 for run
    starts, claims and endings): answers, per write in queue order, what its own ``fn`` would
    have returned, or the error that fails it alone (having written nothing of it).

    The writes are cut into spans (:func:`_spans`) in which doing every start first, then every
    claim, then every append, then every ending gives what queue order gives; each span is a
    handful of statements whatever its size (:func:`_write_span`)."""
    out: list[Any] = []
    for span in _spans(items):
        out += _write_span(conn, span)
    return out


def _spans(items: list[_Merged]) -> Generator[list[_Merged], None, None]:
    """``items`` cut where doing starts, claims, appends, then endings would not be queue order:
    before a start of a run already named in the span (made again, or named before it was
    made), before an append or an ending of a run ended in the span (by an ending, or by an
    append or a start whose events gave it a terminal status: ADR 0134), before an ending of a run
    whose status an append of the span changed (its check must see that), before a claim of a
    run that a write other than its start named in the span (claims come second, after the
    starts), and before a start with a quota once the span has ended a run or changed a status
    (the quota counts open runs, and the span's starts are counted before its endings)."""
    named: set[str] = set()
    touched: set[str] = set()
    ended: set[str] = set()
    restated: set[str] = set()
    begin = 0
    for k, item in enumerate(items):
        run_id = item.run_id
        if isinstance(item, _Start):
            cut = run_id in named or (item.quota is not None and bool(ended or restated))
        elif isinstance(item, _Claim):
            cut = run_id in touched
        else:
            cut = run_id in ended or (isinstance(item, _End) and run_id in restated)
        if cut:
            yield items[begin:k]
            begin = k
            named, touched, ended, restated = set(), set(), set(), set()
        named.add(run_id)
        if not isinstance(item, _Start):
            touched.add(run_id)
        if isinstance(item, _End):
            ended.add(run_id)
        elif item.update is not None and "status" in item.update.run:
            restated.add(run_id)
            if codec.closes_run(item.update.run["status"]):
                ended.add(run_id)  # its projection closes the run (ADR 0134)
    yield items[begin:]


def _write_span(conn: sqlite3.Connection, span: list[_Merged]) -> list[Any]:
    """One span's writes: the starts (quotas counted once per key, one change-number
    allocation, multi-row inserts), the claims (three statements), the endings' checks (one
    query), the numbering and insert of every event (ADR 0030), what the starts' and appends'
    events change in the run index (:func:`_project_many`), the endings' task rows and index
    changes, then the endings' run rows (one change-number allocation, one update)."""
    now = time.time()
    out: list[Any] = [None] * len(span)
    started = _start_runs(conn, span, now, out)
    _claim_runs(conn, span, now, out)
    _check_holders(conn, span, out)
    ending = _check_endings(conn, span, out)
    firsts = _number_events(conn, span, started | ending, out)
    projected: list[tuple[int, str, IndexUpdate]] = []
    ends: list[_End] = []
    for k, item in enumerate(span):
        if isinstance(item, _Append):
            if not isinstance(out[k], Exception):
                out[k] = firsts[k]
                if item.update is not None:
                    projected.append((k, item.run_id, item.update))
        elif isinstance(item, _Start):
            if k in started:
                if item.spec is not None:
                    out[k] = (out[k][0], firsts.get(k, 0))
                if item.update is not None:
                    projected.append((k, item.run_id, item.update))
        elif isinstance(item, _End) and k in ending:
            out[k] = firsts.get(k, 0)
            ends.append(item)
    for k, changed in _project_many(conn, projected, now, numbered=True).items():
        if isinstance(span[k], _Append):
            out[k] = (out[k], changed)
    # An ending comes after every other write of its run in the span (``_spans``): its task
    # rows and index changes follow theirs, as in queue order.
    rows = [row for end in ends for row in end.tasks]
    if rows:
        _upsert_tasks(conn, rows)
    endings = [(0, end.run_id, end.update) for end in ends if end.update is not None]
    _project_many(conn, endings, now, numbered=False)
    _end_runs(conn, ends)
    return out


def _project_many(
    conn: sqlite3.Connection,
    updates: list[tuple[int, str, IndexUpdate]],
    now: float,
    *,
    numbered: bool,
) -> dict[int, bool]:
    """``_project`` for each ``(position, run, update)`` in queue order, in a few statements:
    each task's and each run's columns are folded into their last values (an update sets
    constants, so the last one set wins either way), a ``pending`` run found once (its status
    followed through the updates in Python), one change number given per changed update as
    alone (a run keeps the last of its own); whether each update changed its run."""
    if not updates:
        return {}
    starting = sorted({run_id for _, run_id, update in updates if update.starts})
    status: dict[str, str] = {}
    if starting:
        ids = orjson.dumps(starting).decode()
        status = {str(r[0]): str(r[1]) for r in conn.execute(_STATUSES, (ids,)).fetchall()}
    tasks: dict[tuple[str, str], dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    changed: dict[int, bool] = {}
    changes = 0
    last_change: dict[str, int] = {}
    for k, run_id, update in updates:
        for task_id, fields in update.tasks.items():
            tasks.setdefault((run_id, task_id), {}).update(codec.index_columns(fields))
        change = False
        if update.starts and status.get(run_id) == "pending":
            status[run_id] = "running"
            runs.setdefault(run_id, {})["status"] = "running"
            change = True
        if update.run:
            sets = codec.index_columns(update.run)
            runs.setdefault(run_id, {}).update(sets)
            if "status" in sets:
                status[run_id] = sets["status"]
            change = True
        changed[k] = change
        if change:
            changes += 1
            last_change[run_id] = changes
    by_columns: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    for (run_id, task_id), sets in tasks.items():
        by_columns.setdefault(tuple(sets), []).append((run_id, task_id, *sets.values()))
    for columns, rows in by_columns.items():
        assignments = ", ".join(f"{c} = v.column{i}" for i, c in enumerate(columns, start=3))
        _chunked(conn, f"UPDATE OR ROLLBACK tasks SET {assignments} FROM (VALUES ", _TASK_ROW, rows)
    first = 0
    if numbered and changes:
        first = int(conn.execute(_BUMP_CHANGES, (changes,)).fetchone()[0]) - changes
    by_columns = {}
    for run_id, sets in runs.items():
        if numbered:
            sets = {**sets, "updated_at": now, "change_seq": first + last_change[run_id]}
        by_columns.setdefault(tuple(sets), []).append((run_id, *sets.values()))
    for columns, rows in by_columns.items():
        assignments = ", ".join(f"{c} = v.column{i}" for i, c in enumerate(columns, start=2))
        _update_rows(conn, f"UPDATE OR ROLLBACK runs SET {assignments}", rows)
    ended = [run_id for run_id, sets in runs.items() if codec.closes_run(sets.get("status"))]
    if numbered and ended:  # an ending's run is closed by ``_end_runs``
        _close_ended(conn, ended, now)
    return changed


def _start_runs(
    conn: sqlite3.Connection, span: list[_Merged], now: float, out: list[Any]
) -> set[int]:
    """Store the span's starts that their quotas admit (``out`` gets each admission's
    ``(verdict, 0)``); the positions of those stored. A run id already taken undoes
    the attempt (``_Redo``): the group then runs write by write, and that start fails with its
    own error."""
    starts = [(k, item) for k, item in enumerate(span) if isinstance(item, _Start)]
    if not starts:
        return set()
    ids = orjson.dumps([item.run_id for _, item in starts]).decode()
    if conn.execute(_ANY_TAKEN, (ids,)).fetchone() is not None:
        raise _Redo("a run id is taken")
    usages = _KeyUsages(conn, [item for _, item in starts], now)
    stored: list[tuple[int, _Start]] = []
    for k, item in starts:
        verdict = durable.Admission(True)
        if item.quota is not None:
            verdict = durable.quota_verdict(item.quota, usages.usage(item.quota), now)
        if item.spec is not None:
            out[k] = (verdict, 0)
        if verdict.admitted:
            stored.append((k, item))
            if item.spec is not None and item.spec.key_id is not None:
                usages.started(item.spec.key_id, item.open)
    if not stored:
        return set()
    last = int(conn.execute(_BUMP_CHANGES, (len(stored),)).fetchone()[0])
    change = last - len(stored)
    runs, tasks, specs = [], [], []
    for _, item in stored:
        change += 1
        runs.append((*item.row, change))
        tasks += item.tasks
        if item.spec is not None:
            specs.append(codec.spec_row(item.spec, created_at=now))
    _insert_rows(conn, _INSERT_RUNS, runs)
    ended = [item.run_id for _, item in stored if not item.open]
    if ended:  # stored with a terminal status: closed (ADR 0134)
        _close_ended(conn, ended, now)
    if tasks:
        _upsert_tasks(conn, tasks)
    if specs:
        _insert_rows(conn, _INSERT_SPECS, specs)
    return {k for k, _ in stored}


def _claim_runs(conn: sqlite3.Connection, span: list[_Merged], now: float, out: list[Any]) -> None:
    """The span's claims, as ``claim_run`` makes each alone (``out`` gets each one's attempt,
    or ``None``): one update takes every run it can, one numbers their changes, one counts
    their attempts."""
    claims = [(k, item) for k, item in enumerate(span) if isinstance(item, _Claim)]
    if not claims:
        return
    rows = [(item.run_id, item.owner, now + item.ttl_s, now, item.attempt) for _, item in claims]
    taken = [str(r[0]) for r in _chunked(conn, _CLAIM_HEAD, _CLAIM_TAIL, rows)]
    if not taken:
        return
    last = int(conn.execute(_BUMP_CHANGES, (len(taken),)).fetchone()[0])
    order = {run_id: k for k, run_id in enumerate(r[0] for r in rows)}
    taken.sort(key=order.__getitem__)  # change numbers in queue order
    changes = [(run_id, last - len(taken) + n) for n, run_id in enumerate(taken, start=1)]
    _update_rows(conn, "UPDATE OR ROLLBACK runs SET change_seq = v.column2", changes)
    ids = orjson.dumps(taken).decode()
    attempts = {str(r[0]): int(r[1]) for r in conn.execute(_COUNT_ATTEMPTS, (ids,)).fetchall()}
    for k, item in claims:
        out[k] = attempts.get(item.run_id)


def _check_endings(conn: sqlite3.Connection, span: list[_Merged], out: list[Any]) -> set[int]:
    """The positions of the span's endings that end their run (open, lease not renewed, held by
    the execution the ending names: as ``finish_run`` checks alone); an ending of a missing run
    gets ``RunNotFoundError``, one whose run another execution holds ``RunTakenOverError``."""
    endings = [(k, item) for k, item in enumerate(span) if isinstance(item, _End)]
    if not endings:
        return set()
    ids = orjson.dumps([item.run_id for _, item in endings]).decode()
    found = {str(r[0]): r[1:] for r in conn.execute(_ENDING_CHECK, (ids,)).fetchall()}
    ending: set[int] = set()
    for k, item in endings:
        row = found.get(item.run_id)
        if row is None:
            out[k] = RunNotFoundError(item.run_id)
        elif row[0] and not item.ending.lease_renewed(row[1]):
            try:
                item.ending.check_holder(item.run_id, row[2], row[3])
            except RunTakenOverError as exc:
                out[k] = exc
                continue
            ending.add(k)
    return ending


def _check_holders(conn: sqlite3.Connection, span: list[_Merged], out: list[Any]) -> None:
    """The span's appends made by an execution (``held_by``) to an open run it no longer holds
    get ``RunTakenOverError`` in ``out`` and are not numbered (ADR 0090): one query, after the
    span's claims (which come before them in queue order, ``_spans``)."""
    fenced = [
        (k, item) for k, item in enumerate(span) if isinstance(item, _Append) and item.held_by
    ]
    if not fenced:
        return
    runs = {item.run_id for _, item in fenced}
    if len(runs) == 1:  # (the statement for one run costs SQLite half as much)
        (run_id,) = runs
        row = conn.execute(_HOLDER, (run_id,)).fetchone()
        found = {} if row is None else {run_id: row}
    else:
        ids = orjson.dumps(sorted(runs)).decode()
        found = {str(r[0]): r[1:] for r in conn.execute(_HOLDERS, (ids,)).fetchall()}
    for k, item in fenced:
        row = found.get(item.run_id)
        assert item.held_by is not None
        if row is not None and not item.held_by.holds(row[0], row[1]):
            out[k] = item.held_by.refused(item.run_id, row[0])


def _number_events(
    conn: sqlite3.Connection, span: list[_Merged], made: set[int], out: list[Any]
) -> dict[int, int]:
    """Number and insert the events of the span's appends and of the starts and endings in
    ``made`` (ADR 0030: one statement numbers every run's batches, one inserts up to 128
    rows); each one's first sequence number by position. An append to a missing or ended run
    gets its error in ``out`` and writes nothing."""
    batches = [
        (k, item)
        for k, item in enumerate(span)
        if item.columns[0] and ((isinstance(item, _Append) and out[k] is None) or k in made)
    ]
    if not batches:
        return {}
    counts: dict[str, int] = {}
    for _, item in batches:
        counts[item.run_id] = counts.get(item.run_id, 0) + len(item.columns[0])
    if len(counts) == 1:  # (the statement for one run is simpler for SQLite)
        ((run_id, n),) = counts.items()
        rows = conn.execute(_BUMP_SEQ, (n, run_id)).fetchall()
        bumped = {run_id: int(rows[0][0])} if rows else {}
    else:
        rows = conn.execute(_BUMP_SEQS, (orjson.dumps(counts).decode(),)).fetchall()
        bumped = {str(r[0]): int(r[1]) for r in rows}
    last = {run_id: bumped[run_id] - n for run_id, n in counts.items() if run_id in bumped}
    refused = {r: _refusal(conn, r) for r in counts if r not in bumped}  # missing or ended
    firsts: dict[int, int] = {}
    params: list[Any] = []
    for k, item in batches:
        run_id = item.run_id
        if run_id in refused:
            if not isinstance(item, _Append):  # stored or checked open in this span: a bug
                raise RuntimeError(f"run {run_id!r} could not be numbered")
            out[k] = refused[run_id](run_id)
            continue
        first = last[run_id] + 1
        last[run_id] += len(item.columns[0])
        _event_params(params, run_id, first, item.columns)
        firsts[k] = first
    _insert_events(conn, params)
    for k, first in firsts.items():
        _insert_aparts(conn, span[k].run_id, first, span[k].columns)
    return firsts


def _end_runs(conn: sqlite3.Connection, endings: list[_End]) -> None:
    """Close the runs of ``endings``: one change-number allocation, then one update per set of
    columns (endings nearly always set the same ones), in chunks of rows."""
    if not endings:
        return
    change = int(conn.execute(_BUMP_CHANGES, (len(endings),)).fetchone()[0]) - len(endings)
    by_columns: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    for item in endings:
        change += 1
        by_columns.setdefault(tuple(item.sets), []).append(
            (item.run_id, *item.sets.values(), change)
        )
    for columns, rows in by_columns.items():
        assignments = ", ".join(f"{c} = v.column{i}" for i, c in enumerate(columns, start=2))
        _update_rows(
            conn,
            f"UPDATE OR ROLLBACK runs SET {assignments}, change_seq = v.column{len(columns) + 2}",
            rows,
        )


class _KeyUsages:
    """The usage of every key that a span's starts count against, read once per key, and what
    the span's earlier starts add to it: each quota sees what it would see made alone, in queue
    order (``_key_usage``, plus the runs the span already stored for that key).

    The window's starts are counted only when a quota's page of pivot candidates comes back
    full (the key may be at its limit): a short page gives the count, an empty one proves the
    key under its limit. Counting is a walk over every start of the key in the last minute,
    inside the write transaction, at every admission: for a key whose quota is far above its
    rate it grows with the rate (~1 ms at 20,000 starts a minute; ADR 0042).
    """

    def __init__(self, conn: sqlite3.Connection, starts: list[_Start], now: float) -> None:
        self.now = now
        self.conn = conn
        self.since = since = now - durable.WINDOW_S
        keys = {item.quota.key_id for item in starts if item.quota is not None}
        self.most = {  # how many runs the span may start for each key
            key: sum(1 for s in starts if s.spec is not None and s.spec.key_id == key)
            for key in keys
        }
        self.base_open = {key: int(conn.execute(_KEY_OPEN, (key,)).fetchone()[0]) for key in keys}
        self.window: dict[str, int] = {}  # the key's starts in the window, where counted
        self.newest: dict[tuple[str, int], tuple[int, list[float]]] = {}
        for item in starts:
            quota = item.quota
            if quota is None or (quota.key_id, quota.max_per_minute) in self.newest:
                continue
            # The starts that can be its pivot: ranks P-m .. P among the window's newest.
            offset = max(0, quota.max_per_minute - 1 - self.most[quota.key_id])
            rows = conn.execute(
                _KEY_NEWEST, (quota.key_id, since, quota.max_per_minute - offset, offset)
            ).fetchall()
            self.newest[(quota.key_id, quota.max_per_minute)] = (offset, [r[0] for r in rows])
            if rows and len(rows) < quota.max_per_minute - offset:
                self.window[quota.key_id] = offset + len(rows)  # a short page: all of them
        self.opened: dict[str, int] = {}
        self.starts: dict[str, int] = {}

    def _window_starts(self, key: str, most: int) -> int:
        """The key's starts in the window, or, when its page of pivot candidates for ``most``
        came back empty, ``offset``: at least as many, and still under the limit with every
        start of the span (``offset`` + the span's starts < ``most``)."""
        if key in self.window:
            return self.window[key]
        offset, newest = self.newest[(key, most)]
        if not newest:
            return offset
        count = int(self.conn.execute(_KEY_STARTS, (key, self.since)).fetchone()[0])
        self.window[key] = count
        return count

    def started(self, key_id: str, open_run: bool) -> None:
        self.starts[key_id] = self.starts.get(key_id, 0) + 1
        if open_run:
            self.opened[key_id] = self.opened.get(key_id, 0) + 1

    def usage(self, quota: durable.Quota) -> durable.KeyUsage:
        key, most = quota.key_id, quota.max_per_minute
        new = self.starts.get(key, 0)
        open_runs = self.base_open[key] + self.opened.get(key, 0)
        if most < 1:  # (``_key_usage`` alone says what that means)
            raise _Redo(f"the quota of key {key!r} allows no run a minute")
        base_starts = self._window_starts(key, most)
        if base_starts + new < most:
            return durable.KeyUsage(open_runs)
        rank = most - new  # the pivot's rank among the starts before this span
        if rank <= 0:
            pivot = self.now  # one of the span's own starts
        else:
            offset, newest = self.newest[(key, most)]
            pivot = float(newest[rank - 1 - offset])
        return durable.KeyUsage(open_runs, pivot, base_starts + new)


class _Redo(Exception):
    """Raised by the merge function to undo the attempt: the group runs write by write."""


def _insert_rows(conn: sqlite3.Connection, into: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """``into`` (``INSERT … (columns)``) the ``rows``, a power of two of them per statement
    (so a handful of statements stay prepared whatever the counts)."""
    _chunked(conn, f"{into} VALUES ", "", rows)


def _upsert_tasks(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """The task ``rows`` as ``_INSERT_TASK`` writes one, a power of two of them per statement
    (a key given twice: the later row's values, as one statement a row)."""
    _chunked(conn, f"{_UPSERT_TASKS} VALUES ", f" {codec.TASK_CONFLICT_UPDATE}", rows)


def _update_rows(conn: sqlite3.Connection, update: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """``update`` (``UPDATE runs SET column = v.columnN, …``) from ``rows`` (the run id first),
    a power of two of them per statement."""
    _chunked(conn, f"{update} FROM (VALUES ", ") AS v WHERE runs.run_id = v.column1", rows)


def _chunked(
    conn: sqlite3.Connection, head: str, tail: str, rows: Sequence[Any]
) -> list[tuple[Any, ...]]:
    """``head`` + rows + ``tail`` for every chunk of ``rows``; what the statements returned."""
    width = len(rows[0])
    k, n = 0, len(rows)
    out: list[tuple[Any, ...]] = []
    while k < n:
        size = min(1 << ((n - k).bit_length() - 1), _MAX_ROWS)
        chunk = rows[k : k + size]
        params = [v for row in chunk for v in row]
        out += conn.execute(_rows_statement(head, tail, width, size), params).fetchall()
        k += size
    return out


@functools.lru_cache(maxsize=256)
def _rows_statement(head: str, tail: str, width: int, size: int) -> str:
    row = f"({','.join('?' * width)})"
    return f"{head}{','.join([row] * size)}{tail}"


_MAX_ROWS = 512
"""Rows per statement at most: 512 rows of 16 values stay under SQLite's parameter limit."""
_ANY_TAKEN = "SELECT 1 FROM runs WHERE run_id IN (SELECT value FROM json_each(?)) LIMIT 1"
_CLAIM_HEAD = (
    "UPDATE OR ROLLBACK runs SET owner = v.column2, lease_expires_at = v.column3, "
    "status = 'running', updated_at = v.column4 FROM (VALUES "
)
_CLAIM_TAIL = (
    f") AS v WHERE runs.run_id = v.column1 AND {_OPEN} AND "
    "(runs.owner IS NULL OR runs.owner = v.column2) "
    "AND EXISTS (SELECT 1 FROM run_specs s WHERE s.run_id = runs.run_id "
    "AND (v.column5 IS NULL OR (s.attempts = v.column5 AND runs.owner = v.column2))) "
    "RETURNING runs.run_id"
)
"""A claim naming the ``attempt`` it takes the run from (``column5``) takes it only from its
owner's hold at that attempt (ADR 0099)."""
_COUNT_ATTEMPTS = (
    "UPDATE run_specs SET attempts = attempts + 1, queued_at = NULL "
    "WHERE run_id IN (SELECT value FROM json_each(?)) RETURNING run_id, attempts"
)
_RENEW = (
    f"UPDATE runs INDEXED BY {codec.OPEN_RUNS_BY_ID} SET lease_expires_at = ? "
    f"WHERE run_id IN (SELECT value FROM json_each(?)) AND owner = ? AND {_OPEN} RETURNING run_id"
)
"""Each renewed run looked up in ``open_runs_by_id`` (ADR 0079): without statistics SQLite would
walk every open run by status (``runs_by_status``), now that no index leads with the owner."""
_STATUSES = "SELECT run_id, status FROM runs WHERE run_id IN (SELECT value FROM json_each(?))"
_TASK_ROW = ") AS v WHERE tasks.run_id = v.column1 AND tasks.task_id = v.column2"
_ENDING_CHECK = (
    f"SELECT run_id, {_OPEN}, lease_expires_at, owner, "
    "(SELECT attempts FROM run_specs s WHERE s.run_id = runs.run_id) FROM runs "
    "WHERE run_id IN (SELECT value FROM json_each(?))"
)
_HOLDERS = (
    "SELECT run_id, owner, (SELECT attempts FROM run_specs s WHERE s.run_id = runs.run_id) "
    "FROM runs WHERE run_id IN (SELECT value FROM json_each(?)) AND closed_at IS NULL"
)
"""Who holds each open run (its owner and its spec's claims): ``_check_holders``'s one read."""
_HOLDER = (
    "SELECT owner, (SELECT attempts FROM run_specs s WHERE s.run_id = runs.run_id) "
    "FROM runs WHERE run_id = ? AND closed_at IS NULL"
)
"""``_HOLDERS`` of one run."""
_BUMP_CHANGES = "UPDATE run_changes SET last_change = last_change + ? RETURNING last_change"
_INSERT_RUNS = f"INSERT OR ROLLBACK INTO runs ({codec.RUN_COLUMNS}, change_seq)"
_UPSERT_TASKS = f"INSERT INTO tasks ({codec.TASK_COLUMNS})"
"""``_INSERT_TASK`` for many rows (``_upsert_tasks``)."""
_INSERT_SPECS = f"INSERT OR ROLLBACK INTO run_specs ({codec.SPEC_COLUMNS})"
_KEY_OPEN = (
    f"SELECT count(*) FROM runs WHERE {_OPEN} AND "
    "(SELECT s.key_id FROM run_specs s WHERE s.run_id = runs.run_id) = ?"
)
_KEY_STARTS = "SELECT count(*) FROM run_specs WHERE key_id = ? AND created_at > ?"
_KEY_NEWEST = (
    "SELECT created_at FROM run_specs WHERE key_id = ? AND created_at > ? "
    "ORDER BY created_at DESC LIMIT ? OFFSET ?"
)


_STARTED = "UPDATE runs SET status = 'running' WHERE run_id = ? AND status = 'pending' RETURNING 1"
"""A run's first task started: pending -> running. It names only ``status``, in no open-run
index's predicate since schema version 12 (ADR 0127): neither index's entry is rewritten."""
_CLOSE_ENDED = (
    "UPDATE runs SET closed_at = ? WHERE run_id IN (SELECT value FROM json_each(?)) "
    f"AND {codec.ENDED_UNCLOSED_PREDICATE}"
)


def _close_ended(conn: sqlite3.Connection, run_ids: Collection[str], now: float) -> None:
    """Close those of ``run_ids`` that a write outside ``finish_run`` just gave a terminal
    status (ADR 0134): an ended run takes no more events, and leaves the open-run indexes
    (``closed_at IS NULL``), which then hold open runs only. A run already closed keeps its
    ``closed_at``."""
    conn.execute(_CLOSE_ENDED, (now, orjson.dumps(list(run_ids)).decode()))


def _project(
    conn: sqlite3.Connection, run_id: str, update: IndexUpdate, *, numbered: bool = True
) -> bool:
    """Inside the append's write transaction: apply what its events change in the run index
    (ADR 0020); whether the run row changed. A changed row gets a change number (``listing``),
    and a terminal status closes the run (ADR 0134), unless ``numbered`` is false
    (``finish_run`` numbers and closes it itself)."""
    for task_id, fields in update.tasks.items():
        sets = codec.index_columns(fields)
        conn.execute(
            f"UPDATE tasks SET {', '.join(f'{c} = ?' for c in sets)} "
            "WHERE run_id = ? AND task_id = ?",
            (*sets.values(), run_id, task_id),
        )
    changed = False
    if update.starts:
        started = conn.execute(_STARTED, (run_id,)).fetchall()
        changed = bool(started)
    if update.run:
        sets = codec.index_columns(update.run)
        conn.execute(
            f"UPDATE runs SET {', '.join(f'{c} = ?' for c in sets)} WHERE run_id = ?",
            (*sets.values(), run_id),
        )
        changed = True
    if changed and numbered:
        now = time.time()
        conn.execute(
            "UPDATE runs SET updated_at = ?, change_seq = ? WHERE run_id = ?",
            (now, _next_change(conn), run_id),
        )
        if codec.closes_run(update.run.get("status")):
            _close_ended(conn, [run_id], now)
    return changed


class SQLiteStore(EventStore, durable.DurableRunStore):
    """An :class:`EventStore` in one SQLite file. Create with ``await SQLiteStore.open(path)``."""

    read_ahead_needs_a_turn = False  # the reader thread has the job at once
    tail_batch = _PAGE_ROWS
    """A replaying tail reads 1000 events a page, one aggregate query (ADR 0037). The reader
    thread needs the interpreter lock after each query to hand its row over, and while the loop
    builds a page it gets the lock only when the loop waits (or after the 5 ms switch
    interval): each page costs the loop a wait for that hand-off, however far ahead the query
    ran. At 250 a page those waits were a third of a replay's time on a quiet machine; the
    collections a page of 1000 brings (ADR 0026) cost less, and promote few events to the
    oldest generation (none reached it in replays with a million objects alive)."""

    def __init__(
        self,
        path: Path,
        writer: SQLiteThread,
        reader: SQLiteThread,
        lookups: sqlite3.Connection | None,
    ) -> None:
        super().__init__()
        self.path = path
        self._writer = writer
        self._reader = reader
        self._lookups = lookups
        """A read-only connection for the API-key lookup every request makes, used on the event
        loop itself: one indexed row, tens of microseconds, where a trip through a store thread
        costs a queue wait and then a turn of a loaded loop for the answer (~20 ms at 100 live
        runs). Its busy timeout is zero, so it never holds the loop waiting for a lock: when
        SQLite answers busy (WAL recovery), the lookup goes to the reader thread instead. Each
        lookup reads the committed state afresh (no cache: a revoked key is refused next)."""
        self._memory_secrets: dict[str, str] = {}

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        max_bytes: int | None = None,
    ) -> SQLiteStore:
        """Open (creating it and its parent directories if needed) and migrate the database.

        ``busy_timeout`` bounds how long a write waits for another process's write lock.
        ``max_bytes`` caps the file size like a disk quota: a write that would grow the database
        past it fails with "database or disk is full" and is rolled back.
        """
        target = Path(path)
        in_memory = str(path) == ":memory:"
        if not in_memory:
            _prepare_private_file(target)
        writer = SQLiteThread("thoughtgate-sqlite-writer", target, busy_timeout=busy_timeout)
        immutable = False

        def open_writer() -> sqlite3.Connection:
            nonlocal immutable
            conn, immutable = open_checked(target, busy_timeout=busy_timeout, max_bytes=max_bytes)
            return conn

        await writer.start(open_writer, "open the store")
        if in_memory:  # a second connection would see a different, empty database
            return cls(target, writer, writer, None)

        def open_reader() -> sqlite3.Connection:
            conn = connect(target, busy_timeout=busy_timeout, immutable=immutable)
            conn.execute("PRAGMA query_only = ON")
            return conn

        try:
            reader = SQLiteThread("thoughtgate-sqlite-reader", target, busy_timeout=busy_timeout)
            await reader.start(open_reader, "open the store for reading")
        except BaseException:
            await writer.close()
            raise

        def open_lookups(_: sqlite3.Connection) -> sqlite3.Connection:
            conn = connect(target, busy_timeout=0, immutable=immutable)
            conn.execute("PRAGMA query_only = ON")
            return conn

        try:  # opened on the reader thread (file I/O off the loop), used on the loop
            lookups = await reader.call("open the store for key lookups", open_lookups)
        except BaseException:
            await reader.close()
            await writer.close()
            raise
        return cls(target, writer, reader, lookups)

    async def close(self) -> None:
        lookups, self._lookups = self._lookups, None
        if lookups is not None:
            lookups.close()
        await self._reader.close()
        await self._writer.close()

    def write_refusal(self) -> str | None:
        return self._writer.refusal()

    # -- runs and tasks ------------------------------------------------------------------
    async def create_run(self, run: RunRecord) -> None:
        row = codec.run_row(run)
        tasks = [codec.task_row(t) for t in run.tasks]

        def body(conn: sqlite3.Connection) -> None:
            conn.execute(_INSERT_RUN, (*row, _next_change(conn)))
            if run.status not in OPEN_RUN_STATUSES:
                _close_ended(conn, [run.run_id], time.time())
            conn.executemany(_INSERT_TASK, tasks)

        item = _Start(run.run_id, row, tasks, run.status in OPEN_RUN_STATUSES)
        await self._writer.write(f"create run {run.run_id!r}", body, merge=(_merged_writes, item))
        self.wakeups.notify(listing.RUN_LIST_WAKEUP)

    async def get_run(self, run_id: str, *, apart: bool = True) -> RunRecord:
        codec.no_such_run(run_id)

        def work(conn: sqlite3.Connection) -> RunRecord:
            conn.execute("BEGIN")  # one snapshot for the run and its tasks
            try:
                return _read_run(conn, run_id, apart)
            finally:
                conn.execute("COMMIT")

        return await self._reader.call(f"read run {run_id!r}", work)

    async def list_runs(
        self, *, limit: int = 50, offset: int = 0, apart: bool = True
    ) -> list[RunRecord]:
        tasks_select = _TASK_SELECT if apart else _TASK_SELECT_SHOWN

        def work(conn: sqlite3.Connection) -> list[RunRecord]:
            page = "ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?"
            conn.execute("BEGIN")
            try:
                runs = conn.execute(f"{_RUN_SELECT} {page}", (limit, offset)).fetchall()
                tasks = conn.execute(
                    f"{tasks_select} WHERE run_id IN (SELECT run_id FROM runs {page}) ORDER BY idx",
                    (limit, offset),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            return codec.runs_from_rows(runs, tasks)

        return await self._reader.call("list runs", work)

    async def query_runs(self, query: listing.RunQuery, *, apart: bool = True) -> listing.RunPage:
        sql, params = listing.page_query(
            query, columns=codec.RUN_COLUMNS, placeholder="?", order_column="rowid", like="LIKE"
        )

        def work(conn: sqlite3.Connection) -> listing.RunPage:
            conn.execute("BEGIN")  # one snapshot for the runs and their tasks
            try:
                rows = conn.execute(sql, params).fetchall()
                runs = self._with_tasks(conn, rows[: query.limit], apart)
            finally:
                conn.execute("COMMIT")
            last = rows[query.limit - 1] if len(rows) > query.limit else None
            cursor = None if last is None else listing.RunCursor(float(last[6]), int(last[-1]))
            return listing.RunPage(runs, cursor)

        return await self._reader.call("query runs", work)

    async def run_changes(
        self, *, after: int, limit: int = 100, apart: bool = True
    ) -> listing.RunChanges:
        sql = (
            f"SELECT {codec.RUN_COLUMNS}, change_seq FROM runs WHERE change_seq > ? "
            "ORDER BY change_seq LIMIT ?"
        )

        def work(conn: sqlite3.Connection) -> listing.RunChanges:
            conn.execute("BEGIN")
            try:
                rows = conn.execute(sql, (after, limit)).fetchall()
                runs = self._with_tasks(conn, rows, apart)
            finally:
                conn.execute("COMMIT")
            return listing.RunChanges(
                [(int(r[-1]), run) for r, run in zip(rows, runs, strict=True)]
            )

        return await self._reader.call("read run changes", work)

    async def latest_run_change(self) -> int:
        def work(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT last_change FROM run_changes").fetchone()[0])

        return await self._reader.call("read the latest run change", work)

    @staticmethod
    def _with_tasks(
        conn: sqlite3.Connection, rows: Sequence[Sequence[Any]], apart: bool
    ) -> list[RunRecord]:
        """Run records for ``rows`` (run columns first), with their tasks in index order;
        ``apart=False``: without the task columns kept apart (ADR 0160, amendment 1)."""
        if not rows:
            return []
        ids = [r[0] for r in rows]
        tasks = conn.execute(
            f"{_TASK_SELECT if apart else _TASK_SELECT_SHOWN} WHERE run_id IN ({','.join('?' * len(ids))}) ORDER BY idx",
            ids,
        ).fetchall()
        return codec.runs_from_rows(rows, tasks)

    async def update_run(
        self, run_id: str, *, held_by: Holder | None = None, **change: Unpack[RunChange]
    ) -> None:
        codec.no_such_run(run_id)
        sets = codec.run_update_columns(change, updated_at=time.time())
        metadata = change.get("metadata")

        def body(conn: sqlite3.Connection) -> None:
            if held_by is not None:
                _check_held(conn, run_id, held_by, "run record")
            row = conn.execute("SELECT metadata FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFoundError(run_id)
            if metadata is not None:
                merged = codec.merged_metadata(codec.decode_object(row[0]), metadata)
                sets["metadata"] = codec.dumps(merged, what="run metadata")
            sets["change_seq"] = _next_change(conn)
            assignments = ", ".join(f"{column} = ?" for column in sets)
            conn.execute(
                f"UPDATE runs SET {assignments} WHERE run_id = ?", (*sets.values(), run_id)
            )
            if codec.closes_run(change.get("status")):
                _close_ended(conn, [run_id], sets["updated_at"])

        await self._write(f"update run {run_id!r}", body)
        self.wakeups.notify(listing.RUN_LIST_WAKEUP)

    async def save_task(self, task: TaskRecord, *, held_by: Holder | None = None) -> None:
        row = codec.task_row(task)

        def body(conn: sqlite3.Connection) -> None:
            _check_held(conn, task.run_id, held_by, "task record")
            conn.execute(_INSERT_TASK, row)

        await self._write(f"save task {task.task_id!r}", body)

    async def rebuild_run_index(self, run_id: str) -> RunRecord:
        codec.no_such_run(run_id)
        lifecycle, types = codec.lifecycle_types_sql("?")

        def body(conn: sqlite3.Connection) -> bool:
            stored = _read_run(conn, run_id)
            rows = conn.execute(
                f"{codec.SQLITE_EVENT_SELECT} WHERE run_id = ? AND {lifecycle} ORDER BY seq",
                (run_id, *types),
            ).fetchall()
            task_rows, sets = codec.rebuilt_rows(stored, rows)
            conn.executemany(_INSERT_TASK, task_rows)
            if sets is None:
                return False
            sets.update(updated_at=time.time(), change_seq=_next_change(conn))
            conn.execute(
                f"UPDATE runs SET {', '.join(f'{c} = ?' for c in sets)} WHERE run_id = ?",
                (*sets.values(), run_id),
            )
            if codec.closes_run(sets.get("status")):  # the log says it ended (ADR 0134)
                _close_ended(conn, [run_id], sets["updated_at"])
            return True

        if await self._write(f"rebuild the index of run {run_id!r}", body):
            self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        return await self.get_run(run_id)

    # -- events --------------------------------------------------------------------------
    async def append(
        self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
    ) -> list[Event]:
        if not events:
            codec.no_such_run(run_id)
            await self._reader.call(f"read run {run_id!r}", lambda c: _require_run(c, run_id))
            return []
        out: list[Event] = await self._queue_append(run_id, events, None, held_by).future
        await self.wakeups.observed(run_id, out)
        return out

    def queue_append(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        *,
        after: QueuedAppend | None = None,
        held_by: Holder | None = None,
    ) -> QueuedAppend | None:
        if not events or (after is not None and not isinstance(after, _QueuedAppend)):
            return None
        if after is not None and (
            after.store is not self or after.run_id != run_id or after.job is None
        ):
            return None  # (no job: ``after`` was never queued; the caller meets its error)
        loop = asyncio.get_running_loop()
        try:
            job = self._queue_append(run_id, events, None if after is None else after.job, held_by)
        except Exception as exc:  # reported by ``wait``, as ``append`` would raise it
            failed: asyncio.Future[list[Event]] = loop.create_future()
            failed.set_exception(exc)
            return _QueuedAppend(self, run_id, None, failed, None)
        return _QueuedAppend(self, run_id, job, job.future, after)

    def _queue_append(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        after: QueuedWrite | None,
        held_by: Holder | None = None,
    ) -> QueuedWrite:
        """The append's write, queued now; its future resolves to the events once committed
        and published to live readers (in the commit's hand-off, ADR 0028)."""
        # Encode before queueing: the shared write transaction should not wait on our JSON.
        columns = codec.encode_events(list(events))
        codec.no_such_run(run_id)  # after the events' own refusal, as every store does
        n = len(columns[0])
        update = batch_update(events)
        action = f"append {n} events to run {run_id!r}"

        item = _Append(run_id, columns, update or None, held_by)
        if not update:  # deltas and the like do not touch the index

            def plain(conn: sqlite3.Connection) -> int:
                return _append_rows(conn, run_id, columns, held_by)

            def appended(first: int) -> list[Event]:
                # In the commit's hand-off: live readers get the events a loop turn before the
                # appender's task resumes, in commit order.
                out = codec.appended_events(run_id, first, columns)
                self.wakeups.publish(run_id, out)
                return out

            return self._writer.queue_write(
                action, plain, appended, after=after, merge=(_merged_writes, item)
            )

        def body(conn: sqlite3.Connection) -> tuple[int, bool]:
            first = _append_rows(conn, run_id, columns, held_by)
            return first, _project(conn, run_id, update)

        def published(result: tuple[int, bool]) -> list[Event]:
            first, changed = result
            if changed:
                self.wakeups.notify(listing.RUN_LIST_WAKEUP)
            out = codec.appended_events(run_id, first, columns)
            self.wakeups.publish(run_id, out)
            return out

        return self._writer.queue_write(
            action, body, published, after=after, merge=(_merged_writes, item)
        )

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        codec.no_such_run(run_id)
        fetched = self._reader.call(*self._fetch(run_id, after, limit, apart))
        return await self._decoded(run_id, fetched, apart)

    async def read_types(
        self,
        run_id: str,
        types: Collection[str],
        *,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Event]:
        codec.no_such_run(run_id)
        query, params = read_types_query(run_id, types, after=after, limit=limit)

        def work(conn: sqlite3.Connection) -> list[Event]:
            rows = conn.execute(query, params).fetchall()
            if not rows:  # runs are never deleted, so checking afterwards is race-free
                _require_run(conn, run_id)
            return codec.events_from_rows(run_id, rows)

        return await self._reader.call(f"read events of run {run_id!r}", work)

    def read_ahead(self, run_id: str, *, after: int, limit: int, apart: bool = True) -> PageAhead:
        """The reader thread starts on the page now; its events are built when it is awaited,
        so a replay holds one page of events at a time (its pages ahead are their rows)."""
        fetched = self._reader.queue_call(*self._fetch(run_id, after, limit, apart))
        return _FetchedAhead(self, run_id, fetched, apart)

    def read_now(
        self, run_id: str, *, after: int, limit: int, apart: bool = True
    ) -> list[Event] | None:
        """Up to ``limit`` events on the loop's own connection (the key lookups', ADR 0028), in
        this step: one aggregate query, no trip to the reader thread and back (ADR 0038).
        ``None`` (``read`` instead) without that connection, when the database is locked right
        now, when no event is there (``read`` says whether the run exists), or for a page that
        must be read row by row. It reads what is committed, as the reader thread does."""
        conn = self._lookups
        start = max(after, 0)
        if conn is None or not 0 < limit <= _PAGE_ROWS or not column_storable(run_id):
            return None  # (an id no run has: ``read`` says so, ``codec.no_such_run``)
        try:
            row = conn.execute(
                _READ_PAGE[apart], (run_id, start, codec.seq_page_end(start, limit))
            ).fetchone()
        except sqlite3.Error as exc:
            code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
            if code in _BUSY_CODES or code == _TOOBIG:
                return None
            raise translate_error(exc, self.path, f"read events of run {run_id!r}") from exc
        if not row[0]:
            return None
        return _events_from_page(run_id, start, row)

    @staticmethod
    def _fetch(
        run_id: str, after: int, limit: int | None, apart: bool
    ) -> tuple[str, Callable[[sqlite3.Connection], list[_Page]]]:
        return f"read events of run {run_id!r}", lambda conn: _fetch_pages(
            conn, run_id, after, limit, apart
        )

    async def _decoded(
        self, run_id: str, fetched: Awaitable[list[_Page]], apart: bool
    ) -> list[Event]:
        """The events of pages fetched by the reader thread, built here: the thread goes on to
        the next page (SQLite works without the interpreter lock) while this one is decoded."""
        events: list[Event] = []
        for k, (after, row) in enumerate(await fetched):
            if k:  # a long read: let the loop serve others between pages of _PAGE_ROWS
                await asyncio.sleep(0)
            page = _events_from_page(run_id, after, row)
            if page is None:
                n = len(row) if isinstance(row, list) else int(row[0])
                page = await self._reader.call(
                    f"read events of run {run_id!r}", _rows_reader(run_id, after, n, apart)
                )
            if events:
                events += page
            else:  # (a read of one page, the common one: no copy)
                events = page
        return events

    async def find_run_ids(self, prefix: str, *, limit: int = 10) -> list[str]:
        if not column_storable(prefix):  # no run id holds it (``codec.no_such_run``)
            return []

        def work(conn: sqlite3.Connection) -> list[str]:
            # A range on the primary key (binary collation): an index seek, not a scan.
            rows = conn.execute(
                "SELECT run_id FROM runs WHERE run_id >= ? AND run_id < ? ORDER BY run_id LIMIT ?",
                (prefix, prefix + "\U0010ffff", limit),
            ).fetchall()
            return [str(r[0]) for r in rows]

        return await self._reader.call(f"find runs starting with {prefix!r}", work)

    # -- ending runs, and leases ---------------------------------------------------------
    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        columns, update, task_rows = codec.ending_rows(events, ending)
        codec.no_such_run(run_id)
        now = time.time()
        sets = codec.ending_columns(ending, updated_at=now)
        sets.update(closed_at=now)
        assignments = ", ".join(f"{column} = ?" for column in sets)

        def body(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(_ENDING_CHECK, (orjson.dumps([run_id]).decode(),)).fetchone()
            if row is None:
                raise RunNotFoundError(run_id)
            if not row[1] or ending.lease_renewed(row[2]):
                return None
            ending.check_holder(run_id, row[3], row[4])
            conn.executemany(_INSERT_TASK, task_rows)
            first = _append_rows(conn, run_id, columns) if columns[0] else 0
            if update:
                _project(conn, run_id, update, numbered=False)
            conn.execute(
                f"UPDATE runs SET {assignments}, change_seq = ? WHERE run_id = ?",
                (*sets.values(), _next_change(conn), run_id),
            )
            return first

        def published(first: int | None) -> list[Event]:
            if first is None:
                return []
            self.wakeups.notify(listing.RUN_LIST_WAKEUP)
            out = codec.appended_events(run_id, first, columns) if columns[0] else []
            if out:
                self.wakeups.publish(run_id, out)
            return out

        item = _End(run_id, columns, update or None, task_rows, sets, ending)
        out = await self._writer.write_then(
            f"finish run {run_id!r}", body, published, merge=(_merged_writes, item)
        )
        await self.wakeups.observed(run_id, out)
        return out

    async def renew_leases(self, owner: str, ttl_s: float, run_ids: Collection[str]) -> list[str]:
        if not run_ids:
            return []
        ids = orjson.dumps(list(run_ids)).decode()

        def body(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(_RENEW, (time.time() + ttl_s, ids, owner)).fetchall()
            return [str(r[0]) for r in rows]

        return await self._write("renew run leases", body)

    async def open_runs(
        self,
        *,
        limit: int = 1000,
        after: str | None = None,
        expired: bool = False,
        run_ids: Collection[str] | None = None,
    ) -> OpenRuns:
        ids = None if run_ids is None else orjson.dumps(list(run_ids)).decode()

        def work(conn: sqlite3.Connection) -> OpenRuns:
            now = time.time()
            query, params = open_runs_query(
                limit=limit, after=after, expired=expired, run_ids=ids, now=now
            )
            rows = conn.execute(query, params).fetchall()
            return OpenRuns([OpenRun(str(r[0]), r[1], r[2], r[3]) for r in rows], now)

        return await self._reader.call("list open runs", work)

    # -- durable runs (store.durable) -------------------------------------------------------
    async def admit_run(
        self,
        run: RunRecord,
        spec: durable.RunSpecRecord,
        *,
        quota: durable.Quota | None = None,
        events: Sequence[NewEvent] = (),
        decided: Callable[[], None] | None = None,
        committed: Callable[[], None] | None = None,
    ) -> durable.Admission:
        row = codec.run_row(run)
        tasks = [codec.task_row(t) for t in run.tasks]
        columns = codec.encode_events(list(events))
        update = batch_update(events)

        def body(conn: sqlite3.Connection) -> tuple[durable.Admission, int]:
            # BEGIN IMMEDIATE holds the database's write lock: counting and inserting are one
            # step for every process, so a key never gets past its quota by racing itself.
            now = time.time()
            verdict = durable.Admission(True)
            if quota is not None:
                verdict = durable.quota_verdict(quota, _key_usage(conn, quota, now), now)
                if not verdict.admitted:
                    return verdict, 0
            conn.execute(_INSERT_RUN, (*row, _next_change(conn)))
            if run.status not in OPEN_RUN_STATUSES:
                _close_ended(conn, [run.run_id], now)
            conn.executemany(_INSERT_TASK, tasks)
            conn.execute(_INSERT_SPEC, codec.spec_row(spec, created_at=now))
            first = 0
            if columns[0]:  # the opening events, in the same transaction
                first = _append_rows(conn, run.run_id, columns)
                if update:
                    _project(conn, run.run_id, update)
            return verdict, first

        item = _Start(
            run.run_id,
            row,
            tasks,
            run.status in OPEN_RUN_STATUSES,
            spec,
            quota,
            columns,
            update or None,
        )

        def told(result: tuple[durable.Admission, int]) -> None:
            if decided is not None and result[0].admitted:
                decided()

        def held(result: tuple[durable.Admission, int]) -> None:
            if committed is not None and result[0].admitted:
                committed()

        verdict, first = await self._writer.write(
            f"create run {run.run_id!r}",
            body,
            merge=(_merged_writes, item),
            decided=told,
            committed=held,
        )
        if verdict.admitted:
            self.wakeups.notify(listing.RUN_LIST_WAKEUP)
            if columns[0]:
                out = codec.appended_events(run.run_id, first, columns)
                await self.wakeups.committed(run.run_id, out)
        return verdict

    async def get_run_spec(self, run_id: str) -> durable.RunSpecRecord | None:
        if not column_storable(run_id):  # no such run (``codec.no_such_run``)
            return None

        def work(conn: sqlite3.Connection) -> durable.RunSpecRecord | None:
            row = conn.execute(
                f"SELECT {codec.SPEC_COLUMNS} FROM run_specs WHERE run_id = ?", (run_id,)
            ).fetchone()
            return None if row is None else codec.spec_from_row(row)

        return await self._reader.call(f"read the spec of run {run_id!r}", work)

    async def get_run_specs(self, run_ids: Collection[str]) -> dict[str, durable.RunSpecRecord]:
        if not run_ids:
            return {}
        ids = orjson.dumps(list(run_ids)).decode()

        def work(conn: sqlite3.Connection) -> dict[str, durable.RunSpecRecord]:
            rows = conn.execute(
                f"SELECT {codec.SPEC_COLUMNS} FROM run_specs "
                "WHERE run_id IN (SELECT value FROM json_each(?))",
                (ids,),
            ).fetchall()
            return {spec.run_id: spec for spec in map(codec.spec_from_row, rows)}

        return await self._reader.call(f"read the specs of {len(run_ids)} runs", work)

    async def claim_run(
        self, run_id: str, owner: str, ttl_s: float, *, attempt: int | None = None
    ) -> int | None:
        def body(conn: sqlite3.Connection) -> int | None:
            now = time.time()
            claimed = conn.execute(
                f"UPDATE runs SET owner = ?, lease_expires_at = ?, status = 'running', "
                f"updated_at = ? WHERE run_id = ? AND {_OPEN} AND (owner IS NULL OR owner = ?) "
                "AND EXISTS (SELECT 1 FROM run_specs s WHERE s.run_id = runs.run_id "
                "AND (? IS NULL OR (s.attempts = ? AND runs.owner = ?))) "
                "RETURNING run_id",
                (owner, now + ttl_s, now, run_id, owner, attempt, attempt, owner),
            ).fetchall()
            if not claimed:
                return None
            conn.execute(  # its status may have changed: a change for the run list
                "UPDATE runs SET change_seq = ? WHERE run_id = ?", (_next_change(conn), run_id)
            )
            row = conn.execute(
                "UPDATE run_specs SET attempts = attempts + 1, queued_at = NULL WHERE run_id = ? "
                "RETURNING attempts",
                (run_id,),
            ).fetchone()
            return int(row[0])

        item = _Claim(run_id, owner, ttl_s, attempt)
        attempt = await self._writer.write(
            f"claim run {run_id!r}", body, merge=(_merged_writes, item)
        )
        if attempt is not None:
            self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        return attempt

    async def release_run(
        self,
        run_id: str,
        *,
        owner: str | None,
        queue: bool,
        lease_expired_by: float | None = None,
        attempt: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            held = "owner = ?" if owner is not None else "owner IS NULL"
            args: list[object] = [run_id] if owner is None else [run_id, owner]
            lease = ""
            if lease_expired_by is not None:
                lease = " AND (lease_expires_at IS NULL OR lease_expires_at <= ?)"
                args.append(lease_expired_by)
            waiting = "" if owner is not None else " AND s.queued_at IS NULL"
            claim = ""
            if attempt is not None:  # the releasing execution's claim is still the last
                claim = " AND s.attempts = ?"
                args.append(attempt)
            found = conn.execute(
                f"SELECT runs.metadata FROM runs JOIN run_specs s USING (run_id) WHERE run_id = ? "
                f"AND {_OPEN} AND {held}{lease}{waiting}{claim}",
                args,
            ).fetchone()
            if found is None:
                return False
            conn.execute(
                "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE run_id = ?", (run_id,)
            )
            conn.execute(
                "UPDATE run_specs SET queued_at = ? WHERE run_id = ?",
                (time.time() if queue else None, run_id),
            )
            if metadata is not None:  # why it waits, in the release's transaction (ADR 0112)
                merged = codec.merged_metadata(codec.decode_object(found[0]), metadata)
                conn.execute(
                    "UPDATE runs SET metadata = ?, updated_at = ?, change_seq = ? WHERE run_id = ?",
                    (
                        codec.dumps(merged, what="run metadata"),
                        time.time(),
                        _next_change(conn),
                        run_id,
                    ),
                )
            return True

        moved = await self._write(f"release run {run_id!r}", body)
        if moved and metadata is not None:
            self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        return moved

    async def requeue_run(self, run_id: str, *, queued_at: float) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            moved = conn.execute(
                "UPDATE run_specs SET queued_at = ? WHERE run_id = ? AND queued_at = ? AND "
                f"EXISTS (SELECT 1 FROM runs WHERE runs.run_id = run_specs.run_id AND {_OPEN} "
                "AND owner IS NULL) RETURNING run_id",
                (time.time(), run_id, queued_at),
            ).fetchall()
            return bool(moved)

        return await self._write(f"queue run {run_id!r} again", body)

    async def save_run_queue(self, queue: durable.RunQueueRecord) -> None:
        tools = codec.dumps(list(queue.tools), what="queue tools")

        def body(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO run_queues (name, tools, concurrency, seen_at) "
                "VALUES (?,?,?,?)",
                (queue.name, tools, queue.concurrency, time.time()),
            )

        await self._write(f"save run queue {queue.name!r}", body)

    async def list_run_queues(self, *, seen_within_s: float) -> list[durable.RunQueueRecord]:
        def work(conn: sqlite3.Connection) -> list[durable.RunQueueRecord]:
            rows = conn.execute(
                "SELECT name, tools, concurrency, seen_at FROM run_queues WHERE seen_at >= ? "
                "ORDER BY name",
                (time.time() - seen_within_s,),
            ).fetchall()
            return [
                durable.RunQueueRecord(r[0], tuple(json.loads(r[1])), int(r[2]), float(r[3]))
                for r in rows
            ]

        return await self._reader.call("list run queues", work)

    # -- API keys and secrets ------------------------------------------------------------
    async def save_api_key(self, key: ApiKeyRecord) -> None:
        row = codec.key_row(key)

        def body(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT OR REPLACE INTO api_keys ({codec.KEY_COLUMNS}) VALUES (?,?,?,?,?,?)", row
            )

        await self._write(f"save API key {key.name!r}", body)

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        def work(conn: sqlite3.Connection) -> list[ApiKeyRecord]:
            rows = conn.execute(f"{_KEY_SELECT} ORDER BY created_at, rowid").fetchall()
            return [codec.key_from_row(r) for r in rows]

        return await self._reader.call("list API keys", work)

    async def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        if codec.no_such_key(key_id):
            return None

        def work(conn: sqlite3.Connection) -> ApiKeyRecord | None:
            row = conn.execute(f"{_KEY_SELECT} WHERE key_id = ?", (key_id,)).fetchone()
            return None if row is None else codec.key_from_row(row)

        return await self._look_up("look up an API key", work)

    async def find_api_key(self, key_hash: str) -> ApiKeyRecord | None:
        if codec.no_such_key(key_hash):
            return None

        def work(conn: sqlite3.Connection) -> ApiKeyRecord | None:
            row = conn.execute(
                f"{_KEY_SELECT} WHERE key_hash = ? AND revoked_at IS NULL LIMIT 1", (key_hash,)
            ).fetchone()
            return None if row is None else codec.key_from_row(row)

        return await self._look_up("look up an API key", work)

    async def revoke_api_key(self, key_id: str) -> bool:
        if codec.no_such_key(key_id):
            return False

        def body(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE revoked_at IS NULL AND key_id = ?",
                (time.time(), key_id),
            )
            return cur.rowcount > 0

        return await self._write(f"revoke API key {key_id!r}", body)

    def secret_path(self, name: str) -> Path:
        """Where the secret ``name`` is kept: a 0600 file beside the database, never inside it
        (see docs/adr/0006-ticket-secret.md): whoever can read the data cannot forge tickets."""
        if not _SECRET_NAME.fullmatch(name):
            raise ValueError(f"bad secret name {name!r}: lower-case letters, digits and '_'")
        return self.path.with_name(f"{self.path.name}.{name}.secret")

    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        if str(self.path) == ":memory:":
            return self._memory_secrets.setdefault(name, candidate)
        path = self.secret_path(name)
        action = f"store secret {name!r} in {path}"

        def work(conn: sqlite3.Connection) -> str:
            try:
                found = read_secret_file(path)
                if found is not None:
                    return found
                if not writable(self.path):
                    raise StoreReadOnlyError(
                        f"cannot {action}: SQLite database {self.path} is read-only (the file "
                        "or its directory is not writable), so no new secret is kept beside it"
                    )
                return write_secret_file(path, candidate)
            except PermissionError as exc:
                raise StoreReadOnlyError(
                    f"cannot {action}: {path.parent} is read-only ({exc.strerror})"
                ) from exc
            except OSError as exc:
                raise StoreUnavailableError(f"cannot {action}: {exc.strerror or exc}") from exc

        return await self._writer.call(action, work)

    # -- the backfill of ADR 0167 -----------------------------------------------------------
    async def inline_candidates(self) -> int:
        typed, types = codec.lifecycle_types_sql("?", codec.apart_types())
        query = f"SELECT count(*) FROM events WHERE apart IS NULL AND {typed}"

        def work(conn: sqlite3.Connection) -> int:
            return int(conn.execute(query, types).fetchone()[0])

        return await self._reader.call("count the rows keeping reasoning inline", work)

    async def move_apart(
        self,
        after: apart_backfill.Cursor | None = None,
        *,
        dry_run: bool = False,
        batch: int = apart_backfill.BATCH,
    ) -> apart_backfill.ApartPage:
        """The window is read on the reader (no lock: the writer appends meanwhile); its rows
        are moved in write transactions of ``batch`` rows or :data:`BATCH_BYTES`, each a short
        turn of the one writer between the daemon's appends (ADR 0167)."""
        start = apart_backfill.START if after is None else after
        end, keys = await self._reader.call(
            "find rows keeping reasoning inline", lambda c: _inline_window(c, start)
        )
        moved, k = 0, 0
        refused: list[apart_backfill.Cursor] = []
        while k < len(keys):
            chunk = keys[k : k + max(batch, 1)]
            work = functools.partial(_move_rows, keys=chunk, dry_run=dry_run)
            if dry_run:
                step = await self._reader.call("count reasoning to move apart", work)
            else:
                action = f"move reasoning apart in run {chunk[0][0]!r}"
                began = time.monotonic()
                step = await self._writer.write(action, work)
                # Rest as long as the transaction held the write lock: another process's
                # writer (the daemon's, beside this command) waiting on SQLite's busy handler
                # polls with a backoff of 1 to 100 ms and has no place in a queue; without a
                # rest it found the lock taken again at nearly every poll (ADR 0167).
                await asyncio.sleep(time.monotonic() - began)
            k, moved = k + step.done, moved + step.moved
            refused.extend(step.refused)
        return apart_backfill.ApartPage(len(keys), moved, tuple(refused), end)

    # -- plumbing ------------------------------------------------------------------------
    async def _look_up(self, action: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` (one small indexed read) on the loop's own connection, or on the reader
        thread when there is none (in memory, closed) or the database is locked right now."""
        conn = self._lookups
        if conn is not None:
            try:
                return work(conn)
            except sqlite3.Error as exc:
                if (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF not in _BUSY_CODES:
                    raise translate_error(exc, self.path, action) from exc
        return await self._reader.call(action, work)

    async def _write(self, action: str, body: Callable[[sqlite3.Connection], T]) -> T:
        return await self._writer.write(action, body)


class _QueuedAppend(QueuedAppend):
    """The observers see a queued append once it commits, whether or not anyone waits for it:
    a task whose provider never answers still has its ``task.started`` traced, and a run closed
    at shutdown is observed whole. Each append's observation follows the one it was queued
    behind, so observers see a run's batches in the log's order."""

    __slots__ = ("_observing", "_previous", "future", "job", "run_id", "store")

    def __init__(
        self,
        store: SQLiteStore,
        run_id: str,
        job: QueuedWrite | None,
        future: asyncio.Future[list[Event]],
        after: _QueuedAppend | None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.job = job
        self.future = future
        self._previous = after
        self._observing: asyncio.Future[None] | None = None
        future.add_done_callback(self._committed)

    def _committed(self, future: asyncio.Future[list[Event]]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._observe(future.result())

    def _observe(self, events: list[Event]) -> asyncio.Future[None]:
        if self._observing is None:
            self._observing = asyncio.ensure_future(self._observed(events))
        return self._observing

    async def _observed(self, events: list[Event]) -> None:
        previous = self._previous
        self._previous = None  # a chain of queued appends is not kept alive by its tail
        if previous is not None and previous._observing is not None:
            await asyncio.shield(previous._observing)
        await self.store.wakeups.observed(self.run_id, events)

    async def wait(self) -> list[Event]:
        out = await self.future
        await asyncio.shield(self._observe(out))
        return out

    def done(self) -> bool:
        return self.future.done()

    async def abandon(self) -> None:
        if not self.future.done():
            self.future.cancel()  # the writer skips it if it has not run yet
        elif not self.future.cancelled():
            self.future.exception()


def _key_usage(conn: sqlite3.Connection, quota: durable.Quota, now: float) -> durable.KeyUsage:
    """A key's usage in at most three rows, whatever its history: its open runs (found among the
    open runs of every key through an index on status, not among the key's every run), the
    ``max_per_minute``-th newest start of the window (at most that many index entries), and the
    window's count only when that start exists (the key is refused; the message names it)."""
    open_row = conn.execute(
        f"SELECT count(*) FROM runs WHERE {_OPEN} AND "
        "(SELECT s.key_id FROM run_specs s WHERE s.run_id = runs.run_id) = ?",
        (quota.key_id,),
    ).fetchone()
    open_runs = int(open_row[0])
    since = now - durable.WINDOW_S
    pivot = conn.execute(
        "SELECT created_at FROM run_specs WHERE key_id = ? AND created_at > ? "
        "ORDER BY created_at DESC LIMIT 1 OFFSET ?",
        (quota.key_id, since, quota.max_per_minute - 1),
    ).fetchone()
    if pivot is None:
        return durable.KeyUsage(open_runs)
    starts = conn.execute(
        "SELECT count(*) FROM run_specs WHERE key_id = ? AND created_at > ?",
        (quota.key_id, since),
    ).fetchone()
    return durable.KeyUsage(open_runs, float(pivot[0]), int(starts[0]))


def _prepare_private_file(path: Path) -> None:
    """Create missing folders (0700) and a missing database file (empty, 0600) before SQLite
    does, so that the file and the ``-wal``/``-shm`` SQLite derives from it are private.

    A file we cannot create here is left to SQLite, whose error says read-only or unavailable.
    """
    try:
        make_private_parents(path)
    except PermissionError as exc:
        raise StoreReadOnlyError(
            f"cannot create the directory {path.parent} for SQLite database {path}: {exc}"
        ) from exc
    except OSError as exc:
        raise StoreUnavailableError(
            f"cannot create the directory {path.parent} for SQLite database {path}: {exc}"
        ) from exc
    with contextlib.suppress(OSError):
        create_private_file(path)

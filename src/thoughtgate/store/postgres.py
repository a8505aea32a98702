"""The scale-out store: PostgreSQL shared by any number of ``thoughtgate serve`` replicas.

Ordering (why a resuming reader can never miss an event): see ``_APPEND_STATEMENT``. Live fan-out across
processes: after an append commits, the store's notifier (``pg_notifier``) sends ``NOTIFY`` on a
per-schema channel, one transaction for the appends of a short window; one shared ``LISTEN``
connection per store (``pg_listener``) wakes that store's tails; a slow safety poll covers
anything a dropped listener, or a wake-up never sent, may have missed. Errors are mapped in
``pg_errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Collection, Generator, Mapping, Sequence
from typing import Any, Literal, Unpack

import orjson
import psycopg
from psycopg import sql
from psycopg.types.string import TextBinaryLoader, TextLoader
from psycopg_pool import AsyncConnectionPool

from thoughtgate.errors import RunNotFoundError, StoreError
from thoughtgate.events.schema import EVENT_VERSION, Event, NewEvent
from thoughtgate.store import apart_backfill, codec, durable, listing
from thoughtgate.store.base import (
    REFUSAL_HELD_S,
    EventStore,
    Holder,
    OpenRun,
    OpenRuns,
    RunEnding,
)
from thoughtgate.store.log import PageAhead, abandon_task, append_refused
from thoughtgate.store.migrations import load_migrations
from thoughtgate.store.pg_errors import describe_target, translate_error, writes_refused
from thoughtgate.store.pg_foreign_xids import ForeignXids
from thoughtgate.store.pg_horizon import HorizonWatch
from thoughtgate.store.pg_listener import PgListener
from thoughtgate.store.pg_notifier import PgNotifier
from thoughtgate.store.pg_pool import POOL_WAIT_S, connect, open_pool
from thoughtgate.store.pg_schema import migrate, resolve_schema, schema_tables
from thoughtgate.store.projection import IndexUpdate, batch_update, column_storable
from thoughtgate.store.records import ApiKeyRecord, RunRecord, TaskRecord
from thoughtgate.store.run_index import RunChange

__all__ = [
    "PostgresStore",
    "missing_schema",
    "open_runs_query",
    "read_types_query",
    "split_schema_param",
]

# Sequence order equals commit order.
#
# The UPDATE takes the run row's lock and holds it until this statement's transaction commits, so
# appends to one run are serialized: the next appender blocks on the row, and when it proceeds
# (READ COMMITTED re-reads the updated row) it numbers its events after ours -- only once ours are
# committed and visible. Numbers are therefore handed out in commit order, without gaps. A reader
# that has seen seq N and asks for "seq > N" can never later find a smaller number appearing: no
# transaction holding a number <= N can still be in flight once N is visible. (A plain sequence or
# "max(seq)+1" without the lock lets a later-numbered append commit first; a client resuming from
# its SSE id would then skip the earlier one for good.)
#
# It is one statement (one round trip, its own transaction in autocommit mode): bump the counter
# and insert every event of the batch. It sends no NOTIFY: a transaction that notifies holds a
# server-wide lock through its commit's WAL flush (ADR 0127), so the wake-up is sent after the
# commit, coalesced with other appends' (``pg_notifier``, ADR 0132).
#
# The batch travels as four plain strings that the server splits (see ``_batch_params``; two, and
# the task id and type once, when every event shares them: ``_UNIFORM``): adapting
# Python lists to PostgreSQL arrays costs tens of microseconds per element in the driver, several
# times more than everything else an append does.
#
# An event's ``ts`` is stamped on the server's clock (ADR 0074): each is moved by ``skew``, the
# server's clock when the statement arrived less this process's when it was sent (``sent``), so
# events keep the times between them they were made with; the statement returns it, and the
# events handed back are moved alike (``_append_rows``).
_APPEND_STATEMENT = """
WITH bumped AS (
    UPDATE runs SET last_seq = last_seq + %(n)s
    WHERE run_id = %(run_id)s AND closed_at IS NULL
    RETURNING last_seq - %(n)s AS base,
              extract(epoch FROM statement_timestamp()) - %(sent)s::float8 AS skew
), inserted AS (
    INSERT INTO events (run_id, seq, task_id, type, ts, payload, v{apart_column})
    SELECT %(run_id)s, bumped.base + e.ord, {task_and_type}, e.ts + bumped.skew,
           e.payload::json, %(v)s{apart_value}
    FROM bumped, unnest({task_and_type_arrays}
        string_to_array(%(ts)s, ',')::float8[],
        string_to_array(%(payloads)s, E'\\x1e'){apart_array}
    ) WITH ORDINALITY AS e({task_and_type_names}ts, payload, {apart_name}ord)
    RETURNING 1
)
SELECT base, skew
FROM bumped
"""
_MIXED = {
    "task_and_type": "e.task_id, e.type",
    "task_and_type_arrays": """
        ARRAY(SELECT v FROM json_array_elements_text(%(task_ids)s::json)
              WITH ORDINALITY AS j(v, i) ORDER BY i),
        ARRAY(SELECT v FROM json_array_elements_text(%(types)s::json)
              WITH ORDINALITY AS j(v, i) ORDER BY i),""",
    "task_and_type_names": "task_id, type, ",
}
_UNIFORM = {
    "task_and_type": "%(task_id)s::text, %(type)s::text",
    "task_and_type_arrays": "",
    "task_and_type_names": "",
}
"""For a batch whose events share one task and one type (a model turn's deltas): the two are
sent once, not as arrays the server unpacks row by row (ADR 0096)."""
_NO_APART = {"apart_column": "", "apart_value": "", "apart_array": "", "apart_name": ""}
_APART = {
    "apart_column": ", apart",
    "apart_value": ", e.apart::json",
    "apart_array": ",\n        string_to_array(%(aparts)s, E'\\x1e', '')",
    "apart_name": "apart, ",
}
"""What a batch with a part kept apart (ADR 0160) adds to the statement; a batch without one
(most: answer deltas, tool and lifecycle events) is sent without the column (left NULL)."""


def _fenced(statement: str) -> str:
    return statement.replace(
        "AND closed_at IS NULL",
        "AND closed_at IS NULL AND owner = %(owner)s "
        "AND (%(attempt)s::int IS NULL OR COALESCE(claim, 1) = %(attempt)s::int)",
    )


def _append_statement(*, uniform: bool, held: bool, apart: bool) -> str:
    """``_APPEND_STATEMENT`` for a batch of one task and type or not, and with a part kept apart
    or not; ``held``: fenced for an execution's append, as its end is (``Holder.holds``, ADR
    0090): the run's owner and its latest claim (``runs.claim``, migration 11: a column of the
    row the ``UPDATE`` locks, so a claim that held the lock is seen committed) must be the
    execution's."""
    statement = _APPEND_STATEMENT.format(
        **(_UNIFORM if uniform else _MIXED), **(_APART if apart else _NO_APART)
    )
    return _fenced(statement) if held else statement


_STATEMENTS = {
    (uniform, held, apart): _append_statement(uniform=uniform, held=held, apart=apart)
    for uniform in (False, True)
    for held in (False, True)
    for apart in (False, True)
}
"""Every append statement by (one task and type, fenced, with a part kept apart)."""

_RECORD_SEPARATOR = "\x1e"
"""Joins the encoded payloads. Never inside one: JSON text escapes every control character."""


_WINDOW_END, _INLINE_ROWS_TO, _INLINE_ROWS = apart_backfill.window_sql("%s")
"""The backfill's window (ADR 0167)."""
_INLINE_ROW = (
    "SELECT type, CAST(payload AS TEXT) FROM events "
    "WHERE run_id = %s AND seq = %s AND apart IS NULL FOR UPDATE"
)
"""A row still whole, locked (that row only) until the transaction moving it ends: a second
backfill at the same time waits for it, then finds it apart and passes."""
_MOVE_ROW = (
    "UPDATE events SET payload = %s::json, apart = %s::json "
    "WHERE run_id = %s AND seq = %s AND apart IS NULL"
)


async def _move_rows(
    conn: psycopg.AsyncConnection[Any],
    keys: Sequence[apart_backfill.Cursor],
    *,
    dry_run: bool,
) -> apart_backfill.Batch:
    """In the caller's transaction: the rows of ``keys`` in order, each still whole moved apart,
    until the batch's byte budget is spent; ``dry_run``: read and counted, not locked nor
    written."""
    batch = apart_backfill.Batch()
    select = _INLINE_ROW.removesuffix(" FOR UPDATE") if dry_run else _INLINE_ROW
    for run_id, seq in keys:
        if not batch.takes():
            break
        row = await (await conn.execute(select, (run_id, seq))).fetchone()
        if row is None:  # moved meanwhile (another backfill): nothing left to do
            continue
        split = batch.split((run_id, seq), row[0], row[1])
        if split is not None and not dry_run:
            await conn.execute(_MOVE_ROW, (split[0], split[1], run_id, seq))
    return batch


def _assignments(sets: Mapping[str, Any]) -> sql.Composed:
    """``col = %s, ...`` for the columns of ``sets``."""
    return sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in sets)


def _batch_params(
    payloads: list[str],
    task_ids: list[str | None],
    types: list[str],
    ts: list[float],
    aparts: list[str | None],
) -> dict[str, Any]:
    """The batch columns as strings: JSON arrays for the texts (one task id and one type where
    every event shares them, for ``_UNIFORM``), the shortest digits that read back as
    the same float for the times (orjson's, a tenth of ``repr``'s CPU; ``repr`` for a time that
    is not finite, which orjson would write as ``null``)."""
    stamps = orjson.dumps(list(map(float, ts))).decode()
    params: dict[str, Any] = {
        "ts": ",".join(map(float.__repr__, map(float, ts))) if "null" in stamps else stamps[1:-1],
        "payloads": _RECORD_SEPARATOR.join(payloads),
    }
    if aparts.count(None) != len(aparts):
        # What is kept apart (ADR 0160), ``''`` (read back as NULL) for an event without.
        params["aparts"] = _RECORD_SEPARATOR.join(a or "" for a in aparts)
    n = len(payloads)
    if n and task_ids.count(task_ids[0]) == n and types.count(types[0]) == n:
        params.update(task_id=task_ids[0], type=types[0])
    else:
        params.update(task_ids=codec.dumps(task_ids), types=codec.dumps(types))
    return params


# A page is a closed range of sequence numbers rather than "seq > N ... LIMIT k": sequences have
# no gaps, so both mean the same rows, but the range stays a short index scan whatever the
# planner believes about the table (with stale statistics after a burst of appends it would
# otherwise sort every later event of the run to return the first k).
_READ = {
    apart: f"{codec.event_select(apart=apart)} WHERE run_id = %s AND seq > %s AND seq <= %s "
    "ORDER BY seq"
    for apart in (True, False)
}
_NO_LIMIT = 2**62
_Page = tuple[int, tuple[Any, ...] | list[tuple[Any, ...]]]
"""``(after, row of _READ_PAGE)``, or ``(after, rows of _READ)`` for a page too long to
aggregate: a page fetched, not yet decoded."""
_PAGE_ROWS = 1000
"""Events per aggregate query: a read of a whole run is several, so no aggregated value comes
near PostgreSQL's 1 GB limit on a value (a page of 1 MB reasoning traces is already large)."""
_READ_PAGE = {
    True: "SELECT * FROM events_page_parts(%s, %s, %s)",
    False: "SELECT * FROM events_page_shown(%s, %s, %s)",
}
"""A page as one row of columns (``codec.events_from_columns``): the client loads a handful of
values per page instead of six per event. ``events_page_counted`` (migration 12, ADR 0127; after
``events_page``, migration 7, ADR 0039) aggregates the rows of the range in number order, read
through the primary key's index whatever the table's statistics say, with task ids and types as
joined texts (``codec.task_id_column``). It sends how many rows it read and the largest number,
not the numbers: ``codec.page_range`` takes the page only when they are every number of its
range (no gap), and the codec checks one value per event. ``events_page_shown`` (migration 15,
ADR 0160) is the same page without what is kept apart, for a reader who may see none of it;
``events_page_parts`` (migration 16) is that page with the parts kept apart in two more columns,
joined to their rows by the client (``codec.joined_parts``): ``events_page_counted``, which a
replica of the previous version reads, splices them on the server, at 0.73x a whole replay's
speed (ADR 0160, amendment 3)."""


def read_types_query(
    run_id: str, types: Collection[str], *, after: int, limit: int | None
) -> tuple[str, tuple[Any, ...]]:
    """``read_types``' statement and parameters: a check's through ``lifecycle_events`` (ADR
    0066), which the planner takes for the smaller index, with statistics or without."""
    return codec.typed_read_sql("%s", run_id, types, after=after, limit=limit)


def open_runs_query(
    *, limit: int, after: str | None, expired: bool, run_ids: Collection[str] | None
) -> tuple[str, dict[str, Any]]:
    """``open_runs``' statement and parameters: the open runs in run id order after ``after``,
    a range read of ``open_runs_by_id`` (ADR 0079) that stops at ``limit``. The page is chosen
    from ``runs`` alone, then joined to ``run_specs``: a join in the same query let the planner,
    which underestimates the open runs (it takes status and ``closed_at`` for independent),
    read every open run, hash them against ``run_specs`` and sort. The server's clock is read
    once (a materialized CTE), so every row is judged at one time; it is the last column."""
    where = codec.open_runs_where(
        "%(after)s",
        after=after is not None,
        run_ids=None if run_ids is None else "run_id = ANY(%(ids)s)",
        expired="(SELECT now FROM clock)" if expired else None,
    )
    query = (
        f"WITH clock AS MATERIALIZED (SELECT {_NOW} AS now) "
        "SELECT page.run_id, page.owner, page.lease_expires_at, run_specs.queued_at, clock.now "
        "FROM clock, (SELECT run_id, owner, lease_expires_at FROM runs "
        f"WHERE {where} ORDER BY run_id LIMIT %(limit)s) AS page "
        "LEFT JOIN run_specs USING (run_id) ORDER BY page.run_id"
    )
    ids = None if run_ids is None else list(run_ids)
    return query, {"after": after, "ids": ids, "limit": limit}


_OPEN = codec.OPEN_RUN_PREDICATE
"""An open run; spelled as in the ``open_runs_by_id`` partial index."""
_NOW = "extract(epoch FROM clock_timestamp())"
"""Every time the store keeps is the server's clock -- leases (ADR 0009), and when a run was
created, changed, queued or closed, a key revoked (ADR 0066) -- so replicas on hosts whose clocks
disagree still agree on expiries, the run list's order and the quotas' minute."""
_CLOCK = sql.SQL(_NOW)
_RUN_SELECT = f"SELECT {codec.RUN_COLUMNS} FROM runs"
_TASK_SELECT = f"SELECT {codec.TASK_COLUMNS} FROM tasks"
_TASK_SELECT_SHOWN = f"SELECT {codec.TASK_COLUMNS_SHOWN} FROM tasks"
_KEY_SELECT = f"SELECT {codec.KEY_COLUMNS} FROM api_keys"
_KEY_FIELDS = codec.KEY_COLUMNS.split(", ")
_INSERT_RUN = (
    f"INSERT INTO runs ({codec.RUN_COLUMNS}, change_seq) "
    f"VALUES ({', '.join(['%s'] * (codec.RUN_COLUMN_COUNT + 1))})"
)
_INSERT_SPEC = (
    f"INSERT INTO run_specs ({codec.SPEC_COLUMNS}) "
    f"VALUES ({','.join(['%s'] * codec.SPEC_COLUMN_COUNT)})"
)
# The run list's change numbers (store/listing.py, ADR 0140). A change is numbered by the
# transaction making it: ``base`` (``run_changes``, migration 14) plus its transaction id, so no
# two transactions share a number and none waits for another to get one. (Every transaction
# changes one run: a second run in the same transaction would break ``runs_by_change``'s
# uniqueness, loudly.) Transaction ids are not handed out in commit order, so a reader takes only
# the changes below the horizon, ``base`` plus the oldest transaction id still running in its
# snapshot (``pg_snapshot_xmin``; passing over other databases' transactions, ADR 0146, which
# cannot write here): every transaction below it has ended, and every transaction
# that can still number a change -- running, or yet to start -- numbers it at or above it. A
# reader that has read up to ``N`` below one horizon therefore never finds a new change at or
# below ``N`` later, however the writers' commits interleave.
_NEXT_CHANGE = "SELECT base + pg_current_xact_id()::text::bigint FROM run_changes"
_XMIN = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
_PASSING_OVER = (
    "(SELECT CASE WHEN pg_is_in_recovery() THEN pg_snapshot_xmin(s)::text::bigint "
    "ELSE coalesce((SELECT min(x::text::bigint) FROM pg_snapshot_xip(s) AS x "
    "WHERE x::text::bigint <> ALL(%(foreign)s::bigint[])), pg_snapshot_xmax(s)::text::bigint) END "
    "FROM pg_current_snapshot() AS s)"
)
"""The oldest transaction id of the statement's snapshot that may still number a change, once
some running ids are known to be other databases' (``foreign``, ``ForeignXids``, ADR 0146): the
oldest running one not among them, else the snapshot's ``xmax`` (every id below it has ended).
Without ``foreign`` it would be ``_XMIN``. A standby's snapshot lists its running ids elsewhere
(``pg_snapshot_xip`` is empty there): it is never narrowed."""


@dataclasses.dataclass(frozen=True)
class _RunListReads:
    """The run list's reads with one horizon: the cluster's oldest running transaction
    (``_PLAIN``, the statements of ADR 0140 as they were), or the oldest not of another database
    (``_NARROWED``, while some are known: ADR 0146). Each reads everything in one statement, so
    the changes and the horizon are of one snapshot. ``latest`` and ``since`` end with whether
    committed changes wait above the horizon and the id holding it (``_NARROWED``'s then with the
    snapshot's ``xmin``: the ids below it have ended, and are forgotten)."""

    changes: str
    latest: str
    since: str

    @classmethod
    def below(cls, xid: str, *, with_xmin: bool) -> _RunListReads:
        horizon = f"(SELECT base + {xid} FROM run_changes)"
        holder = f"{xid}, {_XMIN}" if with_xmin else xid
        return cls(
            changes=(
                f"SELECT {codec.RUN_COLUMNS}, change_seq FROM runs WHERE change_seq > %(after)s "
                f"AND change_seq < {horizon} ORDER BY change_seq LIMIT %(limit)s"
            ),
            # the largest number, or the horizon's last when a change waits above it (that run's
            # previous number, which a reader may have read, was at most that)
            latest=(
                "SELECT CASE WHEN max(change_seq) IS NULL THEN 0 ELSE "
                f"LEAST(max(change_seq), {horizon} - 1) END, "
                f"coalesce(max(change_seq) >= {horizon}, false), {holder} FROM runs"
            ),
            since=(
                "SELECT EXISTS (SELECT 1 FROM runs WHERE change_seq > %(after)s "
                "AND change_seq < h.at), EXISTS (SELECT 1 FROM runs WHERE change_seq >= h.at), "
                f"{holder} FROM (SELECT {horizon} AS at) AS h"
            ),
        )


_PLAIN = _RunListReads.below(_XMIN, with_xmin=False)
_NARROWED = _RunListReads.below(_PASSING_OVER, with_xmin=True)
_AHEAD = (
    "FROM (SELECT max(change_seq) AS n FROM runs) AS top "
    "WHERE top.n >= base + pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
)
_NUMBERS_AHEAD = f"SELECT 1 FROM run_changes, {_AHEAD.removeprefix('FROM ')}"
_REBASE = (
    "UPDATE run_changes SET base = top.n + 1 - pg_snapshot_xmin(pg_current_snapshot())::text::bigint "
    + _AHEAD
)
"""At ``open``: when the stored numbers are ahead of this server's transaction ids (the database
was dumped and restored into another cluster, whose ids start lower), move ``base`` so new numbers
come above them. In normal operation no committed change is numbered from an id not yet handed
out: ``_NUMBERS_AHEAD`` finds nothing and the store writes nothing (it may be a standby). Replicas
opening together: the first ``UPDATE`` moves ``base``; the others wait for its row, and their
condition, checked again on the moved row, no longer holds."""
_CLOSE_ENDED = (
    f"UPDATE runs SET closed_at = {_NOW} WHERE run_id = ANY(%s) "
    f"AND {codec.ENDED_UNCLOSED_PREDICATE}"
)
"""Close the runs named that a write outside ``finish_run`` just gave a terminal status (ADR
0134): an ended run takes no more events and leaves the open runs. A closed run keeps its
``closed_at``."""
_ATTEMPTS = "SELECT attempts FROM run_specs WHERE run_id = %s"
"""The claims a run's spec counted: the fencing token of a durable run's end (ADR 0072)."""
_HELD_BY = "SELECT closed_at, owner, claim FROM runs WHERE run_id = %s FOR SHARE"
"""Whether a run is open, and who holds it, for an execution's write outside ``append`` (ADR
0094). ``FOR SHARE`` conflicts with a claim's update of the row: a claim in flight commits
first (and the row is read as it left it) or waits for the write."""


def _held_row(row: Sequence[Any]) -> tuple[Any, Any, int]:
    """``(closed_at, owner, claim)`` as ``Holder.check`` takes it: ``claim`` is ``NULL`` until a
    run's first claim, when only its admission (attempt 1) can hold it (ADR 0090)."""
    return (row[0], row[1], 1 if row[2] is None else row[2])


_UPSERT_TASK = (
    f"INSERT INTO tasks ({codec.TASK_COLUMNS}) "
    f"VALUES ({', '.join(['%s'] * codec.TASK_COLUMN_COUNT)}) {codec.TASK_CONFLICT_UPDATE}"
)
# A new key's creation time is moved onto the server's clock as an event's is (see
# ``_APPEND_STATEMENT``, ADR 0074); a key saved again (a role changed) keeps the time it is
# given, read from the store.
_UPSERT_KEY = (
    f"INSERT INTO api_keys ({codec.KEY_COLUMNS}) VALUES (%(key_id)s, %(name)s, %(role)s, "
    "%(key_hash)s, %(created_at)s + extract(epoch FROM statement_timestamp()) - %(sent)s::float8, "
    "%(revoked_at)s) "
    "ON CONFLICT (key_id) DO UPDATE SET name = EXCLUDED.name, role = EXCLUDED.role, "
    "key_hash = EXCLUDED.key_hash, created_at = %(created_at)s, "
    "revoked_at = EXCLUDED.revoked_at RETURNING created_at"
)


def split_schema_param(url: str) -> tuple[str, str | None]:
    """Take our own ``?schema=NAME`` out of a URL (libpq would reject it); the rest is libpq's.

    The query is found where libpq finds it: after the user info, which ends at the first
    ``@`` before any ``/``, so a password holding a bare ``?`` or ``#`` keeps them, and the
    ``?`` after the host or the database starts the query (``urlsplit`` cut the URL at the
    password's ``?`` or ``#``: ``schema`` was left in, and libpq refused it). The other
    parameters are passed through byte for byte: re-encoding them could change what libpq
    reads (it does not treat ``+`` as a space, for one).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, None
    at, slash = rest.find("@"), rest.find("/")
    past_user = at + 1 if at >= 0 and (slash < 0 or at < slash) else 0
    start = rest.find("?", past_user)
    if start < 0:
        return url, None
    schema: str | None = None
    kept: list[str] = []
    for item in rest[start + 1 :].split("&"):
        key, _, value = item.partition("=")
        if key == "schema" and "@" in value:  # a password's bare ``/`` ended the host early:
            return url, None  # this "query" is the password's, and what follows (ADR 0135)
        if key == "schema":
            schema = urllib.parse.unquote(value)
        else:
            kept.append(item)
    query = "&".join(kept)
    return f"{scheme}://{rest[:start]}{'?' if query else ''}{query}", schema


async def missing_schema(url: str) -> str | None:
    """Where the store ``url`` names, when :meth:`PostgresStore.open` would create it (its schema
    does not exist, or holds no table at all), else None. Only looks: creates nothing."""
    conninfo, url_schema = split_schema_param(url)
    where = describe_target(conninfo, url_schema)
    try:
        conn = await connect(conninfo, application_name="thoughtgate:look")
    except psycopg.Error as exc:
        raise translate_error(exc, "open the store", where, conninfo=conninfo) from exc
    try:
        if url_schema is None:
            row = await (await conn.execute("SELECT current_schema()")).fetchone()
            if row is None or row[0] is None:  # no schema on the search_path exists
                return where
            url_schema = str(row[0])
        if await schema_tables(conn, url_schema):
            return None
        return describe_target(conninfo, url_schema)
    except psycopg.Error as exc:
        raise translate_error(exc, "open the store", where, conninfo=conninfo) from exc
    finally:
        with contextlib.suppress(psycopg.Error, OSError):
            await conn.close()


def channel_name(schema: str) -> str:
    """The NOTIFY channel of one schema; channel names are identifiers (at most 63 bytes)."""
    name = f"thoughtgate_events:{schema}"
    if len(name.encode()) <= 63:
        return name
    return f"thoughtgate_events:{hashlib.sha256(schema.encode()).hexdigest()[:40]}"


_READ_ONLY = (
    "SELECT pg_catalog.pg_is_in_recovery() "
    "OR pg_catalog.current_setting('transaction_read_only') = 'on'"
)
"""Whether a write on this connection would be refused as read-only (``check_writes``)."""


class PostgresStore(EventStore, durable.DurableRunStore):
    """An :class:`EventStore` in one PostgreSQL schema. Create with ``await PostgresStore.open``."""

    #: With a healthy listener, an idle tail still re-reads this often, in case a notification
    #: was lost in a way the listener could not notice (a silently dead TCP connection).
    safety_poll: float = 3.0
    #: A replaying tail reads 1000 events a page: each page costs a round trip and a pooled
    #: connection, which at 500 a page cost more client CPU than the collector does at 1000.
    tail_batch = _PAGE_ROWS
    #: How soon a run-list reader looks again while committed changes wait above the horizon
    #: for an older transaction (of this database: ADR 0146) to end (ADR 0140).
    horizon_poll: float = 0.05

    def __init__(self, conninfo: str, schema: str) -> None:
        """Use :meth:`open`: it migrates the schema and opens the connection pool."""
        super().__init__()
        self.horizon = HorizonWatch()
        """Warns when an older transaction holds the run lists still for long (ADR 0140)."""
        self.foreign_xids = ForeignXids()
        """Running transactions of other databases, which the run lists' horizon passes over
        (ADR 0146)."""
        self.conninfo = conninfo
        """Where the database is (without our ``schema`` parameter): the durable engine keeps its
        workflows in the same database, in a schema beside ours."""
        self.schema = schema
        self.channel = channel_name(schema)
        self._where = describe_target(conninfo, schema)
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._refused: tuple[float, str] | None = None
        """When (``time.monotonic``) and why the database last refused a call (read-only, its
        disk full: ``writes_refused``), unless a write was taken since: what
        :meth:`write_refusal` goes by (ADR 0151, amendment 3)."""
        self._listener = PgListener(
            conninfo,
            self.channel,
            application_name=f"thoughtgate-listen:{schema}"[:63],
            on_notify=self._notified,
            on_connected=self.wakeups.notify_all,
        )
        self._notifier = PgNotifier(
            conninfo, self.channel, application_name=f"thoughtgate-notify:{schema}"[:63]
        )

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        schema: str | None = None,
        pool_size: int = 10,
        pool_wait_s: float = POOL_WAIT_S,
    ) -> PostgresStore:
        """Connect, create the schema if needed, and apply missing migrations.

        ``schema`` (or ``?schema=NAME`` in the URL) names the schema holding thoughtgate's tables;
        without one, the connection's current schema (normally ``public``) is used.
        ``pool_wait_s``: how long a call waits for a connection (none free, or the server
        refusing new ones) before it fails as an outage (``pg_pool``).
        """
        conninfo, url_schema = split_schema_param(url)
        where = describe_target(conninfo, schema or url_schema)
        try:
            conn = await connect(conninfo, application_name="thoughtgate:migrate")
        except psycopg.Error as exc:
            raise translate_error(exc, "open the store", where, conninfo=conninfo) from exc
        try:
            chosen = await resolve_schema(conn, schema or url_schema, where)
            where = describe_target(conninfo, chosen)
            await migrate(conn, chosen, load_migrations("postgres"), where)
            await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(chosen)))
            if await (await conn.execute(_NUMBERS_AHEAD)).fetchone() is not None:
                await conn.execute(_REBASE)
        except psycopg.Error as exc:
            raise translate_error(exc, "open the store", where, conninfo=conninfo) from exc
        finally:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
        store = cls(conninfo, chosen)
        store._pool = await open_pool(
            conninfo,
            size=pool_size,
            setup=store._setup_connection,
            application_name=f"thoughtgate:{chosen}"[:63],
            wait_s=pool_wait_s,
        )
        return store

    async def _setup_connection(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # JSON columns come back as their text: the codec decodes a whole batch in one call.
        # Event reads ask for binary results (``read``), where JSON is the same text.
        conn.adapters.register_loader("json", TextLoader)
        conn.adapters.register_loader("json", TextBinaryLoader)
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))

    @contextlib.asynccontextmanager
    async def _conn(
        self, action: str, *, writes: bool = False
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection for ``action``; ``writes``: the action writes, so its success
        says the database takes writes again (:meth:`write_refusal`)."""
        pool = self._pool
        if pool is None or pool.closed:
            raise StoreError(f"cannot {action}: the store is closed ({self._where})")
        try:
            # ``getconn``/``putconn`` rather than ``pool.connection()``: that one also enters
            # the connection's own context, whose exit commits or rolls back -- nothing to do
            # on an autocommit connection outside a transaction -- and keeps usage statistics,
            # about half of a borrow's CPU (ADR 0087). ``putconn`` still rolls back, or closes,
            # a connection returned inside a transaction or mid-query (``pg_pool``).
            conn = await pool.getconn()
            try:
                yield conn
            finally:
                await pool.putconn(conn)
        except psycopg.Error as exc:
            refused = writes_refused(exc)
            if refused is not None:
                self._refused = (time.monotonic(), refused)
            raise translate_error(exc, action, self._where, conninfo=self.conninfo) from exc
        if writes:
            self._refused = None

    def write_refusal(self) -> str | None:
        """Why the database refused the last call that failed (``store_read_only``,
        ``store_refuses_writes``: its disk full), when that was less than ``REFUSAL_HELD_S``
        ago and no write was taken since; else ``None``. No query: PostgreSQL
        refusing writes while it takes reads and connections is seen here, as SQLite's last
        outcome is (ADR 0151, amendment 3)."""
        refused = self._refused
        if refused is not None and time.monotonic() - refused[0] < REFUSAL_HELD_S:
            return refused[1]
        return None

    async def check_writes(self, wait_s: float) -> str | None:
        """A pooled connection within ``wait_s``, and the server not read-only (a standby, or
        ``default_transaction_read_only``): one round trip, no write (ADR 0151)."""
        pool = self._pool
        if pool is None or pool.closed:
            return "store_closed"
        try:
            async with asyncio.timeout(wait_s):
                conn = await pool.getconn(timeout=wait_s)
                try:
                    cur = await conn.execute(_READ_ONLY)
                    row = await cur.fetchone()
                finally:
                    await pool.putconn(conn)
        except (psycopg.Error, TimeoutError):
            return "store_unreachable"
        return "store_read_only" if row is not None and row[0] else None

    async def close(self) -> None:
        await self._notifier.close()
        await self._listener.stop()
        if self._pool is not None:
            await self._pool.close()

    # -- runs and tasks ------------------------------------------------------------------
    async def create_run(self, run: RunRecord) -> None:
        row = codec.run_row(run)
        tasks = [codec.task_row(t) for t in run.tasks]
        async with (
            self._conn(f"create run {run.run_id!r}", writes=True) as conn,
            conn.transaction(),
        ):
            await conn.execute(_INSERT_RUN, (*row, await self._next_change(conn)))
            if codec.closes_run(run.status):
                await conn.execute(_CLOSE_ENDED, ([run.run_id],))
            if tasks:
                async with conn.cursor() as cur:
                    await cur.executemany(_UPSERT_TASK, tasks)
        self._runs_changed()

    @staticmethod
    async def _next_change(conn: psycopg.AsyncConnection[Any]) -> int:
        """Inside a transaction: the number of the change being made to a run (``_NEXT_CHANGE``)."""
        row = await (await conn.execute(_NEXT_CHANGE)).fetchone()
        assert row is not None  # the migration inserted the row; nothing deletes it
        return int(row[0])

    def _runs_changed(self) -> None:
        """After a commit that changed a run: wake this process's run-list readers, and have the
        notifier wake other replicas' (after the commit, coalesced as appends' are: ADR 0132)."""
        self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        self._notifier.wake(listing.RUN_LIST_WAKEUP)

    async def get_run(self, run_id: str, *, apart: bool = True) -> RunRecord:
        codec.no_such_run(run_id)
        tasks_select = _TASK_SELECT if apart else _TASK_SELECT_SHOWN
        async with self._conn(f"read run {run_id!r}") as conn:
            row = await (
                await conn.execute(f"{_RUN_SELECT} WHERE run_id = %s", (run_id,))
            ).fetchone()
            if row is None:
                raise RunNotFoundError(run_id)
            cur = await conn.execute(f"{tasks_select} WHERE run_id = %s ORDER BY idx", (run_id,))
            tasks = await cur.fetchall()
        return codec.run_from_row(row, map(codec.task_from_row, tasks))

    async def list_runs(
        self, *, limit: int = 50, offset: int = 0, apart: bool = True
    ) -> list[RunRecord]:
        async with self._conn("list runs") as conn:
            cur = await conn.execute(
                f"{_RUN_SELECT} ORDER BY created_at DESC, insert_order DESC LIMIT %s OFFSET %s",
                (limit, offset),
            )
            runs = await cur.fetchall()
            cur = await conn.execute(
                f"{_TASK_SELECT if apart else _TASK_SELECT_SHOWN} WHERE run_id = ANY(%s) "
                "ORDER BY idx",
                ([r[0] for r in runs],),
            )
            tasks = await cur.fetchall()
        return codec.runs_from_rows(runs, tasks)

    async def query_runs(self, query: listing.RunQuery, *, apart: bool = True) -> listing.RunPage:
        statement, params = listing.page_query(
            query,
            columns=codec.RUN_COLUMNS,
            placeholder="%s",
            order_column="insert_order",
            like="ILIKE",
        )
        async with self._conn("query runs") as conn, conn.transaction():
            cur = await conn.execute(statement, params)
            rows = await cur.fetchall()
            runs = await self._with_tasks(conn, rows[: query.limit], apart)
        last = rows[query.limit - 1] if len(rows) > query.limit else None
        return listing.RunPage(
            runs, None if last is None else listing.RunCursor(float(last[6]), int(last[-1]))
        )

    async def run_changes(
        self, *, after: int, limit: int = 100, apart: bool = True
    ) -> listing.RunChanges:
        foreign = self.foreign_xids.foreign()
        reads = _NARROWED if foreign else _PLAIN
        params = {"after": after, "limit": limit, "foreign": foreign}
        async with self._conn("read run changes") as conn, conn.transaction():
            rows = await (await conn.execute(reads.changes, params)).fetchall()
            runs = await self._with_tasks(conn, rows, apart)
        return listing.RunChanges([(int(r[-1]), run) for r, run in zip(rows, runs, strict=True)])

    async def latest_run_change(self) -> int:
        async with self._conn("read the latest run change") as conn:
            row = await self._horizon_read(conn, "latest", {})
        return int(row[0])

    async def _horizon_read(
        self,
        conn: psycopg.AsyncConnection[Any],
        read: Literal["latest", "since"],
        params: dict[str, Any],
    ) -> tuple[Any, ...]:
        """Run ``read`` (``_RunListReads``); while committed changes wait behind a transaction
        newly learned to be another database's (ADR 0146), run it again, in a new snapshot,
        passing over it. The row (less ``_NARROWED``'s ``xmin``) is the last one run: its horizon
        is its own statement's. With nothing learned (the usual case) this is ADR 0140's
        statement, and one round trip."""
        for attempt in range(3):
            foreign = self.foreign_xids.foreign()
            statement = getattr(_NARROWED if foreign else _PLAIN, read)
            got = await (await conn.execute(statement, {**params, "foreign": foreign})).fetchone()
            assert got is not None
            row = tuple(got)
            if foreign:
                *front, xmin = row
                row = tuple(front)
                self.foreign_xids.ended_below(int(xmin))
            held, holder = row[-2:]
            if not held or attempt == 2 or not await self.foreign_xids.learn(conn, int(holder)):
                return row
        raise AssertionError("unreachable")

    @staticmethod
    async def _with_tasks(
        conn: psycopg.AsyncConnection[Any], rows: Sequence[Sequence[Any]], apart: bool
    ) -> list[RunRecord]:
        """Run records for ``rows`` (run columns first), with their tasks in index order;
        ``apart=False``: without the task columns kept apart (ADR 0160, amendment 1)."""
        if not rows:
            return []
        cur = await conn.execute(
            f"{_TASK_SELECT if apart else _TASK_SELECT_SHOWN} WHERE run_id = ANY(%s) ORDER BY idx",
            ([r[0] for r in rows],),
        )
        return codec.runs_from_rows(rows, await cur.fetchall())

    async def update_run(
        self, run_id: str, *, held_by: Holder | None = None, **change: Unpack[RunChange]
    ) -> None:
        codec.no_such_run(run_id)
        sets = codec.run_update_columns(change, updated_at=None)
        metadata = change.get("metadata")
        async with self._conn(f"update run {run_id!r}", writes=True) as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT metadata, closed_at, owner, claim FROM runs WHERE run_id = %s FOR UPDATE",
                (run_id,),
            )
            row = await cur.fetchone()
            if row is None:
                raise RunNotFoundError(run_id)
            if held_by is not None:
                held_by.check(run_id, _held_row(row[1:]), "run record")
            if metadata is not None:
                merged = codec.merged_metadata(codec.decode_object(row[0]), metadata)
                sets["metadata"] = codec.dumps(merged, what="run metadata")
            sets["change_seq"] = await self._next_change(conn)
            await conn.execute(
                sql.SQL("UPDATE runs SET {}, updated_at = {} WHERE run_id = %s").format(
                    _assignments(sets), _CLOCK
                ),
                (*sets.values(), run_id),
            )
            if codec.closes_run(change.get("status")):
                await conn.execute(_CLOSE_ENDED, ([run_id],))
        self._runs_changed()

    async def save_task(self, task: TaskRecord, *, held_by: Holder | None = None) -> None:
        row = codec.task_row(task)
        async with (
            self._conn(f"save task {task.task_id!r}", writes=True) as conn,
            conn.transaction(),
        ):
            if held_by is None:
                found = await conn.execute(
                    "SELECT 1 FROM runs WHERE run_id = %s FOR KEY SHARE", (task.run_id,)
                )
                if await found.fetchone() is None:
                    raise RunNotFoundError(task.run_id)
            else:
                found = await conn.execute(_HELD_BY, (task.run_id,))
                run = await found.fetchone()
                held_by.check(task.run_id, None if run is None else _held_row(run), "task record")
            await conn.execute(_UPSERT_TASK, row)

    async def find_run_ids(self, prefix: str, *, limit: int = 10) -> list[str]:
        if not column_storable(prefix):  # no run id holds it (``codec.no_such_run``)
            return []
        # LIKE with the prefix escaped; a command-line lookup, so a scan is acceptable here.
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        async with self._conn(f"find runs starting with {prefix!r}") as conn:
            cur = await conn.execute(
                "SELECT run_id FROM runs WHERE run_id LIKE %s ORDER BY run_id LIMIT %s",
                (pattern, limit),
            )
            return [str(r[0]) for r in await cur.fetchall()]

    async def rebuild_run_index(self, run_id: str) -> RunRecord:
        codec.no_such_run(run_id)
        lifecycle, types = codec.lifecycle_types_sql("%s")
        async with (
            self._conn(f"rebuild the index of run {run_id!r}", writes=True) as conn,
            conn.transaction(),
        ):
            # The row lock holds appends to this run off until the rebuilt row is stored.
            cur = await conn.execute(f"{_RUN_SELECT} WHERE run_id = %s FOR UPDATE", (run_id,))
            row = await cur.fetchone()
            if row is None:
                raise RunNotFoundError(run_id)
            cur = await conn.execute(f"{_TASK_SELECT} WHERE run_id = %s ORDER BY idx", (run_id,))
            stored = codec.run_from_row(row, map(codec.task_from_row, await cur.fetchall()))
            cur = await conn.execute(
                f"{codec.EVENT_SELECT} WHERE run_id = %s AND {lifecycle} ORDER BY seq",
                (run_id, *types),
            )
            task_rows, sets = codec.rebuilt_rows(stored, await cur.fetchall())
            async with conn.cursor() as tcur:
                await tcur.executemany(_UPSERT_TASK, task_rows)
            if sets is not None:
                sets.update(change_seq=await self._next_change(conn))
                await conn.execute(
                    sql.SQL("UPDATE runs SET {}, updated_at = {} WHERE run_id = %s").format(
                        _assignments(sets), _CLOCK
                    ),
                    (*sets.values(), run_id),
                )
                if codec.closes_run(sets.get("status")):  # the log says it ended (ADR 0134)
                    await conn.execute(_CLOSE_ENDED, ([run_id],))
        if sets is not None:
            self._runs_changed()
        return await self.get_run(run_id)

    # -- events --------------------------------------------------------------------------
    async def append(
        self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
    ) -> list[Event]:
        batch = list(events)
        columns = codec.encode_events(batch)
        codec.no_such_run(run_id)  # after the events' own refusal, as every store does
        update = batch_update(batch)
        changed = False
        async with self._conn(f"append {len(batch)} events to run {run_id!r}", writes=True) as conn:
            if not batch:
                await self._require_run(conn, run_id)
                return []
            if not update:  # deltas and the like: one statement, the index is not touched
                first = await self._append_rows(conn, run_id, columns, held_by)
            else:
                async with conn.transaction():
                    first = await self._append_rows(conn, run_id, columns, held_by)
                    changed = await self._project(conn, run_id, update)
        if changed:
            self._runs_changed()
        out = codec.appended_events(run_id, first, columns)
        await self._committed(run_id, out)
        return out

    async def _committed(self, run_id: str, events: list[Event]) -> None:
        """After a commit that stored ``events``: hand them to this process's live readers and
        have the notifier wake other replicas' (its ``NOTIFY``, after the commit: ADR 0132)."""
        if events:
            self._notifier.committed(run_id, events[-1].seq)
        await self.wakeups.committed(run_id, events)

    async def _append_rows(
        self,
        conn: psycopg.AsyncConnection[Any],
        run_id: str,
        columns: codec.EncodedEvents,
        held_by: Holder | None = None,
    ) -> int:
        """Number and insert encoded events (one statement, see ``_APPEND_STATEMENT``); the first seq.
        Their times in ``columns`` are moved in place as they were stored (the server's clock),
        so the events built from them are the ones a reader will see. ``held_by``: the
        execution appending, which must hold the run (``_append_statement``, ADR 0090)."""
        params = _batch_params(*columns)
        params.update(n=len(columns[0]), run_id=run_id, v=EVENT_VERSION)
        params["sent"] = time.time()
        statement = _STATEMENTS["type" in params, held_by is not None, "aparts" in params]
        if held_by is not None:
            params.update(owner=held_by.owner, attempt=held_by.attempt)
        row = await (await conn.execute(statement, params)).fetchone()
        if row is None:  # no such run, it has ended, or another execution holds it
            cur = await conn.execute(
                "SELECT closed_at, owner FROM runs WHERE run_id = %s", (run_id,)
            )
            raise append_refused(run_id, await cur.fetchone(), held_by)
        skew = float(row[1])
        ts = columns[3]
        ts[:] = [t + skew for t in ts]
        return int(row[0]) + 1

    async def _project(
        self,
        conn: psycopg.AsyncConnection[Any],
        run_id: str,
        update: IndexUpdate,
        *,
        numbered: bool = True,
    ) -> bool:
        """Inside the append's transaction, after it took the run row's lock: apply what its
        events change in the run index (ADR 0020); whether the run row changed. A changed row
        gets a change number, and a terminal status closes the run (ADR 0134), unless
        ``numbered`` is false (``finish_run`` numbers and closes it itself)."""
        for task_id, fields in update.tasks.items():
            sets = codec.index_columns(fields)
            await conn.execute(
                sql.SQL("UPDATE tasks SET {} WHERE run_id = %s AND task_id = %s").format(
                    _assignments(sets)
                ),
                (*sets.values(), run_id, task_id),
            )
        changed = False
        if update.starts:
            cur = await conn.execute(
                "UPDATE runs SET status = 'running' WHERE run_id = %s AND status = 'pending' "
                "RETURNING 1",
                (run_id,),
            )
            changed = await cur.fetchone() is not None
        if update.run:
            sets = codec.index_columns(update.run)
            await conn.execute(
                sql.SQL("UPDATE runs SET {} WHERE run_id = %s").format(_assignments(sets)),
                (*sets.values(), run_id),
            )
            changed = True
        if changed and numbered:
            change = await self._next_change(conn)
            await conn.execute(
                f"UPDATE runs SET updated_at = {_NOW}, change_seq = %s WHERE run_id = %s",
                (change, run_id),
            )
            if codec.closes_run(update.run.get("status")):
                await conn.execute(_CLOSE_ENDED, ([run_id],))
        return changed

    # -- ending runs, and leases ---------------------------------------------------------
    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        columns, projected, task_rows = codec.ending_rows(events, ending)
        codec.no_such_run(run_id)
        sets = codec.ending_columns(ending, updated_at=None)
        assignments = _assignments(sets)
        update = sql.SQL(
            "UPDATE runs SET {}, closed_at = {}, updated_at = {}, change_seq = %s WHERE run_id = %s"
        ).format(assignments, _CLOCK, _CLOCK)
        first = 0
        async with self._conn(f"finish run {run_id!r}", writes=True) as conn, conn.transaction():
            # The row lock serializes this with appends and with other processes finishing the
            # same run: exactly one of them closes it.
            cur = await conn.execute(
                f"SELECT {_OPEN}, lease_expires_at, owner FROM runs WHERE run_id = %s FOR UPDATE",
                (run_id,),
            )
            row = await cur.fetchone()
            if row is None:
                raise RunNotFoundError(run_id)
            if not row[0] or ending.lease_renewed(row[1]):
                return []
            if ending.held_by is not None:
                # Its own statement, after the row lock: a claim that held the lock has
                # committed its attempt, which a snapshot taken before the lock would not see.
                attempts = None
                if ending.held_by.attempt is not None:
                    spec = await (await conn.execute(_ATTEMPTS, (run_id,))).fetchone()
                    attempts = None if spec is None else int(spec[0])
                ending.check_holder(run_id, row[2], attempts)
            if task_rows:
                async with conn.cursor() as tcur:
                    await tcur.executemany(_UPSERT_TASK, task_rows)
            if columns[0]:
                first = await self._append_rows(conn, run_id, columns)
            if projected:
                await self._project(conn, run_id, projected, numbered=False)
            change = await self._next_change(conn)
            await conn.execute(update, (*sets.values(), change, run_id))
        self._runs_changed()
        out = codec.appended_events(run_id, first, columns) if columns[0] else []
        await self._committed(run_id, out)
        return out

    async def renew_leases(self, owner: str, ttl_s: float, run_ids: Collection[str]) -> list[str]:
        if not run_ids:
            return []
        async with self._conn("renew run leases", writes=True) as conn:
            cur = await conn.execute(
                f"UPDATE runs SET lease_expires_at = {_NOW} + %s "
                f"WHERE run_id = ANY(%s) AND owner = %s AND {_OPEN} RETURNING run_id",
                (ttl_s, list(run_ids), owner),
            )
            return [str(r[0]) for r in await cur.fetchall()]

    async def open_runs(
        self,
        *,
        limit: int = 1000,
        after: str | None = None,
        expired: bool = False,
        run_ids: Collection[str] | None = None,
    ) -> OpenRuns:
        query, params = open_runs_query(limit=limit, after=after, expired=expired, run_ids=run_ids)
        async with self._conn("list open runs") as conn:
            rows = await (await conn.execute(query, params)).fetchall()
            if not rows:
                return OpenRuns([], await self._server_now(conn))
        return OpenRuns([OpenRun(str(r[0]), r[1], r[2], r[3]) for r in rows], float(rows[0][4]))

    @staticmethod
    async def _server_now(conn: psycopg.AsyncConnection[Any]) -> float:
        row = await (await conn.execute(f"SELECT {_NOW}")).fetchone()
        return float(row[0]) if row else time.time()

    async def clock(self) -> float:
        async with self._conn("read the clock") as conn:
            return await self._server_now(conn)

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        return await self._decoded(run_id, await self._fetch(run_id, after, limit, apart), apart)

    async def read_types(
        self,
        run_id: str,
        types: Collection[str],
        *,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Event]:
        query, params = read_types_query(run_id, types, after=after, limit=limit)
        codec.no_such_run(run_id)
        async with self._conn(f"read events of run {run_id!r}") as conn:
            rows = await (await conn.execute(query, params)).fetchall()
            if not rows:  # runs are never deleted, so checking afterwards is race-free
                await self._require_run(conn, run_id)
        return codec.events_from_rows(run_id, rows)

    def read_ahead(self, run_id: str, *, after: int, limit: int, apart: bool = True) -> PageAhead:
        """The page's row is fetched by a task; its events are built when it is awaited, so a
        replay holds one page of events at a time (its pages ahead are their rows)."""
        fetched = asyncio.ensure_future(self._fetch(run_id, after, limit, apart))
        return _FetchedAhead(self, run_id, fetched, apart)

    async def _fetch(
        self, run_id: str, after: int, limit: int | None, apart: bool = True
    ) -> list[_Page]:
        """The aggregate rows of up to ``limit`` events after ``after``, one query per
        :data:`_PAGE_ROWS` events, on one connection. Binary results: integers and floats
        arrive as machine values (a float8 exactly), arrays as lists built by psycopg's C
        loaders."""
        codec.no_such_run(run_id)
        pages: list[_Page] = []
        left = _NO_LIMIT if limit is None else max(limit, 0)
        cursor = max(after, 0)
        async with self._conn(f"read events of run {run_id!r}") as conn:
            while left > 0:
                want = min(left, _PAGE_ROWS)
                page: tuple[Any, ...] | list[tuple[Any, ...]] | None
                try:
                    cur = await conn.execute(
                        _READ_PAGE[apart],
                        (run_id, cursor, codec.seq_page_end(cursor, want)),
                        binary=True,
                    )
                    page = await cur.fetchone()
                    count = 0 if page is None else int(page[0])
                except psycopg.errors.ProgramLimitExceeded:
                    # The page's payloads are longer than PostgreSQL's longest value (1 GB):
                    # read its rows.
                    cur = await conn.execute(
                        _READ[apart],
                        (run_id, cursor, codec.seq_page_end(cursor, want)),
                        binary=True,
                    )
                    page = await cur.fetchall()
                    count = len(page)
                if page is None or not count:
                    break
                pages.append((cursor, page))
                if count < want:
                    break
                left -= want
                cursor += want  # every sequence number in the range is there
            if not pages:  # runs are never deleted, so checking afterwards is race-free
                await self._require_run(conn, run_id)
        return pages

    async def _decoded(self, run_id: str, pages: list[_Page], apart: bool = True) -> list[Event]:
        """The events of fetched pages; a page of mixed vocabulary versions, or one whose
        columns the codec does not take (sequence numbers out of order), is read row by row."""
        events: list[Event] = []
        for k, (after, fetched) in enumerate(pages):
            if k:  # a long read: let the loop serve others between pages of _PAGE_ROWS
                await asyncio.sleep(0)
            if isinstance(fetched, list):
                events += codec.events_from_rows(run_id, fetched)
                continue
            count, last, task_ids, null_tasks, types, stamps, payloads, v_min, v_max = fetched[:9]
            parts = None
            if apart:  # (``events_page_parts``: the parts kept apart, joined here)
                apart_seqs, aparts = fetched[9:]
                parts = None if aparts is None else (apart_seqs, aparts)
            seqs = codec.page_range(after, count, last)
            page = None
            if v_min == v_max and seqs is not None:
                page = codec.events_from_columns(
                    run_id,
                    after + 1,
                    seqs,
                    codec.task_id_column(task_ids, null_tasks, after + 1, count),
                    codec.split_column(types, count),
                    stamps,
                    payloads,
                    v_min,
                    parts,
                )
            if page is None:  # the rows the aggregate read: all of (after, last]
                async with self._conn(f"read events of run {run_id!r}") as conn:
                    cur = await conn.execute(_READ[apart], (run_id, after, last), binary=True)
                    page = codec.events_from_rows(run_id, await cur.fetchall())
            events += page
        return events

    def _notified(self, payload: str) -> None:
        """``NOTIFY`` payload ``"<run_id> <last seq>"`` (the seq lets a live reader that already
        has those events, published by this process, skip a read)."""
        run_id, _, last = payload.rpartition(" ")
        if run_id and last.isdigit():
            self.wakeups.notify(run_id, int(last))
        else:  # a payload without a seq (an older thoughtgate): the whole payload is the run id
            self.wakeups.notify(payload)

    def live_poll_interval(self) -> float:
        """Re-read slowly while the listener is healthy (NOTIFY wakes live readers), else poll."""
        self._listener.start()
        return self.safety_poll if self._listener.healthy else self.poll_interval

    async def wait_for_new(self, run_id: str, after: int) -> None:
        """Wake on NOTIFY from any process; poll slowly while the listener is healthy."""
        armed = self.wakeups.arm(run_id)
        # (only whether there is one; also raises once the store is closed)
        if await self.read(run_id, after=after, limit=1, apart=False):
            return
        self._listener.start()
        timeout = self.safety_poll if self._listener.healthy else self.poll_interval
        await self.wakeups.wait(run_id, timeout, armed=armed)

    async def wait_for_run_changes(self, after: int, *, poll_s: float | None = None) -> None:
        """Wake on NOTIFY from any process (``_runs_changed``); poll slowly while the listener is
        healthy, and soon while committed changes wait for an older transaction to end (no
        wake-up need follow that end: ``horizon_poll``)."""
        self._listener.start()
        armed = self.wakeups.arm(listing.RUN_LIST_WAKEUP)
        async with self._conn("look for run changes") as conn:
            row = await self._horizon_read(conn, "since", {"after": after})
            if not row[1]:
                self.horizon.moved()
            elif self.horizon.due():
                await self.horizon.warn(conn, int(row[2]))
        if row[0]:
            return
        if row[1]:
            poll_s = self.horizon_poll
        elif poll_s is None:
            poll_s = self.safety_poll if self._listener.healthy else self.list_poll_interval
        await self.wakeups.wait(listing.RUN_LIST_WAKEUP, poll_s, armed=armed)

    @staticmethod
    async def _require_run(conn: psycopg.AsyncConnection[Any], run_id: str) -> None:
        found = await conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,))
        if await found.fetchone() is None:
            raise RunNotFoundError(run_id)

    # -- the backfill of ADR 0167 -----------------------------------------------------------
    async def inline_candidates(self) -> int:
        typed, types = codec.lifecycle_types_sql("%s", codec.apart_types())
        query = f"SELECT count(*) FROM events WHERE apart IS NULL AND {typed}"
        async with self._conn("count the rows keeping reasoning inline") as conn:
            row = await (await conn.execute(query, types)).fetchone()
        return 0 if row is None else int(row[0])

    async def move_apart(
        self,
        after: apart_backfill.Cursor | None = None,
        *,
        dry_run: bool = False,
        batch: int = apart_backfill.BATCH,
    ) -> apart_backfill.ApartPage:
        """The window is read outside any transaction; its rows are moved in transactions of
        ``batch`` rows or :data:`BATCH_BYTES`, each locking the rows it moves and nothing else:
        appends (new rows) and reads go on meanwhile (ADR 0167)."""
        start = apart_backfill.START if after is None else after
        types = codec.apart_types()
        async with self._conn("find rows keeping reasoning inline") as conn:
            cur = await conn.execute(_WINDOW_END, (*start, apart_backfill.WINDOW - 1))
            last = await cur.fetchone()
            end = None if last is None else (str(last[0]), int(last[1]))
            if end is None:
                cur = await conn.execute(_INLINE_ROWS, (*start, *types))
            else:
                cur = await conn.execute(_INLINE_ROWS_TO, (*start, *end, *types))
            keys = [(str(r[0]), int(r[1])) for r in await cur.fetchall()]
        moved, k = 0, 0
        refused: list[apart_backfill.Cursor] = []
        while k < len(keys):
            chunk = keys[k : k + max(batch, 1)]
            action = f"move reasoning apart in run {chunk[0][0]!r}"
            async with self._conn(action, writes=not dry_run) as conn, conn.transaction():
                step = await _move_rows(conn, chunk, dry_run=dry_run)
            k, moved = k + step.done, moved + step.moved
            refused.extend(step.refused)
        return apart_backfill.ApartPage(len(keys), moved, tuple(refused), end)

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
        """The run's times are kept on the server's clock (ADR 0066): it is created and updated
        at the server's now, and the lease and ``queued_at`` the caller stamped on its own clock
        are carried over by the two clocks' difference, measured here (so a lease keeps the
        length it was given, and a run queued a minute ago stays queued a minute ago). ``run``
        then holds the times stored, as a reader will see them."""
        tasks = [codec.task_row(t) for t in run.tasks]
        columns = codec.encode_events(list(events))
        update = batch_update(events)
        first = 0
        async with (
            self._conn(f"create run {run.run_id!r}", writes=True) as conn,
            conn.transaction(),
        ):
            now_row = await (await conn.execute(f"SELECT {_NOW}")).fetchone()
            now = float(now_row[0]) if now_row else time.time()
            stored, spec = _on_the_server_clock(run, spec, now, now - time.time())
            verdict = durable.Admission(True)
            if quota is not None:
                # One key's admissions queue up on this lock (held until commit), on every
                # replica, so counting and inserting are one step and the quota holds exactly.
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"thoughtgate:{self.schema}:quota:{quota.key_id}",),
                )
                verdict = durable.quota_verdict(quota, await _key_usage(conn, quota, now), now)
                if not verdict.admitted:
                    return verdict
            change = await self._next_change(conn)
            await conn.execute(_INSERT_RUN, (*codec.run_row(stored), change))
            if codec.closes_run(stored.status):
                await conn.execute(_CLOSE_ENDED, ([run.run_id],))
            if tasks:
                async with conn.cursor() as cur:
                    await cur.executemany(_UPSERT_TASK, tasks)
            await conn.execute(_INSERT_SPEC, codec.spec_row(spec, created_at=now))
            if columns[0]:  # the opening events, in the same transaction
                first = await self._append_rows(conn, run.run_id, columns)
                if update:
                    await self._project(conn, run.run_id, update)
        run.created_at, run.updated_at = stored.created_at, stored.updated_at
        run.lease_expires_at = stored.lease_expires_at
        self._runs_changed()
        if columns[0]:
            await self._committed(run.run_id, codec.appended_events(run.run_id, first, columns))
        return verdict

    async def get_run_spec(self, run_id: str) -> durable.RunSpecRecord | None:
        if not column_storable(run_id):  # no such run (``codec.no_such_run``)
            return None
        async with self._conn(f"read the spec of run {run_id!r}") as conn:
            cur = await conn.execute(
                f"SELECT {codec.SPEC_COLUMNS} FROM run_specs WHERE run_id = %s", (run_id,)
            )
            row = await cur.fetchone()
        return None if row is None else codec.spec_from_row(row)

    async def get_run_specs(self, run_ids: Collection[str]) -> dict[str, durable.RunSpecRecord]:
        if not run_ids:
            return {}
        async with self._conn(f"read the specs of {len(run_ids)} runs") as conn:
            cur = await conn.execute(
                f"SELECT {codec.SPEC_COLUMNS} FROM run_specs WHERE run_id = ANY(%s)",
                (list(run_ids),),
            )
            rows = await cur.fetchall()
        return {spec.run_id: spec for spec in map(codec.spec_from_row, rows)}

    async def claim_run(
        self, run_id: str, owner: str, ttl_s: float, *, attempt: int | None = None
    ) -> int | None:
        async with self._conn(f"claim run {run_id!r}", writes=True) as conn, conn.transaction():
            if attempt is not None:
                # From the owner's hold at ``attempt`` only (ADR 0099), read as ``release_run``
                # reads it: on both rows locked, so a claim in flight is seen as it commits.
                cur = await conn.execute(
                    "SELECT 1 FROM runs r JOIN run_specs s USING (run_id) WHERE r.run_id = %s "
                    "AND r.owner = %s AND s.attempts = %s FOR UPDATE OF r, s",
                    (run_id, owner, attempt),
                )
                if await cur.fetchone() is None:
                    return None
            cur = await conn.execute(
                f"UPDATE runs SET owner = %s, lease_expires_at = {_NOW} + %s, status = 'running', "
                f"updated_at = {_NOW} WHERE run_id = %s AND {_OPEN} "
                "AND (owner IS NULL OR owner = %s) "
                "AND EXISTS (SELECT 1 FROM run_specs s WHERE s.run_id = runs.run_id) "
                "RETURNING run_id",
                (owner, ttl_s, run_id, owner),
            )
            if await cur.fetchone() is None:
                return None
            cur = await conn.execute(
                "UPDATE run_specs SET attempts = attempts + 1, queued_at = NULL WHERE run_id = %s "
                "RETURNING attempts",
                (run_id,),
            )
            row = await cur.fetchone()
            await conn.execute(  # its status may have changed: a change for the run list
                "UPDATE runs SET change_seq = %s, claim = %s WHERE run_id = %s",
                (await self._next_change(conn), None if row is None else row[0], run_id),
            )
        self._runs_changed()
        return None if row is None else int(row[0])

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
        held = "r.owner = %(owner)s" if owner is not None else "r.owner IS NULL"
        lease = (
            " AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= %(by)s)"
            if lease_expired_by is not None
            else ""
        )
        waiting = "" if owner is not None else " AND s.queued_at IS NULL"
        # The releasing execution's claim is still the last (ADR 0093). Read on the locked row
        # of ``run_specs``: a release that waited for a claim's locks re-checks both rows as
        # the claim left them (READ COMMITTED re-evaluates a locking read on the new versions).
        claim = " AND s.attempts = %(attempt)s" if attempt is not None else ""
        params = {
            "run_id": run_id,
            "owner": owner,
            "by": lease_expired_by,
            "queue": queue,
            "attempt": attempt,
        }
        async with self._conn(f"release run {run_id!r}", writes=True) as conn, conn.transaction():
            # The row lock orders this with claims and renewals of the same run.
            cur = await conn.execute(
                "SELECT r.metadata FROM runs r JOIN run_specs s USING (run_id) "
                "WHERE r.run_id = %(run_id)s AND r.status IN ('pending', 'running') "
                f"AND r.closed_at IS NULL AND {held}{lease}{waiting}{claim} FOR UPDATE OF r, s",
                params,
            )
            found = await cur.fetchone()
            if found is None:
                return False
            await conn.execute(
                "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE run_id = %(run_id)s",
                params,
            )
            await conn.execute(
                "UPDATE run_specs SET queued_at = CASE WHEN %(queue)s THEN "
                f"{_NOW} ELSE NULL END WHERE run_id = %(run_id)s",
                params,
            )
            if metadata is not None:  # why it waits, in the release's transaction (ADR 0112)
                merged = codec.merged_metadata(codec.decode_object(found[0]), metadata)
                params["metadata"] = codec.dumps(merged, what="run metadata")
                params["change"] = await self._next_change(conn)
                await conn.execute(
                    f"UPDATE runs SET metadata = %(metadata)s, updated_at = {_NOW}, "
                    "change_seq = %(change)s WHERE run_id = %(run_id)s",
                    params,
                )
        if metadata is not None:
            self._runs_changed()
        return True

    async def requeue_run(self, run_id: str, *, queued_at: float) -> bool:
        async with self._conn(f"queue run {run_id!r} again", writes=True) as conn:
            cur = await conn.execute(
                f"UPDATE run_specs s SET queued_at = {_NOW} FROM runs r "
                "WHERE s.run_id = %(run_id)s AND r.run_id = s.run_id AND s.queued_at = %(at)s "
                f"AND {_OPEN} AND r.owner IS NULL RETURNING s.run_id",
                {"run_id": run_id, "at": queued_at},
            )
            return await cur.fetchone() is not None

    async def save_run_queue(self, queue: durable.RunQueueRecord) -> None:
        tools = codec.dumps(list(queue.tools), what="queue tools")
        async with self._conn(f"save run queue {queue.name!r}", writes=True) as conn:
            await conn.execute(
                "INSERT INTO run_queues (name, tools, concurrency, seen_at) "
                f"VALUES (%s, %s, %s, {_NOW}) ON CONFLICT (name) DO UPDATE SET "
                "tools = excluded.tools, concurrency = excluded.concurrency, "
                "seen_at = excluded.seen_at",
                (queue.name, tools, queue.concurrency),
            )

    async def list_run_queues(self, *, seen_within_s: float) -> list[durable.RunQueueRecord]:
        async with self._conn("list run queues") as conn:
            cur = await conn.execute(
                f"SELECT name, tools, concurrency, seen_at FROM run_queues WHERE seen_at >= "
                f"{_NOW} - %s ORDER BY name",
                (seen_within_s,),
            )
            rows = await cur.fetchall()
        return [
            durable.RunQueueRecord(str(r[0]), tuple(json.loads(r[1])), int(r[2]), float(r[3]))
            for r in rows
        ]

    # -- API keys and secrets ------------------------------------------------------------
    async def save_api_key(self, key: ApiKeyRecord) -> None:
        """A new key's ``created_at`` is stored on the server's clock, and ``key`` given it."""
        params = dict(zip(_KEY_FIELDS, codec.key_row(key), strict=True))
        async with self._conn(f"save API key {key.name!r}", writes=True) as conn:
            params["sent"] = time.time()
            row = await (await conn.execute(_UPSERT_KEY, params)).fetchone()
        if row is not None:
            key.created_at = float(row[0])

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        async with self._conn("list API keys") as conn:
            cur = await conn.execute(f"{_KEY_SELECT} ORDER BY created_at, insert_order")
            return [codec.key_from_row(r) for r in await cur.fetchall()]

    async def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        if codec.no_such_key(key_id):
            return None
        async with self._conn("look up an API key") as conn:
            cur = await conn.execute(f"{_KEY_SELECT} WHERE key_id = %s", (key_id,))
            row = await cur.fetchone()
        return None if row is None else codec.key_from_row(row)

    async def find_api_key(self, key_hash: str) -> ApiKeyRecord | None:
        if codec.no_such_key(key_hash):
            return None
        async with self._conn("look up an API key") as conn:
            cur = await conn.execute(
                f"{_KEY_SELECT} WHERE key_hash = %s AND revoked_at IS NULL LIMIT 1", (key_hash,)
            )
            row = await cur.fetchone()
        return None if row is None else codec.key_from_row(row)

    async def revoke_api_key(self, key_id: str) -> bool:
        if codec.no_such_key(key_id):
            return False
        async with self._conn(f"revoke API key {key_id!r}", writes=True) as conn:
            cur = await conn.execute(
                f"UPDATE api_keys SET revoked_at = {_NOW} WHERE revoked_at IS NULL AND key_id = %s",
                (key_id,),
            )
            return cur.rowcount > 0

    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        action = f"store secret {name!r}"
        async with self._conn(action, writes=True) as conn:
            # Two statements on purpose: the SELECT must take a snapshot after a concurrent
            # creator's commit (which ON CONFLICT waited for), or it would see no row at all.
            await conn.execute(
                f"INSERT INTO secrets (name, value, created_at) VALUES (%s, %s, {_NOW}) "
                "ON CONFLICT (name) DO NOTHING",
                (name, candidate),
            )
            cur = await conn.execute("SELECT value FROM secrets WHERE name = %s", (name,))
            row = await cur.fetchone()
        if row is None:  # impossible unless someone deletes secrets behind our back
            raise StoreError(f"cannot {action}: secret {name!r} vanished ({self._where})")
        return str(row[0])


def _on_the_server_clock(
    run: RunRecord, spec: durable.RunSpecRecord, now: float, offset: float
) -> tuple[RunRecord, durable.RunSpecRecord]:
    """Copies of an admission's records with their times on the server's clock: created and
    updated ``now``; the lease and ``queued_at`` (stamped on this process's clock) moved by
    ``offset``, the server's clock less this process's. A replica whose clock is an hour behind
    would otherwise admit a run whose lease every other replica finds expired an hour ago, or
    queued an hour before it was (ADR 0066)."""
    lease = run.lease_expires_at
    queued = spec.queued_at
    stored = dataclasses.replace(
        run,
        created_at=now,
        updated_at=now,
        lease_expires_at=None if lease is None else lease + offset,
    )
    return stored, dataclasses.replace(spec, queued_at=None if queued is None else queued + offset)


async def _key_usage(
    conn: psycopg.AsyncConnection[Any], quota: durable.Quota, now: float
) -> durable.KeyUsage:
    """A key's usage in at most three rows, whatever its history: its open runs (found among the
    open runs of every key, not among the key's every run: a correlated subquery, so that the
    planner does not join the other way), the ``max_per_minute``-th newest start of the window
    (at most that many index entries), and the window's count only when that start exists (the
    key is refused; the message names it)."""
    cur = await conn.execute(
        f"SELECT count(*) FROM runs WHERE {_OPEN} AND "
        "(SELECT s.key_id FROM run_specs s WHERE s.run_id = runs.run_id) = %s",
        (quota.key_id,),
    )
    open_row = await cur.fetchone()
    open_runs = int(open_row[0]) if open_row else 0
    since = now - durable.WINDOW_S
    cur = await conn.execute(
        "SELECT created_at FROM run_specs WHERE key_id = %s AND created_at > %s "
        "ORDER BY created_at DESC LIMIT 1 OFFSET %s",
        (quota.key_id, since, quota.max_per_minute - 1),
    )
    pivot = await cur.fetchone()
    if pivot is None:
        return durable.KeyUsage(open_runs)
    cur = await conn.execute(
        "SELECT count(*) FROM run_specs WHERE key_id = %s AND created_at > %s",
        (quota.key_id, since),
    )
    starts = await cur.fetchone()
    return durable.KeyUsage(open_runs, float(pivot[0]), int(starts[0]) if starts else 0)


class _FetchedAhead:
    """A page being fetched by a task (``PostgresStore.read_ahead``)."""

    __slots__ = ("apart", "fetched", "run_id", "store")

    def __init__(
        self, store: PostgresStore, run_id: str, fetched: asyncio.Task[list[_Page]], apart: bool
    ) -> None:
        self.store, self.run_id, self.fetched, self.apart = store, run_id, fetched, apart

    def __await__(self) -> Generator[Any, None, list[Event]]:
        return self._events().__await__()

    async def _events(self) -> list[Event]:
        return await self.store._decoded(self.run_id, await self.fetched, self.apart)

    async def abandon(self) -> None:
        await abandon_task(self.fetched)

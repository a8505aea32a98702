"""Which running PostgreSQL transactions cannot number this store's run-list changes (ADR 0146).

A run-list reader takes the changes below the oldest transaction still running (ADR 0140). Any
transaction of the cluster counts -- another database's, another application's, a prepared one
-- so an idle or long transaction anywhere held every live run list of the server. But a
transaction's database is a fact that never changes: a backend is connected to one database for
its life, a prepared transaction stays in the database that prepared it, and neither can write a
table of another database. This learns which running transaction ids are such *foreign* ones, so
the readers' horizon (``postgres._PASSING_OVER``) can pass over them.

What is learned is only ever applied to snapshots taken after it was learned (the caller reads
again), and what cannot be placed is left out: it counts as possibly ours and holds the horizon,
as before. How it is learned, and why in that order:

1. ``pg_locks`` (readable by any role): every transaction holds an ``ExclusiveLock`` on its own id
   from just after its assignment to its end, with its backend's pid -- or no pid once prepared.
2. Then, in a later transaction, ``pg_stat_activity`` (any role sees ``datid``) for those pids,
   and ``pg_prepared_xacts`` (with its ``database``). A pid read in 1 that names another process
   by 2 (the first exited, its pid reused) can only mislead about a transaction that ended before
   2, which no later snapshot lists as running; read the other way round it could pin a new
   backend's id on an old backend's database. A transaction prepared between 1 and 2 was still
   its backend's in 1.

``pg_locks`` gives 32-bit ids; they are widened against the ``xmax`` read with them (every running
id is within 2^31 of it). The sets hold only what was running at the last lesson (plus what has
not ended below a reader's ``xmin`` since), so they stay as small as the server's transactions.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

__all__ = ["ForeignXids", "widen_xid"]

_RUNNING = (
    "SELECT transactionid::text::bigint, pid, pg_snapshot_xmax(pg_current_snapshot())::text::bigint, "
    "pg_is_in_recovery() FROM pg_locks "
    "WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted"
)
"""Every running transaction id (32 bits), with its backend's pid (``NULL``: prepared)."""
_PLACES = (
    "SELECT a.pid, NULL::bigint, a.datid <> d.oid FROM pg_stat_activity AS a, pg_database AS d "
    "WHERE d.datname = current_database() AND a.pid = ANY(%s) "
    "UNION ALL SELECT NULL, transaction::text::bigint, database <> current_database() "
    "FROM pg_prepared_xacts"
)
"""Whether each backend, and each prepared transaction, is of another database (``NULL``: a
process connected to none, which counts as possibly ours)."""

_WRAP = 1 << 32


def widen_xid(xid32: int, reference: int) -> int:
    """The 64-bit id whose low 32 bits are ``xid32``, nearest ``reference`` (a 64-bit id within
    2^31 of it: PostgreSQL keeps every running id that close to the next one)."""
    delta = (xid32 - reference) % _WRAP
    if delta >= _WRAP // 2:
        delta -= _WRAP
    return reference + delta


class ForeignXids:
    """Running transaction ids learned to be of another database, for one store's readers.

    ``foreign()`` is what a reader's horizon may pass over. ``learn(conn, holder)`` is called when
    committed changes wait behind ``holder`` (the oldest id the horizon still counts): it places
    every running transaction, unless ``holder`` is already known to be of this database (it
    holds; looking again would not change that) or was tried in the last ``retry_after`` seconds
    without being placed (a transaction between its id and its lock, or a standby's, which lists
    none)."""

    #: How soon an id that could not be placed is tried again.
    retry_after: float = 1.0

    def __init__(self) -> None:
        self._foreign: set[int] = set()
        self._local: set[int] = set()
        self._tried: dict[int, float] = {}
        self._lock = asyncio.Lock()

    def foreign(self) -> list[int]:
        """The ids a reader's horizon may pass over (for its statement's parameter)."""
        return list(self._foreign)

    def ended_below(self, xmin: int) -> None:
        """A reader's snapshot had ``xmin``: every id below it has ended and no snapshot lists it
        again. Forgotten, so the sets do not keep ended ids until the next lesson."""
        if any(x < xmin for x in self._foreign):
            self._foreign = {x for x in self._foreign if x >= xmin}
        if any(x < xmin for x in self._local):
            self._local = {x for x in self._local if x >= xmin}

    async def learn(self, conn: psycopg.AsyncConnection[Any], holder: int) -> bool:
        """Place the running transactions if ``holder`` is not placed yet; whether it turned out
        foreign (the caller reads again: its horizon may move past it). ``conn`` is in autocommit
        mode: each statement its own transaction, so ``pg_stat_activity`` is read afresh."""
        async with self._lock:
            if holder in self._foreign:
                return True  # learned by another reader meanwhile
            if holder in self._local or time.monotonic() - self._tried.get(holder, -1e9) < (
                self.retry_after
            ):
                return False
            await self._place(conn)
            if holder in self._foreign:
                return True
            if holder not in self._local:
                now = time.monotonic()
                self._tried = {x: t for x, t in self._tried.items() if now - t < self.retry_after}
                self._tried[holder] = now
            return False

    async def _place(self, conn: psycopg.AsyncConnection[Any]) -> None:
        running = await (await conn.execute(_RUNNING)).fetchall()
        if not running or running[0][3]:
            return  # nothing running, or a standby: its snapshots list no running ids to filter
        reference = int(running[0][2])
        pids = sorted({int(r[1]) for r in running if r[1] is not None})
        places = await (await conn.execute(_PLACES, (pids,))).fetchall()
        by_pid: dict[int, bool | None] = {int(p): f for p, _, f in places if p is not None}
        prepared: dict[int, bool | None] = {int(x) % _WRAP: f for p, x, f in places if p is None}
        foreign: set[int] = set()
        local: set[int] = set()
        for xid32, pid, _, _ in running:
            places_of, key = (by_pid, int(pid)) if pid is not None else (prepared, int(xid32))
            if key not in places_of:
                continue  # ended before step 2: no later snapshot lists it
            (foreign if places_of[key] is True else local).add(widen_xid(int(xid32), reference))
        alive = {widen_xid(int(r[0]), reference) for r in running}
        self._foreign = (self._foreign & alive) | foreign
        self._local = (self._local & alive) | local

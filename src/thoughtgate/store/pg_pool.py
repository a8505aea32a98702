"""The PostgreSQL store's connections: a ``psycopg_pool`` pool of autocommit connections.

Each connection is set up once when the pool opens it (search path, JSON loaders: ``configure``),
lent to one task at a time, and dropped rather than reused when it may be in an unknown state --
the pool closes a connection returned broken, mid-query (a cancelled call) or in a failed
transaction, and rolls back one returned inside a transaction.

An idle connection the server has hung up on (a restart, a failover, ``pg_terminate_backend``, a
proxy's idle timeout) is noticed before it is lent (``check``): an idle connection has nothing to
read unless the server spoke first, which is nearly always its goodbye. One ``poll`` per lend
finds it without a round trip, and the caller gets a fresh connection instead of an error. (A
connection lost *during* a call still fails that call: whether its statement committed cannot be
known, so it is not retried.)

The pool opens no connection until one is asked for (``min_size=0``), and a caller waits for a
free connection at most ``wait_s`` (then ``PoolTimeout``, a ``psycopg.OperationalError``, which
``pg_errors`` reports as the store being unavailable).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from thoughtgate.errors import UsageError

__all__ = ["LOCK_POLL_S", "POOL_WAIT_S", "connect", "open_pool", "poll_advisory_lock"]

Setup = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]


def _check_decodable(conninfo: str) -> None:
    """Refuse a URL whose ``%``-escapes are not UTF-8 (a password typed as ``%87``): libpq reads
    it, but psycopg cannot decode what libpq read and would raise ``UnicodeDecodeError`` from
    deep inside ``connect`` -- a traceback instead of a usage error. The message names no part
    of the URL: the undecodable piece is most likely the password."""
    try:
        psycopg.conninfo.conninfo_to_dict(conninfo)
    except UnicodeDecodeError:
        raise UsageError(
            "the PostgreSQL store URL holds a %-escape that is not UTF-8 text (such as %87 "
            "alone); escape each character of a user name, password or database name as "
            "UTF-8 (Python: urllib.parse.quote(password, safe=''))"
        ) from None
    except psycopg.ProgrammingError:
        pass  # libpq's own words, translated where the connection is made


async def connect(conninfo: str, *, application_name: str) -> psycopg.AsyncConnection[Any]:
    """One autocommit connection outside the pool (migrations, the LISTEN connection)."""
    _check_decodable(conninfo)
    return await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, application_name=application_name
    )


LOCK_POLL_S = 0.2
"""How often a process waiting for another's advisory lock asks again (a set-up takes seconds)."""


async def poll_advisory_lock(
    conn: psycopg.AsyncConnection[Any],
    key: str,
    *,
    wait_s: float | None = None,
    waiting: Callable[[], None] | None = None,
) -> bool:
    """Take the session advisory lock keyed by ``hashtext(key)`` on ``conn``, asking until it
    is granted, or for ``wait_s`` at most (then ``False``); ``waiting`` is called once, when the
    first ask is refused. Never waits inside a statement: a statement that waits for a lock
    keeps its snapshot, and the holder's ``CREATE INDEX CONCURRENTLY`` waits for every older
    snapshot of the database -- it would wait for its waiters, and the deadlock detector would
    abort one of them (ADRs 0062, 0082). The lock ends with the session, or
    ``pg_advisory_unlock``."""
    deadline = None if wait_s is None else time.monotonic() + wait_s
    said = False
    # The key is written into the statement, not sent as a parameter: ``pg_stat_activity.query``
    # then names what a waiting (or holding) process sets up -- its schema -- which is what tells
    # its connections apart from those of processes on other schemas, over a Unix socket too,
    # where a connection has no client address or port to go by.
    asks = sql.SQL("SELECT pg_try_advisory_lock(hashtext({}))").format(sql.Literal(key))
    while True:
        cur = await conn.execute(asks)
        row = await cur.fetchone()
        if row is not None and row[0]:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if not said and waiting is not None:
            waiting()
        said = True
        await asyncio.sleep(LOCK_POLL_S)


POOL_WAIT_S = 30.0
"""How long a call waits for a pooled connection by default (then ``PoolTimeout``)."""


async def open_pool(
    conninfo: str, *, size: int, setup: Setup, application_name: str, wait_s: float = POOL_WAIT_S
) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
    """At most ``size`` connections, each set up with ``setup`` when it is opened."""
    _check_decodable(conninfo)
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
        conninfo,
        kwargs={"autocommit": True, "application_name": application_name},
        min_size=0,
        max_size=size,
        open=False,
        configure=setup,
        check=_check_not_hung_up,
        timeout=wait_s,
        name=application_name,
    )
    await pool.open()
    return pool


async def _check_not_hung_up(conn: psycopg.AsyncConnection[Any]) -> None:
    """Raise for an idle connection that is closed or has unread input (the server spoke unasked),
    closing it first: the pool drops a closed connection, opens another in its place and lends
    that one (an open connection that fails its check would go back to the pool as it is)."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    try:
        poller = select.poll()  # not select.select: a busy daemon's descriptors exceed 1024
        poller.register(conn.fileno(), select.POLLIN)
        hung_up = bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        hung_up = True
    if hung_up:
        with contextlib.suppress(psycopg.Error, OSError):
            await conn.close()
        raise psycopg.OperationalError("the server closed the idle connection")

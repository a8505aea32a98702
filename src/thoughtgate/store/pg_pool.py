"""A small pool of autocommit PostgreSQL connections.

``psycopg_pool`` is not a dependency, and the store needs little: a bounded number of
connections, each set up once (search path, JSON loaders), handed out one task at a time, and
dropped rather than reused when it may be in an unknown state (connection lost, cancelled
mid-query, transaction left open).

An idle connection the server has hung up on (a restart, a failover, ``pg_terminate_backend``, a
proxy's idle timeout) is noticed before it is lent: an idle connection has nothing to read unless
the server spoke first, which is nearly always its goodbye. One ``poll`` per lend finds it, and the
caller gets a fresh connection instead of an error. (A connection lost *during* a call still fails
that call: whether its statement committed cannot be known, so it is not retried.)
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

__all__ = ["PgPool", "connect"]

Setup = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]


async def connect(conninfo: str, *, application_name: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, application_name=application_name
    )


class PgPool:
    """At most ``size`` connections; ``connection()`` lends one for the duration of a block."""

    def __init__(self, conninfo: str, *, size: int, setup: Setup, application_name: str) -> None:
        self._conninfo = conninfo
        self._setup = setup
        self._application_name = application_name
        self._slots = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self.closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._slots:
            conn = await self._take_idle() or await self._open()
            try:
                yield conn
            finally:
                reusable = (
                    not self.closed
                    and not conn.closed
                    and conn.info.transaction_status == TransactionStatus.IDLE
                )
                if reusable:
                    self._idle.append(conn)
                else:
                    await _close_quietly(conn)

    async def _take_idle(self) -> psycopg.AsyncConnection[Any] | None:
        while self._idle:
            conn = self._idle.pop()
            if not _hung_up(conn):
                return conn
            await _close_quietly(conn)
        return None

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        conn = await connect(self._conninfo, application_name=self._application_name)
        try:
            await self._setup(conn)
        except BaseException:
            await _close_quietly(conn)
            raise
        return conn

    async def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close_quietly(conn)


def _hung_up(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection is closed, or has unread input (the server spoke unasked)."""
    if conn.closed or conn.broken:
        return True
    try:
        poller = select.poll()  # not select.select: a busy daemon's descriptors exceed 1024
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()

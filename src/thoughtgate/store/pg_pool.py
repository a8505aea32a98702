"""A small pool of autocommit PostgreSQL connections.

``psycopg_pool`` is not a dependency, and the store needs little: a bounded number of
connections, each set up once (search path, JSON loaders), handed out one task at a time, and
dropped rather than reused when it may be in an unknown state (connection lost, cancelled
mid-query, transaction left open).
"""

from __future__ import annotations

import asyncio
import contextlib
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
            conn = self._idle.pop() if self._idle else await self._open()
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


async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()

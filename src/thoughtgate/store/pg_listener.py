"""One LISTEN connection per store, shared by all of its live tails, that survives being dropped.

After their appends commit, stores send ``NOTIFY <channel>, '<run_id> <last seq>'``
(``pg_notifier``), so the events are visible when it arrives, in every process listening on the
channel. The listener turns each notification into an in-process wake-up for that run.

Notifications sent while the listener is disconnected are lost. So after every (re)connect, once
``LISTEN`` is in force, it wakes *every* waiting tail: each re-reads from the last sequence number
it delivered, which picks up whatever was appended in the gap. While disconnected, tails fall back
to polling (``healthy`` is false).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from thoughtgate.store.pg_pool import connect

__all__ = ["PgListener"]

log = logging.getLogger(__name__)


class PgListener:
    """Started lazily by the first tail that has to wait; stopped by the store's ``close``."""

    #: Reconnect backoff bounds in seconds (doubling from the first to the second).
    backoff = (0.05, 2.0)

    def __init__(
        self,
        conninfo: str,
        channel: str,
        *,
        application_name: str,
        on_notify: Callable[[str], None],
        on_connected: Callable[[], None],
    ) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._application_name = application_name
        self._on_notify = on_notify
        self._on_connected = on_connected
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.healthy = False
        self.connections = 0
        """How many times LISTEN has been established (1 + reconnects); useful to operators."""

    def start(self) -> None:
        """Start listening, or start again if the task ended though nobody stopped it."""
        if self._stopped:
            return
        task = self._task
        if task is not None and task.done():
            if not task.cancelled() and task.exception() is not None:
                log.error(
                    "LISTEN %s had stopped; restarting it", self._channel, exc_info=task.exception()
                )
            task = None
        if task is None:
            self._task = asyncio.create_task(self._run(), name=f"listen {self._channel}")

    async def stop(self) -> None:
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        delay = self.backoff[0]
        while True:
            try:
                await self._listen()
                delay = self.backoff[0]  # a clean end (server closed us): retry promptly
            except (psycopg.Error, OSError) as exc:
                log.warning("LISTEN %s lost (%s); reconnecting in %.2fs", self._channel, exc, delay)
            except Exception:  # a bug of ours: never worth giving up the tails' wake-ups for
                log.exception("LISTEN %s failed; reconnecting in %.2fs", self._channel, delay)
            finally:
                self.healthy = False
                conn, self._conn = self._conn, None
                if conn is not None:
                    with contextlib.suppress(psycopg.Error, OSError):
                        await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff[1])

    async def _listen(self) -> None:
        self._conn = conn = await connect(self._conninfo, application_name=self._application_name)
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        self.healthy = True
        self.connections += 1
        # Anything appended while we were not listening: re-read. A callback that raises is
        # logged and the listener carries on: LISTEN is in force whatever a callback did.
        self._call(self._on_connected)
        async for note in conn.notifies():
            self._call(self._on_notify, note.payload)

    def _call(self, callback: Callable[..., None], *args: str) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("LISTEN %s: a wake-up callback failed (%s)", self._channel, args)

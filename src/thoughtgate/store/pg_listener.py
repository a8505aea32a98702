"""One LISTEN connection per store, shared by all of its live tails, that survives being dropped.

After their appends commit, stores send ``NOTIFY <channel>, '<run_id> <last seq>'``
(``pg_notifier``), so the events are visible when it arrives, in every process listening on the
channel. The listener turns each notification into an in-process wake-up for that run.

Notifications sent while the listener is disconnected are lost. So after every (re)connect, once
``LISTEN`` is in force, it wakes *every* waiting tail: each re-reads from the last sequence number
it delivered, which picks up whatever was appended in the gap. While disconnected, tails fall back
to polling (``healthy`` is false).

An outage (ADR 0132 amendment 2) is warned about once, when the connection is lost, and said to be
over once (info), when ``LISTEN`` is in force again; the failed attempts in between are logged at
debug level. Attempts back off exponentially, from ``backoff[0]`` to at most ``backoff[1]``, each
wait a random time between half and all of its step, so that the replicas of a server that
restarted do not all reconnect in the same instant; a connection that listened starts the next
outage from the first step again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from thoughtgate.store.pg_pool import connect

__all__ = ["PgListener"]

log = logging.getLogger(__name__)


class PgListener:
    """Started lazily by the first tail that has to wait; stopped by the store's ``close``."""

    #: Reconnect backoff bounds in seconds: the n-th attempt in a row waits between half and all
    #: of ``min(first * 2 ** (n - 1), second)`` (``reconnect_delay``).
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
        self._lost_at: float | None = None  # the loop's time the current outage began
        self._failed = 0  # attempts in a row that did not end listening

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
        while True:
            listened = self.connections
            bug = False
            try:
                await self._listen()
                reason = "the server ended the connection"
            except (psycopg.Error, OSError) as exc:
                reason = next(iter(str(exc).strip().splitlines()), "") or type(exc).__name__
            except Exception as exc:  # a bug of ours: never worth giving up the tails' wake-ups
                reason, bug = repr(exc), True
            finally:
                self.healthy = False
                conn, self._conn = self._conn, None
                if conn is not None:
                    with contextlib.suppress(psycopg.Error, OSError):
                        await conn.close()
            if self.connections > listened:  # it listened: this is a new outage
                self._failed = 0
            self._failed += 1
            delay = self.reconnect_delay(self._failed)
            self._lost(reason, delay, bug=bug)
            await asyncio.sleep(delay)

    def reconnect_delay(self, failures: int) -> float:
        """The wait before the next attempt after ``failures`` in a row (1 for the first)."""
        first, most = self.backoff
        step = min(most, first * 2.0 ** min(failures - 1, 32))
        return random.uniform(step / 2, step)  # jitter: replicas of one server spread out

    def _lost(self, reason: str, delay: float, *, bug: bool) -> None:
        """Log a failed or ended connection: a warning the first time of an outage (an error
        with its traceback for a bug of ours), debug level for the attempts after it."""
        if self._lost_at is None:
            self._lost_at = asyncio.get_running_loop().time()
            log.log(
                logging.ERROR if bug else logging.WARNING,
                "LISTEN %s lost (%s); reconnecting in %.2fs, other replicas' appends reach "
                "this process's readers by their safety poll meanwhile (further attempts are "
                "logged at debug level until it is back)",
                self._channel,
                reason,
                delay,
                exc_info=bug,
            )
        else:
            log.debug(
                "LISTEN %s: attempt %d failed (%s); next in %.2fs",
                self._channel,
                self._failed - 1,
                reason,
                delay,
                exc_info=bug,
            )

    async def _listen(self) -> None:
        self._conn = conn = await connect(self._conninfo, application_name=self._application_name)
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        self.healthy = True
        self.connections += 1
        if self._lost_at is not None:
            log.info(
                "LISTEN %s back after %.1fs (%d attempt(s) failed before)",
                self._channel,
                asyncio.get_running_loop().time() - self._lost_at,
                self._failed - 1,
            )
            self._lost_at = None
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

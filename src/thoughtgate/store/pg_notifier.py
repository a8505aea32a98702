"""The wake-ups a store sends other replicas for the events it committed, coalesced (ADR 0132).

PostgreSQL serializes the commits of every transaction that sent ``NOTIFY`` across the whole
server, each holding a lock from before its commit record is flushed until it ends (ADR 0127).
An append that notified in its own statement therefore kept group commit from combining
concurrent appends' WAL flushes. So appends commit without a ``NOTIFY``, and this sends the
wake-ups after the commit, from one connection of its own, in a transaction that writes no WAL:
``committed`` notes the run and its last sequence number, and one task sends everything noted
since its previous send in one statement (one ``pg_notify`` per run, with its largest number,
and the run list's ``*runs`` when ``wake`` was told of a run-list change, ADR 0140),
``window_s`` after the first of them. However many appends commit in that window or while a send
is in flight, the next send is one transaction: a process sends at most one every ``window_s``
plus a round trip, and a wake-up reaches other replicas at most that much later than its commit.

The events are in the store before their wake-up is sent: the store is the source, the
notification only a hint. A wake-up that is never sent -- the process died between the commit
and the send, or the send failed twice -- leaves other replicas' readers to their safety poll
(``PostgresStore.safety_poll``), which re-reads from each reader's last sequence number.

A flaky network (ADR 0132 amendment 1): each attempt is bounded by ``send_timeout_s``, so a
connection that went silent (no reset, a server that stopped answering) costs one timeout, not
the kernel's TCP retransmission timeout, during which every later wake-up of the process would
wait behind it. A server that keeps refusing is warned about once, when the first wake-up is
given up, and said to be back at the next send that succeeds; the sends in between are logged at
debug level, not once every ``window_s``.

A retry waits (ADR 0132 amendment 2): the second attempt of a send waits ``retry_backoff_s``
(between half and all of it, at random) after the first failed, instead of following it at once
into a server that is restarting or a failover not yet over. The wait is the sending task's, not
an append's: appends only note their run (``committed``) and never wait for a send, and ``close``
ends a wait in progress as it ends a window, so its bound (``within``) is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

import psycopg

from thoughtgate.store.pg_pool import connect

__all__ = ["PgNotifier"]

log = logging.getLogger(__name__)

_SEND = "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p"


class PgNotifier:
    """Started by the first commit it is told of; ``close`` sends what is pending, then stops."""

    #: How long the first commit noted waits for others to share its send. One appender commits
    #: about once a millisecond: without a window each append cost a transaction of its own.
    window_s: float = 0.005
    #: One attempt (connecting included) longer than this is given up as failed: the connection
    #: is dropped and the next attempt opens a new one. A ``NOTIFY`` takes about a round trip.
    send_timeout_s: float = 10.0
    #: After a failed first attempt the second waits between half and all of this: long enough
    #: not to be refused by the same restart, short beside the readers' 3 s safety poll.
    retry_backoff_s: float = 0.1

    def __init__(self, conninfo: str, channel: str, *, application_name: str) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._application_name = application_name
        self._pending: dict[str, int] = {}
        self._woken: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._closed = False
        self._pause: asyncio.Future[None] | None = None  # a window or a retry's wait: ``close``
        # ends it, and the send goes at once
        self._failing = False
        self.sends = 0
        """Notifying transactions sent (each carries every run noted since the previous one)."""
        self.given_up = 0
        """Sends given up after their second attempt (their readers elsewhere poll instead)."""

    def committed(self, run_id: str, last_seq: int) -> None:
        """After a commit: wake other replicas' readers of ``run_id`` up to ``last_seq``."""
        if self._closed:
            return
        if last_seq > self._pending.get(run_id, 0):
            self._pending[run_id] = last_seq
        self._start()

    def wake(self, payload: str) -> None:
        """After a commit: send ``payload`` as it is, with the next send (the run list's wake-up,
        ADR 0140: what ``pg_notify`` sent in the change's transaction before)."""
        if self._closed:
            return
        self._woken.add(payload)
        self._start()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._send_pending(), name=f"notify {self._channel}")

    async def _send_pending(self) -> None:
        while self._pending or self._woken:
            await self._wait(self.window_s)
            noted, self._pending = self._pending, {}
            woken, self._woken = self._woken, set()
            payloads = [f"{run_id} {last}" for run_id, last in noted.items()] + sorted(woken)
            for attempt in (1, 2):  # a connection the server dropped since: once more, anew
                if attempt == 2:
                    await self._wait(random.uniform(self.retry_backoff_s / 2, self.retry_backoff_s))
                try:
                    async with asyncio.timeout(self.send_timeout_s):
                        await self._send(payloads)
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    await self._drop_connection()
                    if attempt == 2:
                        self._gave_up(exc, len(payloads))
                else:
                    if self._failing:
                        self._failing = False
                        log.info("NOTIFY %s sent again", self._channel)
                    break

    async def _wait(self, seconds: float) -> None:
        """``asyncio.sleep(seconds)``, cut short by ``close`` (as cheap: one future, one timer);
        after ``close``, one turn of the loop."""
        if seconds <= 0 or self._closed:  # no window (``bench/notify_bench.py``): as sleep(0)
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        self._pause = pause = loop.create_future()
        timer = loop.call_later(seconds, _end, pause)
        try:
            await pause
        finally:
            timer.cancel()
            self._pause = None

    def _gave_up(self, exc: BaseException, runs: int) -> None:
        self.given_up += 1
        # One warning an outage: a server that refuses for a minute would otherwise be reported
        # once every window, as long as this process appends.
        first, self._failing = not self._failing, True
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "NOTIFY %s failed (%s); other replicas' readers of %d run(s) wait for their safety "
            "poll%s",
            self._channel,
            str(exc) or type(exc).__name__,
            runs,
            " (further failures are logged at debug level until a send succeeds)" if first else "",
        )

    async def idle(self) -> None:
        """Return once nothing noted is waiting to be sent or being sent (sent or given up)."""
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    async def _send(self, payloads: list[str]) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = await connect(self._conninfo, application_name=self._application_name)
        await self._conn.execute(_SEND, (self._channel, payloads))
        self.sends += 1

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def close(self, *, within: float = 5.0) -> None:
        """Send what is still pending (a reader elsewhere should not wait for its poll because
        this store closed), then close the connection. A send that takes longer than ``within``
        (a server that does not answer) is cancelled: its readers have their poll."""
        self._closed = True
        if self._pause is not None:
            _end(self._pause)
        task, self._task = self._task, None
        if task is not None:
            await asyncio.wait({task}, timeout=within)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._drop_connection()


def _end(pause: asyncio.Future[None]) -> None:
    if not pause.done():
        pause.set_result(None)

"""Writes one run's events in order, batching the high-volume deltas.

``message.delta`` and ``reasoning.delta`` arrive once per provider chunk; committing each alone
would make a durable store fsync thousands of times per turn. They are buffered and flushed as one
atomic append every ``flush_interval`` seconds (or every ``max_batch`` events), and any other event
goes out in one append with the buffer before it, so recorded order is always emission order.
Events that happen together (a turn's response, its visible steps and the answer) are emitted
together with ``emit_all``: one commit, one write to each live reader.

A failed append is never skipped over: when the background flush of a window fails (the store is
full or unreachable), that batch is not stored, and the next ``emit``, ``emit_delta``, ``flush``
or ``close`` raises the same error, so the run ends failed instead of recording later events
after a hole in its log.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from thoughtgate.events.catalogue import check_new_events
from thoughtgate.events.schema import Event, NewEvent
from thoughtgate.store.log import EventLog, EventObserver

__all__ = ["EventRecorder", "EventSink"]

EventSink = EventObserver
"""Called with every batch right after it is durably appended (telemetry, live observers): the
log hands it over (``EventLog.observe``), whichever code path appended the batch."""


class EventRecorder:
    """Ordered, batched appends for one run."""

    def __init__(
        self,
        store: EventLog,
        run_id: str,
        *,
        flush_interval: float = 0.02,
        max_batch: int = 256,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self._buffer: list[NewEvent] = []
        self._lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._window_end = 0.0
        self.appended = 0
        self._failure: Exception | None = None

    async def emit(self, event: NewEvent) -> list[Event]:
        """Append ``event`` after everything buffered before it."""
        return await self.emit_all([event])

    async def emit_all(self, events: Sequence[NewEvent]) -> list[Event]:
        """Append ``events`` after everything buffered before them, in one atomic batch (a run
        resumed after a crash finds a step's events whole or not at all; events that happen
        together, such as a turn's end, cost one commit and reach live readers in one write)."""
        if not events:
            return []
        async with self._lock:
            self._raise_failure()
            batch = [*self._buffer, *events]
            self._buffer.clear()
            return await self._append(batch)

    async def emit_delta(self, event: NewEvent) -> None:
        """Append the first delta of a burst at once (a live reader gets the first byte without
        waiting for a window); later deltas wait until the window closes and go as one batch."""
        self._buffer.append(event)
        loop = asyncio.get_running_loop()
        pending = self._flusher is not None and not self._flusher.done()
        if len(self._buffer) >= self.max_batch or (not pending and loop.time() >= self._window_end):
            await self.flush()
            self._window_end = loop.time() + self.flush_interval
        elif not pending:
            self._flusher = asyncio.create_task(self._flush_at(self._window_end))

    async def _flush_at(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - asyncio.get_running_loop().time()))
        try:
            await self.flush()
        except Exception as exc:  # nobody awaits this task: hand the error to the next caller
            if self._failure is None:
                self._failure = exc
            return
        self._window_end = asyncio.get_running_loop().time() + self.flush_interval

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def flush(self) -> None:
        async with self._lock:
            self._raise_failure()
            if self._buffer:
                batch = list(self._buffer)
                self._buffer.clear()
                await self._append(batch)

    async def _append(self, batch: list[NewEvent]) -> list[Event]:
        if not batch:
            return []
        check_new_events(batch)
        try:
            out = await self.store.append(self.run_id, batch)
        except Exception as exc:
            # Once a batch is lost, nothing after it may be recorded: a later event would sit
            # behind a hole in the log. Every later emit, flush or close raises this error.
            if self._failure is None:
                self._failure = exc
            raise
        self.appended += len(out)
        return out

    async def close(self) -> None:
        try:
            await self.flush()
        finally:
            if self._flusher is not None and not self._flusher.done():
                self._flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._flusher

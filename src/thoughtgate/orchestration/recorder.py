"""Writes one run's events in order, batching the high-volume deltas.

``message.delta`` and ``reasoning.delta`` arrive once per provider chunk; committing each alone
would make a durable store fsync thousands of times per turn. They are buffered and flushed as one
atomic append every ``flush_interval`` seconds (or every ``max_batch`` events), and any other event
goes out in one append with the buffer before it, so recorded order is always emission order.

Deltas that continue the one buffered just before them (same type, task and payload but for
``text``: the same turn, part and reasoning kind) are recorded as that one delta with the texts
joined (ADR 0019). They would reach every reader in the same write at the same moment anyway;
recording them apart cost one event, one JSON payload and one row each (most of a long
stream's recording CPU) for nothing a reader can see: the text, its order, its part and the
moment it is delivered are the same. The first delta of a burst still goes out alone at once.
Events that happen together (a turn's response, its visible steps and the answer) are emitted
together with ``emit_all``: one commit, one write to each live reader.

Two waits a run used to spend in sequence are overlapped (ADR 0021, amended): ``start`` queues a
task's ``task.started`` without waiting for its commit, so the provider's stream opens while it
commits, and every later append first waits for that one (its order and its failure are kept;
on a store that keeps a queue's order, SQLite, the next append is queued behind it before that
wait, stored only if it was, and often shares its commit: ADR 0028);
with ``hold_last`` a task's last events (``emit_last``: the tail of its deltas, the last turn's
response, visible steps and answer) are held for the caller to store with the run's ending, one
commit instead of three. Either way no event reaches a reader before it is durable: readers see
only what the store committed.

A failed append is never skipped over: when the background flush of a window fails (the store is
full or unreachable), that batch is not stored, and the next ``emit``, ``emit_delta``, ``flush``
or ``close`` raises the same error, so the run ends failed instead of recording later events
after a hole in its log.

A batch that records a model turn (``agent.response``) is decided before a cancel that lands
while it is appended is raised: stored or not, so the execution's end can tell from the log
whether the billed turn's record is there (ADR 0131, amended).

Every append names the execution recording (``held_by``): the store refuses it once another
execution holds the run (``RunTakenOverError``, ADR 0090), and the execution stops there -- at
the next delta at the latest when the refused append was a window's background flush.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence

from thoughtgate.events.catalogue import check_new_events
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.store.log import EventLog, EventObserver, Holder, QueuedAppend

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
        hold_last: bool = False,
        held_by: Holder | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.held_by = held_by
        """The execution recording, which every append names (ADR 0090)."""
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self._buffer: list[NewEvent] = []
        self._pieces: list[str] = []
        """Texts of the buffer's last event while it is a delta that later deltas continue."""
        self._lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._window_end = 0.0
        self.appended = 0
        self._failure: Exception | None = None
        self._pending: QueuedAppend | None = None
        """The append ``start`` queued and nobody has waited for yet."""
        self.hold_last = hold_last
        self._held: list[NewEvent] = []
        """``emit_last``'s events while ``hold_last``: ``take_held`` hands them over, or else
        ``flush`` and ``close`` append them."""

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
            batch = [*self._take_buffer(), *events]
            return await self._append(batch)

    async def start(self, events: Sequence[NewEvent]) -> None:
        """Queue ``events``' append (after everything buffered) and return without waiting for
        its commit: the caller goes on (opens the provider's stream) while it commits. The next
        append, ``flush`` or ``close`` waits for it first and raises its error, if any."""
        check_new_events(events)
        async with self._lock:
            await self._settle()
            self._raise_failure()
            batch = [*self._take_buffer(), *events]
            queued = self.store.queue_append(self.run_id, batch, held_by=self.held_by)
            if queued is None:  # a store that cannot queue: the append runs as a task
                appended = self.store.append(self.run_id, batch, held_by=self.held_by)
                queued = _Started(asyncio.ensure_future(appended))
            self._pending = queued

    async def emit_last(self, events: Sequence[NewEvent]) -> None:
        """The task's last events. With ``hold_last`` they are held, with the deltas buffered
        before them, for the caller to store in the run's ending (``take_held``); else appended
        like ``emit_all``."""
        if not self.hold_last:
            await self.emit_all(events)
            return
        check_new_events(events)
        async with self._lock:
            await self._settle()
            self._raise_failure()
            self._held += [*self._take_buffer(), *events]

    def take_held(self) -> list[NewEvent]:
        """What ``emit_last`` held, now the caller's to store (not this recorder's any more)."""
        self._raise_failure()
        held = self._held
        self._held = []
        return held

    async def emit_delta(self, event: NewEvent) -> None:
        """Append the first delta of a burst at once (a live reader gets the first byte without
        waiting for a window); later deltas wait until the window closes and go as one batch,
        each joined to the delta before it when it continues that one."""
        if self._failure is not None:  # a window's flush failed: nothing goes after it
            raise self._failure
        buffer = self._buffer
        if self._pieces and _continues(buffer[-1], event):
            self._pieces.append(event.payload["text"])
        else:
            self._seal_last()
            buffer.append(event)
            if event.type in _TEXT_DELTAS and type(event.payload.get("text")) is str:
                self._pieces = [event.payload["text"]]
        loop = asyncio.get_running_loop()
        pending = self._flusher is not None and not self._flusher.done()
        if len(self._buffer) >= self.max_batch or (not pending and loop.time() >= self._window_end):
            await self.flush()
            self._window_end = loop.time() + self.flush_interval
        elif not pending:
            self._flusher = asyncio.create_task(self._flush_at(self._window_end))

    def extend_delta(self, event: NewEvent | None, text: str) -> bool:
        """Join ``text`` to ``event`` if that is the delta last buffered and not yet flushed.

        The caller (the agent loop) knows that ``text`` continues ``event``'s part, so this is the
        per-chunk fast path: no event is built, and no flush is due, since one is already
        scheduled for the buffered delta. ``False``: emit ``text`` in a delta of its own.
        """
        if self._pieces and self._failure is None and self._buffer[-1] is event:
            self._pieces.append(text)
            return True
        return False

    async def _flush_at(self, when: float) -> None:
        """Flush the buffer when its window closes at ``when``; then, while deltas came in
        during that append, again a window later. Nobody else would: ``emit_delta`` opens no
        window while this task runs, so such a delta used to wait for the run's next event,
        however long the provider then stayed silent."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, when - loop.time()))
            try:
                async with self._lock:  # the buffer only: what emit_last holds stays held
                    self._raise_failure()
                    if self._buffer:
                        await self._append(self._take_buffer())
            except Exception as exc:  # nobody awaits this task: hand the error to the next caller
                if self._failure is None:
                    self._failure = exc
                return
            when = self._window_end = loop.time() + self.flush_interval
            if not self._buffer:
                return

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def flush(self) -> None:
        async with self._lock:
            self._raise_failure()
            held = self._held
            self._held = []
            if held or self._buffer:
                await self._append([*held, *self._take_buffer()])  # after ``start``'s append
            else:
                await self._settle()

    def _seal_last(self) -> None:
        """Make the buffer's last delta carry the texts joined to it."""
        pieces = self._pieces
        if len(pieces) > 1:
            last = self._buffer[-1]
            payload = {**last.payload, "text": "".join(pieces)}
            self._buffer[-1] = NewEvent(last.type, payload, task_id=last.task_id, ts=last.ts)
        self._pieces = []

    def _take_buffer(self) -> list[NewEvent]:
        self._seal_last()
        batch = self._buffer
        self._buffer = []
        return batch

    async def _settle(self) -> None:
        """Wait for the append ``start`` queued: the next one goes after it, and not at all if
        it failed (its error is raised by every later emit, flush or close)."""
        pending = self._pending
        if pending is None:
            return
        try:
            out = await pending.wait()
        except Exception as exc:
            if self._failure is None:
                self._failure = exc
            raise
        finally:
            if pending.done():
                self._pending = None
        self.appended += len(out)

    async def _append(self, batch: list[NewEvent]) -> list[Event]:
        if not batch:
            return []
        check_new_events(batch)
        pending = self._pending
        queued = None
        if pending is not None:
            # Queued behind ``start``'s append without waiting for its commit (ADR 0028): the
            # store keeps their order and stores this one only if that one was stored, so the
            # task's first delta commits with or right after ``task.started``, not a commit
            # and two turns of the event loop after it.
            queued = self.store.queue_append(
                self.run_id, batch, after=pending, held_by=self.held_by
            )
        try:
            await self._settle()
        except BaseException:
            if queued is not None:
                await queued.abandon()
            raise
        try:
            appended = (
                self.store.append(self.run_id, batch, held_by=self.held_by)
                if queued is None
                else queued.wait()
            )
            out = await (self._decided(appended) if _records_a_turn(batch) else appended)
        except Exception as exc:
            # Once a batch is lost, nothing after it may be recorded: a later event would sit
            # behind a hole in the log. Every later emit, flush or close raises this error.
            if self._failure is None:
                self._failure = exc
            raise
        self.appended += len(out)
        return out

    async def _decided(self, append: Awaitable[list[Event]]) -> list[Event]:
        """``append``'s answer. A cancel that lands while it is under way waits until it is
        decided (a store call cancelled mid-way may commit all the same, ADR 0059), then is
        raised: the batch records a billed turn, and whoever ends the task next reads the log
        to know whether that turn's record is in it or its stand-in must be (ADR 0131,
        amended)."""
        task = asyncio.ensure_future(append)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])
            lost = None if task.cancelled() else task.exception()
            if isinstance(lost, Exception) and self._failure is None:
                self._failure = lost  # nothing goes after a lost batch
            raise

    async def close(self) -> None:
        flushed = False
        try:
            await self.flush()
            flushed = True
        finally:
            flusher = self._flusher
            if flusher is not None and not flusher.done():
                flusher.cancel()
                # After a flush the flusher holds nothing: it sleeps until its window, or waits
                # for the lock, and a cancel just ends it. Waiting for that cost the run's end a
                # turn of a busy event loop (~1 ms at 10 runs) before its ending was stored.
                # After a failed or cancelled flush it may be appending: wait for it then.
                if not flushed:
                    with contextlib.suppress(asyncio.CancelledError):
                        await flusher
            # A cancelled flusher keeps its CancelledError, whose traceback holds this recorder:
            # dropped, so the two are freed when the run lets go of them, not by the cyclic
            # collector (ADR 0138).
            self._flusher = None
            pending, self._pending = self._pending, None
            if pending is not None:  # cancelled or failed before anyone waited for it
                await pending.abandon()  # the error that matters was raised already


def _records_a_turn(batch: Sequence[NewEvent]) -> bool:
    return any(event.type == EventType.AGENT_RESPONSE for event in batch)


class _Started(QueuedAppend):
    """``start``'s append on a store that cannot queue appends: a task of its own."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Future[list[Event]]) -> None:
        self.task = task

    async def wait(self) -> list[Event]:
        return await self.task

    def done(self) -> bool:
        return self.task.done()

    async def abandon(self) -> None:
        self.task.cancel()
        await asyncio.wait([self.task])
        if not self.task.cancelled():
            self.task.exception()


_TEXT_DELTAS = frozenset({EventType.MESSAGE_DELTA, EventType.REASONING_DELTA})


def _continues(last: NewEvent, event: NewEvent) -> bool:
    """``event`` adds text to ``last``: the same delta type, task, and payload but for ``text``."""
    if last.type != event.type or last.task_id != event.task_id or event.type not in _TEXT_DELTAS:
        return False
    before, after = last.payload, event.payload
    if len(before) != len(after) or type(after.get("text")) is not str:
        return False
    for key, value in before.items():
        if key != "text" and after.get(key, _MISSING) != value:
            return False
    return True


_MISSING = object()

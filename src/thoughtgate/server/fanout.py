"""One store tail per live run in this process, shared by every live reader of that run.

Without it each SSE connection tails the store on its own: one append wakes N readers, each reads
the same new events from the database, filters and encodes them again. With it, one *feed* per run
reads each event once and offers it to every reader, and encoded frames are cached per (event,
role, mode): a thousand readers of a run cost one read and a few encodes per event, not a
thousand.

Correctness never rests on the feed. Each reader keeps its own cursor (the last sequence number
it yielded): it replays from the store until it has caught up, then takes events from the feed,
and whatever the feed cannot give it in order (it joined while the feed was behind or ahead, it
fell more than ``backlog`` events behind and was skipped, the feed stopped) it reads from the
store itself. So a reader never skips or repeats an event, whatever the timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable

from thoughtgate.access.filter import filter_event
from thoughtgate.access.roles import Role
from thoughtgate.events.schema import Event, is_run_terminal
from thoughtgate.store.base import EventStore

__all__ = ["RunFeeds", "replay"]

log = logging.getLogger("thoughtgate.server")

_PAGE = 500
_CACHE_ENTRIES = 4096
_CACHE_MAX_FRAME = 64 * 1024
"""Frames above this size (a long ``agent.response``) are encoded per reader, not kept."""


async def replay(store: EventStore, run_id: str, after: int) -> AsyncIterator[Event]:
    """The run's stored events after ``after``, up to its terminal event or the last one stored
    now (no waiting for more)."""
    cursor = after
    while True:
        page = await store.read(run_id, after=cursor, limit=_PAGE)
        for event in page:
            cursor = event.seq
            yield event
            if is_run_terminal(event.type):
                return
        if len(page) < _PAGE:
            return


class _Subscriber:
    """A reader's inbox: the feed appends without ever waiting; ``None`` means it stopped."""

    def __init__(self, backlog: int) -> None:
        self.backlog = backlog
        self.inbox: deque[Event | None] = deque()
        self.ready = asyncio.Event()

    def offer(self, event: Event | None) -> None:
        if event is None or len(self.inbox) < self.backlog:
            self.inbox.append(event)  # else skipped: the reader refills the gap from the store
        self.ready.set()

    async def next(self) -> Event | None:
        while not self.inbox:
            self.ready.clear()
            await self.ready.wait()
        return self.inbox.popleft()


class _Feed:
    """Tails one run from ``start`` and offers every event to every subscriber."""

    def __init__(self, store: EventStore, run_id: str, start: int, on_end: Callable[[], None]):
        self.subscribers: set[_Subscriber] = set()
        self.done = False
        self._on_end = on_end
        self.task = asyncio.create_task(self._run(store, run_id, start), name=f"feed {run_id}")

    async def _run(self, store: EventStore, run_id: str, start: int) -> None:
        try:
            async for event in store.tail(run_id, after=start):
                for sub in self.subscribers:
                    sub.offer(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # readers go on alone and meet the error themselves
            log.warning("live feed of run %s stopped: %s", run_id, exc)
        finally:
            self.done = True
            for sub in self.subscribers:
                sub.offer(None)
            self._on_end()


class RunFeeds:
    """The feeds of one store; ``tail`` is ``EventStore.tail`` with one read per event per run."""

    def __init__(self, store: EventStore, *, backlog: int = 4096) -> None:
        self.store = store
        self.backlog = backlog
        self._feeds: dict[str, _Feed] = {}
        self._frames: dict[tuple[str, int, Role, str], bytes | None] = {}

    @property
    def active(self) -> int:
        """Runs with a live feed in this process."""
        return len(self._feeds)

    async def tail(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """Stored events after ``after``, then live ones, until the run's terminal event."""
        cursor = after
        async for event in replay(self.store, run_id, after):  # a feed serves the live end only
            cursor = event.seq
            yield event
            if is_run_terminal(event.type):
                return
        sub = _Subscriber(self.backlog)
        feed = self._join(run_id, cursor, sub)
        try:
            while True:
                offered = await sub.next()
                if offered is None:  # the feed stopped: finish alone
                    async for rest in self.store.tail(run_id, after=cursor):
                        yield rest
                    return
                event = offered
                if event.seq <= cursor:
                    continue
                if event.seq > cursor + 1:  # the feed is ahead of us: fill the gap from the store
                    gap = await self.store.read(run_id, after=cursor, limit=event.seq - 1 - cursor)
                    for missed in gap:
                        cursor = missed.seq
                        yield missed
                        if is_run_terminal(missed.type):
                            return
                    if cursor != event.seq - 1:  # cannot happen with gap-free sequences
                        raise RuntimeError(f"run {run_id}: events {cursor + 1}.. not readable")
                cursor = event.seq
                yield event
                if is_run_terminal(event.type):
                    return
        finally:
            self._leave(run_id, feed, sub)

    def _join(self, run_id: str, cursor: int, sub: _Subscriber) -> _Feed:
        feed = self._feeds.get(run_id)
        if feed is None or feed.done:

            def forget() -> None:
                if self._feeds.get(run_id) is feed:
                    del self._feeds[run_id]

            feed = self._feeds[run_id] = _Feed(self.store, run_id, cursor, forget)
        feed.subscribers.add(sub)
        return feed

    def _leave(self, run_id: str, feed: _Feed, sub: _Subscriber) -> None:
        feed.subscribers.discard(sub)
        if not feed.subscribers and not feed.done:
            feed.task.cancel()
            if self._feeds.get(run_id) is feed:
                del self._feeds[run_id]

    def frame(
        self, event: Event, role: Role, mode: str, encode: Callable[[Event], bytes]
    ) -> bytes | None:
        """``encode(filter_event(event, role, mode))``, computed once per event, role and mode
        (``None`` when the role may not see the event)."""
        key = (event.run_id, event.seq, role, mode)
        if key in self._frames:
            return self._frames[key]
        shown = filter_event(event, role, mode=mode)
        data = None if shown is None else encode(shown)
        if data is None or len(data) <= _CACHE_MAX_FRAME:
            if len(self._frames) >= _CACHE_ENTRIES:
                del self._frames[next(iter(self._frames))]  # the oldest
            self._frames[key] = data
        return data

    async def close(self) -> None:
        """Stop every feed (readers still attached finish from the store)."""
        feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            feed.task.cancel()
        for feed in feeds:
            with contextlib.suppress(asyncio.CancelledError):
                await feed.task

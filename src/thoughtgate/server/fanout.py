"""One feed per live run in this process, shared by every live reader of that run.

Without it each SSE connection tails the store on its own: one append wakes N readers, each reads
the same new events from the database, filters and encodes them again. With it, one *feed* per run
takes each event once and offers it to every reader, and encoded frames are cached per (event,
role, mode): a thousand readers of a run cost a few encodes per event, not a thousand. The feed
gets the events this process appends straight from the store after their commit
(``RunWakeups.publish``), so it reads the store only for what another process appended.

Correctness never rests on the feed. Each reader keeps its own cursor (the last sequence number
it yielded): it replays from the store until it has caught up, then takes events from the feed,
and whatever the feed cannot give it in order (it joined while the feed was behind or ahead, it
fell more than ``backlog`` events behind and was skipped, the feed stopped) it reads from the
store itself. So a reader never skips or repeats an event, whatever the timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence

from thoughtgate.access.filter import event_filter
from thoughtgate.access.roles import Role
from thoughtgate.events.schema import Event, is_run_terminal
from thoughtgate.store.log import EventLog, PageAhead

__all__ = ["FirstPage", "LiveReader", "RunFeeds", "replay"]

log = logging.getLogger("thoughtgate.server")

_PAGE = 500
_PAGE_NOW = 64
"""Events a first page reads on the event loop itself when the store can (``read_now``, ADR
0038): a live run's first page is a few events; a longer run's reader reads on from the store."""
_CACHE_ENTRIES = 4096
_CACHE_MAX_FRAME = 64 * 1024
"""Frames above this size (a long ``agent.response``) are encoded per reader, not kept."""
_dropping: set[asyncio.Future[None]] = set()
"""Reads of first pages nobody took, being abandoned (held until they end)."""


def _nothing() -> None:
    """What an ended feed calls instead of its ``unlisten`` and ``on_end`` (both done once)."""


async def replay(
    store: EventLog, run_id: str, after: int, *, apart: bool = True
) -> AsyncIterator[Event]:
    """The run's stored events after ``after``, up to its terminal event or the last one stored
    now (no waiting for more); ``apart`` as ``EventLog.read``'s."""
    cursor = after
    while True:
        page = await store.read(run_id, after=cursor, limit=_PAGE, apart=apart)
        for event in page:
            cursor = event.seq
            yield event
            if is_run_terminal(event.type):
                return
        if len(page) < _PAGE:
            return


Deliver = Callable[[Sequence[Event]], bool]
"""Hands events straight to a waiting reader's connection; ``False``: it cannot take them now."""


class _Subscriber:
    """A reader's inbox: the feed appends without ever waiting; ``None`` means it stopped.

    While its reader waits with nothing queued, ``deliver`` is set: the feed hands new events
    to it directly (ADR 0022), so they reach the connection in the appender's own step, without
    waking the reader's task. Whatever it refuses goes to the inbox, as before.
    """

    def __init__(self, backlog: int) -> None:
        self.backlog = backlog
        self.inbox: deque[Event | None] = deque()
        self.ready = asyncio.Event()
        self.deliver: Deliver | None = None

    def offer(self, events: Sequence[Event]) -> None:
        """``events`` continue each other, in order, after what was offered before."""
        deliver = self.deliver
        if deliver is not None and not self.inbox and not self.ready.is_set() and deliver(events):
            return
        room = self.backlog - len(self.inbox)
        # past the backlog, events are skipped: the reader refills the gap from the store
        self.inbox.extend(events if room >= len(events) else events[: max(0, room)])
        self.ready.set()

    def stop(self) -> None:
        self.inbox.append(None)
        self.ready.set()


class _Feed:
    """Follows one run from ``start`` and offers every event to every subscriber, in order.

    Events committed by this process arrive as the store publishes them (no read); the feed reads
    the store only for what it cannot get that way: at its start, after a gap in what was
    published, when another process may have appended (a notification, or every poll interval).
    A feed started by a reader that has every event this process committed up to ``start``
    (``read_first=False``, ADR 0038) skips the read at its start: what this process commits
    next is published to it, and another process's appends are found as they always are, by a
    notification or the next poll.
    """

    def __init__(
        self,
        store: EventLog,
        run_id: str,
        start: int,
        on_end: Callable[[], None],
        *,
        read_first: bool = True,
    ):
        self.subscribers: set[_Subscriber] = set()
        self.done = False
        self.cursor = start
        self._on_end = on_end
        self._wake = asyncio.Event()
        if read_first:  # read what may already be stored after ``start``
            self._wake.set()
        self._unlisten = store.wakeups.listen(run_id, self)
        self._running = False
        self.task = asyncio.create_task(self._run(store, run_id), name=f"feed {run_id}")

    # -- RunListener: called by the store in this process --------------------------------
    def published(self, events: Sequence[Event]) -> None:
        self._take(events)

    def notified(self, last_seq: int | None) -> None:
        if last_seq is None or last_seq > self.cursor:
            self._wake.set()

    def _take(self, events: Sequence[Event]) -> None:
        """Offer the events that continue the cursor, in one batch to each subscriber; a gap is
        read from the store instead."""
        if self.done:
            return
        fresh: list[Event] = []
        ended = False
        cursor = self.cursor
        for event in events:
            if event.seq <= cursor:
                continue
            if event.seq != cursor + 1:
                self._wake.set()
                break
            cursor = event.seq
            fresh.append(event)
            if is_run_terminal(event.type):
                ended = True
                break
        if not fresh:
            return
        self.cursor = cursor
        # a copy: a reader handed the terminal event leaves the feed while we go on
        for sub in tuple(self.subscribers):
            sub.offer(fresh)
        if ended:
            self.stop()

    def stop(self) -> None:
        """Follow the run no more: readers still attached are stopped, and ``_run`` ends."""
        self._stop()
        # Cancelled where it waits, or, not started yet, left to find the feed done at its first
        # step: a coroutine cancelled before it started ends holding that cancel, whose traceback
        # holds this feed, so that only the cyclic collector would free either (ADR 0138).
        if self._running and asyncio.current_task() is not self.task:
            self.task.cancel()

    async def _run(self, store: EventLog, run_id: str) -> None:
        self._running = True
        loop = asyncio.get_running_loop()
        try:
            while not self.done:
                if not self._wake.is_set():
                    timer = loop.call_later(store.live_poll_interval(), self._wake.set)
                    try:
                        await self._wake.wait()
                    finally:
                        timer.cancel()
                self._wake.clear()
                page = await store.read(run_id, after=self.cursor, limit=_PAGE)
                self._take(page)
                if len(page) == _PAGE:
                    self._wake.set()
        except asyncio.CancelledError:
            if not self.done:
                raise
        except Exception as exc:  # readers go on alone and meet the error themselves
            log.warning("live feed of run %s stopped: %s", run_id, exc)
        finally:
            self._stop()

    def _stop(self) -> None:
        if self.done:
            return
        self.done = True
        self._unlisten()
        for sub in self.subscribers:
            sub.stop()
        self._on_end()
        # Both close over this feed (the store's listener list, the run's feed map): dropped,
        # so that an ended feed is freed as soon as nobody holds it, not by the cyclic
        # collector (ADR 0138).
        self._unlisten = self._on_end = _nothing


class LiveReader:
    """One reader's cursor over a run: stored events first, then the run's shared feed.

    ``next`` returns the events after the cursor that are ready now, in order, as one batch (so
    a connection writes them at once), and waits only when none are. It replays from the store
    until it has caught up, then takes what the feed offers; whatever the feed cannot give in
    order (it joined while the feed was behind or ahead, it fell more than the backlog behind
    and was skipped, the feed stopped) it reads from the store itself. So a reader never skips
    or repeats an event, whatever the timing. A batch ends with the run's terminal event, after
    which ``next`` returns ``None``.

    With a ``sink`` (``LiveReader.sink``), events the feed publishes while ``next`` waits with
    nothing queued go to it at once, in the appender's step, instead of waking the task that
    called ``next``: the sink writes them to the connection and returns ``True``, or refuses
    (``False``: the socket's buffer is full, the stream is ending) and ``next`` returns them as
    usual. The cursor moves the same way on both paths, so they never overlap or skip.
    """

    def __init__(
        self,
        feeds: RunFeeds,
        run_id: str,
        after: int,
        *,
        follow: bool,
        first_page: FirstPage | None = None,
        apart: bool = True,
    ) -> None:
        self._feeds = feeds
        self._apart = apart
        """Whether this reader's own reads (its replay, a gap, alone) read what a store keeps
        apart (``EventLog.read``, ADR 0160); the feed it shares reads every event whole."""
        self._first_page = first_page
        """``RunFeeds.first_page(run_id, after)``, read already: the first ``next`` takes it
        instead of reading."""
        self.store = feeds.store
        self.run_id = run_id
        self.cursor = after
        self._follow = follow
        self._replaying = True
        self._now_first = follow
        """A follower's first read goes to the loop when the store can answer it there
        (``read_now``); a replay's next pages, and a finished run's, are read as usual."""
        self._done = False
        self._sub: _Subscriber | None = None
        self._feed: _Feed | None = None
        self._alone = False  # the feed stopped: read the store directly
        self._woken = False
        self.sink: Deliver | None = None
        """Takes events published while ``next`` waits (see the class docstring)."""

    @property
    def behind(self) -> int:
        """Events the run's feed has that this reader has not taken yet (0 while replaying)."""
        if self._feed is None:
            return 0
        return max(0, self._feed.cursor - self.cursor)

    @property
    def done(self) -> bool:
        """Whether the last batch ``next`` returned was the stream's last (``next`` would return
        ``None``): it held the run's terminal event, or, without ``follow``, the last event
        stored when replaying reached it."""
        return self._done

    @property
    def following(self) -> bool:
        """Whether the replay caught up: ``next`` now waits for what is appended next."""
        return not self._replaying and not self._done

    @property
    def shared(self) -> bool:
        """Whether other readers follow the same feed now (then a frame is worth caching)."""
        return self._feed is not None and len(self._feed.subscribers) > 1

    def wake(self) -> None:
        """Make a waiting ``next`` return at once (with an empty batch if nothing is new)."""
        self._woken = True
        if self._sub is not None:
            self._sub.ready.set()

    async def next(self, timeout: float | None = None) -> list[Event] | None:  # noqa: ASYNC109
        """The next batch; ``[]`` after ``timeout`` seconds (or a ``wake``) with nothing new;
        ``None`` once the run's terminal event was returned, or, without ``follow``, the last
        event stored when replaying reached it."""
        if self._done:
            return None
        if self._replaying:
            first, self._first_page = self._first_page, None
            now_first, self._now_first = self._now_first, False
            # Whether this process's commits since the page was read are all in ``page``: then
            # the feed joined below, in this step, needs no read of its own to start (ADR 0038).
            seen = False
            if first is not None:  # and what was published since, joined below in this step
                page, caught_up, seen = first.take(self.cursor)
            elif now_first and (
                now := self.store.read_now(
                    self.run_id, after=self.cursor, limit=_PAGE_NOW, apart=self._apart
                )
            ):
                page, caught_up, seen = now, len(now) < _PAGE_NOW, True
            else:
                page = await self.store.read(
                    self.run_id, after=self.cursor, limit=_PAGE, apart=self._apart
                )
                caught_up = len(page) < _PAGE
            if caught_up:
                self._replaying = False
                if not self._follow:
                    self._done = True
                    if not page:
                        return None
                elif not self._cut(page):
                    self._sub = _Subscriber(self._feeds.backlog)
                    # A feed started here starts after the page: an event published before its
                    # first read came back then continues it, and reaches this reader at once
                    # instead of after that read and another (ADR 0028).
                    end = page[-1].seq if page else self.cursor
                    self._feed = self._feeds._join(self.run_id, end, self._sub, read_first=not seen)
            return self._accept(page)
        if self._alone:
            return await self._from_store(timeout)
        return await self._from_feed(timeout)

    def _cut(self, events: list[Event]) -> bool:
        """Whether ``events`` hold the terminal event (the batch is cut after it)."""
        return any(is_run_terminal(e.type) for e in events)

    def _accept(self, events: list[Event]) -> list[Event]:
        """Advance the cursor over ``events`` (in order, after it), stopping at the terminal."""
        taken = self._advance(events)
        return events if taken == len(events) else events[:taken]

    def _advance(self, events: Sequence[Event]) -> int:
        """``_accept``'s step: how many of ``events`` were taken (all, or through the
        terminal)."""
        for i, event in enumerate(events):
            self.cursor = event.seq
            if is_run_terminal(event.type):
                self._done = True
                self.close()
                return i + 1
        return len(events)

    async def _from_feed(self, timeout: float | None) -> list[Event]:  # noqa: ASYNC109
        sub = self._sub
        assert sub is not None
        if not sub.inbox and not self._woken:
            sub.ready.clear()
            if self.sink is not None:
                sub.deliver = self._deliver
            timer = (
                None
                if timeout is None
                else asyncio.get_running_loop().call_later(timeout, sub.ready.set)
            )
            try:
                await sub.ready.wait()
            finally:
                sub.deliver = None
                if timer is not None:
                    timer.cancel()
        self._woken = False
        batch: list[Event] = []
        while sub.inbox:
            event = sub.inbox.popleft()
            if event is None:  # the feed stopped: finish alone
                self._alone = True
                self._leave()
                break
            if event.seq <= self.cursor:
                continue
            if event.seq > self.cursor + 1:  # the feed is ahead of us: fill the gap from the store
                # a page at a time: a reader that fell far behind a busy run reads its gap as it
                # reads a replay, not all at once (ADR 0147)
                missing = event.seq - 1 - self.cursor
                gap = await self.store.read(
                    self.run_id, after=self.cursor, limit=min(missing, _PAGE), apart=self._apart
                )
                batch += self._accept(gap)
                if self._done:
                    return batch
                if missing > _PAGE and len(gap) == _PAGE:  # more of it: in the next call
                    sub.inbox.appendleft(event)
                    break
                if self.cursor != event.seq - 1:  # cannot happen with gap-free sequences
                    raise RuntimeError(
                        f"run {self.run_id}: events {self.cursor + 1}.. not readable"
                    )
            batch += self._accept([event])
            if self._done or len(batch) >= _PAGE:
                break
        return batch

    def _deliver(self, events: Sequence[Event]) -> bool:
        """The feed's events while ``next`` waits with nothing queued: to the sink, if they
        continue the cursor and it takes them; else the feed queues them for ``next``."""
        sub, sink = self._sub, self.sink
        if sub is None or sink is None or self._done:
            return False
        cursor = self.cursor
        # As a rule the batch continues the cursor: handed on as it is, the same object to every
        # reader, so that ``RunFeeds.chunk`` encodes it once for all of them.
        fresh = (
            events
            if events and events[0].seq == cursor + 1
            else [e for e in events if e.seq > cursor]
        )
        if not fresh:
            return True  # already had them (joined while the feed was behind)
        if fresh[0].seq != cursor + 1 or not sink(fresh):
            return False  # a gap (``next`` fills it from the store), or the sink is full
        self._advance(fresh)
        if self._done:  # that was the terminal event: let ``next`` return ``None``
            sub.ready.set()
        return True

    async def _from_store(self, timeout: float | None) -> list[Event]:  # noqa: ASYNC109
        read = functools.partial(self.store.read, self.run_id, limit=_PAGE, apart=self._apart)
        page = await read(after=self.cursor)
        if not page:
            # asyncio.timeout, not wait_for, which on 3.11 can drop this stream's cancellation
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.store.wait_for_new(self.run_id, self.cursor)
            page = await read(after=self.cursor)
        return self._accept(page)

    def _leave(self) -> None:
        if self._feed is not None and self._sub is not None:
            self._feeds._leave(self._feed, self._sub)
        self._feed = None

    def close(self) -> None:
        """Leave the run's feed (idempotent); the reader is done."""
        self._done = True
        self._leave()
        self._sub = None
        if self._first_page is not None:
            self._first_page.close()
            self._first_page = None


class FirstPage:
    """A reader's first read, made early (``RunFeeds.first_page``), and the events this process
    published for the run from before that read until the reader takes it.

    The early read is made while the request is still being served (a ticket's check); an
    event committed after it (the run's first delta, typically) would otherwise reach the
    reader only through one more read, by the feed it then joins. Caught here, it is handed
    over with the page, in the same step in which the reader joins the feed: nothing
    published in between is missed, and ``take`` keeps only what continues the page, in
    order, without repeats (ADR 0028).

    Where the store answers a short read on the loop (``EventLog.read_now``: SQLite), the page
    is read there, in the step that takes it, up to ``_PAGE_NOW`` events: no trip to the
    store's reader thread and back, which cost a busy loop two of its turns (ADR 0038).
    """

    def __init__(self, store: EventLog, run_id: str, *, apart: bool = True) -> None:
        self.apart = apart
        """As ``EventLog.read``'s: ``False`` only for a reader who may see none of it in a run
        of any mode (the page is read before the run's mode is known)."""
        self.page: list[Event] = []
        self._caught: list[Event] = []
        self._unlisten: Callable[[], None] | None = store.wakeups.listen(run_id, self)
        self._store = store
        self._run_id = run_id
        self._after = 0
        self._queued: asyncio.Handle | None = None
        self._ahead: PageAhead | None = None
        self._read: list[Event] | None = None
        """The page, when ``read_now`` answered it in ``_start``."""
        self._full = _PAGE
        """A page this long is full: more may be stored after it."""
        self._elsewhere = False
        """Another process said it appended to the run (``notified``) while this caught."""

    def read_soon(self, after: int) -> None:
        """Queue the page's read in the loop's next step, not in this one: a read the caller
        queues now (a ticket's key check) goes to the store first (ADR 0028, amended). No task
        runs it, so the caller that takes the page (``ready``) resumes one loop turn after the
        store answers, not two (the task's end, then the caller). A caller that takes it in
        this step (``ready`` before the loop turned) has it read then, on the loop when the
        store can (ADR 0038)."""
        self._after = after
        self._queued = asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self._queued = None
        self._read = self._store.read_now(
            self._run_id, after=self._after, limit=_PAGE_NOW, apart=self.apart
        )
        if self._read is not None:
            self._full = _PAGE_NOW
            return
        self._ahead = self._store.read_ahead(
            self._run_id, after=self._after, limit=_PAGE, apart=self.apart
        )

    async def ready(self) -> None:
        """Wait for the read queued by ``read_soon`` and keep its page; its error is raised
        (and this page closed)."""
        if self._queued is not None:  # the loop has not turned yet: queue it now, then
            self._queued.cancel()
            self._start()
        read, self._read = self._read, None
        if read is not None:
            self.page = read
            return
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            raise RuntimeError("this first page was closed, or taken already")
        try:
            self.page = await ahead
        except BaseException:
            self.close()
            raise

    # -- RunListener ---------------------------------------------------------------------------
    def published(self, events: Sequence[Event]) -> None:
        if self._unlisten is None:
            return
        if len(self._caught) + len(events) > _PAGE:  # too much: the reader reads for itself
            self._caught.clear()
            self._stop_catching()
            return
        self._caught.extend(events)
        if any(is_run_terminal(e.type) for e in events):
            self._stop_catching()  # nothing follows; a first page nobody takes is let go at the end

    def notified(self, last_seq: int | None) -> None:
        """Another process appended: the feed the reader joins reads it."""
        self._elsewhere = True

    def _stop_catching(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None

    def close(self) -> None:
        """Stop catching events, and drop the read if nobody took it (idempotent)."""
        self._stop_catching()
        if self._queued is not None:
            self._queued.cancel()
            self._queued = None
        self._read = None
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # its outcome is moot; taken so that asyncio logs no error
            dropping = asyncio.ensure_future(ahead.abandon())
            _dropping.add(dropping)
            dropping.add_done_callback(_dropping.discard)

    def take(self, after: int) -> tuple[list[Event], bool, bool]:
        """The page and the caught events that continue it without a gap; whether that is
        all the store held when the page was read (a full page: more is to be read); and
        whether it holds every event this process published for the run since before the page
        was read (nothing was let go, nothing left after a gap), so a feed that starts after
        it now misses none of them."""
        whole = self._unlisten is not None and not self._elsewhere
        self._stop_catching()
        out = self._continued(after)
        if out is None:
            self._caught = []
            return self.page, False, False
        last = out[-1].seq if out else after
        whole = whole and all(e.seq <= last for e in self._caught)
        self._caught = []
        return out, True, whole

    def ends_run(self) -> bool:
        """Whether the page (read after ``read_soon``'s ``after``) and the events caught since
        reach the run's terminal event without a gap: the run has ended, and a reader that
        takes this page has all of it."""
        out = self._continued(self._after)
        return out is not None and any(is_run_terminal(e.type) for e in out)

    def _continued(self, after: int) -> list[Event] | None:
        """``take``'s events, without taking them; ``None`` for a full page."""
        page = self.page
        if len(page) >= self._full:
            return None
        out = list(page)
        cursor = page[-1].seq if page else after
        for event in self._caught:
            if event.seq <= cursor:
                continue  # in the page already (published while it was read)
            if event.seq != cursor + 1:
                break  # a gap: the feed reads it
            out.append(event)
            cursor = event.seq
        return out


class RunFeeds:
    """The feeds of one store: its live readers (``reader``) read each event once per run, not
    once per reader."""

    def __init__(self, store: EventLog, *, backlog: int = 4096) -> None:
        self.store = store
        self.backlog = backlog
        self._feeds: dict[str, _Feed] = {}
        self._frames: dict[tuple[str, int, Role, str], bytes | None] = {}
        self._batch: Sequence[Event] = ()
        self._batch_chunks: dict[tuple[Role, str], tuple[bytes, int] | None] = {}

    @property
    def active(self) -> int:
        """Runs with a live feed in this process."""
        return len(self._feeds)

    def readers(self, run_id: str) -> int:
        """Readers following the live feed of ``run_id`` now."""
        feed = self._feeds.get(run_id)
        return 0 if feed is None else len(feed.subscribers)

    def reader(
        self,
        run_id: str,
        *,
        after: int = 0,
        follow: bool = True,
        first_page: FirstPage | None = None,
        apart: bool = True,
    ) -> LiveReader:
        """One reader's view of the run after ``after``, in batches (see :class:`LiveReader`);
        ``follow=False`` ends at the last event stored now. ``first_page``: what
        ``first_page(run_id, after)`` returned, read earlier (alongside a ticket's check).
        ``apart``: as ``EventLog.read``'s, for the reader's own reads (ADR 0160)."""
        return LiveReader(self, run_id, after, follow=follow, first_page=first_page, apart=apart)

    async def first_page(self, run_id: str, after: int, *, apart: bool = True) -> FirstPage:
        """The first read a reader of ``run_id`` after ``after`` makes, for a caller that starts
        it early (``reader(first_page=...)``), with what this process publishes meanwhile;
        ``close`` it if no reader takes it."""
        first = self.start_first_page(run_id, after, apart=apart)
        await first.ready()
        return first

    def start_first_page(self, run_id: str, after: int, *, apart: bool = True) -> FirstPage:
        """``first_page`` without waiting: its read is queued in the loop's next step (see
        ``FirstPage.read_soon``), and ``ready`` waits for it."""
        first = FirstPage(self.store, run_id, apart=apart)
        first.read_soon(after)
        return first

    def _join(
        self, run_id: str, cursor: int, sub: _Subscriber, *, read_first: bool = True
    ) -> _Feed:
        """``sub`` joins the run's feed, started at ``cursor`` if there is none; without
        ``read_first`` (the caller has every event this process committed up to ``cursor``,
        and joins in the step in which it learned that), a feed started here waits for what is
        published, or for its poll, before it reads."""
        feed = self._feeds.get(run_id)
        if feed is None or feed.done:

            def forget() -> None:
                if self._feeds.get(run_id) is feed:
                    del self._feeds[run_id]

            feed = self._feeds[run_id] = _Feed(
                self.store, run_id, cursor, forget, read_first=read_first
            )
        feed.subscribers.add(sub)
        return feed

    def _leave(self, feed: _Feed, sub: _Subscriber) -> None:
        feed.subscribers.discard(sub)
        if not feed.subscribers and not feed.done:
            feed.stop()  # which forgets it here (its ``on_end``)

    def chunk(
        self,
        events: Sequence[Event],
        role: Role,
        mode: str,
        encode: Callable[[Event], bytes],
        *,
        cache: bool = True,
        show: Callable[[Event], Event | None] | None = None,
    ) -> tuple[bytes, int] | None:
        """The frames of ``events`` a reader with ``role`` and ``mode`` is sent (``frame``'s,
        joined) and the ``seq`` of the last event among them; ``None`` when it may see none.

        With ``cache``, computed once per batch, role and mode: a feed hands the same batch
        object to each of its readers, and at 1,000 readers looking up and joining each
        event's frames again for every one of them was about a seventh of the fan-out's Python
        time (its socket writes cost several times that: docs/benchmarks.md). Only the last
        batch is kept (``is``, not ``==``: a batch is never changed once offered, and the one
        kept cannot be freed and its address reused)."""
        if cache:
            if events is not self._batch:
                self._batch, self._batch_chunks = events, {}
            elif (role, mode) in self._batch_chunks:
                return self._batch_chunks[role, mode]
        parts: list[bytes] = []
        last = 0
        for event in events:
            data = self.frame(event, role, mode, encode, cache=cache, show=show)
            if data is not None:
                parts.append(data)
                last = event.seq
        out = (b"".join(parts), last) if parts else None
        if cache:
            self._batch_chunks[(role, mode)] = out
        return out

    def frame(
        self,
        event: Event,
        role: Role,
        mode: str,
        encode: Callable[[Event], bytes],
        *,
        cache: bool = True,
        show: Callable[[Event], Event | None] | None = None,
    ) -> bytes | None:
        """``encode(filter_event(event, role, mode))``, computed once per event, role and mode
        (``None`` when the role may not see the event). ``cache=False`` for a reader alone on
        its run: nobody else would use the frame, so it is neither kept nor looked up (the same
        event, role and mode make the same bytes). ``show``: ``event_filter(role, mode=mode)``,
        resolved once by a caller that frames many events for one reader."""
        if cache:
            key = (event.run_id, event.seq, role, mode)
            if key in self._frames:
                return self._frames[key]
        shown = (show if show is not None else event_filter(role, mode=mode))(event)
        data = None if shown is None else encode(shown)
        if cache and (data is None or len(data) <= _CACHE_MAX_FRAME):
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

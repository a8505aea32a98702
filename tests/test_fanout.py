"""The shared per-run feed: however readers join, lag or outlive it, each one gets exactly the
events after its own cursor, in order, once; and the store is read once per event, not per reader."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.live_reads import live_events
from support.settle import settled

from thoughtgate.access.roles import Role
from thoughtgate.errors import StoreError
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.server.fanout import FirstPage, RunFeeds
from thoughtgate.store.base import Holder
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord
from thoughtgate.store.sqlite import SQLiteStore


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.fail_reads = False

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        self.reads += 1
        if self.fail_reads:
            raise StoreError("cannot read: injected")
        return await super().read(run_id, after=after, limit=limit, apart=apart)


async def _collect(feeds: RunFeeds, after: int, pause_every: int) -> list[int]:
    seen = []
    async for event in live_events(feeds, "run_1", after=after):
        seen.append(event.seq)
        if pause_every and event.seq % pause_every == 0:
            await asyncio.sleep(0.003)  # a slow reader: the feed runs ahead of it
    return seen


@settings(max_examples=25, deadline=None)
@given(
    readers=st.lists(
        st.tuples(st.integers(0, 60), st.integers(0, 30), st.sampled_from([0, 0, 7])),
        min_size=1,
        max_size=6,
    ),
    backlog=st.sampled_from([2, 8, 4096]),
)
def test_every_reader_gets_exactly_the_events_after_its_cursor(
    readers: Sequence[tuple[int, int, int]], backlog: int
) -> None:
    async def go() -> None:
        store = MemoryStore()
        await store.create_run(RunRecord("run_1", "p"))
        feeds = RunFeeds(store, backlog=backlog)
        total = 80
        tasks: dict[int, asyncio.Task[list[int]]] = {}
        for i in range(total):
            for n, (join_at, after, pause) in enumerate(readers):
                if join_at == i:  # join mid-run, with a cursor behind or ahead of the feed
                    tasks[n] = asyncio.create_task(_collect(feeds, min(after, i), pause))
            kind = EventType.RUN_SETTLEMENT_COMPLETED if i == total - 1 else "message.delta"
            await store.append("run_1", [NewEvent(kind, {"i": i})])
            if i % 5 == 0:
                await asyncio.sleep(0)
        for n, (join_at, after, pause) in enumerate(readers):
            if n not in tasks:  # joined after the end: pure replay
                tasks[n] = asyncio.create_task(_collect(feeds, min(after, join_at), pause))
        for n, task in tasks.items():
            join_at, after, _ = readers[n]
            start = min(after, join_at)
            assert await asyncio.wait_for(task, 10) == list(range(start + 1, total + 1))
        assert feeds.active == 0  # every feed ended with its run

    asyncio.run(go())


async def test_a_thousand_readers_of_events_appended_here_cost_no_store_read() -> None:
    store = CountingStore()
    # The feed also reads every poll interval (0.25 s) for writers in other processes; on a loaded
    # machine this test can outlast one. That read is not per append, so it is kept out of here.
    store.poll_interval = 3600.0
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)
    readers = [asyncio.create_task(_collect(feeds, 0, 0)) for _ in range(1000)]
    # all joined (one replay read each), and the feed has made its one start-up read
    await settled(lambda: feeds.readers("run_1") == 1000 and store.reads >= 1001)
    before = store.reads
    for i in range(20):
        await store.append("run_1", [NewEvent("message.delta", {"i": i})])
        await asyncio.sleep(0.002)
    await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
    results = await asyncio.gather(*readers)
    assert all(r == list(range(1, 22)) for r in results)
    # the feed takes what this process appends as it is committed: no read per append at all
    assert store.reads - before == 0


class PageRecordingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.pages: list[int] = []

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        page = await super().read(run_id, after=after, limit=limit, apart=apart)
        self.pages.append(len(page))
        return page


async def test_a_reader_far_behind_the_feed_reads_its_gap_a_page_at_a_time() -> None:
    """A reader that stopped taking events while a run produced thousands (its inbox full, the
    rest skipped) read the whole gap in one store read when the run's next event came: memory
    by the size of the gap, per reader (ADR 0147). It reads it in pages, and still gets every
    event once, in order."""
    store = PageRecordingStore()
    store.poll_interval = 3600.0
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store, backlog=8)
    reader = live_events(feeds, "run_1", after=0)
    await store.append("run_1", [NewEvent("message.delta", {"i": 0})])
    seen = [(await anext(reader)).seq]
    await settled(lambda: feeds.readers("run_1") == 1)
    for i in range(1, 3000):  # while it takes nothing: 8 in its inbox, the rest skipped
        await store.append("run_1", [NewEvent("message.delta", {"i": i})])
    seen += [(await anext(reader)).seq for _ in range(8)]  # its inbox, emptied
    await store.append("run_1", [NewEvent("message.delta", {"i": 3000})])  # the feed goes on
    await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
    seen += [event.seq async for event in reader]
    assert seen == list(range(1, 3003))
    assert max(store.pages) <= 500, store.pages


async def test_a_feed_that_fails_leaves_readers_to_meet_the_error_themselves() -> None:
    store = CountingStore()
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)
    await store.append("run_1", [NewEvent("message.delta", {"i": 0})])
    seen: list[int] = []

    async def read_all() -> None:
        async for event in live_events(feeds, "run_1"):
            seen.append(event.seq)

    reader = asyncio.create_task(read_all())
    # replayed, joined, and the feed has made its start-up read
    await settled(lambda: feeds.readers("run_1") == 1 and store.reads >= 2)
    store.fail_reads = True
    # news the feed must read (as from another process, or after a lost signal): the read fails
    store.wakeups.notify_all()
    try:
        await asyncio.wait_for(reader, 5)
    except StoreError as exc:
        assert "injected" in str(exc)
    else:
        raise AssertionError("the store error did not reach the reader")
    assert seen == [1] and feeds.active == 0


def test_frames_are_filtered_and_encoded_once_per_role() -> None:
    feeds = RunFeeds(MemoryStore())
    calls: list[int] = []

    def encode(event: Event) -> bytes:
        calls.append(event.seq)
        return f"{event.seq}:{event.payload.get('text')}".encode()

    delta = Event(1, "run_1", EventType.REASONING_DELTA, {"text": "secret"})
    for _ in range(3):
        assert feeds.frame(delta, Role.DEVELOPER, "surface", encode) == b"1:secret"
        assert feeds.frame(delta, Role.VIEWER, "surface", encode) is None  # withheld
    assert calls == [1]


def test_a_frame_for_a_reader_alone_is_the_same_bytes_and_kept_nowhere() -> None:
    """``cache=False`` (a reader alone on its run) with its filter resolved once: the same
    frame, or ``None``, as a shared reader gets; not kept for anyone."""
    from thoughtgate.access.filter import event_filter
    from thoughtgate.server.sse import event_frame

    shared, alone = RunFeeds(MemoryStore()), RunFeeds(MemoryStore())
    events = [
        Event(1, "run_1", EventType.REASONING_DELTA, {"text": "secret"}),
        Event(2, "run_1", EventType.MESSAGE_DELTA, {"text": "answer"}),
    ]
    for role in Role:
        for mode in ("hidden", "surface", "telemetry_only"):
            show = event_filter(role, mode=mode)
            for event in events:
                frame = alone.frame(event, role, mode, event_frame, cache=False, show=show)
                assert frame == shared.frame(event, role, mode, event_frame)
    assert not alone._frames
    assert shared.frame(events[0], Role.VIEWER, "surface", event_frame) is None
    assert shared.frame(events[0], Role.DEVELOPER, "surface", event_frame) is not None


class ElsewhereStore(CountingStore):
    """Appends as if from another process: nothing is published here; ``signal`` says whether a
    notification (PostgreSQL's NOTIFY, with the last seq) arrives, else readers must poll."""

    poll_interval = 0.02

    def __init__(self, *, signal: bool) -> None:
        super().__init__()
        self.signal = signal

    async def append(
        self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
    ) -> list[Event]:
        published, self.wakeups.publish = self.wakeups.publish, lambda *_: None  # type: ignore[method-assign]
        try:
            out = await super().append(run_id, events, held_by=held_by)
        finally:
            self.wakeups.publish = published  # type: ignore[method-assign]
        if self.signal and out:
            self.wakeups.notify(run_id, out[-1].seq)
        return out


async def test_events_appended_by_another_process_reach_every_reader_once() -> None:
    for signal in (True, False):
        store = ElsewhereStore(signal=signal)
        await store.create_run(RunRecord("run_1", "p"))
        feeds = RunFeeds(store)
        readers = [asyncio.create_task(_collect(feeds, 0, 0)) for _ in range(5)]
        await settled(lambda feeds=feeds: feeds.readers("run_1") == 5)
        for i in range(30):
            await store.append("run_1", [NewEvent("message.delta", {"i": i})])
            if i % 7 == 0:
                await asyncio.sleep(0.005)
        await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
        results = await asyncio.wait_for(asyncio.gather(*readers), 10)
        assert all(r == list(range(1, 32)) for r in results), signal
        assert feeds.active == 0


async def test_a_notification_for_events_already_published_costs_no_read() -> None:
    store = CountingStore()
    store.poll_interval = 3600.0  # the notification is the only reason to read
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)
    marker = asyncio.Event()

    async def read_all() -> list[int]:
        seen = []
        async for event in live_events(feeds, "run_1"):
            seen.append(event.seq)
            if event.seq == 2:
                marker.set()
        return seen

    reader = asyncio.create_task(read_all())
    # replayed, joined, and the feed has made its start-up read
    await settled(lambda: feeds.readers("run_1") == 1 and store.reads >= 2)
    before = store.reads
    out = await store.append("run_1", [NewEvent("message.delta", {"i": 0})])
    store.wakeups.notify("run_1", out[-1].seq)  # our own NOTIFY coming back from PostgreSQL
    # A marker the reader gets through the feed: a read the notification had asked for would
    # have been started first (the loop runs ready tasks in order).
    await store.append("run_1", [NewEvent("message.delta", {"i": 1})])
    await asyncio.wait_for(marker.wait(), 5)
    assert store.reads == before
    await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
    assert await asyncio.wait_for(reader, 5) == [1, 2, 3]


@settings(max_examples=40, deadline=None)
@given(
    counts=st.tuples(*(st.integers(0, 4) for _ in range(4))),
    lose=st.one_of(st.none(), st.integers(0, 8)),
)
def test_a_reader_started_from_an_early_first_page_gets_every_event_once_in_order(
    counts: tuple[int, int, int, int], lose: int | None
) -> None:
    """A live stream's first read is made while its ticket is checked (``RunFeeds.first_page``);
    events published before, during and after that read, and after the reader joined, each
    reach it once and in order -- also when a publish never reached the first page (it is
    then read from the store)."""
    before, during, between, after = counts

    async def go() -> None:
        store = CountingStore()
        await store.create_run(RunRecord("run_1", "p"))
        appended = 0

        async def add(n: int) -> None:
            nonlocal appended
            for _ in range(n):
                appended += 1
                await store.append("run_1", [NewEvent("message.delta", {"i": appended})])

        await add(before)
        feeds = RunFeeds(store)
        first = FirstPage(store, "run_1")  # what first_page does, with appends during its read
        await add(during)
        first.page = await store.read("run_1", after=0, limit=500)
        await add(between)
        if lose is not None and lose < len(first._caught):
            del first._caught[lose]  # as if that publish had not reached it
        reads = store.reads
        reader = feeds.reader("run_1", after=0, first_page=first)
        seen = [e.seq for e in (await reader.next() or [])]
        assert store.reads == reads, "the first page is not read again"
        if lose is None:  # what was published meanwhile came with it, without a read
            assert seen == list(range(1, appended + 1))
        await add(after)
        await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
        while (batch := await asyncio.wait_for(reader.next(), 10)) is not None:
            seen += [e.seq for e in batch]
        assert seen == list(range(1, appended + 2))
        assert not store.wakeups._listeners  # the first page stopped listening, the feed ended

    asyncio.run(go())


class LoopReadingStore(CountingStore):
    """Answers short reads on the loop (``read_now``), as SQLite's loop connection does."""

    def read_now(
        self, run_id: str, *, after: int, limit: int, apart: bool = True
    ) -> list[Event] | None:
        events = self._events.get(run_id, [])
        page = [e for e in events if e.seq > after][:limit]
        return page or None


async def test_a_follower_whose_first_read_is_answered_on_the_loop_reads_nothing_else() -> None:
    """A follower's first read answered in its step (ADR 0038) and the feed it then joins in
    that step: nothing this process appends later needs a read, not even the feed's start."""
    store = LoopReadingStore()
    store.poll_interval = 3600.0  # the feed's poll (for other processes) is not what is counted
    await store.create_run(RunRecord("run_1", "p"))
    await store.append("run_1", [NewEvent("message.delta", {"i": 0})])
    feeds = RunFeeds(store)
    readers = [asyncio.create_task(_collect(feeds, 0, 0)) for _ in range(3)]
    await settled(lambda: feeds.readers("run_1") == 3)
    for i in range(1, 10):
        await store.append("run_1", [NewEvent("message.delta", {"i": i})])
    await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
    results = await asyncio.wait_for(asyncio.gather(*readers), 10)
    assert all(r == list(range(1, 12)) for r in results)
    assert store.reads == 0


@pytest.mark.inprocess
async def test_a_stream_read_on_the_loop_gets_what_another_process_appends(tmp_path: Path) -> None:
    """The first page answered on SQLite's loop connection, then a feed that starts without a
    read of its own: events another process appends (nothing tells this one) still reach each
    reader once and in order, interleaved with this process's own."""
    path = tmp_path / "two.db"
    here = await SQLiteStore.open(path)
    there = await SQLiteStore.open(path)
    here.poll_interval = 0.02
    try:
        run = RunRecord("run_1", "p")
        await here.create_run(run)
        await here.append("run_1", [NewEvent("message.delta", {"i": 0})])
        feeds = RunFeeds(here)
        first = feeds.start_first_page("run_1", 0)  # a live stream's first connection
        await first.ready()
        readers = [
            asyncio.create_task(_collect(feeds, 0, 0)),
            asyncio.create_task(_tail_from(feeds, first)),
        ]
        await settled(lambda: feeds.readers("run_1") == 2)
        for i in range(1, 13):
            writer = there if i % 3 == 0 else here
            await writer.append("run_1", [NewEvent("message.delta", {"i": i})])
            if i % 4 == 0:
                await asyncio.sleep(0.01)
        await there.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
        results = await asyncio.wait_for(asyncio.gather(*readers), 10)
        assert all(r == list(range(1, 15)) for r in results)
    finally:
        await there.close()
        await here.close()


async def _tail_from(feeds: RunFeeds, first: FirstPage) -> list[int]:
    reader = feeds.reader("run_1", after=0, first_page=first)
    seen: list[int] = []
    try:
        while (batch := await reader.next()) is not None:
            seen += [e.seq for e in batch]
    finally:
        reader.close()
    return seen


async def test_a_first_page_told_of_another_process_append_starts_a_feed_that_reads() -> None:
    """A first page that heard, while it waited for its reader, that another process appended
    (a notification) hands over a feed that reads at its start: that append reaches the reader
    at once, not at the next poll."""
    store = ElsewhereStore(signal=True)
    store.poll_interval = 3600.0  # no poll to fall back on: only the start-up read finds it
    await store.create_run(RunRecord("run_1", "p"))
    await store.append("run_1", [NewEvent("message.delta", {"i": 0})])
    feeds = RunFeeds(store)
    first = feeds.start_first_page("run_1", 0)
    await first.ready()
    await store.append("run_1", [NewEvent("message.delta", {"i": 1})])  # after the page
    reader = feeds.reader("run_1", after=0, first_page=first)
    seen: list[int] = []
    try:
        while len(seen) < 2:
            batch = await asyncio.wait_for(reader.next(), 5)
            assert batch is not None
            seen += [e.seq for e in batch]
    finally:
        reader.close()
    assert seen == [1, 2]

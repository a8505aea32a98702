"""A live stream's first page of a run this daemon executes, taken from the events this process
published for it since before its first commit, instead of read (ADR 0118): a reader still gets
exactly the events after its cursor, once, in order, and nothing its role may not see, whatever
the order of the publishes, whoever else appends to the run, and however the reader joins."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.access.roles import Role
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.providers.base import TurnRequest
from thoughtgate.providers.sse import SSEDecoder
from thoughtgate.server.app import create_app
from thoughtgate.server.fanout import RunFeeds
from thoughtgate.server.sse import DirectWrites, live_frames
from thoughtgate.server.state import ServerState
from thoughtgate.store.log import PageAhead
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, text

SECRET = "SECRET-REASONING"


class ReadCounting(MemoryStore):
    """Counts the reads a first page may make (the reader thread's, ahead, and on the loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        self.reads += 1
        return await super().read(run_id, after=after, limit=limit)

    def read_ahead(self, run_id: str, *, after: int, limit: int) -> PageAhead:
        self.reads += 1
        return super().read_ahead(run_id, after=after, limit=limit)

    def read_now(self, run_id: str, *, after: int, limit: int) -> list[Event] | None:
        self.reads += 1
        return None


def _event(i: int, last: bool) -> NewEvent:
    if last:
        return NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)
    if i % 3 == 1:
        reasoning = {"text": f"{SECRET} {i}", "reasoning_kind": "summary", "index": 0, "turn": 1}
        return NewEvent(EventType.REASONING_DELTA, reasoning)
    return NewEvent(EventType.MESSAGE_DELTA, {"text": f"w{i} ", "turn": 1})


class Publishes:
    """The store's hand-off of each commit to this process's listeners, made to happen the way
    a batch's fate says: at once (``here``), after the next batch's (``late``: an append merged
    into the admission's commit is published before it, ADR 0040), or never, as when another
    process committed it (``elsewhere``, told by a notification or not: SQLite has none)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.wakeups = store.wakeups
        self.publish = store.wakeups.publish
        self.fate = "here"
        self.held: list[Sequence[Event]] = []
        store.wakeups.publish = self._publish  # type: ignore[method-assign]

    def _publish(self, run_id: str, events: Sequence[Event]) -> None:
        fate, held = self.fate, self.held
        self.held = []
        if fate == "late":
            self.held = [events]
        elif fate == "elsewhere":
            pass
        elif fate == "told":
            self.wakeups.notify(run_id, events[-1].seq)
        else:
            self.publish(run_id, events)
        for events_before in held:
            self.publish(run_id, events_before)


async def _follow(
    feeds: RunFeeds, role: Role, after: int, first_page: bool, rng: random.Random
) -> bytes:
    """What one connection's client receives, direct writes and yielded chunks in order."""
    received: list[bytes] = []
    direct = DirectWrites()

    def write(chunk: bytes) -> bool:
        if rng.random() < 0.3:
            return False  # the socket is not keeping up: the stream yields it later
        received.append(chunk)
        return True

    direct.write = write
    first = await feeds.first_page("run_1", after) if first_page else None
    frames = live_frames(
        feeds.store,
        "run_1",
        role=role,
        mode="surface",
        after=after,
        feeds=feeds,
        direct=direct,
        first_page=first,
    )
    async for chunk in frames:
        received.append(chunk)
        if rng.random() < 0.2:
            await asyncio.sleep(0)
    return b"".join(received)


@settings(max_examples=40, deadline=None)
@given(
    readers=st.lists(
        st.tuples(
            st.sampled_from([Role.VIEWER, Role.DEVELOPER]),
            st.integers(0, 30),  # joins when this many events were appended
            st.booleans(),  # a stream's early first page (else a follower's first read)
        ),
        min_size=1,
        max_size=5,
    ),
    batches=st.lists(
        st.tuples(
            st.integers(1, 4),
            st.sampled_from(["here", "here", "here", "late", "elsewhere", "told"]),
        ),
        min_size=3,
        max_size=25,
    ),
    seed=st.integers(0, 2**16),
)
def test_first_pages_from_published_events_never_gap_repeat_reorder_or_leak(
    readers: Sequence[tuple[Role, int, bool]],
    batches: Sequence[tuple[int, str]],
    seed: int,
) -> None:
    async def go() -> None:
        store = MemoryStore()
        store.poll_interval = 0.01  # what another process appended untold is found by the poll
        await store.create_run(RunRecord("run_1", "p"))
        feeds = RunFeeds(store, backlog=8)
        feeds.from_start("run_1")  # before the run's first commit
        publishes = Publishes(store)
        rng = random.Random(seed)
        tasks: dict[int, tuple[int, asyncio.Task[bytes]]] = {}
        appended = 0
        for b, (size, fate) in enumerate(batches):
            last = b == len(batches) - 1
            for n, (role, join_at, first_page) in enumerate(readers):
                if n not in tasks and join_at <= appended:
                    after = 0 if first_page else rng.randint(0, appended)
                    task = asyncio.create_task(_follow(feeds, role, after, first_page, rng))
                    tasks[n] = (after, task)
            publishes.fate = "here" if last else fate
            batch = [_event(appended + k + 1, last and k == size - 1) for k in range(size)]
            await store.append("run_1", batch)
            appended += size
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
        stored = await store.read("run_1")
        for n, (role, _, first_page) in enumerate(readers):
            if n not in tasks:
                tasks[n] = (0, asyncio.create_task(_follow(feeds, role, 0, first_page, rng)))
        for n, (after, task) in tasks.items():
            role = readers[n][0]
            body = await asyncio.wait_for(task, 10)
            messages = SSEDecoder().feed(body)
            seqs = [json.loads(m.data)["seq"] for m in messages]
            assert [int(m.id) for m in messages if m.id is not None] == seqs
            visible = [
                e.seq
                for e in stored
                if e.seq > after and (role >= Role.DEVELOPER or e.type != EventType.REASONING_DELTA)
            ]
            assert seqs == visible and seqs[-1] == stored[-1].seq
            if role < Role.DEVELOPER:
                assert SECRET.encode() not in body
        assert feeds.active == 0
        assert not store.wakeups._listeners  # the run's first events were let go at its end

    asyncio.run(go())


async def test_a_runs_first_page_comes_from_its_published_events_without_a_read() -> None:
    store = ReadCounting()
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)
    feeds.from_start("run_1")
    for i in range(1, 4):
        await store.append("run_1", [_event(i, False)])
    first = await feeds.first_page("run_1", 0)
    assert [e.seq for e in first.page] == [1, 2, 3]
    follower = feeds.reader("run_1", after=1)
    assert [e.seq for e in await follower.next() or []] == [2, 3]
    assert store.reads == 0
    first.close()
    follower.close()


async def test_a_first_page_after_another_process_appended_is_read_from_the_store() -> None:
    store = ReadCounting()
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)
    feeds.from_start("run_1")
    await store.append("run_1", [_event(1, False)])
    publishes = Publishes(store)
    publishes.fate = "told"  # another process's append: only its notification comes here
    await store.append("run_1", [_event(2, False)])
    first = await feeds.first_page("run_1", 0)
    assert [e.seq for e in first.page] == [1, 2]
    assert store.reads > 0
    first.close()


async def test_a_run_that_did_not_start_here_is_read_from_the_store() -> None:
    store = ReadCounting()
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)
    await store.append("run_1", [_event(1, False)])
    feeds.from_start("run_1")  # too late: its first commit was not seen here
    await store.append("run_1", [_event(2, False)])
    first = await feeds.first_page("run_1", 0)
    assert [e.seq for e in first.page] == [1, 2]
    assert store.reads > 0
    first.close()


class _Gated:
    """``fake:first-events``: a turn that waits until let through."""

    def __init__(self) -> None:
        self.through = asyncio.Event()

    def __call__(self, request: TurnRequest, _: int) -> AsyncIterator[Any]:
        return self._turn()

    async def _turn(self) -> AsyncIterator[Any]:
        await self.through.wait()
        yield text("done")


@pytest.fixture
def gated() -> Iterator[_Gated]:
    model = _Gated()
    FAKE_SCRIPTS["first-events"] = model
    yield model
    del FAKE_SCRIPTS["first-events"]


@pytest.mark.inprocess
@pytest.mark.parametrize("early", [False, True])
async def test_a_daemons_stream_of_a_run_it_started_reads_no_first_page(
    tmp_path: Path, gated: _Gated, early: bool
) -> None:
    """Through the daemon's own wiring (its run manager tells its feeds of each run it starts,
    before the admission commits): the stream's first page and a follower's first read are the
    run's stored events, and neither reads the store for them."""
    store = await SQLiteStore.open(tmp_path / "runs.db")
    app = create_app(store, recover_on_start=False)
    state = app.state.thoughtgate
    assert isinstance(state, ServerState) and state.feeds is not None
    feeds = state.feeds
    try:
        run = await state.manager.start(
            RunRequest("hello", model="fake:first-events"), chain_of_thought="surface", early=early
        )
        loop_reads: list[int] = []
        read_now = store.read_now

        def counted(run_id: str, *, after: int, limit: int) -> list[Event] | None:
            loop_reads.append(after)
            return read_now(run_id, after=after, limit=limit)

        store.read_now = counted  # type: ignore[method-assign]
        for _ in range(20):
            await asyncio.sleep(0)  # its execution's first events are committed too
        stored = await store.read(run.run_id)
        first = await feeds.first_page(run.run_id, 0)
        follower = feeds.reader(run.run_id)
        assert [e.seq for e in first.page] == [e.seq for e in stored]
        assert [e.seq for e in await follower.next() or []] == [e.seq for e in stored]
        assert loop_reads == []
        first.close()
        follower.close()
        gated.through.set()
        await state.manager.shutdown()
    finally:
        gated.through.set()
        await feeds.close()
        await store.close()

"""Direct delivery (ADR 0022): while a live stream waits, the feed writes the events an append
publishes straight to its connection. Whether each write is taken or refused (a full socket
buffer sends it back to the awaited path), a reader gets every event it may see, once, in order,
and nothing its role may not see."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.access.roles import Role
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.providers.sse import SSEDecoder
from thoughtgate.server.fanout import RunFeeds
from thoughtgate.server.sse import DirectWrites, LiveResponse, live_frames
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord

SECRET = "SECRET-REASONING"


def _event(i: int, last: bool) -> NewEvent:
    if last:
        return NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)
    if i % 3 == 1:
        reasoning = {"text": f"{SECRET} {i}", "reasoning_kind": "summary", "index": 0, "turn": 1}
        return NewEvent(EventType.REASONING_DELTA, reasoning)
    return NewEvent(EventType.MESSAGE_DELTA, {"text": f"w{i} ", "turn": 1})


async def _follow(
    feeds: RunFeeds, role: Role, after: int, refuse: float, rng: random.Random
) -> tuple[bytes, int]:
    """What one connection's client receives, in order: chunks the feed wrote directly and
    chunks the stream yielded, interleaved as they happened; and how many were direct."""
    received: list[bytes] = []
    direct = DirectWrites()
    taken = 0

    def write(chunk: bytes) -> bool:
        nonlocal taken
        if rng.random() < refuse:
            return False  # the socket is not keeping up: the stream yields it later instead
        taken += 1
        received.append(chunk)
        return True

    direct.write = write
    frames = live_frames(
        feeds.store, "run_1", role=role, mode="surface", after=after, feeds=feeds, direct=direct
    )
    async for chunk in frames:
        received.append(chunk)
        if rng.random() < 0.2:
            await asyncio.sleep(0)  # a write that took a while: the feed goes on meanwhile
    return b"".join(received), taken


@settings(max_examples=30, deadline=None)
@given(
    readers=st.lists(
        st.tuples(
            st.sampled_from([Role.VIEWER, Role.DEVELOPER]),
            st.integers(0, 40),  # joins when this many events were appended
            st.sampled_from([0.0, 0.3, 1.0]),  # share of direct writes refused
        ),
        min_size=1,
        max_size=5,
    ),
    batches=st.lists(st.integers(1, 4), min_size=10, max_size=30),
    seed=st.integers(0, 2**16),
)
def test_direct_and_awaited_writes_never_gap_repeat_reorder_or_leak(
    readers: Sequence[tuple[Role, int, float]], batches: Sequence[int], seed: int
) -> None:
    async def go() -> None:
        store = MemoryStore()
        await store.create_run(RunRecord("run_1", "p"))
        feeds = RunFeeds(store, backlog=8)
        rng = random.Random(seed)
        tasks: dict[int, tuple[int, asyncio.Task[tuple[bytes, int]]]] = {}
        appended = 0
        for b, size in enumerate(batches):
            last = b == len(batches) - 1
            for n, (role, join_at, refuse) in enumerate(readers):
                if n not in tasks and join_at <= appended:
                    after = rng.randint(0, appended)
                    task = asyncio.create_task(_follow(feeds, role, after, refuse, rng))
                    tasks[n] = (after, task)
            batch = [_event(appended + k + 1, last and k == size - 1) for k in range(size)]
            await store.append("run_1", batch)  # one commit: published to the feed at once
            appended += size
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
        stored = await store.read("run_1")
        for n, (role, _, _) in enumerate(readers):
            if n not in tasks:
                tasks[n] = (0, asyncio.create_task(_follow(feeds, role, 0, 0.0, rng)))
        for n, (after, task) in tasks.items():
            role = readers[n][0]
            body, _ = await asyncio.wait_for(task, 10)
            messages = SSEDecoder().feed(body)
            seqs = [json.loads(m.data)["seq"] for m in messages]
            assert [int(m.id) for m in messages if m.id is not None] == seqs
            visible = [
                e.seq
                for e in stored
                if e.seq > after and (role >= Role.DEVELOPER or e.type != EventType.REASONING_DELTA)
            ]
            # in order, no gap, no repeat: exactly the visible events after the reader's cursor,
            # through the terminal event
            assert seqs == visible and seqs[-1] == stored[-1].seq
            if role < Role.DEVELOPER:
                assert SECRET.encode() not in body
        assert feeds.active == 0

    asyncio.run(go())


async def test_a_waiting_reader_gets_a_commit_without_its_task_running() -> None:
    store = MemoryStore()
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)
    got: list[Sequence[Event]] = []
    reader = feeds.reader("run_1")
    reader.sink = lambda events: got.append(events) is None
    assert await reader.next() == []  # replayed (nothing yet); now on the feed
    waiting = asyncio.create_task(reader.next())
    await asyncio.sleep(0)  # parked, waiting for news
    await store.append("run_1", [NewEvent(EventType.MESSAGE_DELTA, {"text": "a", "turn": 1})])
    # handed over inside the append's own step: the reader's task has not run since
    assert [e.seq for batch in got for e in batch] == [1] and not waiting.done()
    await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
    assert await asyncio.wait_for(waiting, 5) == []  # woken once the terminal event went out
    assert await reader.next() is None
    assert [e.seq for batch in got for e in batch] == [1, 2]


async def test_a_stream_ends_with_its_terminal_event_in_its_last_write() -> None:
    """The client reads its run's end in one wake: the chunk holding the terminal event is the
    response's last body message (ADR 0085), even when the feed writes the events before it
    straight to the connection, and no event after the terminal one is sent."""
    store = MemoryStore()
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)
    direct = DirectWrites()
    written: list[bytes] = []
    sent: list[dict[str, object]] = []
    stream_open = asyncio.Event()

    async def send(message: dict[str, object]) -> None:
        sent.append(message)
        stream_open.set()

    async def receive() -> dict[str, object]:
        await asyncio.Event().wait()  # the client never goes away
        raise AssertionError

    frames = live_frames(
        store, "run_1", role=Role.VIEWER, mode="surface", after=0, feeds=feeds, direct=direct
    )
    response = LiveResponse(frames, send_timeout_s=5.0, headers={}, direct=direct)
    serving = asyncio.create_task(response({"type": "http"}, receive, send))  # type: ignore[arg-type]
    await stream_open.wait()
    direct.write = lambda chunk: written.append(chunk) is None  # the socket takes direct writes
    for _ in range(3):
        await asyncio.sleep(0)  # the stream waits on the feed now
    await store.append("run_1", [NewEvent(EventType.MESSAGE_DELTA, {"text": "a", "turn": 1})])
    await store.append(
        "run_1",
        [
            NewEvent(EventType.MESSAGE_DELTA, {"text": "b", "turn": 1}),
            NewEvent(EventType.RUN_SETTLEMENT_COMPLETED),
        ],
    )
    await asyncio.wait_for(serving, 5)
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    last = bodies[-1]
    assert last["more_body"] is False
    seqs = [json.loads(m.data)["seq"] for m in SSEDecoder().feed(last["body"])]  # type: ignore[arg-type]
    assert seqs == [2, 3]  # the terminal event and the delta committed with it
    # the first delta went out directly, and nothing else did
    assert [json.loads(m.data)["seq"] for m in SSEDecoder().feed(b"".join(written))] == [1]
    assert len(bodies) == 1  # no empty end after it

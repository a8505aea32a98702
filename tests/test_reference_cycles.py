"""What a run and its requests leave behind is freed when the last reference to it goes, not
later by Python's cyclic collector (ADR 0138): a request's scope, a live feed that ended, a
recorder closed with its batching window open. Each of these once formed a reference cycle, so
at 100 concurrent runs the daemon's collector had about 35 objects a run from them to find and
free, and its passes stop the event loop. Each test turns the collector off and checks that the
object is gone once nothing holds it. With the cycle back, the object stays."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from support.live_reads import live_events
from support.settle import settled

from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.orchestration.recorder import EventRecorder
from thoughtgate.server.app import create_app
from thoughtgate.server.fanout import RunFeeds
from thoughtgate.server.sse import SERVER_SEND
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord

pytestmark = pytest.mark.unit


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    gc.collect()  # nothing pending collects in the middle of the test
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


async def _turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class _Cycle:
    """What uvicorn's request cycle is to the app: it holds the request's scope, and the app's
    ``send`` is a method of it."""

    def __init__(self, path: str) -> None:
        self.scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1:8000")],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }
        self.messages: list[dict[str, Any]] = []
        self.server_send_seen = False

    async def receive(self) -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        # the server's own send is in the scope while the app answers (live streams write
        # through it, server.sse)
        self.server_send_seen = self.server_send_seen or SERVER_SEND in self.scope
        self.messages.append(message)


async def test_a_request_answered_leaves_its_cycle_and_scope_to_reference_counting() -> None:
    app = create_app(MemoryStore())
    with _collector_off():
        cycle = _Cycle("/healthz")
        await app(cycle.scope, cycle.receive, cycle.send)
        assert cycle.messages[0]["status"] == 200
        assert cycle.server_send_seen
        gone = weakref.ref(cycle)
        del cycle
        assert gone() is None


@pytest.mark.parametrize("feed_ran", [False, True])
async def test_an_ended_live_feed_is_freed_with_its_readers(feed_ran: bool) -> None:
    """``feed_ran``: the run ends after the feed's task has waited for it, or before that
    task's first step."""
    store = MemoryStore()
    store.poll_interval = 3600.0  # only what is appended here wakes the feed
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)

    async def read() -> list[int]:
        return [event.seq async for event in live_events(feeds, "run_1", after=0)]

    with _collector_off():
        reader = asyncio.create_task(read())
        await settled(lambda: feeds.readers("run_1") == 1)
        feed = weakref.ref(feeds._feeds["run_1"])
        if feed_ran:
            await _turns()
        await store.append("run_1", [NewEvent("message.delta", {"text": "a", "turn": 0})])
        await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
        assert await reader == [1, 2]
        del reader
        await _turns()
        assert feeds.readers("run_1") == 0
        assert feed() is None


async def test_a_feed_its_last_reader_left_is_freed_and_a_new_reader_gets_a_new_one() -> None:
    store = MemoryStore()
    store.poll_interval = 3600.0
    await store.create_run(RunRecord("run_1", "p"))
    feeds = RunFeeds(store)

    async def first(after: int = 0) -> int:
        async with contextlib.aclosing(live_events(feeds, "run_1", after=after)) as events:
            async for event in events:
                return event.seq
        raise AssertionError("no event")

    with _collector_off():
        reader = asyncio.create_task(first())
        await settled(lambda: feeds.readers("run_1") == 1)
        await _turns()  # the feed's task waits for the run
        feed = weakref.ref(feeds._feeds["run_1"])
        await store.append("run_1", [NewEvent("message.delta", {"text": "a", "turn": 0})])
        assert await reader == 1  # and it left, the run going on
        del reader
        await _turns()
        assert feeds.readers("run_1") == 0
        assert feed() is None
    later = asyncio.create_task(first(after=1))
    await settled(lambda: feeds.readers("run_1") == 1)
    await store.append("run_1", [NewEvent("message.delta", {"text": "b", "turn": 0})])
    assert await later == 2  # a new feed brought it


async def test_a_recorder_closed_with_its_window_open_is_freed_with_its_run() -> None:
    store = MemoryStore()
    await store.create_run(RunRecord("run_1", "p"))
    with _collector_off():
        recorder = EventRecorder(store, "run_1", flush_interval=3600.0)
        first, second = (NewEvent("message.delta", {"text": t, "turn": 0}) for t in ("a", " b"))
        await recorder.emit_delta(first)  # appended at once
        await recorder.emit_delta(second)  # waits for its window
        await recorder.close()  # flushes it, and ends the task that waited for the window
        gone = weakref.ref(recorder)
        del recorder
        await _turns()  # the cancelled wait ends
        assert gone() is None
    stored = await store.read("run_1")
    assert [e.payload["text"] for e in stored] == ["a", " b"]

"""A replaying stream holds none of its page's events while its chunk is sent (ADR 0171).

Why it matters: a reader that replays a run reads it from the store a page (500 events) at a
time, and its connection's write of that page's chunk waits while the client reads. A thousand
readers replaying a long run together each waited with their page's events, their frames and
the chunk alive: the daemon's pymalloc arenas grew by ~30 a burst to ~250 (RSS 68 -> 415 MB)
and stayed there, since an arena is given back only once every block in it is free. Only the
chunk itself need wait.
"""

from __future__ import annotations

import gc
from pathlib import Path

from thoughtgate.access.roles import Role
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.server.fanout import RunFeeds
from thoughtgate.server.sse import live_frames
from thoughtgate.store.records import RunRecord
from thoughtgate.store.sqlite import SQLiteStore

EVENTS = 700  # a page of 500, then the rest with the run's end


def _alive(run_id: str) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is Event and o.run_id == run_id)


async def test_a_replaying_stream_holds_no_event_while_its_chunk_waits(tmp_path: Path) -> None:
    store = await SQLiteStore.open(str(tmp_path / "replay.db"))
    try:
        await store.create_run(RunRecord("run_1", "p"))
        await store.append(
            "run_1", [NewEvent(EventType.MESSAGE_DELTA, {"text": f"w{i} "}) for i in range(EVENTS)]
        )
        await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
        held = _alive("run_1")  # by the store: the last batch it appended (published)
        frames = live_frames(
            store, "run_1", role=Role.VIEWER, mode="surface", after=0, feeds=RunFeeds(store)
        )
        sizes, alive = [], []
        async for chunk in frames:  # the stream waits at each while the connection writes it
            sizes.append(chunk.count(b"id: "))
            alive.append(_alive("run_1"))
        # the first page read on the loop (64 events), then pages of 500 (the last with the end)
        assert sizes == [64, 500, EVENTS + 1 - 564]
        assert alive == [held] * 3  # before ADR 0171: [64 + held, 500 + held, 137 + held]
    finally:
        await store.close()

"""The recorder batches deltas without reordering anything and without delaying the first byte."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.errors import StoreError
from thoughtgate.events.schema import Event, NewEvent
from thoughtgate.orchestration.recorder import EventRecorder
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord, TaskRecord
from thoughtgate.store.sqlite import SQLiteStore


def delta(text: str, turn: int = 0) -> NewEvent:
    return NewEvent("message.delta", {"text": text, "turn": turn})


def thought(text: str, index: int = 0, kind: str = "raw", turn: int = 0) -> NewEvent:
    payload = {"text": text, "reasoning_kind": kind, "index": index, "turn": turn}
    return NewEvent("reasoning.delta", payload, task_id="task_1")


def progress(i: int) -> NewEvent:
    """A non-delta event carrying ``i`` (in ``turn``)."""
    card = {"call_id": "c", "tool_key": "t", "turn": i, "label": "t"}
    return NewEvent("tool.progress", {**card, "message": "working"})


async def fresh() -> tuple[MemoryStore, EventRecorder]:
    store = MemoryStore()
    await store.create_run(RunRecord("run_1", "p"))
    return store, EventRecorder(store, "run_1", flush_interval=0.05)


async def test_first_delta_is_appended_immediately_then_batched() -> None:
    store, rec = await fresh()
    batches: list[list[str]] = []
    window_closed = asyncio.Event()

    async def sink(events: Sequence[Event]) -> None:
        batches.append([e.payload["text"] for e in events])
        if len(batches) == 2:
            window_closed.set()

    store.observe(sink)  # every batch the log commits
    await rec.emit_delta(delta("a"))
    assert len(await store.read("run_1")) == 1, "the first byte is not held back"
    await rec.emit_delta(delta("b"))
    await rec.emit_delta(delta("c"))
    assert len(await store.read("run_1")) == 1
    await asyncio.wait_for(window_closed.wait(), 10)  # nobody flushes: the window closes alone
    # b and c continue the same part in the same window: one delta, the text in order
    assert batches == [["a"], ["bc"]]
    assert [e.payload["text"] for e in await store.read("run_1")] == ["a", "bc"]
    await rec.close()


_PARTS = st.sampled_from(
    [("message.delta", 0, "raw", 0), ("message.delta", 1, "raw", 0)]
    + [
        ("reasoning.delta", turn, kind, index)
        for turn in (0, 1)
        for kind in ("raw", "summary")
        for index in (0, 1)
    ]
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(st.tuples(_PARTS, st.text(min_size=1, max_size=3)), st.just(None)),
        max_size=60,
    ),
    st.sampled_from([0.0, 0.001, 10.0]),
)
def test_joined_deltas_keep_every_text_of_every_part_in_order(
    plan: list[tuple[tuple[str, int, str, int], str] | None], window: float
) -> None:
    """Deltas are recorded joined only to the delta of the same part just before them: what a
    reader rebuilds (each part's text, the order of parts and of other events) is what was
    emitted, and no recorded delta could have been joined to the one before it in its batch."""

    def event(part: tuple[str, int, str, int], text: str) -> NewEvent:
        kind, turn, reasoning_kind, index = part
        return (
            delta(text, turn)
            if kind == "message.delta"
            else thought(text, index, reasoning_kind, turn)
        )

    def key(e: NewEvent) -> tuple[object, ...]:
        return (e.type, e.task_id, *sorted((k, v) for k, v in e.payload.items() if k != "text"))

    async def go() -> tuple[list[NewEvent], list[list[Any]]]:
        store = BatchCountingStore()
        await store.create_run(RunRecord("run_1", "p"))
        rec = EventRecorder(store, "run_1", flush_interval=window)
        emitted: list[NewEvent] = []
        for i, step in enumerate(plan):
            e = progress(i) if step is None else event(*step)
            emitted.append(e)
            await (rec.emit(e) if step is None else rec.emit_delta(e))
        await rec.close()
        return emitted, store.event_batches

    emitted, batches = asyncio.run(go())

    def runs(events: list[Any]) -> list[tuple[tuple[object, ...], str]]:
        """Consecutive events of one part, their texts joined (other events stay apart)."""
        out: list[tuple[tuple[object, ...], str]] = []
        for e in events:
            joinable = e.type in ("message.delta", "reasoning.delta")
            if joinable and out and out[-1][0] == key(e):
                out[-1] = (out[-1][0], out[-1][1] + e.payload["text"])
            else:
                out.append(
                    (
                        key(e) if joinable else ("other", e.payload["turn"]),
                        e.payload.get("text", ""),
                    )
                )
        return out

    recorded = [e for batch in batches for e in batch]
    assert runs(recorded) == runs(emitted)
    for batch in batches:
        for before, after in itertools.pairwise(batch):
            if after.type in ("message.delta", "reasoning.delta"):
                assert key(before) != key(after) or before.type not in (
                    "message.delta",
                    "reasoning.delta",
                )


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 0.0, 0.001])), max_size=40))
def test_recorded_order_is_emission_order(plan: list[tuple[bool, float]]) -> None:
    async def go() -> list[int]:
        store, rec = await fresh()
        rec.flush_interval = 0.002
        for i, (is_delta, pause) in enumerate(plan):
            event = delta(str(i), i) if is_delta else progress(i)
            if is_delta:
                await rec.emit_delta(event)
            else:
                await rec.emit(event)
            if pause:
                await asyncio.sleep(pause)
        await rec.close()
        return [e.payload["turn"] for e in await store.read("run_1")]

    assert asyncio.run(go()) == list(range(len(plan)))


async def test_after_a_failed_append_nothing_more_is_recorded() -> None:
    from thoughtgate.errors import StoreError

    store, rec = await fresh()
    real = store.append
    calls = {"n": 0}

    async def flaky(run_id: str, events: object, **fenced: Any) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise StoreError("database or disk is full")
        return await real(run_id, events, **fenced)  # type: ignore[arg-type]

    store.append = flaky  # type: ignore[method-assign]
    await rec.emit(progress(0))
    with pytest.raises(StoreError):
        await rec.emit(progress(1))
    for attempt in (rec.emit(progress(3)), rec.close()):
        try:
            await attempt
        except StoreError:
            continue
        raise AssertionError("a recorder that lost a batch must refuse later events")
    assert [e.payload["turn"] for e in await store.read("run_1")] == [0]


class BatchCountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []
        self.event_batches: list[list[Any]] = []

    async def append(self, run_id: str, events: Any, *, held_by: Any = None) -> Any:
        self.batches.append([e.type for e in events])
        self.event_batches.append(list(events))
        return await super().append(run_id, events, held_by=held_by)

    async def finish_run(self, run_id: str, events: Any, ending: Any) -> Any:
        self.batches.append([e.type for e in events])
        self.event_batches.append(list(events))
        return await super().finish_run(run_id, events, ending)


async def test_events_emitted_together_are_one_batch_after_the_buffered_deltas() -> None:
    store = BatchCountingStore()
    await store.create_run(RunRecord("run_1", "p"))
    rec = EventRecorder(store, "run_1", flush_interval=10)
    await rec.emit_delta(delta("a"))  # the first byte goes alone
    await rec.emit_delta(delta("b"))
    await rec.emit_delta(delta("c", turn=1))
    out = await rec.emit_all([progress(1), progress(2)])
    assert [e.seq for e in out] == [2, 3, 4, 5]
    assert store.batches == [
        ["message.delta"],
        ["message.delta", "message.delta", "tool.progress", "tool.progress"],
    ]
    await rec.close()


async def test_a_turn_ends_in_one_batch_whatever_its_visible_steps() -> None:
    from thoughtgate.orchestration.runtime import RunRequest, Runtime
    from thoughtgate.testing.fake import reasoning, text

    def script(request: Any, turn: int) -> Any:
        yield reasoning("weighing it")
        yield text("done")

    from thoughtgate.testing.fake import FakeProvider

    store = BatchCountingStore()
    runtime = Runtime(store, provider_factory=lambda model: FakeProvider(script, model=model))
    run = await runtime.run(RunRequest("q", model="fake:x"), chain_of_thought="surface")
    assert run.status == "completed"
    ends = [b for b in store.batches if "agent.response" in b]
    assert len(ends) == 1
    closing = ends[0][ends[0].index("agent.response") :]
    # The run's last turn ends in the run's ending (ADR 0021, amended), in the order readers see.
    assert closing[-4:] == [
        "message.completed",
        "worker.completed",
        "task.completed",
        "run.settlement.completed",
    ]
    assert any(t.startswith("cot.") for t in closing)  # the visible steps came along


def _started(prompt: str = "p") -> NewEvent:
    payload = {"index": 0, "prompt": prompt, "backend": "fake", "model": "fake:x"}
    return NewEvent("task.started", payload, task_id="task_1")


@pytest.mark.inprocess
async def test_on_sqlite_the_first_delta_does_not_wait_for_task_started_to_commit(
    tmp_path: Path,
) -> None:
    """With the writer busy, ``task.started`` and the task's first delta are queued together
    and share one commit, in order (before, the delta was queued only after ``task.started``'s
    commit came back: a second commit, and two turns of a loaded event loop, later)."""
    store = await SQLiteStore.open(tmp_path / "r.db")
    try:
        await store.create_run(
            RunRecord("run_1", "p", tasks=[TaskRecord("task_1", "run_1", 0, "p")])
        )
        rec = EventRecorder(store, "run_1", flush_interval=0.05)
        holding, gate = threading.Event(), threading.Event()

        def hold(conn: sqlite3.Connection) -> None:
            holding.set()
            gate.wait(10)

        busy = asyncio.ensure_future(store._writer.call("wait", hold))
        assert await asyncio.to_thread(holding.wait, 10)
        commits = store._writer.commits
        await rec.start([_started()])
        first = asyncio.ensure_future(rec.emit_delta(thought("first")))
        for _ in range(1000):  # the delta's append is queued without waiting for the commit
            if store._writer.waiting() == 2:
                break
            await asyncio.sleep(0)
        assert store._writer.waiting() == 2
        gate.set()
        await busy
        await first
        assert store._writer.commits == commits + 1
        log = await store.read("run_1")
        assert [e.type for e in log] == ["task.started", "reasoning.delta"]
        await rec.close()
    finally:
        await store.close()


@pytest.mark.inprocess
async def test_on_sqlite_a_delta_queued_behind_a_failed_task_started_is_not_recorded(
    tmp_path: Path,
) -> None:
    store = await SQLiteStore.open(tmp_path / "small.db", max_bytes=256 * 1024)
    try:
        await store.create_run(
            RunRecord("run_1", "p", tasks=[TaskRecord("task_1", "run_1", 0, "p")])
        )
        rec = EventRecorder(store, "run_1", flush_interval=0.05)
        await rec.start([_started("x" * 1_000_000)])  # never fits: its commit fails
        with pytest.raises(StoreError, match="disk is full"):
            await rec.emit_delta(thought("first"))
        with pytest.raises(StoreError, match="disk is full"):
            await rec.close()
        assert await store.read("run_1") == []
    finally:
        await store.close()


async def test_a_closed_recorder_returns_at_once_and_leaves_no_task_behind() -> None:
    """A run's end does not wait for the window flusher to stop (ADR 0085): ``close`` returns
    without a turn of the loop, and the flusher it cancelled ends on the next, storing nothing."""
    store = MemoryStore()
    await store.create_run(RunRecord("run_1", "p"))
    rec = EventRecorder(store, "run_1", flush_interval=60.0, hold_last=True)
    await rec.emit_delta(delta("a"))  # at once
    await rec.emit_delta(delta("b", turn=1))  # waits for a window 60 s away
    await rec.emit_last([progress(1)])
    assert [e.type for e in rec.take_held()] == ["message.delta", "tool.progress"]
    mine = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not mine]  # the flusher, waiting
    closing = asyncio.ensure_future(rec.close())
    await asyncio.sleep(0)  # one turn: close ran whole
    assert closing.done() and closing.exception() is None
    await asyncio.sleep(0)  # and the cancelled flusher has ended
    assert [t for t in asyncio.all_tasks() if t is not mine] == []
    assert [e.payload["text"] for e in await store.read("run_1")] == ["a"]


async def test_a_cancel_during_a_turns_record_is_raised_once_the_record_is_decided() -> None:
    """A store call cancelled mid-way may commit all the same (SQLite's writer does): a cancel
    that lands while a turn's ``agent.response`` is appended is raised only once the append is
    decided, so whoever ends the task next finds the record in the log, or knows it is not
    there, and records the turn's stand-in exactly when it is not (ADR 0131, amended)."""
    store, rec = await fresh()
    real = store.append
    under_way, commit = asyncio.Event(), asyncio.Event()

    async def commits_anyway(run_id: str, events: Any, **fenced: Any) -> Any:
        async def write() -> Any:
            under_way.set()
            await commit.wait()
            return await real(run_id, events, **fenced)

        return await asyncio.shield(asyncio.ensure_future(write()))

    store.append = commits_anyway  # type: ignore[method-assign]
    response = {
        "turn": 0,
        "answer": "a",
        "complete": True,
        "finish_reason": "stop",
        "raw_finish_reason": "stop",
        "provider": "fake",
        "model": "x",
        "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
        "tool_calls": [],
    }
    record = asyncio.create_task(rec.emit_all([NewEvent("agent.response", response)]))
    await under_way.wait()
    record.cancel()
    await asyncio.sleep(0)
    commit.set()
    with pytest.raises(asyncio.CancelledError):
        await record
    assert [e.type for e in await store.read("run_1")] == ["agent.response"]

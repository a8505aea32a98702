"""The recorder batches deltas without reordering anything and without delaying the first byte."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.events.schema import Event, NewEvent
from thoughtgate.orchestration.recorder import EventRecorder
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord


def delta(text: str, turn: int = 0) -> NewEvent:
    return NewEvent("message.delta", {"text": text, "turn": turn})


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
    assert batches == [["a"], ["b", "c"]]
    assert [e.payload["text"] for e in await store.read("run_1")] == ["a", "b", "c"]
    await rec.close()


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

    async def flaky(run_id: str, events: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise StoreError("database or disk is full")
        return await real(run_id, events)  # type: ignore[arg-type]

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

    async def append(self, run_id: str, events: Any) -> Any:
        self.batches.append([e.type for e in events])
        return await super().append(run_id, events)


async def test_events_emitted_together_are_one_batch_after_the_buffered_deltas() -> None:
    store = BatchCountingStore()
    await store.create_run(RunRecord("run_1", "p"))
    rec = EventRecorder(store, "run_1", flush_interval=10)
    await rec.emit_delta(delta("a"))  # the first byte goes alone
    await rec.emit_delta(delta("b"))
    await rec.emit_delta(delta("c"))
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
    assert closing[-1] == "message.completed"
    assert any(t.startswith("cot.") for t in closing)  # the visible steps came along

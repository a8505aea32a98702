"""A run does not wait for one commit before starting the work after it (ADR 0021, amended).

The provider's stream opens while ``task.started`` commits, and a run's last turn ends in the
run's ending commit; readers still see every event in order, and only once it is durable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from thoughtgate.errors import StoreError, UsageError
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.base import Holder
from thoughtgate.store.leases import close_run_interrupted
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text


class HeldStartStore(MemoryStore):
    """Commits ``task.started`` only once the provider's stream has been opened (or fails it)."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.opened = asyncio.Event()
        self.fail = fail

    async def append(
        self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
    ) -> list[Event]:
        if any(e.type == EventType.TASK_STARTED for e in events):
            # A runtime that waited for this commit before opening the stream never gets here.
            await asyncio.wait_for(self.opened.wait(), 5)
            if self.fail:
                raise StoreError("the disk is full")
        return await super().append(run_id, events, held_by=held_by)


def _runtime(store: MemoryStore | SQLiteStore, opened: asyncio.Event | None = None) -> Runtime:
    def script(request: Any, turn: int) -> Iterator[Any]:
        if opened is not None:
            opened.set()
        yield reasoning("weighing it")
        yield reasoning(" carefully")
        yield text("done")

    return Runtime(store, provider_factory=lambda model: FakeProvider(script, model=model))


@pytest.mark.unit
async def test_the_provider_stream_opens_before_task_started_is_committed() -> None:
    store = HeldStartStore()
    run = await _runtime(store, store.opened).run(
        RunRequest("q", model="fake:x"), chain_of_thought="surface"
    )
    assert run.status == "completed"
    types = [e.type for e in await store.read(run.run_id)]
    # The log keeps the order: the task starts before its first delta.
    assert types.index(EventType.TASK_STARTED) < types.index(EventType.REASONING_DELTA)
    assert types[-1] == EventType.RUN_SETTLEMENT_COMPLETED


@pytest.mark.unit
async def test_a_task_whose_start_fails_to_commit_fails_and_reports_no_answer() -> None:
    store = HeldStartStore(fail=True)
    runtime = _runtime(store, store.opened)
    created = await runtime.create_run(RunRequest("q", model="fake:x"), chain_of_thought="surface")
    with pytest.raises(StoreError):
        await runtime.execute(created.run_id)
    run = await store.get_run(created.run_id)
    assert run.status == "failed"
    assert run.tasks[0].status == "failed"
    types = [e.type for e in await store.read(run.run_id)]
    assert EventType.TASK_STARTED not in types
    # Nothing after the lost event claims success: no delta, no answer, a failed run.
    assert EventType.REASONING_DELTA not in types
    assert EventType.MESSAGE_COMPLETED not in types
    assert types[-1] == EventType.RUN_FAILED
    # What the run's end cancelled or let go (the lease renewal, the provider's stream) winds
    # down at once: within a few turns of the event loop, counted in turns, not in wall time (it
    # waits on nothing), so a loaded machine cannot make it late.
    for _ in range(_TURNS):
        if not _other_tasks():
            break
        await asyncio.sleep(0)
    assert _other_tasks() == []


_TURNS = 10
"""Turns of the event loop a cancelled task may take to end (two are needed today)."""


def _other_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


@pytest.mark.inprocess
@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_a_run_ends_in_one_commit_after_its_stream(tmp_path: Path, mode: str) -> None:
    """The stream's last deltas, the turn's record (visible steps included) and the run's end."""
    store = await SQLiteStore.open(tmp_path / "end.db")
    writer = store._writer
    groups: list[list[str]] = []  # each commit's writes, by what they do
    commit_group = writer._commit_group

    def noted(jobs: list[Any]) -> Any:
        outcomes = commit_group(jobs)
        groups.append([job.action for job in jobs])
        return outcomes

    writer._commit_group = noted  # type: ignore[method-assign]
    at_stream_end: list[int] = []

    def script(request: Any, turn: int) -> Iterator[Any]:
        yield reasoning("weighing it")
        yield reasoning(" carefully")
        yield text("do")
        yield text("ne")
        at_stream_end.append(len(groups))

    runtime = Runtime(store, provider_factory=lambda model: FakeProvider(script, model=model))
    try:
        run = await runtime.run(RunRequest("q", model="fake:x"), chain_of_thought=mode)
        assert run.status == "completed"
        # The run's own writes after its stream: one commit. (The lease keeper's first renewal,
        # made when the run began, may commit before or after the stream's end: not the run's.)
        after = [g for g in groups[at_stream_end[0] :] if any(run.run_id in a for a in g)]
        assert len(after) == 1
        events = await store.read(run.run_id)
        types = [e.type for e in events]
        assert types[-4:] == [
            EventType.MESSAGE_COMPLETED,
            EventType.WORKER_COMPLETED,
            EventType.TASK_COMPLETED,
            EventType.RUN_SETTLEMENT_COMPLETED,
        ]
        deltas = "".join(e.payload["text"] for e in events if e.type == EventType.MESSAGE_DELTA)
        assert deltas == "done"  # the tail deltas are recorded, before the answer
        assert types.index(EventType.AGENT_RESPONSE) > max(
            i for i, t in enumerate(types) if t == EventType.MESSAGE_DELTA
        )
    finally:
        await store.close()


@pytest.mark.unit
async def test_a_run_cancelled_after_its_last_turn_still_records_that_turn() -> None:
    """The last turn is held for the run's ending; a cancel before that end stores it anyway,
    before ``run.interrupted``, and nothing claims the task succeeded."""
    closing = asyncio.Event()
    gate = asyncio.Event()

    class SlowToClose(FakeProvider):
        async def aclose(self) -> None:  # the run is cancelled here, after its last turn
            closing.set()
            await gate.wait()

    def script(request: Any, turn: int) -> Iterator[Any]:
        yield reasoning("weighing it")
        yield text("done")

    store = MemoryStore()
    runtime = Runtime(store, provider_factory=lambda model: SlowToClose(script, model=model))
    created = await runtime.create_run(RunRequest("q", model="fake:x"), chain_of_thought="surface")
    execution = asyncio.create_task(runtime.execute(created.run_id))
    await asyncio.wait_for(closing.wait(), 5)
    execution.cancel("stop")
    with pytest.raises(asyncio.CancelledError):
        await execution
    run = await store.get_run(created.run_id)
    assert run.status == "interrupted"
    types = [e.type for e in await store.read(run.run_id)]
    assert types.index(EventType.MESSAGE_COMPLETED) < types.index(EventType.RUN_INTERRUPTED)
    assert types[-1] == EventType.RUN_INTERRUPTED
    assert EventType.WORKER_COMPLETED not in types
    assert run.tasks[0].status == "interrupted"


class ReadCountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.run_reads = 0

    async def get_run(self, run_id: str, *, apart: bool = True) -> Any:
        self.run_reads += 1
        return await super().get_run(run_id, apart=apart)

    async def get_run_spec(self, run_id: str) -> Any:
        self.run_reads += 1
        return await super().get_run_spec(run_id)


@pytest.mark.unit
async def test_the_daemons_execution_of_a_run_it_admitted_reads_nothing_back() -> None:
    store = ReadCountingStore()
    runtime = _runtime(store)
    created = await runtime.create_run(RunRequest("q", model="fake:x"), chain_of_thought="surface")
    assert created.tasks[0].status == "pending"
    await runtime.run_to_end(created.run_id)
    assert store.run_reads == 0
    assert created.tasks[0].status == "pending"  # the caller's record is not the execution's
    run = await store.get_run(created.run_id)
    assert run.status == "completed" and run.tasks[0].output == "done"


@pytest.mark.unit
async def test_a_run_closed_elsewhere_after_its_admission_lease_ran_out_is_not_executed() -> None:
    store = ReadCountingStore()
    runtime = _runtime(store)
    created = await runtime.create_run(RunRequest("q", model="fake:x"), chain_of_thought="surface")
    runtime._admitted[created.run_id][0].lease_expires_at = time.time() - 1  # as if long ago
    await close_run_interrupted(store, created.run_id, "its process looked gone")
    with pytest.raises(UsageError, match="already ended"):
        await runtime.run_to_end(created.run_id)
    types = [e.type for e in await store.read(created.run_id)]
    assert types[-1] == EventType.RUN_INTERRUPTED
    assert EventType.TASK_STARTED not in types

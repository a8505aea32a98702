"""The events of an execution that lost its run are refused, not interleaved with the events of
the execution that took it over (ADR 0090).

A process that stalls past its lease (a long GC pause, ``SIGSTOP``, a suspended VM) while it
executes a run loses the run: a sweep releases it and another execution claims it (attempt 2)
and writes its log. ADR 0072 fenced the stalled execution's *end*; these check its events in
between -- a task's end, its next task's start, the model's reasoning and text deltas -- which
it appends as soon as it wakes, before any lease renewal could notice. The stall is modelled as
in ``test_owner_fenced_ends``: the first process's worker (or provider stream) waits on a gate,
with a lease of a minute, so no renewal falls inside a test, and the take-over is the sweep's
own store calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from support.pg import pg_admin, pg_schema
from support.store_backends import Postgres, SQLite
from test_owner_fenced_ends import (
    LEASE_S,
    A,
    B,
    Gate,
    Keeper,
    process,
    stalls,
    take_over,
    terminal_events,
)

from thoughtgate.config import Config, OrchestrationConfig
from thoughtgate.engine.steps import DirectSteps
from thoughtgate.errors import RunTakenOverError
from thoughtgate.events.schema import Event, EventType
from thoughtgate.orchestration.resume import begin_execution
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name


def after_claim(events: list[Event]) -> list[Event]:
    """The events after the take-over's ``run.resumed``: the second execution's log."""
    (resumed,) = [e for e in events if e.type == EventType.RUN_RESUMED]
    return [e for e in events if e.seq > resumed.seq]


STREAMED = 200
"""Reasoning and text delta pairs the stalled turn streams once it wakes: alternating, so none
joins the one before it, and more than a recorder's batch (``max_batch``, 256 events) -- a
batch is appended while the turn still streams, whatever the timing."""


class StalledStream:
    """A model turn that streams reasoning, stalls until let through, then streams more
    reasoning and its answer: the first call only; every later turn answers at once."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.through = asyncio.Event()
        self.calls = 0

    def __call__(self, request: TurnRequest, turn: int) -> AsyncIterator[Any] | Iterator[Any]:
        self.calls += 1
        if self.calls > 1:
            return iter([reasoning("second thinks"), text("second says")])
        return self._stalled()

    async def _stalled(self) -> AsyncIterator[Any]:
        yield reasoning("first thinks before ")
        self.entered.set()
        await self.through.wait()
        for k in range(STREAMED):  # more deltas than a window holds: one is flushed meanwhile
            yield reasoning(f"first thinks {k} ")
            yield text(f"first says {k} ")


def reasoning_process(store: EventStore, stream: StalledStream) -> Runtime:
    """A process on ``store`` (owner A) whose model is ``stream``."""
    config = Config(orchestration=OrchestrationConfig(lease_ttl_s=LEASE_S))
    runtime = Runtime(store, config, provider_factory=lambda model: FakeProvider(stream))
    runtime.leases = Keeper(store, A)
    return runtime


class Scenarios:
    async def test_a_stalled_execution_appends_nothing_into_the_log_another_one_writes(
        self, store: EventStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A executes task one of two and stalls; the run is released and B resumes it (attempt
        2) and is executing task one. A wakes: its task's end -- its first write -- is refused,
        A stops (no start of task two, no end), and B's log holds B's events alone; B then
        completes the run."""
        stalled, resumer = Gate("A's answer"), Gate("B's answer")
        a, b = process(store, A, stalled), process(store, B, resumer)
        run = await a.create_run(RunRequest("p", tasks=[TaskSpec("one"), TaskSpec("two")]))
        begun = await begin_execution(a, run.run_id, a.forget_admitted(run.run_id))
        assert begun is not None
        a_run, a_spec, a_tools, _, a_attempt = begun
        a_job = asyncio.create_task(
            a._run_held(a_run, a_spec.tasks, a_tools, DirectSteps(), attempt=a_attempt)
        )
        await stalled.entered.wait()  # A executes task one ... and stalls
        await stalls(a)  # (its first renewal done: none in flight reads the take-over)

        await take_over(store, run.run_id, by=None)
        taken = await begin_execution(b, run.run_id)
        assert taken is not None
        b_run, b_spec, b_tools, b_resumed, b_attempt = taken
        assert b_attempt == 2
        steps = DirectSteps()
        steps.resumed = b_resumed
        b_job = asyncio.create_task(
            b._run_held(b_run, b_spec.tasks, b_tools, steps, attempt=b_attempt)
        )
        await resumer.entered.wait()  # B executes task one now

        with caplog.at_level(logging.WARNING, logger="thoughtgate.store.log"):
            stalled.through.set()  # A wakes: its task's end is refused, and A stops
            with pytest.raises(RunTakenOverError) as refused:
                await a_job
        seen = after_claim(await store.read(run.run_id))
        assert all("A's answer" not in str(e.payload) for e in seen), "nothing of A's lands"
        assert "its events here were not recorded" in str(refused.value)
        assert any(
            run.run_id in r.getMessage() and "refused" in r.getMessage() for r in caplog.records
        )
        assert run.run_id not in a.leases, "A renews it no more"
        held = await store.get_run(run.run_id)
        assert (held.status, held.owner) == ("running", B.owner_id)

        resumer.through.set()
        assert await b_job == "completed"
        ended = await store.get_run(run.run_id)
        assert [t.output for t in ended.tasks] == ["B's answer", "B's answer"]
        events = after_claim(await store.read(run.run_id))
        assert all("A's answer" not in str(e.payload) for e in events)
        # Task one's start is A's when its append committed before the take-over (B's resume
        # keeps it), else B's: A's was still in flight as its provider was called, and the
        # fence refused it. Either way each task starts once in the whole log, task two by B.
        one, two = (t.task_id for t in ended.tasks)
        log_ = await store.read(run.run_id)
        starts = [e.task_id for e in log_ if e.type == EventType.TASK_STARTED]
        assert sorted(starts) == sorted([one, two]), "each task started once"
        started = [e.task_id for e in events if e.type == EventType.TASK_STARTED]
        assert started in ([two], [one, two]), "task two started by B, after the take-over"
        assert await terminal_events(store, run.run_id) == [EventType.RUN_SETTLEMENT_COMPLETED]

    async def test_a_stalled_streams_reasoning_stops_once_its_process_took_the_run_again(
        self, store: EventStore
    ) -> None:
        """The same process claims the run again (its own queue took it back: attempt 2, same
        owner) while its first execution is stalled mid-stream. The first execution's next
        reasoning and text deltas are refused -- fenced by the attempt, as the owner is the
        same -- and it stops; the second execution's model turn is the one the log keeps."""
        stream = StalledStream()
        a = reasoning_process(store, stream)
        request = RunRequest("p", model="fake:stalled", chain_of_thought="surface")
        run = await a.create_run(request)
        begun = await begin_execution(a, run.run_id, a.forget_admitted(run.run_id))
        assert begun is not None
        first, spec, tools, _, attempt = begun
        job = asyncio.create_task(
            a._run_held(first, spec.tasks, tools, DirectSteps(), attempt=attempt)
        )
        await stream.entered.wait()
        await stalls(a)
        before = await store.read(run.run_id)
        assert any(e.type == EventType.REASONING_DELTA for e in before), "it streamed, then"

        await take_over(store, run.run_id, by=None)
        taken = await begin_execution(a, run.run_id)  # the same owner claims it: attempt 2
        assert taken is not None
        second, spec, tools, resumed, again = taken
        assert again == 2

        stream.through.set()
        with pytest.raises(RunTakenOverError):
            await job
        assert after_claim(await store.read(run.run_id)) == [], "nothing of the first lands"

        steps = DirectSteps()
        steps.resumed = resumed
        assert await a._run_held(second, spec.tasks, tools, steps, attempt=again) == "completed"
        events = after_claim(await store.read(run.run_id))
        texts = " ".join(str(e.payload.get("text", "")) for e in events)
        assert "second thinks" in texts and "first" not in texts
        ended = await store.get_run(run.run_id)
        assert (ended.status, ended.tasks[0].output) == ("completed", "second says")

    async def test_a_plain_run_taken_over_by_another_process_records_no_more_events(
        self, store: EventStore
    ) -> None:
        """A ``thoughtgate run``-style run of two tasks (no claim: fenced by its owner alone)
        whose process stalled in the first and whose run another process took: the first
        task's end is refused, and the second never starts."""
        stalled = Gate("A's answer")
        a = process(store, A, stalled)
        job = asyncio.create_task(a.run(RunRequest("p", tasks=[TaskSpec("1"), TaskSpec("2")])))
        await stalled.entered.wait()
        await stalls(a)
        (run,) = await store.list_runs()
        await take_over(store, run.run_id, by=B)
        before = await store.read(run.run_id)
        stalled.through.set()
        with pytest.raises(RunTakenOverError):
            await job
        assert await store.read(run.run_id) == before
        assert (await store.get_run(run.run_id)).owner == B.owner_id


@pytest.mark.inprocess
class TestOnSQLite(SQLite, Scenarios):
    pass


@pytest.mark.postgres
class TestOnPostgres(Postgres, Scenarios):
    pass

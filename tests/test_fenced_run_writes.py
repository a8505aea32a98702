"""An execution that lost its run writes nothing more to the run's rows (ADR 0094).

ADR 0090 fenced every append an execution makes; two of its writes went to the run index
directly and were not: a task's record saved after its end events (its readable reasoning), and
the run's metadata its claim clears (``suspended``). Each comes after a fenced append of the
same execution, but not in one transaction with it: a process that stalls in between (a long GC
pause, ``SIGSTOP``) wakes after a sweep released its run and wrote it over. The stall is a gate
right after that append, with a lease of a minute, so no renewal falls inside a test, and the
take-over is the sweep's own store calls (as in ``test_fenced_appends``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from support.pg import pg_admin, pg_schema
from support.store_backends import Postgres, SQLite
from test_owner_fenced_ends import LEASE_S, A, B, take_over

from thoughtgate.config import Config, OrchestrationConfig
from thoughtgate.engine.steps import DirectSteps
from thoughtgate.errors import RunTakenOverError
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.orchestration.leases import LeaseKeeper
from thoughtgate.orchestration.resume import begin_execution
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore, Holder
from thoughtgate.store.leases import Owner, suspend
from thoughtgate.testing.fake import FakeProvider, reasoning, text

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name


class Model:
    """Each turn thinks and answers as ``who``; with ``held``, a turn waits until let through."""

    def __init__(self, who: str, *, held: bool = False) -> None:
        self.who = who
        self.entered = asyncio.Event()
        self.through = asyncio.Event()
        if not held:
            self.through.set()

    def __call__(self, request: TurnRequest, turn: int) -> AsyncIterator[Any] | Iterator[Any]:
        return self._turn()

    async def _turn(self) -> AsyncIterator[Any]:
        self.entered.set()
        await self.through.wait()
        yield reasoning(f"{self.who} thinks")
        yield text(f"{self.who}'s answer")


def process(store: EventStore, owner: Owner, model: Model) -> Runtime:
    """A process on ``store`` (``owner``) whose model is ``model``."""
    config = Config(orchestration=OrchestrationConfig(lease_ttl_s=LEASE_S))
    runtime = Runtime(store, config, provider_factory=lambda _: FakeProvider(model))
    runtime.leases = LeaseKeeper(store, owner, ttl_s=LEASE_S)
    return runtime


class Stall:
    """The process stalls right after an append of ``kind`` (a task's end, its resume) is
    stored, until let through: its next write is the one outside ``append``."""

    def __init__(self, runtime: Runtime, kind: str) -> None:
        self.entered = asyncio.Event()
        self.through = asyncio.Event()
        append = runtime._append

        async def stalling(
            run_id: str, events: list[NewEvent], held_by: Holder | None = None
        ) -> None:
            await append(run_id, events, held_by)
            if any(e.type == kind for e in events) and not self.entered.is_set():
                self.entered.set()
                await self.through.wait()

        runtime._append = stalling  # type: ignore[method-assign]


class Scenarios:
    async def test_a_stalled_executions_task_record_lands_nowhere_after_the_take_over(
        self, store: EventStore
    ) -> None:
        """A ends task one of two (its end events stored) and stalls before it saves the task's
        reasoning beside them; the run is released and B resumes it and is executing. A wakes:
        its save is refused -- nothing of A is written to the run after B's claim -- and A
        stops (it starts no task two); B completes the run."""
        a_model, b_model = Model("A"), Model("B", held=True)
        a, b = process(store, A, a_model), process(store, B, b_model)
        request = RunRequest(
            "p",
            model="fake:x",
            chain_of_thought="surface",
            tasks=[TaskSpec("one"), TaskSpec("two")],
        )
        run = await a.create_run(request)
        stall = Stall(a, EventType.TASK_COMPLETED)
        saved: list[str | None] = []
        save = store.save_task

        async def noted(task: Any, **kw: Any) -> None:
            await save(task, **kw)
            saved.append(task.reasoning)

        store.save_task = noted  # type: ignore[method-assign]
        begun = await begin_execution(a, run.run_id, a.forget_admitted(run.run_id))
        assert begun is not None
        a_run, a_spec, a_tools, _, a_attempt = begun
        a_job = asyncio.create_task(
            a._run_held(a_run, a_spec.tasks, a_tools, DirectSteps(), attempt=a_attempt)
        )
        await stall.entered.wait()  # task one's end is stored; A stalls before its reasoning

        await take_over(store, run.run_id, by=None)
        taken = await begin_execution(b, run.run_id)
        assert taken is not None
        b_run, b_spec, b_tools, b_resumed, b_attempt = taken
        steps = DirectSteps()
        steps.resumed = b_resumed
        b_job = asyncio.create_task(
            b._run_held(b_run, b_spec.tasks, b_tools, steps, attempt=b_attempt)
        )
        await b_model.entered.wait()  # B executes (its steps redo task one's turn)
        one = (await store.get_run(run.run_id)).tasks[0]

        stall.through.set()
        with pytest.raises(RunTakenOverError) as refused:
            await a_job
        assert saved == [], "nothing of A's is written to the run after B's claim"
        assert refused.value.holder == B.owner_id
        assert (await store.get_run(run.run_id)).tasks[0] == one
        assert run.run_id not in a.leases

        b_model.through.set()
        assert await b_job == "completed"
        ended = await store.get_run(run.run_id)
        assert [t.status for t in ended.tasks] == ["completed", "completed"]
        assert all(r == "B thinks" for r in saved), "B's own records only"
        events = await store.read(run.run_id)
        started = [e.task_id for e in events if e.type == EventType.TASK_STARTED]
        assert started == [t.task_id for t in ended.tasks], "each task started once"

    async def test_a_stalled_resume_does_not_clear_the_suspension_a_sweep_recorded_since(
        self, store: EventStore
    ) -> None:
        """A resumes a suspended run (attempt 2): its ``run.resumed`` is stored, and A stalls
        before it clears the run's ``suspended``; its lease expires, a sweep releases the run
        and records why it is suspended now. A wakes: its clear is refused and A stops, so the
        run still says it waits to be resumed, and why."""
        a = process(store, A, Model("A"))
        run = await a.create_run(RunRequest("p", model="fake:x"))
        assert await begin_execution(a, run.run_id, a.forget_admitted(run.run_id)) is not None
        await take_over(store, run.run_id, by=None)
        await suspend(store, run.run_id, "first", queued=False, previous=A.owner_id)

        stall = Stall(a, EventType.RUN_RESUMED)
        resuming = asyncio.create_task(begin_execution(a, run.run_id))
        await stall.entered.wait()  # run.resumed stored (attempt 2); A stalls
        await take_over(store, run.run_id, by=None)
        await suspend(store, run.run_id, "second", queued=False, previous=A.owner_id)

        stall.through.set()
        with pytest.raises(RunTakenOverError):
            await resuming
        now = await store.get_run(run.run_id)
        assert (now.status, now.owner) == ("running", None)
        suspended = now.metadata["suspended"]
        assert isinstance(suspended, dict) and suspended["reason"] == "second"
        assert suspended["resume"] == "manual"


@pytest.mark.inprocess
class TestOnSQLite(SQLite, Scenarios):
    pass


@pytest.mark.postgres
class TestOnPostgres(Postgres, Scenarios):
    pass

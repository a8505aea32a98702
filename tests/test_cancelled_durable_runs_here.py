"""A durable run of ``thoughtgate run`` or the MCP tool (``Runtime.run``: created and executed
here, in one task) whose task is cancelled leaves no workflow behind (ADR 0093).

``Runtime.run`` starts the run's DBOS workflow here (``DurableEngine.start``), whose row DBOS
writes in a thread a cancel does not stop. A cancel that landed there ended the run (ADR 0072)
but left the row ``PENDING`` under this process's executor id, which no later process recovers,
and which the sweep never deletes (it deletes finished workflows only): there for good. A cancel
while the run executes did the same: DBOS records no outcome for a cancelled workflow. ADR 0090
settled the daemon's starts (``DurableEngine.withdraw`` cancels the workflow of a run it ended);
these are the same, for the run's own task: the workflow is ``CANCELLED`` and the next sweep
deletes it with the workflows of ended runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import dbos._core as dbos_core
import pytest
from dbos import DBOS
from support.durable_engine import SweepingDaemon, launched_by
from support.pg import PG_URL, pg_admin, pg_schema

from thoughtgate.config import Config
from thoughtgate.events.schema import RUN_TERMINAL_TYPES, EventType
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, text

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(120)

REASON = "cancelled by the MCP host"


class Model:
    """``fake:gated``: each turn notes its prompt, says it is under way, then answers once let
    through."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.entered = asyncio.Event()
        self.through = asyncio.Event()

    def __call__(self, request: TurnRequest, _: int) -> AsyncIterator[Any]:
        self.asked.append(request.messages[-1].text if request.messages else "")
        return self._turn()

    async def _turn(self) -> AsyncIterator[Any]:
        self.entered.set()
        await self.through.wait()
        yield text("done")


@pytest.fixture
def model() -> Iterator[Model]:
    model = Model()
    FAKE_SCRIPTS["gated"] = model
    yield model
    del FAKE_SCRIPTS["gated"]


class _Process(SweepingDaemon[Any]):
    """``thoughtgate run``'s runtime and engine (taking runs from no queue), with a daemon's
    run manager beside it for the sweep a later daemon on the store runs."""

    def __init__(self, store: EventStore) -> None:
        super().__init__(store, Config.from_mapping({"durability": {"poll_interval_s": 0.1}}))

    async def ended_once(self, run_id: str) -> None:
        run = await self.store.get_run(run_id)
        assert run.status == "interrupted" and run.error is not None and REASON in run.error
        types = await self.types(run_id)
        assert sum(t in RUN_TERMINAL_TYPES for t in types) == 1
        assert run_id not in self.runtime.executing

    async def workflow(self, run_id: str) -> str | None:
        found = await DBOS.get_workflow_status_async(run_id)
        return None if found is None else found.status

    async def swept_away(self, run_id: str) -> None:
        """The next sweep deletes the workflow, and the run stays as it ended."""
        assert await self.manager.recover() == []
        assert await self.workflow(run_id) is None
        assert (await self.store.get_run(run_id)).status == "interrupted"


async def _launched(store: EventStore) -> _Process:
    process = _Process(store)
    await process.launch(like="run")
    return process


@pytest.fixture
async def sqlite_process(tmp_path: Path) -> AsyncIterator[_Process]:
    async with launched_by(await SQLiteStore.open(tmp_path / "runs.db"), _launched) as process:
        yield process


@pytest.fixture
async def postgres_process(pg_schema: str) -> AsyncIterator[_Process]:
    async with launched_by(await PostgresStore.open(PG_URL, schema=pg_schema), _launched) as p:
        yield p


def _two_tasks() -> RunRequest:
    """Two tasks: its first execution takes checkpoints, so it executes as a DBOS workflow."""
    return RunRequest("a", model="fake:gated", tasks=[TaskSpec("a"), TaskSpec("b")])


async def _created(process: _Process) -> str:
    """The id of the one run the test created."""
    (run,) = await process.store.list_runs()
    return run.run_id


# ---------------------------------------------------------------------- while DBOS starts it
async def _a_cancel_while_dbos_writes_its_workflow_leaves_none(
    process: _Process, model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    entered, written, through = asyncio.Event(), asyncio.Event(), threading.Event()
    init = dbos_core._init_workflow

    def held(*args: Any, **kwargs: Any) -> Any:
        """DBOS's write of a new workflow, in its thread: held until the test cancelled the
        task that awaits it, then done as DBOS does it."""
        loop.call_soon_threadsafe(entered.set)
        through.wait(30)
        try:
            return init(*args, **kwargs)
        finally:
            loop.call_soon_threadsafe(written.set)

    monkeypatch.setattr(dbos_core, "_init_workflow", held)
    job = asyncio.create_task(process.runtime.run(_two_tasks()))
    await entered.wait()
    job.cancel(REASON)
    await asyncio.sleep(0)  # the cancel lands where the task awaits DBOS's thread
    through.set()
    with pytest.raises(asyncio.CancelledError):
        await job
    await written.wait()  # (the thread writes the row whatever became of its caller)
    run_id = await _created(process)
    await process.ended_once(run_id)
    assert EventType.TASK_STARTED not in await process.types(run_id), "it never began"
    assert await process.workflow(run_id) == "CANCELLED", "not PENDING for good"
    await process.swept_away(run_id)
    await asyncio.sleep(0.3)  # queue polls: nothing takes it up
    assert model.asked == []


@pytest.mark.inprocess
async def test_a_cancel_while_dbos_writes_its_workflow_leaves_none_sqlite(
    sqlite_process: _Process, model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _a_cancel_while_dbos_writes_its_workflow_leaves_none(sqlite_process, model, monkeypatch)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_cancel_while_dbos_writes_its_workflow_leaves_none_postgres(
    postgres_process: _Process, model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _a_cancel_while_dbos_writes_its_workflow_leaves_none(postgres_process, model, monkeypatch)


# ---------------------------------------------------------------------- while it executes
async def _a_cancel_while_it_executes_leaves_no_workflow(process: _Process, model: Model) -> None:
    job = asyncio.create_task(process.runtime.run(_two_tasks()))
    await model.entered.wait()  # its first task's model turn is under way
    run_id = await _created(process)
    assert await process.workflow(run_id) == "PENDING"
    job.cancel(REASON)
    with pytest.raises(asyncio.CancelledError):
        await job
    await process.ended_once(run_id)
    assert await process.workflow(run_id) == "CANCELLED", "not PENDING for good"
    await process.swept_away(run_id)
    assert model.asked == ["a"]


@pytest.mark.inprocess
async def test_a_cancel_while_it_executes_leaves_no_workflow_sqlite(
    sqlite_process: _Process, model: Model
) -> None:
    await _a_cancel_while_it_executes_leaves_no_workflow(sqlite_process, model)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_cancel_while_it_executes_leaves_no_workflow_postgres(
    postgres_process: _Process, model: Model
) -> None:
    await _a_cancel_while_it_executes_leaves_no_workflow(postgres_process, model)

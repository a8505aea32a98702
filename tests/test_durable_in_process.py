"""Durable runs a process executes itself (``thoughtgate run``, the MCP server), with the real
engine (ADR 0046).

* A run of one model task without tools takes no checkpoint in its first execution, so that
  execution writes no DBOS workflow, as a daemon's does (ADR 0031); a run with tools, or of several
  tasks, is still a workflow.
* Such a run whose process stopped mid-way is suspended by the lease sweep, and ``resume``
  finishes it from its spec: its workflow is written then.
* Cancelled (Ctrl-C), it ends ``interrupted``.
* An execution without a workflow that needs a checkpoint after all continues as one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS
from support.durable import one_lookup, until
from support.durable_engine import InProcessDaemon, Like

from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.errors import RuntimeFailure, UsageError
from thoughtgate.orchestration.runtime import ENGINE_CLOSED, SUSPENDED, RunRequest
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.leases import UNWRITTEN, Owner, close_orphaned_runs
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, text

pytestmark = [pytest.mark.timeout(60), pytest.mark.inprocess]


@tool
def lookup(query: str) -> str:
    """A tool the model may call."""
    return f"found {query}"


_RELEASED: list[asyncio.Event] = []
"""The test's event (one per test: an event belongs to its loop); set, ``fake:in-process-held``
answers at once (its resumed execution)."""


def _held(request: TurnRequest, _: int) -> AsyncIterator[Any]:
    """Waits until the test's event is set (or the run is cancelled), then answers."""

    async def gen() -> AsyncIterator[Any]:
        await _RELEASED[0].wait()
        yield text("released")

    return gen()


@pytest.fixture
def scripts() -> Iterator[None]:
    FAKE_SCRIPTS["in-process-held"] = _held
    FAKE_SCRIPTS["in-process-unasked-tool"] = one_lookup  # a tool nobody offered
    _RELEASED[:] = [asyncio.Event()]
    yield
    del FAKE_SCRIPTS["in-process-held"], FAKE_SCRIPTS["in-process-unasked-tool"]


class _Local(InProcessDaemon[SQLiteStore]):
    """A process executing its own durable runs, as ``thoughtgate run`` does."""

    def __init__(self, store: SQLiteStore, tools: ToolRegistry | None = None) -> None:
        super().__init__(store, Config(), tools=tools)

    async def workflows(self) -> list[str]:
        found = await DBOS.list_workflows_async(load_input=False, load_output=False)
        return [w.workflow_id for w in found]


async def _local(
    tmp_path: Path, tools: ToolRegistry | None = None, *, like: Like = "run"
) -> _Local:
    local = _Local(await SQLiteStore.open(tmp_path / "runs.db"), tools)
    await local.launch(like=like)
    return local


async def test_a_run_of_one_model_task_without_tools_writes_no_workflow(tmp_path: Path) -> None:
    local = await _local(tmp_path)
    try:
        run = await local.runtime.run(RunRequest("hi", model="fake:echo"))
        assert run.status == "completed" and run.tasks[0].output
        assert await local.workflows() == []
        assert "run.resumed" not in await local.types(run.run_id)
        spec = await local.store.get_run_spec(run.run_id)
        assert spec is not None and spec.durable and spec.attempts == 1
    finally:
        await local.close()


async def test_a_run_with_a_tool_still_writes_its_workflow_and_checkpoints(
    tmp_path: Path, scripts: None
) -> None:
    local = await _local(tmp_path, ToolRegistry([lookup]))
    try:
        run = await local.runtime.run(RunRequest("look", model="fake:in-process-unasked-tool"))
        assert run.status == "completed"
        status = await DBOS.get_workflow_status_async(run.run_id)
        assert status is not None and status.status == "SUCCESS"
        steps = await DBOS.list_workflow_steps_async(run.run_id)
        assert [s["function_name"].split(": ", 1)[1] for s in steps] == [
            "model turn 0",
            "tool call_1",
        ]
        assert "run.resumed" not in await local.types(run.run_id)
    finally:
        await local.close()


async def test_a_run_of_several_tasks_still_writes_its_workflow(tmp_path: Path) -> None:
    local = await _local(tmp_path)
    try:
        tasks = [TaskSpec("one"), TaskSpec("two")]
        run = await local.runtime.run(RunRequest("both", model="fake:echo", tasks=tasks))
        assert run.status == "completed"
        assert await local.workflows() == [run.run_id]
    finally:
        await local.close()


async def test_an_execution_without_a_workflow_that_needs_a_checkpoint_continues_as_one(
    tmp_path: Path, scripts: None
) -> None:
    local = await _local(tmp_path)
    try:
        run = await local.runtime.run(RunRequest("look", model="fake:in-process-unasked-tool"))
        assert run.status == "completed" and run.tasks[0].output == "the answer"
        resumed = [e for e in await local.store.read(run.run_id) if e.type == "run.resumed"]
        assert len(resumed) == 1 and resumed[0].payload["reason"] == UNWRITTEN
        status = await DBOS.get_workflow_status_async(run.run_id)
        assert status is not None and status.status == "SUCCESS"
    finally:
        await local.close()


async def test_a_cancelled_run_without_a_workflow_ends_interrupted(
    tmp_path: Path, scripts: None
) -> None:
    """Ctrl-C reaches the execution as it reaches a workflow: the run is closed, not left open."""
    local = await _local(tmp_path)
    try:
        run = await local.runtime.create_run(RunRequest("hi", model="fake:in-process-held"))
        job = asyncio.create_task(local.runtime.execute(run.run_id))
        await until(lambda: _executing(local, run.run_id))
        job.cancel("interrupted from the terminal (Ctrl-C)")
        with pytest.raises(asyncio.CancelledError):
            await job
        ended = await local.store.get_run(run.run_id)
        assert ended.status == "interrupted" and "Ctrl-C" in (ended.error or "")
        assert await local.workflows() == []
    finally:
        await local.close()


async def test_a_run_whose_process_stopped_mid_way_is_suspended_and_resume_finishes_it(
    tmp_path: Path, scripts: None
) -> None:
    """Its execution wrote no workflow; its process stops (as a SIGTERM'd one does: the run is
    left open, its lease no longer renewed), the next process's sweep suspends it
    (``thoughtgate run``'s runs wait for ``resume``), and ``resume`` starts it again from its
    spec, writing its workflow then."""
    local = await _local(tmp_path, like="serve")
    try:
        run = await local.runtime.create_run(RunRequest("hi", model="fake:in-process-held"))
        job = asyncio.create_task(local.runtime.execute(run.run_id))
        await until(lambda: _has(local, run.run_id, "task.started"))
        assert await local.workflows() == [], "no workflow written for its first execution"
        job.cancel(SUSPENDED)  # its execution stops and leaves the run open, its lease unrenewed
        with pytest.raises(asyncio.CancelledError):
            await job
        me = local.runtime.leases.owner
        restarted = Owner(me.host, me.pid, "restarted")
        assert await close_orphaned_runs(local.store, me=restarted) == []
        suspended = await local.store.get_run(run.run_id)
        assert suspended.status == "running" and suspended.owner is None
        assert suspended.metadata["suspended"]["resume"] == "manual"
        _RELEASED[0].set()
        assert await local.store.release_run(run.run_id, owner=None, queue=True)
        assert local.engine.queue is not None
        await local.engine.resume(run.run_id, local.engine.queue)
        await until(lambda: _ended(local, run.run_id))
        ended = await local.store.get_run(run.run_id)
        assert ended.status == "completed" and ended.tasks[0].output == "released"
        types = await local.types(run.run_id)
        assert types.count("run.resumed") == 1 and "run.interrupted" not in types
        assert await local.workflows() == [run.run_id]
    finally:
        await local.close()


async def test_a_run_admitted_here_that_had_not_begun_ends_when_the_engine_closes(
    tmp_path: Path,
) -> None:
    """Admitted to execute here (``thoughtgate run``, MCP), then the engine is closed before its
    execution began (an error, a Ctrl-C between the two): no process would ever execute it, so
    it ends ``interrupted`` with a reason a reader may see, its task too -- not ``pending``
    under a live process's lease (ADR 0131). Executing it afterwards is refused, as any start
    on a closed engine is (ADR 0125)."""
    local = await _local(tmp_path)
    try:
        run = await local.runtime.create_run(RunRequest("hi", model="fake:echo"))
        assert (await local.store.get_run(run.run_id)).status == "pending"
        await local.engine.close()
        ended = await local.store.get_run(run.run_id)
        assert ended.status == "interrupted", ended.status
        assert ended.error == f"interrupted: {ENGINE_CLOSED}"
        assert [t.status for t in ended.tasks] == ["interrupted"]
        assert (await local.types(run.run_id))[-1] == "run.interrupted"
        with pytest.raises(UsageError):
            await local.runtime.execute(run.run_id)
        assert (await local.types(run.run_id)).count("run.interrupted") == 1
    finally:
        await local.close()


async def test_a_shutting_down_daemon_hands_back_a_run_it_admitted_and_had_not_begun(
    tmp_path: Path,
) -> None:
    """A daemon's shutdown keeps its runs open for another replica (``refuse_executions`` with
    ``SUSPENDED``): such a run stays open, its lease ended at once for the next sweep."""
    local = await _local(tmp_path)
    try:
        run = await local.runtime.create_run(RunRequest("hi", model="fake:echo"))
        local.runtime.refuse_executions(SUSPENDED)
        await local.engine.close()
        left = await local.store.get_run(run.run_id)
        assert left.status == "pending" and left.owner is not None
        assert left.lease_expires_at is not None
        assert left.lease_expires_at <= time.time()
        assert not local.runtime.leases.is_admitted(run.run_id)
    finally:
        await local.close()


async def _executing(local: _Local, run_id: str) -> bool:
    return run_id in local.runtime.executing


async def _has(local: _Local, run_id: str, event_type: str) -> bool:
    return event_type in await local.types(run_id)


async def _ended(local: _Local, run_id: str) -> bool:
    return (await local.store.get_run(run_id)).status not in ("pending", "running")


async def test_a_launch_that_failed_leaves_no_dbos_and_the_process_can_launch_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch that fails (its database unreachable, a set-up lock never granted, a cancel)
    leaves nothing behind: another engine attaches, launches and runs (the failure is a
    thoughtgate error naming the step, ADR 0125; more in ``test_durable_launch``)."""

    def unreachable() -> None:
        raise ConnectionError("the workflows' database is unreachable")

    failed = _Local(await SQLiteStore.open(tmp_path / "first.db"))
    with monkeypatch.context() as patch:
        patch.setattr(DBOS, "launch", unreachable)
        with pytest.raises(RuntimeFailure, match=r"open its workflows database.*unreachable"):
            await failed.launch(like="run")
    assert not failed.engine.launched
    await failed.close()

    local = await _local(tmp_path)
    try:
        run = await local.runtime.run(RunRequest("hi", model="fake:echo"))
        assert run.status == "completed" and run.tasks[0].output
    finally:
        await local.close()

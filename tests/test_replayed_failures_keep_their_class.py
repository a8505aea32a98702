"""A step's foreign exception, replayed from its checkpoint by a resumed execution, is described
as the first execution described it: by its own class, not ``RuntimeError`` (ADR 0079).

A step that raised an exception thoughtgate did not write is checkpointed by its class and, where
the run's mode keeps a failure's words, its first line (ADR 0073). The execution that saw it
raise re-raises the object itself; a resumed one only has the checkpoint. Before ADR 0079 it
raised ``RuntimeError("AdapterBug: first line")``, so the run's and the task's public ``error``
said ``RuntimeError`` (and the detail ``RuntimeError: AdapterBug: ...``). Here the real DBOS
engine checkpoints the failed model turn of a run's first task, its execution stops right after
(the process shutting down: the run stays open), and the run is put back on the queue: the
resumed execution replays the checkpoint and ends the run with the texts an uninterrupted run of
the same script records -- on a ``hidden`` run without any of the failure's words.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.durable import until
from support.durable_engine import InProcessDaemon
from support.scripts import failing

from thoughtgate.config import Config
from thoughtgate.events.schema import Event
from thoughtgate.orchestration.runtime import SUSPENDED, RunRequest
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS

pytestmark = [pytest.mark.inprocess, pytest.mark.timeout(60)]

SECRET = "REPLAY-SECRET-41C"


class AdapterBug(Exception):
    """An adapter's own bug: no ``ProviderError``, nothing ``stream_llm_turn`` wraps."""


def _buggy(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    return failing(AdapterBug(f"cannot read {SECRET}\n[parameters: ('{SECRET}',)]"))


def _ending(events: list[Event]) -> tuple[Any, ...]:
    """What readers are told of the failure: the first task's end and the run's."""
    task = next(e.payload for e in events if e.type == "task.completed")
    run = events[-1].payload
    return (
        events[-1].type,
        task["status"],
        task["error"],
        task.get("error_detail"),
        run["error"],
        run.get("error_type"),
        run.get("error_detail"),
    )


Stopping = dict[str, "asyncio.Future[asyncio.Task[Any]]"]
"""Runs whose execution stops after the failed turn's checkpoint, each with where the test learns
the task that executed it."""


async def _run_to_end(
    daemon: InProcessDaemon[SQLiteStore], mode: str, stopping: Stopping | None = None
) -> str:
    """Admit and submit a run; with ``stopping``, its execution is to stop (registered before
    its submit, so however soon the execution gets there)."""
    tasks = (TaskSpec("first", model="fake:replay-buggy"), TaskSpec("second"))
    run, rank = await daemon.runtime.admit(
        RunRequest("hi", model="fake:echo", chain_of_thought=mode, tasks=tasks),
        queue=daemon.queue,
    )
    if stopping is not None:
        stopping[run.run_id] = asyncio.get_running_loop().create_future()
    await daemon.engine.submit(run.run_id, daemon.queue, priority=rank)
    return run.run_id


@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_a_replayed_step_failure_names_its_own_class_as_the_first_execution_did(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FAKE_SCRIPTS, "replay-buggy", _buggy)
    store = await SQLiteStore.open(tmp_path / "runs.db")
    daemon = InProcessDaemon(store, Config())
    await daemon.launch()
    runtime = daemon.runtime
    aborted = runtime._task_aborted
    stopping: Stopping = {}

    async def stops_after_the_checkpoint(run: Any, *args: Any, **kwargs: Any) -> None:
        stopped = stopping.get(run.run_id)
        if stopped is not None and not stopped.done():  # its failed turn is checkpointed
            stopped.set_result(runtime.workflow_tasks()[run.run_id])
            raise asyncio.CancelledError(SUSPENDED)  # the process stops (a shutdown's cancel)
        await aborted(run, *args, **kwargs)

    monkeypatch.setattr(runtime, "_task_aborted", stops_after_the_checkpoint)
    try:
        first = await _run_to_end(daemon, mode)  # never stopped: the texts to compare with
        await until(lambda: daemon.ended(first))
        expected = _ending(await store.read(first))
        assert expected[2] == expected[4] == "AdapterBug", expected

        run_id = await _run_to_end(daemon, mode, stopping)
        stopped = stopping[run_id]
        # As a shutdown does: the run is released only once its execution stopped and is over.
        # (Its workflow may not have begun when ``submit`` returns: a release then would take
        # the run from under the execution about to begin, whose renewal finds it lost.)
        await asyncio.wait([await stopped])
        assert run_id not in runtime.executing
        assert not await daemon.ended(run_id), "the run stayed open to resume"
        me = runtime.leases.owner.owner_id  # what a shutdown does with a run it executed
        assert await store.release_run(run_id, owner=me, queue=True)
        await daemon.engine.resume(run_id, daemon.queue)
        await until(lambda: daemon.ended(run_id))

        events = await store.read(run_id)
        assert "run.resumed" in [e.type for e in events], "the ending came from a replay"
        assert _ending(events) == expected
        ended = await store.get_run(run_id)
        assert ended.error == "AdapterBug" and ended.tasks[0].error == "AdapterBug"
        assert "RuntimeError" not in repr([e.payload for e in events])
        if mode == "surface":  # the first line, for developers; never the lines after it
            assert expected[3] == expected[6] == f"AdapterBug: cannot read {SECRET}"
        else:
            assert expected[3] is None and expected[6] is None
            assert all(SECRET not in repr(e.payload) for e in events), "no words kept"
        assert all("[parameters" not in repr(e.payload) for e in events)
    finally:
        await daemon.close()

"""Which steps of a durable run DBOS checkpoints, and how its queue is polled (ADR 0025, ADR 0029),
with the real engine.

A run's last result -- the model turn that ends its last task -- is recorded by the run's
ending commit, so its first execution does not checkpoint it; every result a later step of the
execution builds on (a turn with tool calls, a tool's result, a turn that ends an earlier task)
still is, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS
from support.durable import one_lookup

from thoughtgate.config import Config, DurabilityConfig
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.durable import DurableEngine
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, text

pytestmark = pytest.mark.timeout(60)

CALLS: list[str] = []


@tool
def lookup(query: str) -> str:
    """A tool with an effect to count."""
    CALLS.append(query)
    return f"found {query}"


@pytest.fixture
def scripts() -> Iterator[None]:
    FAKE_SCRIPTS["one-lookup"] = one_lookup
    CALLS.clear()
    yield
    del FAKE_SCRIPTS["one-lookup"]


async def _steps_of(request: RunRequest, tmp_path: Path) -> tuple[str, list[str]]:
    store = await SQLiteStore.open(tmp_path / "runs.db")
    runtime = Runtime(store, Config(), tools=ToolRegistry([lookup]))
    engine = DurableEngine.attach(runtime, runtime.config.durability)
    try:
        await engine.launch()
        run = await runtime.run(request)
        steps = await DBOS.list_workflow_steps_async(run.run_id)
        status = await DBOS.get_workflow_status_async(run.run_id)
        assert status is not None and status.status == "SUCCESS"
        return run.status, [s["function_name"] for s in steps]
    finally:
        await engine.close()
        await store.close()


async def test_a_one_turn_run_checkpoints_no_step(tmp_path: Path) -> None:
    status, steps = await _steps_of(RunRequest("hi", model="fake:echo"), tmp_path)
    assert status == "completed"
    assert steps == []


async def test_a_turn_with_tool_calls_and_the_tool_are_checkpointed_the_last_turn_not(
    tmp_path: Path, scripts: None
) -> None:
    status, steps = await _steps_of(RunRequest("look", model="fake:one-lookup"), tmp_path)
    assert status == "completed" and CALLS == ["q"]
    assert [s.split(": ", 1)[1] for s in steps] == ["model turn 0", "tool call_1"]


async def test_the_turn_that_ends_an_earlier_task_is_checkpointed(tmp_path: Path) -> None:
    tasks = (TaskSpec("first", model="fake:echo"), TaskSpec("second", model="fake:echo"))
    status, steps = await _steps_of(RunRequest("two", model="fake:echo", tasks=tasks), tmp_path)
    assert status == "completed"
    assert [s.split(": ", 1)[1] for s in steps] == ["model turn 0"], "the first task's only"


def _slow(request: TurnRequest, _: int) -> AsyncIterator[Any]:
    async def gen() -> AsyncIterator[Any]:
        await asyncio.sleep(0.3)
        yield text("done")

    return gen()


async def test_a_queue_polls_fast_while_runs_wait_a_while_after_and_then_slowly_again(
    tmp_path: Path,
) -> None:
    """A backlog drains at the fast pace; the pace outlasts it by ten poll intervals (DBOS's
    worker would otherwise come down from the slow one again for the next burst), and an idle
    daemon goes back to polling slowly."""
    FAKE_SCRIPTS["slow"] = _slow
    store = await SQLiteStore.open(tmp_path / "runs.db")
    config = Config(durability=DurabilityConfig(concurrency=1, poll_interval_s=0.2))
    runtime = Runtime(store, config)
    engine = DurableEngine.attach(runtime, config.durability)
    try:
        await engine.launch(listen=[])
        queue = engine.queue
        assert queue is not None

        async def interval() -> float:
            found = await DBOS.retrieve_queue_async(queue)
            assert found is not None
            return found.polling_interval_sec

        runs = []
        for _ in range(10):  # one starts at once, nine wait here, then on the queue (ADR 0031)
            run, rank = await runtime.admit(RunRequest("hi", model="fake:slow"), queue=queue)
            await engine.submit(run.run_id, queue, priority=rank)
            runs.append(run.run_id)
        await _until(lambda: _queued(engine))
        await _until(lambda: _is(interval(), 0.02))
        await _until(lambda: _all_ended(store, runs))
        assert await interval() == 0.02, "still fast just after the backlog drained"
        await _until(lambda: _is(interval(), 0.2))
    finally:
        await engine.close()
        await store.close()
        del FAKE_SCRIPTS["slow"]


async def _queued(engine: DurableEngine) -> bool:
    return engine.starts is not None and bool(engine.starts.waiting)


async def _is(value: Awaitable[float], expected: float) -> bool:
    return await value == expected


async def _all_ended(store: SQLiteStore, run_ids: list[str]) -> bool:
    return [(await store.get_run(r)).status for r in run_ids] == ["completed"] * len(run_ids)


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)

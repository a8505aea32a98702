"""Which steps of a durable run DBOS checkpoints, and how its queue is polled (ADR 0025, ADR 0029),
with the real engine.

A run's last result -- the model turn that ends its last task -- is recorded by the run's
ending commit, so its first execution does not checkpoint it; every result a later step of the
execution builds on (a turn with tool calls, a tool's result, a turn that ends an earlier task)
still is, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS
from support.durable import one_lookup, until
from support.durable_engine import InProcessDaemon

from thoughtgate.config import Config, DurabilityConfig
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.durable import DurableEngine
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.store.leases import Owner, close_orphaned_runs
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
    """The run of ``request`` executed by a process of its own, as ``thoughtgate run``'s, and
    the names of the steps DBOS checkpointed for it."""
    store = await SQLiteStore.open(tmp_path / "runs.db")
    tools = ToolRegistry([lookup])
    async with InProcessDaemon.launched(store, Config(), tools=tools, like="run") as process:
        run = await process.runtime.run(request)
        steps = await DBOS.list_workflow_steps_async(run.run_id)
        status = await DBOS.get_workflow_status_async(run.run_id)
        assert status is not None and status.status == "SUCCESS"
        return run.status, [s["function_name"] for s in steps]


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


@contextlib.asynccontextmanager
async def _daemon(tmp_path: Path, **durability: Any) -> AsyncIterator[InProcessDaemon[SQLiteStore]]:
    """A daemon on a fresh SQLite store, launched for the block."""
    store = await SQLiteStore.open(tmp_path / "runs.db")
    config = Config(durability=DurabilityConfig(**durability))
    async with InProcessDaemon.launched(store, config) as daemon:
        yield daemon


async def _interval_of(queue: str) -> float:
    found = await DBOS.retrieve_queue_async(queue)
    assert found is not None
    return found.polling_interval_sec


async def test_a_queue_polls_fast_while_runs_wait_a_while_after_and_then_slowly_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog drains at the fast pace; the pace outlasts it by ten poll intervals (DBOS's
    worker would otherwise come down from the slow one again for the next burst), and a daemon
    that has executed nothing for as long polls at the idle pace (ADR 0057).

    Each run's turn notes the pace as its 0.3 s ends, in the same step of the loop: a timer
    that moves the pace on after the linger (due two seconds after the last run began) fires
    after that turn's, however late a loaded machine runs the loop, and the change it makes
    is written after an await. (The queue's row read once the test has seen every run end is
    read whenever a loaded loop gets there, which can be after the linger is over.)"""
    async with _daemon(
        tmp_path, concurrency=1, poll_interval_s=0.2, idle_poll_interval_s=0.5
    ) as daemon:
        queue, starts = daemon.queue, daemon.engine.starts
        assert starts is not None
        paces: list[tuple[bool, float]] = []

        def slow(request: TurnRequest, _: int) -> AsyncIterator[Any]:
            async def gen() -> AsyncIterator[Any]:
                await asyncio.sleep(0.3)
                paces.append((bool(starts.waiting), starts.interval_s))
                yield text("done")

            return gen()

        # its own name, put back as it was: the session's fake scripts have a "slow" of their own
        monkeypatch.setitem(FAKE_SCRIPTS, "queue-slow", slow)
        # one starts at once, nine wait here, then on the queue (ADR 0031)
        runs = [await daemon.start("fake:queue-slow") for _ in range(10)]
        await until(lambda: _queued(daemon.engine))
        await until(lambda: _is(_interval_of(queue), 0.02))
        await until(lambda: _all_ended(daemon.store, runs))
        assert paces[-1] == (False, 0.02), "still fast just after the backlog drained"
        await until(lambda: _is(_interval_of(queue), 0.5))


class _Held:
    """A fake script whose turn lasts until the test lets it end (:meth:`end`): a run that is
    executing for as long as the test looks at it, however late the loop gets to it. (DBOS
    executes a daemon's workflows on the loop that launched it: the test's.)"""

    def __init__(self) -> None:
        self.began = False
        self._ended = asyncio.Event()

    def __call__(self, request: TurnRequest, _: int) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            self.began = True
            await self._ended.wait()
            yield text("done")

        return gen()

    async def executing(self) -> bool:
        return self.began

    def end(self) -> None:
        self._ended.set()


@pytest.mark.inprocess
async def test_an_idle_daemon_polls_slowly_still_takes_a_queued_run_and_is_in_use_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0057: a daemon that has executed nothing for ten poll intervals polls its queue at the
    idle pace; a run the lease sweep puts on the queue meanwhile (its process stopped before it
    began) is still taken and completes, and the daemon polls at ``poll_interval_s`` again while
    it is in use.

    The run executes until the test has seen that pace: a run that begins from the queue is
    first polled for at the backlog's pace for ten poll intervals after it began, and the
    in-use pace follows only until ten poll intervals after its end -- for a quick run, a
    window as short as the run, which a loaded machine's late timer skips altogether."""
    held = _Held()
    monkeypatch.setitem(FAKE_SCRIPTS, "queue-held", held)
    async with _daemon(
        tmp_path, poll_interval_s=0.2, idle_poll_interval_s=0.6, concurrency=1
    ) as daemon:
        runtime, engine, store, queue = daemon.runtime, daemon.engine, daemon.store, daemon.queue
        assert await _interval_of(queue) == 0.2, "a daemon that just started is in use"
        await until(lambda: _is(_interval_of(queue), 0.6))

        run, _ = await runtime.admit(RunRequest("hi", model="fake:queue-held"), queue=queue)
        engine.unreserve(run.run_id)  # it never starts here: as if its process had stopped
        runtime.forget_admitted(run.run_id)
        me = runtime.leases.owner

        async def requeue(run_id: str, _: object) -> None:
            await engine.resume(run_id, queue)

        restarted = Owner(me.host, me.pid, "restarted")
        assert await close_orphaned_runs(store, me=restarted, requeue=requeue) == []
        await until(held.executing)
        # the run that began here puts the daemon in use for as long as it executes
        await until(lambda: _is(_interval_of(queue), 0.2))
        held.end()
        await until(lambda: _all_ended(store, [run.run_id]))
        await until(lambda: _is(_interval_of(queue), 0.6))


@pytest.mark.inprocess
async def test_an_idle_daemon_never_slows_down_a_queue_another_replica_sped_up(
    tmp_path: Path,
) -> None:
    """The queue's row is shared by its replicas: one going idle leaves alone a pace another one
    set since (its backlog), which slows it down again itself."""
    async with _daemon(tmp_path, poll_interval_s=0.1, idle_poll_interval_s=0.4) as daemon:
        queue, starts = daemon.queue, daemon.engine.starts
        assert starts is not None
        found = await DBOS.retrieve_queue_async(queue)
        assert found is not None
        await found.set_polling_interval_sec_async(0.01)  # another replica's backlog

        async def idle() -> bool:
            return starts.interval_s == 0.4

        await until(idle)
        assert await _interval_of(queue) == 0.01


async def _queued(engine: DurableEngine) -> bool:
    return engine.starts is not None and bool(engine.starts.waiting)


async def _is(value: Awaitable[float], expected: float) -> bool:
    return await value == expected


async def _all_ended(store: EventStore, run_ids: list[str]) -> bool:
    return [(await store.get_run(r)).status for r in run_ids] == ["completed"] * len(run_ids)

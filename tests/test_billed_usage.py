"""A run's usage is what its providers billed: every model turn that returned usage counts, in
tasks that completed, failed or were cut, and in a durable run resumed after its process stopped
(each turn once) -- on the run record, its terminal event and the ``agent.response`` events alike
(ADR 0131).

The in-process runtime with the fake provider, on a real SQLite file (and PostgreSQL, whose store
ends and closes runs by its own code), and the durable engine for the resume.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from support.durable import until
from support.durable_engine import InProcessDaemon
from support.pg import pg_admin, pg_schema
from support.store_backends import Postgres, SQLite

from thoughtgate.config import Config
from thoughtgate.engine.loop import TURN_UNRECORDED
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.runtime import SUSPENDED, RunRequest, Runtime
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.store.leases import Owner, close_orphaned_runs, close_run_interrupted
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.telemetry import TelemetrySink
from thoughtgate.testing.fake import FAKE_SCRIPTS, text, tool_call
from thoughtgate.types import FinishChunk, UsageChunk

__all__ = ["pg_admin", "pg_schema"]

pytestmark = [pytest.mark.timeout(60)]

FIRST = {"input_tokens": 12, "output_tokens": 37}
"""The first turn's bill: 49 tokens, as the walkthrough saw."""
SECOND = {"input_tokens": 60, "output_tokens": 5}

_GATE: list[asyncio.Event] = []
"""Set: the second turn answers (else it waits until the run is cancelled)."""


@tool
def lookup(query: str) -> str:
    """A tool the model may call."""
    return f"found {query}"


def _first_turn() -> list[Any]:
    """A ``lookup`` call, billed ``FIRST``."""
    return [tool_call("lookup", {"query": "q"}, call_id="call_1"), UsageChunk(**FIRST)]


def _billed(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """Turn 0 is :func:`_first_turn`; turn 1 waits for the gate, then answers, billed
    ``SECOND``."""

    async def gen() -> AsyncIterator[Any]:
        if not any(m.role == "tool" for m in request.messages):
            for chunk in [*_first_turn(), FinishChunk("tool_calls")]:
                yield chunk
            return
        await _GATE[0].wait()
        for chunk in [text("the answer"), UsageChunk(**SECOND), FinishChunk("stop")]:
            yield chunk

    return gen()


def _billed_then_broken(request: TurnRequest, turn: int) -> Iterator[Any]:
    """Turn 0 is :func:`_first_turn`; turn 1 raises what no provider error is (a bug in it)."""
    if any(m.role == "tool" for m in request.messages):
        raise RuntimeError("the adapter broke")
    yield from _first_turn()
    yield FinishChunk("tool_calls")


def _answers(request: TurnRequest, turn: int) -> Iterator[Any]:
    yield text("done")
    yield UsageChunk(input_tokens=3, output_tokens=4)
    yield FinishChunk("stop")


@pytest.fixture(autouse=True)
def scripts() -> Iterator[None]:
    FAKE_SCRIPTS["billed"] = _billed
    FAKE_SCRIPTS["billed-then-broken"] = _billed_then_broken
    FAKE_SCRIPTS["answers"] = _answers
    _GATE[:] = [asyncio.Event()]
    yield
    for name in ("billed", "billed-then-broken", "answers"):
        del FAKE_SCRIPTS[name]


def _tokens(usage: Any) -> tuple[int, int]:
    usage = usage or {}
    return int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))


def _sum(*bills: dict[str, int]) -> tuple[int, int]:
    return (sum(b["input_tokens"] for b in bills), sum(b["output_tokens"] for b in bills))


async def _billed_in_log(store: EventStore, run_id: str) -> tuple[int, int]:
    """The sum over the run's ``agent.response`` events: what its providers reported."""
    responses = [e for e in await store.read(run_id) if e.type == "agent.response"]
    got = [_tokens(e.payload.get("usage")) for e in responses]
    return sum(i for i, _ in got), sum(o for _, o in got)


async def _every_surface_agrees(store: EventStore, run_id: str, expected: tuple[int, int]) -> None:
    run = await store.get_run(run_id)
    assert _tokens(run.usage) == expected, run.usage
    ending = (await store.read(run_id))[-1]
    assert ending.type.startswith("run."), ending.type
    assert _tokens(ending.payload.get("usage")) == expected, ending.payload
    assert await _billed_in_log(store, run_id) == expected
    listed = [r for r in await store.list_runs() if r.run_id == run_id]
    assert listed and _tokens(listed[0].usage) == expected
    # Each task records what its own turns were billed, however it ended, so the run's usage
    # is the sum of its tasks' -- on the index and on the tasks' ending events alike.
    tasks = [_tokens(t.usage) for t in run.tasks]
    assert (sum(i for i, _ in tasks), sum(o for _, o in tasks)) == expected, run.tasks
    ends = [
        _tokens(e.payload.get("usage"))
        for e in await store.read(run_id)
        if e.type in ("worker.completed", "task.completed") and "usage" in e.payload
    ]
    assert (sum(i for i, _ in ends), sum(o for _, o in ends)) == expected


def _runtime(store: EventStore) -> Runtime:
    config = Config.model_validate({"durability": {"enabled": False}})
    return Runtime(store, config, tools=ToolRegistry([lookup]))


async def _stopped_after_a_billed_turn(runtime: Runtime, reason: str) -> str:
    """A run of ``fake:billed`` executed until its second turn is asked, then cancelled with
    ``reason``; its id."""
    store = runtime.store
    run = await runtime.create_run(RunRequest("look it up", model="fake:billed"))
    job = asyncio.create_task(runtime.execute(run.run_id))

    async def second_turn_asked() -> bool:
        return "tool.completed" in [e.type for e in await store.read(run.run_id)]

    await until(second_turn_asked)
    job.cancel(reason)
    with pytest.raises(asyncio.CancelledError):
        await job
    return run.run_id


class _Cases:
    async def test_an_interrupted_run_keeps_the_turns_it_was_billed_for(
        self, store: EventStore
    ) -> None:
        run_id = await _stopped_after_a_billed_turn(
            _runtime(store), "interrupted from the terminal (SIGTERM)"
        )
        assert (await store.get_run(run_id)).status == "interrupted"
        await _every_surface_agrees(store, run_id, _sum(FIRST))

    async def test_a_run_closed_by_another_process_shows_what_its_log_was_billed(
        self, store: EventStore
    ) -> None:
        """Its execution stopped after a billed turn and left it open (a process that stopped);
        who closes it then (a sweep, a shutdown, a failed resume) knows no count: the log's is
        taken."""
        run_id = await _stopped_after_a_billed_turn(_runtime(store), SUSPENDED)
        assert (await store.get_run(run_id)).status == "running"
        assert await close_run_interrupted(store, run_id, "its process stopped")
        await _every_surface_agrees(store, run_id, _sum(FIRST))

    async def test_a_failed_task_s_billed_turns_count_in_its_run(self, store: EventStore) -> None:
        """Two tasks: the first completes (billed 3 + 4), the second is billed a turn, then its
        provider raises: the run errs with both tasks' turns on it."""
        runtime = _runtime(store)
        tasks = [
            TaskSpec("one", model="fake:answers"),
            TaskSpec("two", model="fake:billed-then-broken"),
        ]
        run = await runtime.create_run(RunRequest("both", model="fake:answers", tasks=tasks))
        with pytest.raises(RuntimeError, match="the adapter broke"):
            await runtime.execute(run.run_id)
        assert (await store.get_run(run.run_id)).status == "error"
        await _every_surface_agrees(
            store, run.run_id, _sum({"input_tokens": 3, "output_tokens": 4}, FIRST)
        )

    async def test_a_task_whose_own_end_was_lost_records_its_turns_with_the_runs_end(
        self, store: EventStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Its provider raised after a billed turn, and the append of its own failed
        ``task.completed`` failed too: the run's end, reading the run back, closes the task --
        with what its turn was billed, as the run's usage counts it."""
        append = store.append

        async def loses_the_tasks_end(run_id: str, events: Any, **kwargs: Any) -> Any:
            if any(e.type == "task.completed" for e in events):
                raise RuntimeError("the disk is full")
            return await append(run_id, events, **kwargs)

        monkeypatch.setattr(store, "append", loses_the_tasks_end)
        runtime = _runtime(store)
        run = await runtime.create_run(RunRequest("look it up", model="fake:billed-then-broken"))
        with pytest.raises(RuntimeError, match="the disk is full"):
            await runtime.execute(run.run_id)
        monkeypatch.setattr(store, "append", append)
        ended = await store.get_run(run.run_id)
        assert ended.status == "error"
        # it ran: its error says its end was lost, not that it never ran
        assert ended.tasks[0].error is not None and "not run" not in ended.tasks[0].error
        await _every_surface_agrees(store, run.run_id, _sum(FIRST))

    async def test_a_turn_billed_and_cut_before_its_record_is_in_the_log(
        self, store: EventStore
    ) -> None:
        """The first turn answered (billed ``FIRST``); the run is cancelled while its visible
        steps are still being made, before its ``agent.response`` was stored: the interruption
        records the turn's stand-in, so the log says what the run was billed."""
        reached = asyncio.Event()

        class Stalls:
            narrates = False

            async def turn_finished(self, turn: Any, **_: Any) -> list[Any]:
                reached.set()
                await asyncio.Event().wait()
                return []

        config = Config.model_validate({"durability": {"enabled": False}})
        exporter = InMemorySpanExporter()
        tracing = TracerProvider(shutdown_on_exit=False)
        tracing.add_span_processor(SimpleSpanProcessor(exporter))
        runtime = Runtime(
            store,
            config,
            tools=ToolRegistry([lookup]),
            observer_factory=lambda run, disclosure: Stalls(),  # type: ignore[arg-type,return-value]
            sinks=[TelemetrySink(tracing)],
        )
        run = await runtime.create_run(RunRequest("look it up", model="fake:billed"))
        job = asyncio.create_task(runtime.execute(run.run_id))
        await asyncio.wait_for(reached.wait(), 10)
        job.cancel("interrupted from the terminal (SIGTERM)")
        with pytest.raises(asyncio.CancelledError):
            await job
        assert (await store.get_run(run.run_id)).status == "interrupted"
        await _every_surface_agrees(store, run.run_id, _sum(FIRST))
        responses = await store.read_types(run.run_id, ("agent.response",))
        assert [
            (r.payload["turn"], r.payload["complete"], r.payload["error"]) for r in responses
        ] == [(0, False, TURN_UNRECORDED)]
        # its call returned and was billed: telemetry does not count it a failed call
        (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
        assert chat.status.status_code != StatusCode.ERROR
        assert chat.attributes is not None and "error.type" not in chat.attributes
        assert chat.attributes["gen_ai.usage.output_tokens"] == FIRST["output_tokens"]


@pytest.mark.inprocess
class TestOnSQLite(SQLite, _Cases):
    pass


@pytest.mark.postgres
class TestOnPostgres(Postgres, _Cases):
    """PostgreSQL ends and closes runs by its own statements."""


@pytest.mark.inprocess
async def test_a_resumed_durable_run_counts_each_billed_turn_once(tmp_path: Path) -> None:
    """Its process stops after the first turn was billed and checkpointed; the resumed execution
    replays that turn from its checkpoint (not billed again) and is billed the second: the run's
    usage is both, once each."""
    store = await SQLiteStore.open(tmp_path / "runs.db")
    local = InProcessDaemon(store, Config(), tools=ToolRegistry([lookup]))
    await local.launch(like="serve")
    try:
        # as a stopped process leaves it: open, its lease unrenewed
        run_id = await _stopped_after_a_billed_turn(local.runtime, SUSPENDED)
        me = local.runtime.leases.owner
        assert await close_orphaned_runs(store, me=Owner(me.host, me.pid, "restarted")) == []
        _GATE[0].set()
        assert await store.release_run(run_id, owner=None, queue=True)
        await local.engine.resume(run_id, local.queue)
        await until(lambda: local.ended(run_id))
        ended = await store.get_run(run_id)
        assert ended.status == "completed" and ended.tasks[0].output == "the answer"
        assert (await local.types(run_id)).count("run.resumed") == 1
        await _every_surface_agrees(store, run_id, _sum(FIRST, SECOND))
    finally:
        await local.close()

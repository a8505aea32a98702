"""Whatever the turns a run's provider billed, and whether its last turn answered or its provider
broke, or wherever it was cut: the run's usage, on its record and its ending event, is the sum of
the turns that returned, which is the sum of its tasks' and of its ``agent.response`` events'
usage (ADR 0131, and its amendments)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, text, tool_call
from thoughtgate.types import FinishChunk, UsageChunk

BILL = st.tuples(st.integers(0, 5000), st.integers(0, 5000))


@tool
def lookup(query: str) -> str:
    """A tool the model may call."""
    return f"found {query}"


def _script(bills: list[tuple[int, int]], breaks: bool) -> Any:
    """Turn ``n`` is billed ``bills[n]``: a ``lookup`` call but the last, which answers -- or,
    with ``breaks``, raises instead (no usage: the turn never returned)."""

    def script(request: TurnRequest, turn: int) -> Iterator[Any]:
        n = sum(m.role == "tool" for m in request.messages)
        last = n == len(bills) - 1
        if last and breaks:
            raise RuntimeError("the adapter broke")
        if last:
            yield text("done")
        else:
            yield from tool_call("lookup", {"query": str(n)}, call_id=f"call_{n}")
        yield UsageChunk(input_tokens=bills[n][0], output_tokens=bills[n][1])
        yield FinishChunk("stop" if last else "tool_calls")

    return script


@pytest.mark.unit
@settings(max_examples=60, deadline=None)
@given(bills=st.lists(BILL, min_size=1, max_size=5), breaks=st.booleans())
async def test_a_runs_usage_is_the_sum_of_its_returned_turns(
    bills: list[tuple[int, int]], breaks: bool
) -> None:
    store = MemoryStore()
    config = Config.model_validate({"durability": {"enabled": False}})
    script = _script(bills, breaks)
    runtime = Runtime(
        store,
        config,
        provider_factory=lambda model: FakeProvider(script, model=model),
        tools=ToolRegistry([lookup]),
    )
    run = await runtime.create_run(RunRequest("go", model="fake:x"))
    if breaks:
        with pytest.raises(RuntimeError):
            await runtime.execute(run.run_id)
    else:
        await runtime.execute(run.run_id)
    returned = bills[:-1] if breaks else bills
    expected = (sum(i for i, _ in returned), sum(o for _, o in returned))
    ended = await store.get_run(run.run_id)
    assert ended.status == ("error" if breaks else "completed")
    assert (ended.usage["input_tokens"], ended.usage["output_tokens"]) == expected
    events = await store.read(run.run_id)
    assert events[-1].payload["usage"]["total_tokens"] == sum(expected)
    responses = [e.payload["usage"] for e in events if e.type == "agent.response"]
    assert (
        sum(u["input_tokens"] for u in responses),
        sum(u["output_tokens"] for u in responses),
    ) == expected


CUTS = ("streaming", "recording", "failing", "tool")
"""Where turn ``at`` of task ``where`` is cut: while it streams (not billed yet, cancelled),
after it answered and was billed but before its record was stored (cancelled while the
observer's steps are still being made; or the observer raises), or while its tool call runs
(the turn recorded, cancelled)."""


class _Stepless:
    """An observer that makes no steps; on turn ``at`` it waits forever (``recording``) or
    raises (``failing``)."""

    narrates = False

    def __init__(self, at: int, cut: str | None, reached: asyncio.Event) -> None:
        self.at, self.cut, self.reached, self.turns = at, cut, reached, 0

    async def turn_finished(self, turn: Any, *, task_id: str, narrations: Any = ()) -> list[Any]:
        n, self.turns = self.turns, self.turns + 1
        if n == self.at and self.cut == "failing":
            raise RuntimeError("the observer broke")
        if n == self.at and self.cut == "recording":
            self.reached.set()
            await asyncio.Event().wait()
        return []

    async def tool_started(self, call: Any, *, task_id: str) -> list[Any]:
        return []

    async def tool_finished(self, call: Any, status: str, **_: Any) -> list[Any]:
        return []

    async def task_finished(self, *, task_id: str) -> list[Any]:
        return []


@pytest.mark.unit
@settings(max_examples=80, deadline=None)
@given(bills=st.lists(BILL, min_size=1, max_size=4), tasks=st.integers(1, 2), data=st.data())
async def test_for_any_cut_the_runs_usage_is_its_tasks_and_its_logs(
    bills: list[tuple[int, int]], tasks: int, data: st.DataObject
) -> None:
    """Each task's turns are billed ``bills``; a cut at any point of any turn of any task: the
    run's usage is the sum of the turns billed before it (a turn that answered counts, recorded
    or not), the sum of its tasks' usage, and the sum of the usage its log's ``agent.response``
    events say was billed (ADR 0131, amended)."""
    where = data.draw(st.integers(0, tasks - 1), label="task cut")
    at = data.draw(st.integers(0, len(bills) - 1), label="turn cut")
    cut = data.draw(st.sampled_from(CUTS if at < len(bills) - 1 else CUTS[:3]), label="cut")
    reached = asyncio.Event()

    async def slow_lookup(query: str) -> str:
        """A tool the model may call; the cut one never returns."""
        if cut == "tool" and query == f"{where}.{at}":
            reached.set()
            await asyncio.Event().wait()
        return f"found {query}"

    def script_of(task: int) -> Any:
        def script(request: TurnRequest, turn: int) -> Any:
            n = sum(m.role == "tool" for m in request.messages)

            async def gen() -> Any:
                if cut == "streaming" and (task, n) == (where, at):
                    yield text("thinking it over")
                    reached.set()
                    await asyncio.Event().wait()
                if n == len(bills) - 1:
                    yield text("done")
                else:
                    query = {"query": f"{task}.{n}"}
                    for chunk in tool_call("slow_lookup", query, call_id=f"call_{n}"):
                        yield chunk
                yield UsageChunk(input_tokens=bills[n][0], output_tokens=bills[n][1])
                yield FinishChunk("stop" if n == len(bills) - 1 else "tool_calls")

            return gen()

        return script

    observers = iter(range(tasks))

    def observer(run: Any, disclosure: Any) -> _Stepless:
        task = next(observers)
        return _Stepless(at, cut if task == where else None, reached)

    store = MemoryStore()
    config = Config.model_validate({"durability": {"enabled": False}})
    runtime = Runtime(
        store,
        config,
        provider_factory=lambda model: FakeProvider(script_of(int(model[-1])), model=model),
        tools=ToolRegistry([tool(slow_lookup)]),
        observer_factory=observer,  # type: ignore[arg-type]
    )
    specs = [TaskSpec(f"task {i}", model=f"fake:t{i}") for i in range(tasks)]
    run = await runtime.create_run(RunRequest("go", model="fake:t0", tasks=specs))
    job = asyncio.create_task(runtime.execute(run.run_id))
    if cut == "failing":
        with pytest.raises(RuntimeError, match="the observer broke"):
            await job
    else:
        await asyncio.wait_for(reached.wait(), 10)
        job.cancel("cut by the test")
        with pytest.raises(asyncio.CancelledError):
            await job
    billed = bills * where + bills[: at + (cut != "streaming")]
    expected = (sum(i for i, _ in billed), sum(o for _, o in billed))
    ended = await store.get_run(run.run_id)
    assert ended.status == ("error" if cut == "failing" else "interrupted")
    assert _tokens(ended.usage) == expected
    used = [_tokens(t.usage or {}) for t in ended.tasks]
    assert (sum(i for i, _ in used), sum(o for _, o in used)) == expected
    events = await store.read(run.run_id)
    assert _tokens(events[-1].payload["usage"]) == expected
    responses = [_tokens(e.payload["usage"]) for e in events if e.type == "agent.response"]
    assert (sum(i for i, _ in responses), sum(o for _, o in responses)) == expected
    turns = [(e.task_id, e.payload["turn"]) for e in events if e.type == "agent.response"]
    assert len(turns) == len(set(turns)), "a turn recorded twice"
    ends = [
        _tokens(e.payload["usage"])
        for e in events
        if e.type in ("worker.completed", "task.completed") and "usage" in e.payload
    ]
    assert (sum(i for i, _ in ends), sum(o for _, o in ends)) == expected


def _tokens(usage: Any) -> tuple[int, int]:
    return int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))

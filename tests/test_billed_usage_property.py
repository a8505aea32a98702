"""Whatever the turns a run's provider billed, and whether its last turn answered or its provider
broke: the run's usage, on its record and its ending event, is the sum of the turns that
returned, which is the sum of its ``agent.response`` events' usage (ADR 0131)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.runtime import RunRequest, Runtime
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

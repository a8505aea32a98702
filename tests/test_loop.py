"""The agent loop over the fake provider: tools, approvals, limits, and no rehydration."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from thoughtgate.config import Config
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.engine.tools import ToolRegistry, load_tools, tool
from thoughtgate.errors import UsageError
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text, tool_call
from thoughtgate.types import Chunk, ReasoningPart, TextPart, ToolResultPart


@tool
def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Longer explanation that is not part of the description."""
    return a + b


@tool
def broken(x: str) -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


@tool(fallback=lambda x: f"cached {x}")
def flaky(x: str) -> str:
    """Fails, with a fallback."""
    raise TimeoutError("upstream slow")


@tool(requires_approval=True)
def delete_file(path: str) -> str:
    """Delete a file (needs approval)."""
    return f"deleted {path}"


def test_schema_comes_from_signature_and_docstring() -> None:
    assert add.name == "add"
    assert add.description == "Add two integers."
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert add.parameters["required"] == ["a"]
    assert add.parameters["properties"]["b"]["default"] == 1


def test_load_tools_from_module_reference() -> None:
    registry = load_tools(["test_loop:add", "test_loop:broken"])
    assert [t.name for t in registry] == ["add", "broken"]
    with pytest.raises(UsageError, match="module:attr"):
        load_tools(["nocolon"])
    with pytest.raises(UsageError, match="cannot load tools"):
        load_tools(["test_loop:missing"])


def calls_then_answer(calls: list[tuple[str, dict[str, Any]]]) -> Any:
    def script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
        yield reasoning(f"SECRET-THOUGHT-{turn}")
        if turn < len(calls):
            name, args = calls[turn]
            yield tool_call(name, args, call_id=f"call_{turn}")
        else:
            yield text("final answer")

    return script


async def run_with(
    calls: list[tuple[str, dict[str, Any]]],
    *,
    tools: ToolRegistry,
    approvals: ApprovalBroker | None = None,
    config: Config | None = None,
) -> tuple[Any, MemoryStore, list[FakeProvider]]:
    store = MemoryStore()
    providers: list[FakeProvider] = []

    def factory(model: str) -> FakeProvider:
        providers.append(FakeProvider(calls_then_answer(calls)))
        return providers[-1]

    runtime = Runtime(store, config, provider_factory=factory, tools=tools, approvals=approvals)
    run = await runtime.run(RunRequest("go", model="fake:x"), chain_of_thought="surface")
    return run, store, providers


async def test_tool_results_feed_the_next_turn_without_reasoning_text() -> None:
    run, store, providers = await run_with([("add", {"a": 2, "b": 3})], tools=ToolRegistry([add]))
    assert run.tasks[0].output == "final answer"
    second = providers[0].requests[1]
    parts = [p for m in second.messages for p in m.parts]
    assert not any(isinstance(p, ReasoningPart) for p in parts), "never rehydrate reasoning"
    assert "SECRET-THOUGHT" not in repr(second.messages)
    result = next(p for p in parts if isinstance(p, ToolResultPart))
    assert result.content == "5" and not result.is_error
    events = [e.type for e in await store.read(run.run_id)]
    assert events.count("agent.response") == 2
    assert events.index("tool.started") < events.index("tool.completed")


async def test_failed_tool_is_not_terminal() -> None:
    run, store, providers = await run_with([("broken", {"x": "a"})], tools=ToolRegistry([broken]))
    assert run.status == "completed" and run.tasks[0].output == "final answer"
    failed = next(e for e in await store.read(run.run_id) if e.type == "tool.failed")
    assert "disk on fire" in failed.payload["error"]
    result = next(
        p
        for m in providers[0].requests[1].messages
        for p in m.parts
        if isinstance(p, ToolResultPart)
    )
    assert result.is_error and "disk on fire" in result.content


async def test_fallback_gives_a_degraded_result() -> None:
    run, store, _ = await run_with([("flaky", {"x": "q"})], tools=ToolRegistry([flaky]))
    degraded = next(e for e in await store.read(run.run_id) if e.type == "tool.degraded")
    assert degraded.payload["output"] == "cached q" and "upstream slow" in degraded.payload["error"]


async def test_unknown_tool_and_bad_arguments_are_reported_to_the_model() -> None:
    run, store, _providers = await run_with(
        [("nope", {}), ("add", {"a": "not a number"})], tools=ToolRegistry([add])
    )
    assert run.status == "completed"
    failures = [e for e in await store.read(run.run_id) if e.type == "tool.failed"]
    assert len(failures) == 2
    assert "unknown tool" in failures[0].payload["error"]


@pytest.mark.parametrize(
    ("decision", "expected"), [("approve", "deleted /tmp/x"), ("reject", "rejected")]
)
async def test_approval_approve_and_reject(decision: str, expected: str) -> None:
    async def decider(call_id: str, name: str, args: Any) -> Any:
        return decision

    run, store, providers = await run_with(
        [("delete_file", {"path": "/tmp/x"})],
        tools=ToolRegistry([delete_file]),
        approvals=ApprovalBroker(decider=decider),
    )
    events = await store.read(run.run_id)
    kinds = [e.type for e in events]
    assert "tool.approval_required" in kinds and "tool.approval_response" in kinds
    result = next(
        p
        for m in providers[0].requests[1].messages
        for p in m.parts
        if isinstance(p, ToolResultPart)
    )
    assert expected in result.content
    assert run.tasks[0].output == "final answer", "the loop continues after a rejection"
    assert ("tool.started" in kinds) == (decision == "approve")


async def test_approval_times_out_and_the_loop_goes_on() -> None:
    config = Config.from_mapping({"orchestration": {"approval_timeout_s": 0.05}})
    run, store, _providers = await run_with(
        [("delete_file", {"path": "/x"})], tools=ToolRegistry([delete_file]), config=config
    )
    kinds = [e.type for e in await store.read(run.run_id)]
    assert "tool.approval_timeout" in kinds and "tool.started" not in kinds
    assert run.tasks[0].output == "final answer"


async def test_approval_answered_through_the_broker_api() -> None:
    broker = ApprovalBroker()
    store = MemoryStore()
    runtime = Runtime(
        store,
        provider_factory=lambda m: FakeProvider(
            calls_then_answer([("delete_file", {"path": "/y"})])
        ),
        tools=ToolRegistry([delete_file]),
        approvals=broker,
    )
    created = await runtime.create_run(RunRequest("go", model="fake:x"))
    task = asyncio.create_task(runtime.execute(created.run_id))
    for _ in range(200):
        if broker.pending(created.run_id):
            break
        await asyncio.sleep(0.01)
    assert broker.pending(created.run_id) == ["call_0"]
    assert broker.respond(created.run_id, "call_0", "approve", by="alice")
    assert not broker.respond(created.run_id, "call_0", "approve"), "answered once only"
    run = await task
    response = next(e for e in await store.read(run.run_id) if e.type == "tool.approval_response")
    assert response.payload["by"] == "alice"


async def test_turn_limit_ends_the_task_clearly() -> None:
    config = Config.from_mapping({"orchestration": {"max_turns": 2}})
    run, store, _ = await run_with(
        [("add", {"a": 1})] * 5, tools=ToolRegistry([add]), config=config
    )
    assert run.tasks[0].status == "partial"
    assert "turn limit of 2" in (run.tasks[0].error or "")
    events = await store.read(run.run_id)
    last = [e for e in events if e.type == "message.partially_completed"]
    assert last and last[0].payload["reason"] == "max_turns"
    kinds = [e.type for e in events]
    assert "cot.completed" in kinds, "the reader still gets a disclosure receipt"
    assert kinds.index("cot.completed") < kinds.index("message.partially_completed")


async def test_assistant_text_between_tool_calls_is_kept_in_history() -> None:
    def script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
        if turn == 0:
            yield text("Checking.")
            yield tool_call("add", {"a": 1})
        else:
            yield text("done")

    store = MemoryStore()
    provider = FakeProvider(script)
    runtime = Runtime(store, provider_factory=lambda m: provider, tools=ToolRegistry([add]))
    await runtime.run(RunRequest("go", model="fake:x"))
    assistant = provider.requests[1].messages[1]
    assert assistant.role == "assistant"
    assert any(isinstance(p, TextPart) and p.text == "Checking." for p in assistant.parts)
    assert json.dumps(repr(assistant)).count("add") >= 1


async def test_continued_conversation_carries_no_reasoning() -> None:
    store = MemoryStore()
    providers: list[FakeProvider] = []

    def factory(model: str) -> FakeProvider:
        providers.append(FakeProvider(calls_then_answer([])))
        return providers[-1]

    runtime = Runtime(store, provider_factory=factory)
    first = await runtime.run(
        RunRequest("first question", model="fake:x"), chain_of_thought="surface"
    )
    assert "SECRET-THOUGHT-0" in (first.tasks[0].reasoning or "")
    second = await runtime.continue_run(first.run_id, "follow-up", chain_of_thought="surface")
    sent = providers[1].requests[0].messages
    assert [m.role for m in sent] == ["user", "assistant", "user"]
    assert [m.text for m in sent] == ["first question", "final answer", "follow-up"]
    assert "SECRET-THOUGHT" not in repr(sent)
    assert second.metadata["continues"] == first.run_id


async def test_carriers_from_another_model_are_dropped_and_recorded() -> None:
    from thoughtgate.types import ContinuityBlock, Message, TextPart

    foreign = ContinuityBlock(
        "anthropic.thinking",
        {"thinking": "t", "signature": "s"},
        provider="anthropic",
        model="claude-a",
    )
    history = [Message.user("q"), Message("assistant", (foreign, TextPart("a")))]
    store = MemoryStore()
    provider = FakeProvider(calls_then_answer([]), model="other")
    runtime = Runtime(store, provider_factory=lambda m: provider)
    run = await runtime.run(RunRequest("next", model="fake:other", history=history))
    sent = provider.requests[0].messages
    assert not any(isinstance(p, ContinuityBlock) for m in sent for p in m.parts)
    dropped = [e for e in await store.read(run.run_id) if e.type == "continuity.dropped"]
    assert dropped and "claude-a" in dropped[0].payload["reason"]

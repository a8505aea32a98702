"""OpenTelemetry spans from the event stream: structure, timing, usage, content rules per mode."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support.scripts import cut, outage

from thoughtgate.config import Config, TelemetryConfig
from thoughtgate.engine.approvals import ApprovalBroker, Decision
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.errors import ProviderConnectionError
from thoughtgate.events.schema import Event
from thoughtgate.orchestration.runtime import RunRequest, Runtime, TaskSpec
from thoughtgate.providers.base import Provider, TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.telemetry import TelemetrySink, build_tracer_provider, telemetry_sinks
from thoughtgate.testing.fake import FakeProvider, reasoning, text, tool_call
from thoughtgate.types import (
    Chunk,
    ContinuityBlock,
    ContinuityChunk,
    FinishChunk,
    ReasoningDelta,
    UsageChunk,
)

MARKER = "RAW-THOUGHT-51C2"
SIGNATURE = "SIG-SECRET-90AB"
ENCRYPTED = "ENC-SECRET-77EF"
TOOL_ARG = "ARG-VALUE-3D1E"
TOOL_OUT = "TOOL-RESULT-C4B8"
ANSWER = "The city is Lyon."
PROMPT = "Which city? PROMPT-TEXT-6A0F"


def _script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
    """Turn 0: reasoning (signed) + a tool call; turn 1: more reasoning, an encrypted carrier, the
    answer. Usage with reasoning tokens on both turns."""
    if turn == 0:
        yield ReasoningDelta(f"First I look it up {MARKER}. ")
        yield ReasoningDelta("", signature=SIGNATURE)
        yield text("Let me check.")
        yield tool_call("lookup", {"q": TOOL_ARG}, call_id="call_1")
        yield UsageChunk(input_tokens=100, output_tokens=40, reasoning_tokens=25)
        yield FinishChunk("tool_calls", raw_reason="tool_use")
    else:
        yield reasoning(f"Now I answer {MARKER}.")
        yield ContinuityChunk(
            ContinuityBlock(
                "openai.reasoning_item", {"encrypted_content": ENCRYPTED}, provider="fake"
            )
        )
        yield text(ANSWER)
        yield UsageChunk(
            input_tokens=150, output_tokens=30, reasoning_tokens=10, cache_read_tokens=64
        )
        yield FinishChunk("stop", raw_reason="end_turn")


def _tools() -> ToolRegistry:
    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"{TOOL_OUT} for {q}"

    return ToolRegistry([lookup])


def _tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def _run(
    mode: str,
    *,
    capture: bool,
    script: Any = _script,
    tasks: Sequence[TaskSpec] = (),
    factory: Any = None,
    system: str | None = None,
) -> tuple[list[ReadableSpan], list[Event], Any]:
    provider, exporter = _tracing()
    config = Config.from_mapping({"telemetry": {"capture_content": capture}})
    store = MemoryStore()

    def make(model: str) -> Provider:
        return FakeProvider(script, model="fake-model-v2")

    runtime = Runtime(
        store,
        config,
        provider_factory=factory or make,
        tools=_tools(),
        sinks=telemetry_sinks(config, tracer_provider=provider),
    )
    request = RunRequest(PROMPT, model="fake:scripted", tasks=tasks, system=system)
    run = await runtime.create_run(request, chain_of_thought=mode)
    try:
        await runtime.execute(run.run_id)
    except Exception as exc:
        outcome: Any = exc
    else:
        outcome = None
    events = await store.read(run.run_id)
    return list(exporter.get_finished_spans()), events, outcome


def _by_op(spans: list[ReadableSpan], op: str) -> list[ReadableSpan]:
    return sorted(
        (s for s in spans if s.attributes and s.attributes.get("gen_ai.operation.name") == op),
        key=lambda s: s.start_time or 0,
    )


def _all_text(spans: list[ReadableSpan]) -> str:
    """Everything a span exports that could carry content: names, attributes, events, status."""
    out = []
    for s in spans:
        out.append(s.name)
        out.append(json.dumps(dict(s.attributes or {}), default=str))
        out.extend(json.dumps(dict(e.attributes or {}), default=str) for e in s.events)
        out.append(s.status.description or "")
    return "\n".join(out)


def _ns(ts: float) -> int:
    return int(ts * 1_000_000_000)


# --------------------------------------------------------------------------- structure


async def test_one_task_run_is_rooted_at_its_agent_span_with_turns_and_tools() -> None:
    spans, events, _ = await _run("surface", capture=False)
    assert not _by_op(spans, "invoke_workflow"), "one task is not a workflow"
    (agent,) = _by_op(spans, "invoke_agent")
    turns = _by_op(spans, "chat")
    (tool_span,) = _by_op(spans, "execute_tool")
    assert len(turns) == 2 and len(spans) == 4

    assert agent.parent is None
    for child in [*turns, tool_span]:
        assert child.parent is not None and child.parent.span_id == agent.context.span_id
    assert {s.context.trace_id for s in spans} == {agent.context.trace_id}

    assert agent.name == "invoke_agent thoughtgate"
    assert [t.name for t in turns] == ["chat scripted", "chat scripted"]
    assert tool_span.name == "execute_tool lookup"
    assert [t.kind for t in turns] == [SpanKind.CLIENT, SpanKind.CLIENT]
    assert tool_span.kind == SpanKind.INTERNAL
    # the root carries the run: it spans the whole run and says how it ended
    ts = {e.type: e.ts for e in events}
    assert agent.start_time == _ns(ts["run.started"])
    assert agent.end_time == _ns(ts["run.settlement.completed"])
    assert agent.attributes is not None
    assert agent.attributes["thoughtgate.run.status"] == "completed"
    assert agent.attributes["thoughtgate.run.id"] == events[0].run_id


async def test_attributes_follow_genai_conventions_with_reasoning_tokens() -> None:
    spans, events, _ = await _run("surface", capture=False)
    (task,) = _by_op(spans, "invoke_agent")
    first, second = _by_op(spans, "chat")
    (tool_span,) = _by_op(spans, "execute_tool")
    assert task.attributes is not None
    assert first.attributes is not None and second.attributes is not None
    run_id = events[0].run_id

    assert first.attributes["gen_ai.provider.name"] == "fake"
    assert first.attributes["gen_ai.request.model"] == "scripted"
    assert first.attributes["gen_ai.response.model"] == "fake-model-v2"
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_call",)
    assert second.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert first.attributes["gen_ai.usage.input_tokens"] == 100
    assert first.attributes["gen_ai.usage.output_tokens"] == 40
    assert first.attributes["gen_ai.usage.reasoning.output_tokens"] == 25
    assert second.attributes["gen_ai.usage.reasoning.output_tokens"] == 10
    assert second.attributes["gen_ai.usage.cache_read.input_tokens"] == 64
    assert first.attributes["gen_ai.conversation.id"] == run_id
    assert first.attributes["gen_ai.request.stream"] is True
    assert first.attributes["gen_ai.request.max_tokens"] == 4096
    assert first.attributes["thoughtgate.turn"] == 0
    for turn in (first, second):
        assert turn.attributes is not None
        assert float(turn.attributes["gen_ai.response.time_to_first_chunk"]) >= 0  # type: ignore[arg-type]

    # the agent carries the task's totals and names itself
    assert task.attributes["gen_ai.usage.input_tokens"] == 250
    assert task.attributes["gen_ai.usage.output_tokens"] == 70
    assert task.attributes["gen_ai.usage.reasoning.output_tokens"] == 35
    assert task.attributes["gen_ai.request.model"] == "scripted"
    assert task.attributes["gen_ai.provider.name"] == "fake"
    assert task.attributes["gen_ai.agent.name"] == "thoughtgate"
    assert task.attributes["gen_ai.agent.id"] == events[2].task_id
    assert task.attributes["gen_ai.conversation.id"] == run_id
    assert task.attributes["thoughtgate.task.status"] == "completed"
    assert task.attributes["thoughtgate.turns"] == 2
    assert task.attributes["thoughtgate.chain_of_thought"] == "surface"

    assert tool_span.attributes is not None
    assert tool_span.attributes["gen_ai.tool.name"] == "lookup"
    assert tool_span.attributes["gen_ai.tool.call.id"] == "call_1"
    assert tool_span.attributes["gen_ai.tool.type"] == "function"
    assert tool_span.attributes["thoughtgate.tool.status"] == "completed"
    assert all(s.status.status_code == StatusCode.UNSET for s in spans)


async def test_span_times_come_from_event_timestamps() -> None:
    spans, events, _ = await _run("hidden", capture=False)
    ts = {e.type: e.ts for e in events}
    responses = [e for e in events if e.type == "agent.response"]
    first, second = _by_op(spans, "chat")
    (tool_span,) = _by_op(spans, "execute_tool")

    # a turn starts when its request was sent and ends when its response was recorded
    assert [first.start_time, second.start_time] == [
        _ns(e.payload["call"]["started_at"]) for e in responses
    ]
    assert [first.end_time, second.end_time] == [_ns(e.ts) for e in responses]
    assert first.start_time is not None and first.start_time >= _ns(ts["task.started"])
    assert tool_span.start_time == _ns(ts["tool.started"])
    assert tool_span.end_time == _ns(ts["tool.completed"])
    # the second turn begins once the tool result is recorded, not before
    assert second.start_time is not None and second.start_time >= _ns(ts["tool.completed"])


def _tool_only_script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
    """Turn 0 calls a tool and says nothing (no text, no reasoning delta)."""
    if turn == 0:
        yield tool_call("lookup", {"q": "x"}, call_id="call_7")
    else:
        yield text("done")


async def test_time_to_first_chunk_on_every_turn_even_a_tool_only_one() -> None:
    spans, events, _ = await _run("hidden", capture=False, script=_tool_only_script)
    first, second = _by_op(spans, "chat")
    (response, _) = [e for e in events if e.type == "agent.response"]
    assert response.payload["answer"] == "" and not any(
        e.type in ("message.delta", "reasoning.delta") and e.payload.get("turn") == 0
        for e in events
    )
    call = response.payload["call"]
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["gen_ai.response.time_to_first_chunk"] == pytest.approx(
        call["first_chunk_at"] - call["started_at"]
    )
    assert "gen_ai.response.time_to_first_chunk" in second.attributes


async def test_several_tasks_are_grouped_under_one_workflow() -> None:
    spans, events, _ = await _run(
        "hidden", capture=False, tasks=[TaskSpec("first"), TaskSpec("second")]
    )
    (workflow,) = _by_op(spans, "invoke_workflow")
    tasks = _by_op(spans, "invoke_agent")
    assert workflow.parent is None
    assert workflow.name == "invoke_workflow thoughtgate"
    assert workflow.attributes is not None
    assert workflow.attributes["gen_ai.workflow.name"] == "thoughtgate"
    assert "gen_ai.agent.name" not in workflow.attributes
    assert workflow.attributes["thoughtgate.run.status"] == "completed"
    assert len(tasks) == 2
    assert [t.attributes["thoughtgate.task.index"] for t in tasks if t.attributes] == [0, 1]
    assert [t.attributes["gen_ai.agent.id"] for t in tasks if t.attributes] == [
        e.task_id for e in events if e.type == "task.started"
    ]
    assert all(t.parent is not None and t.parent.span_id == workflow.context.span_id for t in tasks)
    assert len(_by_op(spans, "chat")) == 4


# --------------------------------------------------------------------------- content rules


@pytest.mark.parametrize("mode", ["hidden", "surface", "telemetry_only"])
async def test_no_content_without_capture(mode: str) -> None:
    spans, _, _ = await _run(mode, capture=False)
    dump = _all_text(spans)
    for secret in (MARKER, SIGNATURE, ENCRYPTED, TOOL_ARG, TOOL_OUT, ANSWER, "PROMPT-TEXT"):
        assert secret not in dump, (mode, secret)
    for span in spans:
        keys = set(span.attributes or {})
        assert not keys & {
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
            "gen_ai.system_instructions",
            "gen_ai.tool.definitions",
        }
        # token counts are always there on turns; the reasoning's own count only where the
        # run records reasoning (ADR 0163: a hidden run's is withheld even from the trace)
        if span.attributes and span.attributes.get("gen_ai.operation.name") == "chat":
            assert "gen_ai.usage.output_tokens" in keys
            assert ("gen_ai.usage.reasoning.output_tokens" in keys) == (mode != "hidden")


async def test_hidden_mode_is_token_counts_only_even_with_capture() -> None:
    spans, _, _ = await _run("hidden", capture=True)
    dump = _all_text(spans)
    for secret in (MARKER, SIGNATURE, ENCRYPTED, TOOL_ARG, TOOL_OUT, ANSWER, "PROMPT-TEXT"):
        assert secret not in dump, secret
    first, _ = _by_op(spans, "chat")
    assert first.attributes is not None
    # the provider billed 25 reasoning tokens; a hidden run's reasoning is neither requested nor
    # recorded, so its count is a reasoning field the trace does not show (ADR 0163). What it
    # was billed still goes out: the output count includes them.
    assert "gen_ai.usage.reasoning.output_tokens" not in first.attributes
    assert first.attributes["gen_ai.usage.output_tokens"] > 25
    for span in spans:
        assert "gen_ai.usage.reasoning.output_tokens" not in (span.attributes or {})


def _messages(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None
    return json.loads(str(span.attributes[name]))


@pytest.mark.parametrize("mode", ["surface", "telemetry_only"])
async def test_with_capture_each_turn_carries_its_input_its_output_and_its_own_reasoning(
    mode: str,
) -> None:
    spans, events, _ = await _run(mode, capture=True)
    (agent,) = _by_op(spans, "invoke_agent")
    first, second = _by_op(spans, "chat")
    (tool_span,) = _by_op(spans, "execute_tool")
    user = {"role": "user", "parts": [{"type": "text", "content": PROMPT}]}
    call = {"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {"q": TOOL_ARG}}

    # turn 0: the prompt in; its own reasoning, text and tool call out
    assert _messages(first, "gen_ai.input.messages") == [user]
    (out0,) = _messages(first, "gen_ai.output.messages")
    assert out0["finish_reason"] == "tool_call"
    assert [p["type"] for p in out0["parts"]] == ["reasoning", "text", "tool_call"]
    assert out0["parts"][0]["content"] == f"First I look it up {MARKER}. "
    assert out0["parts"][1:] == [{"type": "text", "content": "Let me check."}, call]

    # turn 1: the whole history in (no reasoning in it), the tool result included
    inputs = _messages(second, "gen_ai.input.messages")
    assert inputs[0] == user
    assert inputs[1] == {
        "role": "assistant",
        "parts": [{"type": "text", "content": "Let me check."}, call],
    }
    assert inputs[2]["role"] == "tool"
    (result,) = inputs[2]["parts"]
    assert result["type"] == "tool_call_response" and result["id"] == "call_1"
    assert result["result"].startswith(TOOL_OUT)
    (out1,) = _messages(second, "gen_ai.output.messages")
    assert out1["parts"] == [
        {"type": "reasoning", "content": f"Now I answer {MARKER}."},
        {"type": "text", "content": ANSWER},
    ]
    assert MARKER not in json.dumps(inputs), "reasoning never goes back in, not even in telemetry"

    # the agent: the task's input and final answer; reasoning lives on the turns only
    assert _messages(agent, "gen_ai.input.messages") == [user]
    assert _messages(agent, "gen_ai.output.messages") == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": ANSWER}],
            "finish_reason": "stop",
        }
    ]
    holders = sorted(s.name for s in spans if MARKER in _all_text([s]))
    assert holders == ["chat scripted", "chat scripted"]
    assert json.loads(str(tool_span.attributes["gen_ai.tool.call.arguments"])) == {"q": TOOL_ARG}  # type: ignore[index]
    assert str(tool_span.attributes["gen_ai.tool.call.result"]).startswith(TOOL_OUT)  # type: ignore[index]

    # carriers are nowhere
    dump = _all_text(spans)
    assert SIGNATURE not in dump and ENCRYPTED not in dump
    if mode == "telemetry_only":  # ... and still never on a display surface
        shown = [e for e in events if MARKER in json.dumps(dict(e.payload))]
        assert {e.type for e in shown} == {"agent.response", "worker.completed"}
        for e in shown:
            assert MARKER not in json.dumps({k: v for k, v in e.payload.items() if k != "trace"}), (
                "telemetry_only keeps reasoning in trace metadata only"
            )


async def test_system_instructions_and_tool_definitions_are_opt_in_content() -> None:
    system = "You are terse. SYSTEM-TEXT-81D2"
    for capture in (False, True):
        spans, _, _ = await _run("surface", capture=capture, system=system)
        (agent,) = _by_op(spans, "invoke_agent")
        first, _ = _by_op(spans, "chat")
        for span in (agent, first):
            assert span.attributes is not None
            if not capture:
                assert "gen_ai.system_instructions" not in span.attributes
                assert "gen_ai.tool.definitions" not in span.attributes
                continue
            assert _messages(span, "gen_ai.system_instructions") == [
                {"type": "text", "content": system}
            ]
            assert _messages(span, "gen_ai.tool.definitions") == [
                {"type": "function", "name": "lookup"}
            ]
        assert ("SYSTEM-TEXT" in _all_text(spans)) is capture


async def test_telemetry_only_without_capture_keeps_counts_only() -> None:
    spans, _, _ = await _run("telemetry_only", capture=False)
    (task,) = _by_op(spans, "invoke_agent")
    assert task.attributes is not None
    assert "gen_ai.output.messages" not in task.attributes
    assert task.attributes["gen_ai.usage.reasoning.output_tokens"] == 35


# --------------------------------------------------------------------------- failures


def _unknown_tool_script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
    if turn == 0:
        yield tool_call("nope", {"x": TOOL_ARG}, call_id="call_9")
    else:
        yield text("ok")


async def test_failed_tool_span_is_an_error_without_leaking_the_message() -> None:
    spans, _, _ = await _run("surface", capture=False, script=_unknown_tool_script)
    (tool_span,) = _by_op(spans, "execute_tool")
    assert tool_span.name == "execute_tool nope"
    assert tool_span.status.status_code == StatusCode.ERROR
    assert tool_span.status.description is None
    assert tool_span.attributes is not None
    assert tool_span.attributes["error.type"] == "unknown_tool"  # the public error_kind
    assert tool_span.start_time == tool_span.end_time


async def test_approved_tool_that_degrades_to_its_fallback() -> None:
    def cached(q: str) -> str:
        return f"cached {q}"

    @tool(requires_approval=True, fallback=cached)
    def lookup(q: str) -> str:
        """Look something up."""
        raise ConnectionError("backend down")

    async def approve(call_id: str, name: str, arguments: Any) -> Decision:
        return "approve"

    provider, exporter = _tracing()
    config = Config()
    runtime = Runtime(
        MemoryStore(),
        config,
        provider_factory=lambda m: FakeProvider(_script),
        tools=ToolRegistry([lookup]),
        approvals=ApprovalBroker(decider=approve),
        sinks=telemetry_sinks(config, tracer_provider=provider),
    )
    await runtime.run(RunRequest("hi", model="fake:x"), chain_of_thought="surface")
    spans = list(exporter.get_finished_spans())
    (tool_span,) = _by_op(spans, "execute_tool")
    assert tool_span.attributes is not None
    assert tool_span.attributes["thoughtgate.tool.status"] == "degraded"
    assert tool_span.status.status_code == StatusCode.UNSET
    (task,) = _by_op(spans, "invoke_agent")
    assert [e.name for e in task.events] == ["tool.approval_required", "tool.approval_response"]
    assert task.events[1].attributes is not None
    assert task.events[1].attributes["thoughtgate.approval.decision"] == "approve"
    assert task.events[1].attributes["gen_ai.tool.name"] == "lookup"


async def test_run_that_dies_before_its_task_runs_still_has_a_failed_root() -> None:
    def broken(model: str) -> Provider:
        raise ProviderConnectionError("the provider cannot be reached")

    spans, _, outcome = await _run("surface", capture=False, factory=broken)
    assert isinstance(outcome, ProviderConnectionError)
    (agent,) = _by_op(spans, "invoke_agent")
    assert agent.parent is None
    assert agent.status.status_code == StatusCode.ERROR
    assert agent.attributes is not None
    assert agent.attributes["error.type"] == "failed"
    assert agent.attributes["thoughtgate.run.status"] == "failed"


@pytest.mark.parametrize(
    ("script", "status", "error_type"),
    [(outage, "failed", "overloaded"), (cut, "partial", "ProviderStreamError")],
    ids=["outage", "cut"],
)
async def test_a_run_that_did_not_complete_has_error_spans_with_the_provider_error_type(
    script: Any, status: str, error_type: str
) -> None:
    spans, events, _ = await _run("surface", capture=False, script=script)
    (agent,) = _by_op(spans, "invoke_agent")
    (turn,) = _by_op(spans, "chat")
    assert agent.attributes is not None and turn.attributes is not None
    assert agent.attributes["thoughtgate.run.status"] == status
    for span in (agent, turn):
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes is not None and span.attributes["error.type"] == error_type
    assert turn.status.description is None, "error messages are content"
    (response,) = [e for e in events if e.type == "agent.response"]
    assert response.payload["error_type"] == error_type


async def test_a_partial_run_of_several_tasks_makes_the_workflow_an_error() -> None:
    def script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
        prompt = str(request.messages[-1].parts[0].text)  # type: ignore[union-attr]
        if prompt == "second":
            yield from cut(request, turn)
        else:
            yield text("fine")

    spans, _, _ = await _run(
        "hidden", capture=False, script=script, tasks=[TaskSpec("first"), TaskSpec("second")]
    )
    (workflow,) = _by_op(spans, "invoke_workflow")
    first, second = _by_op(spans, "invoke_agent")
    assert first.status.status_code == StatusCode.UNSET
    assert second.status.status_code == StatusCode.ERROR
    assert workflow.status.status_code == StatusCode.ERROR
    assert workflow.attributes is not None
    assert workflow.attributes["error.type"] == "ProviderStreamError"
    assert workflow.attributes["thoughtgate.run.status"] == "partial"


async def test_a_task_that_failed_after_a_billed_turn_has_its_tokens_on_its_span() -> None:
    """Its first turn is billed and calls a tool; its provider raises in the second. The task
    has no ``worker.completed``; its span still carries what its turns were billed, as the
    run does (ADR 0131)."""

    def script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
        if turn == 1:
            raise RuntimeError("the adapter broke")
        yield tool_call("lookup", {"q": "x"}, call_id="call_1")
        yield UsageChunk(input_tokens=100, output_tokens=40)
        yield FinishChunk("tool_calls")

    spans, events, outcome = await _run("hidden", capture=False, script=script)
    assert isinstance(outcome, RuntimeError)
    (ending,) = [e for e in events if e.type == "run.error"]
    assert (ending.payload["usage"]["input_tokens"], ending.payload["usage"]["output_tokens"]) == (
        100,
        40,
    )
    (agent,) = _by_op(spans, "invoke_agent")
    assert agent.status.status_code == StatusCode.ERROR
    assert agent.attributes is not None
    assert agent.attributes["thoughtgate.task.status"] == "failed"
    assert agent.attributes["gen_ai.usage.input_tokens"] == 100
    assert agent.attributes["gen_ai.usage.output_tokens"] == 40


def _usage_script(usage: UsageChunk) -> Any:
    def script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
        yield text("ok")
        yield usage
        yield FinishChunk("stop")

    return script


class _AnthropicShaped(FakeProvider):
    """Reports usage the way the Anthropic adapter does (under its name)."""

    name = "anthropic"


@pytest.mark.parametrize(
    ("model", "expected_input"), [("anthropic:claude-sonnet-4-5", 10 + 200 + 30), ("fake:x", 10)]
)
async def test_input_tokens_include_cache_reads_and_writes_where_the_provider_leaves_them_out(
    model: str, expected_input: int
) -> None:
    """Anthropic's input_tokens leave out cache reads and writes; the conventions count them."""
    usage = UsageChunk(
        input_tokens=10, output_tokens=5, cache_read_tokens=200, cache_write_tokens=30
    )
    provider, exporter = _tracing()
    config = Config()
    runtime = Runtime(
        MemoryStore(),
        config,
        provider_factory=lambda m: (
            _AnthropicShaped if m.startswith("anthropic:") else FakeProvider
        )(_usage_script(usage), model=m.split(":")[1]),
        sinks=telemetry_sinks(config, tracer_provider=provider),
    )
    await runtime.run(RunRequest("hi", model=model))
    spans = list(exporter.get_finished_spans())
    (turn,) = _by_op(spans, "chat")
    (agent,) = _by_op(spans, "invoke_agent")
    for span in (turn, agent):
        assert span.attributes is not None
        assert span.attributes["gen_ai.usage.input_tokens"] == expected_input
        assert span.attributes["gen_ai.usage.cache_read.input_tokens"] == 200
        assert span.attributes["gen_ai.usage.cache_creation.input_tokens"] == 30
        # hidden mode, no reasoning tokens reported: the attribute does not apply
        assert "gen_ai.usage.reasoning.output_tokens" not in span.attributes


async def test_a_broken_sink_never_fails_the_run(caplog: pytest.LogCaptureFixture) -> None:
    provider, _ = _tracing()
    sink = TelemetrySink(provider)

    def explode(event: Event) -> None:
        raise RuntimeError("boom")

    sink.handle = explode  # type: ignore[method-assign]
    store = MemoryStore()
    runtime = Runtime(
        store,
        Config(),
        provider_factory=lambda m: FakeProvider(_script),
        tools=_tools(),
        sinks=[sink],
    )
    done = await runtime.run(RunRequest("hi", model="fake:x"))
    assert done.status == "completed"
    assert "telemetry: could not record" in caplog.text


# --------------------------------------------------------------------------- configuration


def test_no_exporter_means_no_sink() -> None:
    assert telemetry_sinks(Config()) == []
    assert build_tracer_provider(TelemetryConfig()) is None
    assert Runtime(MemoryStore(), sinks=telemetry_sinks(Config())).sinks == []


_EXPORTER_MODULES = {
    "otlp_http": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "otlp_grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "console": "opentelemetry.sdk.trace.export",
}


def _exporter_of(provider: Any) -> Any:
    """The configured exporter (unwrapped from the outage guard around OTLP exporters)."""
    (processor,) = provider._active_span_processor._span_processors
    exporter = processor.span_exporter
    return getattr(exporter, "inner", exporter)


@pytest.mark.parametrize(
    ("exporter", "endpoint", "expected"),
    [
        ("otlp_http", "http://collector:4318", "http://collector:4318/v1/traces"),
        ("otlp_http", "http://collector:4318/custom/traces", "http://collector:4318/custom/traces"),
        ("otlp_grpc", "http://collector:4317", None),
        ("console", None, None),
    ],
)
def test_configured_exporters(exporter: str, endpoint: str | None, expected: str | None) -> None:
    config = TelemetryConfig(exporter=exporter, endpoint=endpoint)  # type: ignore[arg-type]
    provider = build_tracer_provider(config)
    assert provider is not None
    try:
        made = _exporter_of(provider)
        assert type(made).__module__ == _EXPORTER_MODULES[exporter]
        if expected is not None:
            assert made._endpoint == expected
        sinks = telemetry_sinks(config, tracer_provider=provider)
        assert len(sinks) == 1 and isinstance(sinks[0], TelemetrySink)
    finally:
        provider.shutdown()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("env", "expected"), [(None, "thoughtgate"), ("billing-agent", "billing-agent")]
)
def test_service_name_defaults_to_thoughtgate_unless_the_environment_names_one(
    monkeypatch: pytest.MonkeyPatch, env: str | None, expected: str
) -> None:
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    if env is None:
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    else:
        monkeypatch.setenv("OTEL_SERVICE_NAME", env)
    provider: Any = build_tracer_provider(TelemetryConfig(exporter="console"))
    try:
        assert provider.resource.attributes["service.name"] == expected
    finally:
        provider.shutdown()


async def test_console_exporter_writes_spans_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    config = Config.from_mapping({"telemetry": {"exporter": "console"}})
    (sink,) = telemetry_sinks(config)
    assert isinstance(sink, TelemetrySink)
    runtime = Runtime(
        MemoryStore(),
        config,
        provider_factory=lambda m: FakeProvider(_script),
        tools=_tools(),
        sinks=[sink],
    )
    await runtime.run(RunRequest("hi", model="fake:x"))
    sink.force_flush()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert '"name": "invoke_agent thoughtgate"' in captured.err
    sink.shutdown()
    assert "gen_ai.client.operation.duration" in capsys.readouterr().err


# --------------------------------------------------------------------------- a collector that is down


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_a_down_collector_is_one_warning_and_never_a_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = Config.from_mapping(
        {"telemetry": {"exporter": "otlp_http", "endpoint": _closed_port_url()}}
    )
    sinks = telemetry_sinks(config)
    (sink,) = sinks
    assert isinstance(sink, TelemetrySink)
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        run = await Runtime(MemoryStore(), config, sinks=sinks).run(
            RunRequest("x", model="fake:echo")
        )
        assert run.status == "completed"
        sink.force_flush()  # export now, as the batch thread would
    sink.shutdown()  # what process exit does
    shown = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in shown] == ["thoughtgate.telemetry"], [r.getMessage() for r in shown]
    assert "cannot export to http://127.0.0.1:" in shown[0].getMessage()
    assert "dropping spans and metrics" in shown[0].getMessage(), "one warning for both signals"
    assert not any("retry" in r.getMessage().lower() for r in caplog.records)


async def test_each_process_with_a_down_collector_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sinks built anew (what each ``thoughtgate run`` process does) report an outage that is
    still going on in one line of their own: not nothing because an earlier set already warned,
    and not one per span or signal."""
    config = Config.from_mapping(
        {"telemetry": {"exporter": "otlp_http", "endpoint": _closed_port_url()}}
    )
    caplog.set_level(logging.DEBUG)
    per_process = []
    for _ in range(3):
        before = len([r for r in caplog.records if r.levelno >= logging.WARNING])
        sinks = telemetry_sinks(config)
        (sink,) = sinks
        assert isinstance(sink, TelemetrySink)
        for _ in range(2):
            run = await Runtime(MemoryStore(), config, sinks=sinks).run(
                RunRequest("x", model="fake:echo")
            )
            assert run.status == "completed"
        sink.shutdown()  # spans and metrics exported (and failing), as at process exit
        shown = [r for r in caplog.records if r.levelno >= logging.WARNING][before:]
        per_process.append([r.getMessage().split(";")[0] for r in shown])
    assert all(lines == [per_process[0][0]] for lines in per_process), per_process
    assert per_process[0][0].startswith("telemetry: cannot export to http://127.0.0.1:")


async def test_a_down_grpc_collector_at_its_default_address_is_one_warning_naming_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no ``endpoint``, the gRPC span and metric exporters send to the same collector
    (``OTEL_EXPORTER_OTLP_ENDPOINT``): one outage is one warning, and it says which address."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    url = _closed_port_url()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    config = Config.from_mapping({"telemetry": {"exporter": "otlp_grpc"}})
    caplog.set_level(logging.WARNING)
    sinks = telemetry_sinks(config)
    (sink,) = sinks
    assert isinstance(sink, TelemetrySink)
    run = await Runtime(MemoryStore(), config, sinks=sinks).run(RunRequest("x", model="fake:echo"))
    assert run.status == "completed"
    sink.shutdown()  # spans and metrics exported (and failing), as at process exit
    shown = [r.getMessage().split(";")[0] for r in caplog.records if r.levelno >= logging.WARNING]
    assert shown == [f"telemetry: cannot export to {url.removeprefix('http://')}"]


class _Flaky:
    def __init__(self) -> None:
        self.calls = 0
        self.up = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        logging.getLogger("opentelemetry.exporter.otlp.common.http").error("retrying in 1s")
        return SpanExportResult.SUCCESS if self.up else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def test_during_an_outage_batches_are_dropped_without_trying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from thoughtgate.telemetry import _OutageAwareExporter

    inner = _Flaky()
    guard = _OutageAwareExporter(inner, "http://collector", cooldown_s=3600)  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)
    assert guard.export([]) is SpanExportResult.FAILURE
    assert guard.export([]) is SpanExportResult.FAILURE
    assert inner.calls == 1, "the second batch did not wait on a collector known to be down"
    guard.cooldown_s = 0.0
    guard._down_until = 0.0
    inner.up = True
    assert guard.export([]) is SpanExportResult.SUCCESS
    messages = [r.getMessage() for r in caplog.records]
    assert "retrying in 1s" not in messages, "the exporter's own lines are not printed"
    assert [m.split(";")[0] for m in messages] == [
        "telemetry: cannot export to http://collector",
        "telemetry: the collector at http://collector is reachable again",
    ]


def test_an_outage_warning_names_the_collector_without_its_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The warning goes to the operator's log: a token in the endpoint's user part or query is
    not in it, only the collector's scheme, host and port."""
    from thoughtgate.telemetry import _OutageAwareExporter

    endpoint = "https://tenant:token-secret@collector.example:4318/v1/traces?key=query-secret"
    guard = _OutageAwareExporter(_Flaky(), endpoint, cooldown_s=3600)  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING)
    assert guard.export([]) is SpanExportResult.FAILURE
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(";")[0] for m in messages] == [
        "telemetry: cannot export to https://collector.example:4318"
    ]


def test_the_provider_behind_openai_compatible_is_named_from_the_endpoint_rules() -> None:
    from thoughtgate.providers.rules import known_servers
    from thoughtgate.telemetry.conventions import provider_name

    assert provider_name("openai-compatible", "deepseek") == "deepseek"
    assert provider_name("openai-compatible", "xai") == "x_ai"
    assert provider_name("openai-compatible", "azure") == "azure.ai.openai"
    assert provider_name("openai-compatible", "generic") == "openai"
    assert provider_name("openai-compatible", None) == "openai"
    assert provider_name("anthropic") == "anthropic"
    assert provider_name(None) is None
    for server in known_servers():
        name = provider_name("openai-compatible", server)
        assert name and " " not in name, server

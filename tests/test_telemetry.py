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
    request = RunRequest(PROMPT, model="fake:scripted", tasks=tasks)
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


async def test_span_tree_links_run_task_turns_and_tools() -> None:
    spans, _, _ = await _run("surface", capture=False)
    (run,) = _by_op(spans, "invoke_workflow")
    (task,) = _by_op(spans, "invoke_agent")
    turns = _by_op(spans, "chat")
    (tool_span,) = _by_op(spans, "execute_tool")
    assert len(turns) == 2 and len(spans) == 5

    assert run.parent is None
    assert task.parent is not None and task.parent.span_id == run.context.span_id
    for child in [*turns, tool_span]:
        assert child.parent is not None and child.parent.span_id == task.context.span_id
    assert {s.context.trace_id for s in spans} == {run.context.trace_id}

    assert run.name == "invoke_workflow thoughtgate"
    assert task.name == "invoke_agent thoughtgate"
    assert [t.name for t in turns] == ["chat scripted", "chat scripted"]
    assert tool_span.name == "execute_tool lookup"
    assert [t.kind for t in turns] == [SpanKind.CLIENT, SpanKind.CLIENT]
    assert tool_span.kind == SpanKind.INTERNAL


async def test_attributes_follow_genai_conventions_with_reasoning_tokens() -> None:
    spans, events, _ = await _run("surface", capture=False)
    (run,) = _by_op(spans, "invoke_workflow")
    (task,) = _by_op(spans, "invoke_agent")
    first, second = _by_op(spans, "chat")
    (tool_span,) = _by_op(spans, "execute_tool")
    assert run.attributes is not None and task.attributes is not None
    assert first.attributes is not None and second.attributes is not None

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
    assert first.attributes["thoughtgate.turn"] == 0
    assert float(first.attributes["gen_ai.response.time_to_first_chunk"]) >= 0  # type: ignore[arg-type]

    # task and run carry the totals
    for span in (task, run):
        assert span.attributes is not None
        assert span.attributes["gen_ai.usage.input_tokens"] == 250
        assert span.attributes["gen_ai.usage.output_tokens"] == 70
        assert span.attributes["gen_ai.usage.reasoning.output_tokens"] == 35
    assert task.attributes["gen_ai.request.model"] == "scripted"
    assert task.attributes["gen_ai.provider.name"] == "fake"
    assert task.attributes["gen_ai.agent.name"] == "thoughtgate"
    assert task.attributes["thoughtgate.task.status"] == "completed"
    assert task.attributes["thoughtgate.turns"] == 2
    run_id = events[0].run_id
    assert run.attributes["gen_ai.conversation.id"] == run_id
    assert run.attributes["thoughtgate.chain_of_thought"] == "surface"
    assert run.attributes["thoughtgate.run.status"] == "completed"

    assert tool_span.attributes is not None
    assert tool_span.attributes["gen_ai.tool.name"] == "lookup"
    assert tool_span.attributes["gen_ai.tool.call.id"] == "call_1"
    assert tool_span.attributes["gen_ai.tool.type"] == "function"
    assert tool_span.attributes["thoughtgate.tool.status"] == "completed"
    assert all(s.status.status_code == StatusCode.UNSET for s in spans)


async def test_span_times_come_from_event_timestamps() -> None:
    spans, events, _ = await _run("hidden", capture=False)
    ts = {e.type: e.ts for e in events}
    responses = [e.ts for e in events if e.type == "agent.response"]
    (run,) = _by_op(spans, "invoke_workflow")
    (task,) = _by_op(spans, "invoke_agent")
    first, second = _by_op(spans, "chat")
    (tool_span,) = _by_op(spans, "execute_tool")

    assert run.start_time == _ns(ts["run.started"])
    assert run.end_time == _ns(ts["run.settlement.completed"])
    assert task.start_time == _ns(ts["task.started"])
    assert task.end_time == _ns(ts["task.completed"])
    assert first.start_time == _ns(ts["task.started"])
    assert [first.end_time, second.end_time] == [_ns(t) for t in responses]
    assert tool_span.start_time == _ns(ts["tool.started"])
    assert tool_span.end_time == _ns(ts["tool.completed"])
    # the second turn begins once the tool result is recorded, not before
    assert second.start_time is not None and second.start_time >= _ns(ts["tool.completed"])


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
        }
        # token counts are always there on turns
        if span.attributes and span.attributes.get("gen_ai.operation.name") == "chat":
            assert "gen_ai.usage.reasoning.output_tokens" in keys


async def test_hidden_mode_is_token_counts_only_even_with_capture() -> None:
    spans, _, _ = await _run("hidden", capture=True)
    dump = _all_text(spans)
    for secret in (MARKER, SIGNATURE, ENCRYPTED, TOOL_ARG, TOOL_OUT, ANSWER, "PROMPT-TEXT"):
        assert secret not in dump, secret
    first, _ = _by_op(spans, "chat")
    assert first.attributes is not None
    assert first.attributes["gen_ai.usage.reasoning.output_tokens"] == 25


async def test_surface_with_capture_records_messages_but_never_reasoning() -> None:
    spans, _, _ = await _run("surface", capture=True)
    dump = _all_text(spans)
    assert MARKER not in dump and SIGNATURE not in dump and ENCRYPTED not in dump
    (task,) = _by_op(spans, "invoke_agent")
    first, second = _by_op(spans, "chat")
    (tool_span,) = _by_op(spans, "execute_tool")
    assert task.attributes is not None and tool_span.attributes is not None

    inputs = json.loads(str(task.attributes["gen_ai.input.messages"]))
    assert inputs == [{"role": "user", "parts": [{"type": "text", "content": PROMPT}]}]
    outputs = json.loads(str(task.attributes["gen_ai.output.messages"]))
    assert outputs == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": ANSWER}],
            "finish_reason": "stop",
        }
    ]
    assert first.attributes is not None and second.attributes is not None
    turn0 = json.loads(str(first.attributes["gen_ai.output.messages"]))
    assert turn0[0]["parts"] == [
        {"type": "text", "content": "Let me check."},
        {"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {"q": TOOL_ARG}},
    ]
    assert turn0[0]["finish_reason"] == "tool_call"
    assert all(p["type"] != "reasoning" for p in turn0[0]["parts"])
    assert json.loads(str(tool_span.attributes["gen_ai.tool.call.arguments"])) == {"q": TOOL_ARG}
    assert str(tool_span.attributes["gen_ai.tool.call.result"]).startswith(TOOL_OUT)


async def test_telemetry_only_with_capture_puts_reasoning_part_on_the_task_span() -> None:
    spans, events, _ = await _run("telemetry_only", capture=True)
    (task,) = _by_op(spans, "invoke_agent")
    assert task.attributes is not None
    outputs = json.loads(str(task.attributes["gen_ai.output.messages"]))
    assert len(outputs) == 1 and outputs[0]["role"] == "assistant"
    parts = outputs[0]["parts"]
    assert [p["type"] for p in parts] == ["reasoning", "text"]
    assert MARKER in parts[0]["content"] and parts[0]["content"].count(MARKER) == 2
    assert parts[1] == {"type": "text", "content": ANSWER}

    # the reasoning is on that one attribute only, and carriers are nowhere
    holders = [s.name for s in spans if MARKER in _all_text([s])]
    assert holders == ["invoke_agent thoughtgate"]
    dump = _all_text(spans)
    assert SIGNATURE not in dump and ENCRYPTED not in dump
    # ... and still never on a display surface: the events carry it only in the trace metadata
    shown = [e for e in events if MARKER in json.dumps(dict(e.payload))]
    assert [e.type for e in shown] == ["worker.completed"]


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


async def test_run_that_dies_mid_task_still_ends_every_span_as_error() -> None:
    def broken(model: str) -> Provider:
        raise ProviderConnectionError("the provider cannot be reached")

    spans, _, outcome = await _run("surface", capture=False, factory=broken)
    assert isinstance(outcome, ProviderConnectionError)
    (run,) = _by_op(spans, "invoke_workflow")
    (task,) = _by_op(spans, "invoke_agent")
    assert run.status.status_code == StatusCode.ERROR
    assert run.attributes is not None and run.attributes["error.type"] == "failed"
    assert task.status.status_code == StatusCode.ERROR
    # the aborted task records its own failed task.completed just before run.failed
    assert task.end_time is not None and run.end_time is not None
    assert task.end_time <= run.end_time


async def test_two_tasks_get_two_task_spans_under_one_run() -> None:
    spans, _, _ = await _run("hidden", capture=False, tasks=[TaskSpec("first"), TaskSpec("second")])
    (run,) = _by_op(spans, "invoke_workflow")
    tasks = _by_op(spans, "invoke_agent")
    assert len(tasks) == 2
    assert [t.attributes["thoughtgate.task.index"] for t in tasks if t.attributes] == [0, 1]
    assert all(t.parent is not None and t.parent.span_id == run.context.span_id for t in tasks)
    assert len(_by_op(spans, "chat")) == 4


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
    assert '"name": "invoke_workflow thoughtgate"' in captured.err
    sink.tracer_provider.shutdown()  # type: ignore[attr-defined]


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
    sink.tracer_provider.shutdown()  # type: ignore[attr-defined]  # what process exit does
    shown = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in shown] == ["thoughtgate.telemetry"], [r.getMessage() for r in shown]
    assert "cannot export spans" in shown[0].getMessage()
    assert not any("retry" in r.getMessage().lower() for r in caplog.records)


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
        "telemetry: cannot export spans to http://collector",
        "telemetry: the collector at http://collector is reachable again",
    ]

"""OpenTelemetry spans for runs, tasks, model turns and tool calls, built from the event stream.

Telemetry is a Runtime *sink*: it reads the events a run records (with their timestamps) and turns
them into spans that follow the GenAI semantic conventions. The runtime makes no instrumentation
calls, and with no exporter configured no sink is registered, so telemetry then costs nothing::

    invoke_workflow thoughtgate   run.started .. run.settlement.completed | run.failed | run.error
    └── invoke_agent thoughtgate  task.started .. task.completed (one per task)
        ├── chat {model}          one per model turn: from its request to its agent.response
        └── execute_tool {tool}   tool.started .. tool.completed | tool.failed | tool.degraded

What may reach a span (ARCHITECTURE.md, "Who sees what, where", OpenTelemetry row). Without content
capture every mode gets metadata only: models, providers, finish reasons, tool names, statuses,
durations and token counts (``gen_ai.usage.*``, including ``reasoning.output_tokens``). With
``telemetry.capture_content = true``:

==================  ===========================================================================
``hidden``          still token counts only; nothing the run said or was told
``surface``         prompt, answer text, tool calls with arguments and results, error messages;
                    never reasoning (in this mode reasoning belongs to display surfaces)
``telemetry_only``  all of the above, plus the task's reasoning as a ``reasoning`` part of
                    ``gen_ai.output.messages`` (taken from ``worker.completed`` trace metadata)
==================  ===========================================================================

Signatures, encrypted reasoning and other continuity carriers never reach telemetry: content is
rebuilt from named fields (answer text, tool calls, ``trace.reasoning``), never copied wholesale.
A failure inside telemetry is logged and swallowed; it never fails a run.

Telemetry never slows a run. Spans are exported in batches on the SDK's own thread, each batch in
one attempt bounded by ``telemetry.export_timeout_s`` (0.5 s by default, below the OTLP
exporters' first retry backoff, so they never sleep and retry). While the collector is down,
batches are dropped at once for ``OUTAGE_COOLDOWN_S`` instead of being tried again, and the outage
is reported with one warning (the exporters' own retry and failure lines are not printed), so a
process that exits with a dead collector waits for nothing. ``bench/telemetry_bench.py`` measures
what a down collector costs a run.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue

from thoughtgate.access.filter import filter_payload
from thoughtgate.access.roles import Role
from thoughtgate.config import Config, TelemetryConfig
from thoughtgate.events.schema import Event, EventType
from thoughtgate.orchestration.recorder import EventSink

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = [
    "OUTAGE_COOLDOWN_S",
    "TelemetrySink",
    "build_tracer_provider",
    "telemetry_sinks",
]

logger = logging.getLogger(__name__)

# GenAI semantic-convention attribute names (opentelemetry-semantic-conventions defines the same
# strings under opentelemetry.semconv._incubating; spelled out here so an incubating rename there
# cannot silently change what we emit).
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"

AGENT = "thoughtgate"

_PROVIDER_NAMES = {"openai-compatible": "openai"}
"""Our adapter names -> well-known ``gen_ai.provider.name`` values (others pass through)."""

_FINISH_REASONS = {"tool_calls": "tool_call"}
"""Our normalized finish reasons -> the conventions' spelling (others pass through)."""

_DELTAS = frozenset({EventType.MESSAGE_DELTA, EventType.REASONING_DELTA})


def _ns(ts: float) -> int:
    return int(ts * 1_000_000_000)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _split(model: str | None) -> tuple[str | None, str | None]:
    """``"anthropic:claude-x"`` -> ``("anthropic", "claude-x")``; no prefix -> ``(None, model)``."""
    if not model:
        return None, None
    prefix, sep, name = model.partition(":")
    return (prefix, name) if sep else (None, model)


def _provider_name(raw: str | None) -> str | None:
    return _PROVIDER_NAMES.get(raw, raw) if raw else None


def _usage_attributes(usage: Any) -> dict[str, AttributeValue]:
    if not isinstance(usage, Mapping):
        return {}
    attrs: dict[str, AttributeValue] = {
        INPUT_TOKENS: int(usage.get("input_tokens") or 0),
        OUTPUT_TOKENS: int(usage.get("output_tokens") or 0),
        REASONING_TOKENS: int(usage.get("reasoning_tokens") or 0),
    }
    for key, name in (
        ("cache_read_tokens", CACHE_READ_TOKENS),
        ("cache_write_tokens", CACHE_WRITE_TOKENS),
    ):
        if usage.get(key):
            attrs[name] = int(usage[key])
    return attrs


def _finish(reason: Any) -> str | None:
    return _FINISH_REASONS.get(reason, reason) if isinstance(reason, str) and reason else None


@dataclass(slots=True)
class _Task:
    span: Span
    model: str | None
    cursor: float
    """When the next model turn began: the latest non-delta event of this task."""
    first_chunk: float | None = None
    tools: dict[str, Span] = field(default_factory=dict)
    reasoning: str | None = None
    partial_reason: str | None = None
    error: str | None = None


@dataclass(slots=True)
class _Run:
    span: Span
    mode: str = "hidden"
    """Until ``capability.resolved`` says otherwise, content rules are the strictest."""
    tasks: dict[str, _Task] = field(default_factory=dict)


class TelemetrySink:
    """A Runtime sink that turns every run's events into GenAI spans.

    ``capture_content`` is the operator's opt-in for message content (see the module docstring for
    what each mode then allows). One sink can follow many concurrent runs.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider,
        *,
        capture_content: bool = False,
        max_open_runs: int = 4096,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.tracer: Tracer = tracer_provider.get_tracer("thoughtgate")
        self.capture_content = capture_content
        self.max_open_runs = max_open_runs
        self._runs: dict[str, _Run] = {}

    async def __call__(self, events: Sequence[Event]) -> None:
        for event in events:
            try:
                self.handle(event)
            except Exception:
                logger.exception("telemetry: could not record %s for %s", event.type, event.run_id)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        flush = getattr(self.tracer_provider, "force_flush", None)
        return bool(flush(timeout_millis)) if flush is not None else True

    # ------------------------------------------------------------------ dispatch
    def handle(self, event: Event) -> None:
        """Apply one event (synchronous and cheap: deltas cost a dict lookup)."""
        if event.type == EventType.RUN_STARTED:
            self._run_started(event)
            return
        run = self._runs.get(event.run_id) or self._adopt(event)
        if event.type in _DELTAS:
            task = run.tasks.get(event.task_id or "")
            if task is not None and task.first_chunk is None:
                task.first_chunk = event.ts
            return
        handler = self._HANDLERS.get(event.type)
        if handler is not None:
            handler(self, run, event)
        task = run.tasks.get(event.task_id or "")
        if task is not None and event.type != EventType.TASK_STARTED:
            task.cursor = max(task.cursor, event.ts)

    def _content(self, run: _Run) -> bool:
        return self.capture_content and run.mode != "hidden"

    def _start(
        self,
        name: str,
        ts: float,
        attributes: dict[str, AttributeValue],
        *,
        parent: Span | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Span:
        context = trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(
            name, context=context, kind=kind, attributes=attributes, start_time=_ns(ts)
        )

    def _payload(self, run: _Run, event: Event) -> Mapping[str, Any]:
        """The payload to copy content from: through the one filter, so continuity carriers
        (signatures, encrypted items) are gone even from tool arguments and results."""
        if not self._content(run):
            return event.payload
        shown = filter_payload(
            event.type, event.payload, Role.OWNER, mode=run.mode, surface="trace"
        )
        return shown if shown is not None else {}

    def _fail(self, run: _Run, span: Span, error_type: str, message: Any = None) -> None:
        """Mark a span failed; the message is content (it may quote arguments or a prompt)."""
        span.set_attribute(ERROR_TYPE, error_type)
        description = str(message)[:512] if message and self._content(run) else None
        span.set_status(Status(StatusCode.ERROR, description))

    # ------------------------------------------------------------------ run
    def _run_started(self, event: Event) -> None:
        if event.run_id in self._runs:
            return
        self._evict()
        payload = event.payload
        prefix, model = _split(payload.get("model"))
        attrs: dict[str, AttributeValue] = {
            OPERATION: "invoke_workflow",
            AGENT_NAME: AGENT,
            CONVERSATION_ID: event.run_id,
            "thoughtgate.run.id": event.run_id,
        }
        if model:
            attrs[REQUEST_MODEL] = model
        if prefix:
            attrs[PROVIDER] = _provider_name(prefix) or prefix
        if isinstance(payload.get("tasks"), int):
            attrs["thoughtgate.run.tasks"] = payload["tasks"]
        self._runs[event.run_id] = _Run(self._start(f"invoke_workflow {AGENT}", event.ts, attrs))

    def _adopt(self, event: Event) -> _Run:
        """Events of a run whose start this sink never saw (registered mid-run): open it now."""
        self._run_started(Event(0, event.run_id, EventType.RUN_STARTED, {}, ts=event.ts))
        return self._runs[event.run_id]

    def _evict(self) -> None:
        while len(self._runs) >= self.max_open_runs:
            run_id = next(iter(self._runs))
            run = self._runs.pop(run_id)
            self._close(run, None, "evicted")

    def _capability(self, run: _Run, event: Event) -> None:
        mode = event.payload.get("chain_of_thought")
        if isinstance(mode, str):
            run.mode = mode
            run.span.set_attribute("thoughtgate.chain_of_thought", mode)

    def _run_finished(self, run: _Run, event: Event) -> None:
        payload = event.payload
        run.span.set_attributes(_usage_attributes(payload.get("usage")))
        status = payload.get("status")
        if isinstance(status, str):
            run.span.set_attribute("thoughtgate.run.status", status)
        if event.type != EventType.RUN_SETTLEMENT_COMPLETED:
            self._fail(run, run.span, str(status or event.type), payload.get("error"))
        self._runs.pop(event.run_id, None)
        self._close(run, event.ts, None)

    def _close(self, run: _Run, ts: float | None, error_type: str | None) -> None:
        """End the run span and anything still open under it (a run that died mid-task)."""
        end = _ns(ts) if ts is not None else None
        for task in run.tasks.values():
            for span in task.tools.values():
                self._fail(run, span, error_type or "interrupted")
                span.end(end_time=end)
            self._fail(run, task.span, error_type or "interrupted")
            task.span.end(end_time=end)
        run.tasks.clear()
        if error_type is not None:
            self._fail(run, run.span, error_type)
        run.span.end(end_time=end)

    # ------------------------------------------------------------------ task
    def _task_started(self, run: _Run, event: Event) -> None:
        if event.task_id is None:
            return
        payload = event.payload
        model = payload.get("model") if isinstance(payload.get("model"), str) else None
        prefix, name = _split(model)
        attrs: dict[str, AttributeValue] = {
            OPERATION: "invoke_agent",
            AGENT_NAME: AGENT,
            CONVERSATION_ID: event.run_id,
            "thoughtgate.task.id": event.task_id,
        }
        if isinstance(payload.get("index"), int):
            attrs["thoughtgate.task.index"] = payload["index"]
        if isinstance(payload.get("backend"), str):
            attrs["thoughtgate.worker_backend"] = payload["backend"]
        if name:
            attrs[REQUEST_MODEL] = name
        if prefix:
            attrs[PROVIDER] = _provider_name(prefix) or prefix
        if self._content(run) and isinstance(payload.get("prompt"), str):
            attrs[INPUT_MESSAGES] = _json(
                [{"role": "user", "parts": [{"type": "text", "content": payload["prompt"]}]}]
            )
        span = self._start(f"invoke_agent {AGENT}", event.ts, attrs, parent=run.span)
        run.tasks[event.task_id] = _Task(span, model, event.ts)

    def _worker_completed(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is None:
            return
        payload = event.payload
        task.span.set_attributes(_usage_attributes(payload.get("usage")))
        if isinstance(payload.get("turns"), int):
            task.span.set_attribute("thoughtgate.turns", payload["turns"])
        reason = _finish(payload.get("finish_reason"))
        if reason:
            task.span.set_attribute(FINISH_REASONS, [reason])
        trace_meta = payload.get("trace")
        # Only the reasoning text is read from the trace; its continuity list is never touched.
        if run.mode == "telemetry_only" and self._content(run) and isinstance(trace_meta, Mapping):
            text = trace_meta.get("reasoning")
            task.reasoning = text if isinstance(text, str) and text else None

    def _message_ended(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is not None and event.type == EventType.MESSAGE_PARTIALLY_COMPLETED:
            reason = event.payload.get("reason")
            task.partial_reason = reason if isinstance(reason, str) else "partial"
            task.error = event.payload.get("error")

    def _task_completed(self, run: _Run, event: Event) -> None:
        task = run.tasks.pop(event.task_id or "", None)
        if task is None:
            return
        payload = event.payload
        status = payload.get("status")
        if isinstance(status, str):
            task.span.set_attribute("thoughtgate.task.status", status)
        if self._content(run):
            parts: list[dict[str, Any]] = []
            if task.reasoning:
                parts.append({"type": "reasoning", "content": task.reasoning})
            if isinstance(payload.get("output"), str) and payload["output"]:
                parts.append({"type": "text", "content": payload["output"]})
            if parts:
                message = {
                    "role": "assistant",
                    "parts": parts,
                    "finish_reason": "stop" if status == "completed" else "error",
                }
                task.span.set_attribute(OUTPUT_MESSAGES, _json([message]))
        if status not in (None, "completed"):
            self._fail(
                run,
                task.span,
                task.partial_reason or str(status),
                payload.get("error") or task.error,
            )
        for span in task.tools.values():
            self._fail(run, span, "unfinished")
            span.end(end_time=_ns(event.ts))
        task.span.end(end_time=_ns(event.ts))

    # ------------------------------------------------------------------ model turn
    def _agent_response(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is None:
            return
        payload = self._payload(run, event)
        prefix, requested = _split(task.model)
        provider = _provider_name(payload.get("provider") or prefix) or "_OTHER"
        attrs: dict[str, AttributeValue] = {OPERATION: "chat", PROVIDER: provider}
        if provider != payload.get("provider") and payload.get("provider"):
            attrs["thoughtgate.provider"] = str(payload["provider"])
        if requested:
            attrs[REQUEST_MODEL] = requested
        if isinstance(payload.get("model"), str) and payload["model"]:
            attrs[RESPONSE_MODEL] = payload["model"]
        reason = _finish(payload.get("finish_reason"))
        if reason:
            attrs[FINISH_REASONS] = [reason]
        if isinstance(payload.get("turn"), int):
            attrs["thoughtgate.turn"] = payload["turn"]
        if task.first_chunk is not None:
            attrs[TIME_TO_FIRST_CHUNK] = max(0.0, task.first_chunk - task.cursor)
        attrs.update(_usage_attributes(payload.get("usage")))
        if self._content(run):
            attrs[OUTPUT_MESSAGES] = _json([_turn_message(payload, reason)])
        span = self._start(
            f"chat {requested or payload.get('model') or 'model'}",
            task.cursor,
            attrs,
            parent=task.span,
            kind=SpanKind.CLIENT,
        )
        if payload.get("error"):
            self._fail(run, span, "provider_error", payload["error"])
        span.end(end_time=_ns(max(event.ts, task.cursor)))
        task.first_chunk = None

    # ------------------------------------------------------------------ tools
    def _tool_started(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is None:
            return
        span = self._start(
            f"execute_tool {event.payload.get('tool_key') or 'tool'}",
            event.ts,
            self._tool_attributes(run, event),
            parent=task.span,
        )
        task.tools[str(event.payload.get("call_id"))] = span

    def _tool_attributes(self, run: _Run, event: Event) -> dict[str, AttributeValue]:
        payload = self._payload(run, event)
        attrs: dict[str, AttributeValue] = {
            OPERATION: "execute_tool",
            TOOL_NAME: str(payload.get("tool_key") or ""),
            TOOL_CALL_ID: str(payload.get("call_id") or ""),
            TOOL_TYPE: "function",
        }
        if self._content(run) and "input" in payload:
            attrs[TOOL_ARGUMENTS] = _json(payload["input"])
        return attrs

    def _tool_finished(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is None:
            return
        payload = self._payload(run, event)
        span = task.tools.pop(str(payload.get("call_id")), None)
        if span is None:  # failed before it started (unknown tool)
            span = self._start(
                f"execute_tool {payload.get('tool_key') or 'tool'}",
                event.ts,
                self._tool_attributes(run, event),
                parent=task.span,
            )
        status = event.type.removeprefix("tool.")
        span.set_attribute("thoughtgate.tool.status", status)
        if self._content(run) and isinstance(payload.get("output"), str):
            span.set_attribute(TOOL_RESULT, payload["output"])
        if event.type == EventType.TOOL_FAILED:
            kind = payload.get("error_kind")
            self._fail(
                run, span, kind if isinstance(kind, str) else "tool_error", payload.get("error")
            )
        span.end(end_time=_ns(event.ts))

    def _tool_approval(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is None:
            return
        attrs: dict[str, AttributeValue] = {
            TOOL_NAME: str(event.payload.get("tool_key") or ""),
            TOOL_CALL_ID: str(event.payload.get("call_id") or ""),
        }
        if isinstance(event.payload.get("decision"), str):
            attrs["thoughtgate.approval.decision"] = event.payload["decision"]
        task.span.add_event(event.type, attrs, timestamp=_ns(event.ts))

    _HANDLERS: Mapping[str, Callable[[TelemetrySink, _Run, Event], None]] = {
        EventType.CAPABILITY_RESOLVED: _capability,
        EventType.TASK_STARTED: _task_started,
        EventType.AGENT_RESPONSE: _agent_response,
        EventType.TOOL_STARTED: _tool_started,
        EventType.TOOL_COMPLETED: _tool_finished,
        EventType.TOOL_DEGRADED: _tool_finished,
        EventType.TOOL_FAILED: _tool_finished,
        EventType.TOOL_APPROVAL_REQUIRED: _tool_approval,
        EventType.TOOL_APPROVAL_RESPONSE: _tool_approval,
        EventType.TOOL_APPROVAL_TIMEOUT: _tool_approval,
        EventType.MESSAGE_COMPLETED: _message_ended,
        EventType.MESSAGE_PARTIALLY_COMPLETED: _message_ended,
        EventType.WORKER_COMPLETED: _worker_completed,
        EventType.TASK_COMPLETED: _task_completed,
        EventType.RUN_SETTLEMENT_COMPLETED: _run_finished,
        EventType.RUN_FAILED: _run_finished,
        EventType.RUN_ERROR: _run_finished,
        EventType.RUN_INTERRUPTED: _run_finished,
    }


def _turn_message(payload: Mapping[str, Any], reason: str | None) -> dict[str, Any]:
    """The turn's output message from its answer and tool calls only (never its reasoning)."""
    parts: list[dict[str, Any]] = []
    if isinstance(payload.get("answer"), str) and payload["answer"]:
        parts.append({"type": "text", "content": payload["answer"]})
    for call in payload.get("tool_calls") or ():
        if isinstance(call, Mapping):
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("call_id"),
                    "name": call.get("name"),
                    "arguments": call.get("input"),
                }
            )
    return {"role": "assistant", "parts": parts, "finish_reason": reason or "error"}


# --------------------------------------------------------------------------- exporters


def _http_endpoint(endpoint: str) -> str:
    """A bare collector URL (``http://collector:4318``) gets the traces path appended."""
    return endpoint.rstrip("/") + "/v1/traces" if urlsplit(endpoint).path in ("", "/") else endpoint


def _resource() -> Resource:
    """The SDK's resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, …), with
    ``service.name = thoughtgate`` only where the environment names no service."""
    from opentelemetry.sdk.resources import SERVICE_NAME
    from opentelemetry.sdk.resources import Resource as SdkResource

    resource = SdkResource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(SdkResource({SERVICE_NAME: "thoughtgate"}))
    return resource


OUTAGE_COOLDOWN_S = 30.0
"""After a failed export, batches are dropped without trying for this long."""

_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
)
"""Where the OTLP exporters log each retry and failure (silenced inside our export calls)."""

_quiet = threading.local()


class _QuietInOurExports(logging.Filter):
    """Drops exporter log records emitted on a thread that is inside ``_OutageAwareExporter``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_quiet, "active", False)


_QUIET_FILTER = _QuietInOurExports()


class _OutageAwareExporter:
    """Wraps an OTLP exporter: one bounded attempt per batch, one warning per outage.

    A ``SpanExporter`` in the SDK's sense (duck-typed so importing this module never imports the
    SDK). While the collector is known to be down, batches are dropped without a network call.
    """

    def __init__(self, inner: SpanExporter, endpoint: str, *, cooldown_s: float) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.cooldown_s = cooldown_s
        self._down_until = 0.0
        self._down = False
        for name in _EXPORTER_LOGGERS:
            logger_ = logging.getLogger(name)
            if _QUIET_FILTER not in logger_.filters:
                logger_.addFilter(_QUIET_FILTER)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self._down and time.monotonic() < self._down_until:
            return SpanExportResult.FAILURE
        _quiet.active = True
        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        finally:
            _quiet.active = False
        if result is SpanExportResult.SUCCESS:
            if self._down:
                logger.warning("telemetry: the collector at %s is reachable again", self.endpoint)
            self._down = False
        else:
            if not self._down:
                logger.warning(
                    "telemetry: cannot export spans to %s; dropping them (runs are not slowed; "
                    "trying again every %.0f s)",
                    self.endpoint,
                    self.cooldown_s,
                )
            self._down = True
            self._down_until = time.monotonic() + self.cooldown_s
        return result

    def shutdown(self) -> None:
        _quiet.active = True
        try:
            self.inner.shutdown()
        finally:
            _quiet.active = False

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def build_tracer_provider(config: TelemetryConfig) -> TracerProvider | None:
    """An SDK tracer provider exporting as configured, or ``None`` for ``exporter = "none"``.

    It is private to thoughtgate (the global provider is left alone), batches spans off the event
    loop, and flushes at interpreter exit. ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and
    the ``OTEL_EXPORTER_OTLP_*`` variables (headers, certificates, and the endpoint when
    ``telemetry.endpoint`` is unset) apply as the OpenTelemetry SDK defines them.
    """
    if config.exporter == "none":
        return None
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter: SpanExporter
    timeout = config.export_timeout_s
    if config.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # stderr: stdout carries --json output and the MCP stdio protocol.
        exporter = ConsoleSpanExporter(out=sys.stderr)
    elif config.exporter == "otlp_http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        http = HttpExporter(
            endpoint=_http_endpoint(config.endpoint) if config.endpoint else None, timeout=timeout
        )
        exporter = _wrap(http, str(getattr(http, "_endpoint", config.endpoint)))
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        grpc = GrpcExporter(endpoint=config.endpoint, timeout=timeout)
        exporter = _wrap(grpc, str(config.endpoint or "the default OTLP gRPC endpoint"))
    provider = SdkTracerProvider(resource=_resource())
    provider.add_span_processor(BatchSpanProcessor(exporter, export_timeout_millis=timeout * 1000))
    return provider


def _wrap(inner: SpanExporter, endpoint: str) -> SpanExporter:
    wrapped = _OutageAwareExporter(inner, endpoint, cooldown_s=OUTAGE_COOLDOWN_S)
    return cast("SpanExporter", wrapped)


def telemetry_sinks(
    config: Config | TelemetryConfig,
    *,
    tracer_provider: TracerProvider | None = None,
) -> list[EventSink]:
    """The sinks to pass as ``Runtime(..., sinks=...)``: none when no exporter is configured.

    ``tracer_provider`` overrides the configured exporter (tests pass an SDK provider with an
    in-memory exporter; an application may pass its own); ``capture_content`` still comes from
    the config.
    """
    settings = config.telemetry if isinstance(config, Config) else config
    provider = tracer_provider or build_tracer_provider(settings)
    if provider is None:
        return []
    return [TelemetrySink(provider, capture_content=settings.capture_content)]

"""GenAI spans and metrics for runs, tasks, model turns and tool calls, built from the event log.

Telemetry is a Runtime *sink*: it reads the events a run records (with their timestamps) and turns
them into spans and metrics that follow the OpenTelemetry GenAI semantic conventions. The runtime
makes no instrumentation calls, and with no exporter configured no sink is registered::

    one task:      invoke_agent thoughtgate          run.started .. the run's terminal event
                   ├── chat {model}                  one per model turn (kind CLIENT)
                   └── execute_tool {tool}           tool.started .. tool.completed | failed | ...
    several tasks: invoke_workflow thoughtgate       run.started .. the run's terminal event
                   └── invoke_agent thoughtgate      task.started .. task.completed, per task
                       ├── chat {model}
                       └── execute_tool {tool}

``invoke_workflow`` is only emitted when the run really groups several tasks (the conventions ask
instrumentations not to report it otherwise). Each chat span also feeds the client metrics
``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``.

What may reach a span (the README's "Who sees what, where", OpenTelemetry row). Without content
capture every mode gets metadata only: models, providers, servers, finish reasons, tool names,
statuses, durations and token counts. With ``telemetry.capture_content = true``:

==================  ===========================================================================
``hidden``          still metadata and token counts only; nothing the run said or was told
``surface``         system instructions, tool definitions (names), each turn's input messages
``telemetry_only``  (the history, tool results included) and output messages with the turn's
                    reasoning as a ``reasoning`` part, tool arguments and results, error messages
==================  ===========================================================================

Continuity carriers (signatures, encrypted reasoning) never reach telemetry: content is rebuilt
from named fields and passed through the one output filter (owner, trace surface), which leaves a
carrier's presence only; carriers are never copied. A failure inside telemetry is logged and
swallowed; it never fails a run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue

from thoughtgate import __version__
from thoughtgate.access.filter import filter_payload, shows
from thoughtgate.access.roles import Role
from thoughtgate.engine.loop import (
    NOT_APPROVED_IN_TIME,
    REJECTED_BY_USER,
    TURN_UNRECORDED_TYPE,
    failed_tool_text,
    unknown_tool_text,
)
from thoughtgate.events.payloads import TokenUsage
from thoughtgate.events.schema import Event, EventType
from thoughtgate.events.visibility import declared_fields
from thoughtgate.providers.base import total_input_tokens
from thoughtgate.telemetry import conventions as gc

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram, MeterProvider

__all__ = ["AGENT", "TelemetrySink"]

logger = logging.getLogger("thoughtgate.telemetry")

AGENT = "thoughtgate"
"""``gen_ai.agent.name`` and ``gen_ai.workflow.name`` of every span (and their span names)."""

_FINISH_REASONS = {"tool_calls": "tool_call"}
"""Our normalized finish reasons -> the conventions' spelling (others pass through)."""

_DELTAS = frozenset({EventType.MESSAGE_DELTA, EventType.REASONING_DELTA})
_RUN_ENDS = frozenset(
    {
        EventType.RUN_SETTLEMENT_COMPLETED,
        EventType.RUN_FAILED,
        EventType.RUN_ERROR,
        EventType.RUN_INTERRUPTED,
    }
)


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


def _finish(reason: Any) -> str | None:
    return _FINISH_REASONS.get(reason, reason) if isinstance(reason, str) and reason else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(slots=True)
class _Tokens:
    """A turn's or task's token counts as the conventions count them."""

    input: int = 0
    output: int = 0
    reasoning: int | None = 0
    """``None``: the trace does not show this run's reasoning count (a ``hidden`` run)."""
    cache_read: int = 0
    cache_write: int = 0

    @classmethod
    def of(cls, usage: Any, adapter: str | None, mode: str) -> _Tokens | None:
        """A turn's or task's counts as the trace shows them to the operator: by
        ``TokenUsage``'s declaration, as the one filter reads it for an owner on the trace
        surface. Billed counts always; ``reasoning_tokens`` only where the run records
        reasoning -- a ``hidden`` run's, which the provider billed anyway, is withheld here as
        on every other path (ADR 0163); its output count still includes them."""
        if not isinstance(usage, Mapping):
            return None
        declared = declared_fields(TokenUsage)
        usage = {
            k: v
            for k, v in usage.items()
            if k in declared and shows(declared[k].cls, Role.OWNER, mode, "trace")
        }
        return cls(
            total_input_tokens(usage, adapter),  # the conventions count cached input as input
            _int(usage.get("output_tokens")),
            _int(usage["reasoning_tokens"]) if "reasoning_tokens" in usage else None,
            _int(usage.get("cache_read_tokens")),
            _int(usage.get("cache_write_tokens")),
        )

    def attributes(self, *, reasoning_applies: bool) -> dict[str, AttributeValue]:
        attrs: dict[str, AttributeValue] = {
            gc.INPUT_TOKENS: self.input,
            gc.OUTPUT_TOKENS: self.output,
        }
        if self.reasoning is not None and (self.reasoning or reasoning_applies):
            attrs[gc.REASONING_TOKENS] = self.reasoning
        if self.cache_read:
            attrs[gc.CACHE_READ_TOKENS] = self.cache_read
        if self.cache_write:
            attrs[gc.CACHE_WRITE_TOKENS] = self.cache_write
        return attrs


@dataclass(slots=True)
class _Task:
    span: Span
    task_id: str
    adapter: str | None
    """The adapter prefix of the task's model (``anthropic``, ``openai-compatible``, ...)."""
    model: str | None
    """The model asked for, without its prefix."""
    cursor: float
    """When the next model turn began, for events recorded before turns carried their times."""
    root: bool = False
    """The run's root span (a one-task run): it ends with the run, not the task."""
    first_chunk: float | None = None
    tools: dict[str, Span] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation so far, as the next model turn will be given it (content capture)."""
    results: list[dict[str, Any]] = field(default_factory=list)
    """Tool results of the current turn, not yet sent back."""
    system: str | None = None
    definitions: list[dict[str, Any]] | None = None
    provider: str | None = None
    """``gen_ai.provider.name`` from the task's first model turn (it knows the server)."""
    error_type: str | None = None
    error: Any = None
    status: str | None = None
    open: bool = True


@dataclass(slots=True)
class _Run:
    run_id: str
    started: float
    workflow: Span | None = None
    """The ``invoke_workflow`` span of a run with several tasks (else the task span is the root)."""
    mode: str = "hidden"
    """Until ``capability.resolved`` says otherwise, content rules are the strictest."""
    model: str | None = None
    reasoning_requested: bool = False
    tasks: dict[str, _Task] = field(default_factory=dict)
    root: _Task | None = None
    error_type: str | None = None
    """The first failing task's error type: the run's own when it does not complete."""


class TelemetrySink:
    """A Runtime sink that turns every run's events into GenAI spans and client metrics.

    ``capture_content`` is the operator's opt-in for message content (see the module docstring
    for what each mode then allows). One sink can follow many concurrent runs.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider,
        *,
        meter_provider: MeterProvider | None = None,
        capture_content: bool = False,
        max_open_runs: int = 4096,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.tracer: Tracer = tracer_provider.get_tracer(
            gc.SCOPE, __version__, schema_url=gc.SCHEMA_URL
        )
        self._tokens: Histogram | None = None
        self._duration: Histogram | None = None
        if meter_provider is not None:
            meter = meter_provider.get_meter(gc.SCOPE, __version__, schema_url=gc.SCHEMA_URL)
            self._tokens = meter.create_histogram(
                gc.TOKEN_USAGE,
                unit="{token}",
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=gc.TOKEN_BUCKETS,
            )
            self._duration = meter.create_histogram(
                gc.OPERATION_DURATION,
                unit="s",
                description="GenAI operation duration.",
                explicit_bucket_boundaries_advisory=gc.DURATION_BUCKETS,
            )
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
        ok = True
        for provider in (self.tracer_provider, self.meter_provider):
            flush = getattr(provider, "force_flush", None)
            if flush is not None:
                ok = bool(flush(timeout_millis)) and ok
        return ok

    def shutdown(self) -> None:
        """Flush and stop both providers (what interpreter exit does for SDK providers)."""
        for provider in (self.tracer_provider, self.meter_provider):
            stop = getattr(provider, "shutdown", None)
            if stop is not None:
                stop()

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
        # A root span gets an empty context: never the caller's current span.
        context = trace.set_span_in_context(parent or trace.INVALID_SPAN)
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
        span.set_attribute(gc.ERROR_TYPE, error_type)
        description = str(message)[:512] if message and self._content(run) else None
        span.set_status(Status(StatusCode.ERROR, description))

    # ------------------------------------------------------------------ run
    def _run_started(self, event: Event) -> None:
        if event.run_id in self._runs:
            return
        self._evict()
        run = _Run(event.run_id, event.ts, model=_text(event.payload.get("model")))
        tasks = event.payload.get("tasks")
        if isinstance(tasks, int) and tasks > 1:
            attrs: dict[str, AttributeValue] = {
                gc.OPERATION: "invoke_workflow",
                gc.WORKFLOW_NAME: AGENT,
                "thoughtgate.run.id": event.run_id,
                "thoughtgate.run.tasks": tasks,
            }
            run.workflow = self._start(f"invoke_workflow {AGENT}", event.ts, attrs)
        self._runs[event.run_id] = run

    def _adopt(self, event: Event) -> _Run:
        """Events of a run whose start this sink never saw (registered mid-run): open it now."""
        self._run_started(Event(0, event.run_id, EventType.RUN_STARTED, {}, ts=event.ts))
        return self._runs[event.run_id]

    def _evict(self) -> None:
        while len(self._runs) >= self.max_open_runs:
            run_id = next(iter(self._runs))
            run = self._runs.pop(run_id)
            self._close(run, None, "evicted", None)

    def _capability(self, run: _Run, event: Event) -> None:
        mode = event.payload.get("chain_of_thought")
        if isinstance(mode, str):
            run.mode = mode
        run.reasoning_requested = bool(event.payload.get("reasoning_requested"))

    def _run_attributes(self, run: _Run) -> dict[str, AttributeValue]:
        return {"thoughtgate.run.id": run.run_id, "thoughtgate.chain_of_thought": run.mode}

    def _run_finished(self, run: _Run, event: Event) -> None:
        self._runs.pop(event.run_id, None)
        status = event.payload.get("status")
        status = status if isinstance(status, str) else str(event.type)
        error_type = None
        if status != "completed":
            error_type = run.error_type or status
        self._close(run, event.ts, error_type, event.payload.get("error"), status=status)

    def _close(
        self,
        run: _Run,
        ts: float | None,
        error_type: str | None,
        message: Any,
        *,
        status: str | None = None,
    ) -> None:
        """End the run's spans: tasks still open (a run that died mid-task) as errors, then the
        root -- the workflow, or the one task's agent span -- with the run's status."""
        end = _ns(ts) if ts is not None else None
        for task in run.tasks.values():
            if task is run.root:
                continue
            self._end_task(run, task, end, error_type or "interrupted", None)
        root = run.root
        if run.workflow is None and root is None:
            # The run ended before its task began: its root still reports how it ended.
            root = self._agent(run, None, run.started, {"model": run.model}, root=True)
        span = run.workflow or (root.span if root is not None else None)
        assert span is not None
        span.set_attributes(self._run_attributes(run))
        if status is not None:
            span.set_attribute("thoughtgate.run.status", status)
        if root is not None and run.workflow is None:
            task_error = root.error_type if root.status not in (None, "completed") else None
            self._end_task(run, root, end, error_type or task_error, message, force=True)
        else:
            if error_type is not None:
                self._fail(run, span, error_type, message)
            span.end(end_time=end)
        run.tasks.clear()

    def _end_task(
        self,
        run: _Run,
        task: _Task,
        end: int | None,
        error_type: str | None,
        message: Any,
        *,
        force: bool = False,
    ) -> None:
        """End a task's open tool spans, then (unless it is the root) the task span."""
        for span in task.tools.values():
            self._fail(run, span, error_type or "unfinished")
            span.end(end_time=end)
        task.tools.clear()
        if task.root and not force:
            return
        if task.open:
            if error_type is not None:
                self._fail(run, task.span, error_type, message or task.error)
            task.span.end(end_time=end)
            task.open = False

    # ------------------------------------------------------------------ task
    def _agent(
        self,
        run: _Run,
        task_id: str | None,
        ts: float,
        payload: Mapping[str, Any],
        *,
        root: bool,
    ) -> _Task:
        model = payload.get("model") if isinstance(payload.get("model"), str) else None
        adapter, name = _split(model)
        attrs: dict[str, AttributeValue] = {
            gc.OPERATION: "invoke_agent",
            gc.AGENT_NAME: AGENT,
            gc.AGENT_VERSION: __version__,
            gc.CONVERSATION_ID: run.run_id,
        }
        if task_id:
            attrs[gc.AGENT_ID] = task_id
            attrs["thoughtgate.task.id"] = task_id
        if isinstance(payload.get("index"), int):
            attrs["thoughtgate.task.index"] = payload["index"]
        if isinstance(payload.get("backend"), str):
            attrs["thoughtgate.worker_backend"] = payload["backend"]
        provider = gc.provider_name(adapter)
        if provider is not None:
            attrs[gc.PROVIDER] = provider
        if name:
            attrs[gc.REQUEST_MODEL] = name
        if root:
            attrs.update(self._run_attributes(run))
        task = _Task(
            self._start(f"invoke_agent {AGENT}", ts, attrs, parent=run.workflow),
            task_id or "",
            adapter,
            name,
            ts,
            root=root,
        )
        if root:
            run.root = task
        return task

    def _task_started(self, run: _Run, event: Event) -> None:
        if event.task_id is None:
            return
        payload = self._payload(run, event)
        root = run.workflow is None and run.root is None
        start = run.started if root else event.ts
        task = self._agent(run, event.task_id, start, payload, root=root)
        task.cursor = event.ts
        run.tasks[event.task_id] = task
        if not self._content(run):
            return
        task.system = _text(payload.get("system"))
        tools = payload.get("tools")
        if isinstance(tools, list):
            # Required properties only, as the conventions recommend by default.
            task.definitions = [
                {"type": "function", "name": t.get("name")} for t in tools if isinstance(t, Mapping)
            ]
        history = payload.get("history")
        task.messages = [dict(m) for m in history if isinstance(m, Mapping)] if history else []
        prompt = payload.get("prompt")
        if isinstance(prompt, str):
            task.messages.append({"role": "user", "parts": [{"type": "text", "content": prompt}]})
        attrs = self._instructions(task)
        if task.messages:
            attrs[gc.INPUT_MESSAGES] = _json(task.messages)
        task.span.set_attributes(attrs)

    def _instructions(self, task: _Task) -> dict[str, AttributeValue]:
        attrs: dict[str, AttributeValue] = {}
        if task.system:
            attrs[gc.SYSTEM_INSTRUCTIONS] = _json([{"type": "text", "content": task.system}])
        if task.definitions:
            attrs[gc.TOOL_DEFINITIONS] = _json(task.definitions)
        return attrs

    def _worker_completed(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is None:
            return
        payload = event.payload
        tokens = _Tokens.of(payload.get("usage"), task.adapter, run.mode)
        if tokens is not None:
            task.span.set_attributes(tokens.attributes(reasoning_applies=run.reasoning_requested))
        if isinstance(payload.get("turns"), int):
            task.span.set_attribute("thoughtgate.turns", payload["turns"])
        reason = _finish(payload.get("finish_reason"))
        if reason:
            task.span.set_attribute(gc.FINISH_REASONS, [reason])

    def _message_ended(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is None or event.type != EventType.MESSAGE_PARTIALLY_COMPLETED:
            return
        payload = event.payload
        reason = payload.get("reason")
        if reason == "provider_error":  # the cut turn's own error type, when it was recorded
            task.error_type = (
                task.error_type or _text(payload.get("error_type")) or "provider_error"
            )
        else:
            task.error_type = reason if isinstance(reason, str) else "partial"
        task.error = payload.get("error")

    def _task_completed(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is None:
            return
        if not task.root:
            run.tasks.pop(event.task_id or "", None)
        payload = event.payload
        status = payload.get("status")
        task.status = status if isinstance(status, str) else None
        if task.status:
            task.span.set_attribute("thoughtgate.task.status", task.status)
        # A task that failed or was cut has no worker.completed: its end says what it was billed.
        tokens = _Tokens.of(payload.get("usage"), task.adapter, run.mode)
        if tokens is not None:
            task.span.set_attributes(tokens.attributes(reasoning_applies=run.reasoning_requested))
        if self._content(run) and _text(payload.get("output")):
            message = {
                "role": "assistant",
                "parts": [{"type": "text", "content": payload["output"]}],
                "finish_reason": "stop" if status == "completed" else "error",
            }
            task.span.set_attribute(gc.OUTPUT_MESSAGES, _json([message]))
        error_type = None
        if status not in (None, "completed"):
            error_type = task.error_type or str(status)
            task.error_type = error_type
            task.error = payload.get("error") or task.error
            run.error_type = run.error_type or error_type
        self._end_task(run, task, _ns(event.ts), error_type, task.error)

    # ------------------------------------------------------------------ model turn
    def _agent_response(self, run: _Run, event: Event) -> None:
        task = run.tasks.get(event.task_id or "")
        if task is None:
            return
        payload = self._payload(run, event)
        call = payload.get("call") if isinstance(payload.get("call"), Mapping) else {}
        assert isinstance(call, Mapping)
        adapter = _text(payload.get("provider")) or task.adapter
        provider = gc.provider_name(adapter, _text(call.get("server"))) or "_OTHER"
        if task.provider is None:
            task.provider = provider
            task.span.set_attribute(gc.PROVIDER, provider)
        started = call.get("started_at")
        start = float(started) if isinstance(started, int | float) else task.cursor
        end = max(event.ts, start)
        attrs = self._turn_attributes(run, task, payload, call, provider, start)
        content = self._content(run)
        if content:
            attrs.update(self._instructions(task))
            if task.results:
                task.messages.append({"role": "tool", "parts": task.results})
                task.results = []
            if task.messages:
                attrs[gc.INPUT_MESSAGES] = _json(task.messages)
            output = _turn_message(payload, self._reasoning(run, payload))
            attrs[gc.OUTPUT_MESSAGES] = _json([output])
            task.messages.append({"role": "assistant", "parts": _history_parts(payload)})
        span = self._start(
            f"chat {task.model or payload.get('model') or 'model'}",
            start,
            attrs,
            parent=task.span,
            kind=SpanKind.CLIENT,
        )
        error_type = None
        # A stand-in's call returned (billed); only its record was cut off: not a failed call.
        if payload.get("error") and payload.get("error_type") != TURN_UNRECORDED_TYPE:
            error_type = _text(payload.get("error_type")) or "provider_error"
            task.error_type = error_type
            self._fail(run, span, error_type, payload["error"])
        span.end(end_time=_ns(end))
        task.first_chunk = None
        self._record_metrics(attrs, end - start, error_type)

    def _turn_attributes(
        self,
        run: _Run,
        task: _Task,
        payload: Mapping[str, Any],
        call: Mapping[str, Any],
        provider: str,
        start: float,
    ) -> dict[str, AttributeValue]:
        attrs: dict[str, AttributeValue] = {
            gc.OPERATION: "chat",
            gc.PROVIDER: provider,
            gc.CONVERSATION_ID: run.run_id,
        }
        if task.model:
            attrs[gc.REQUEST_MODEL] = task.model
        response_model = _text(call.get("response_model")) or _text(payload.get("model"))
        if response_model:
            attrs[gc.RESPONSE_MODEL] = response_model
        if _text(call.get("response_id")):
            attrs[gc.RESPONSE_ID] = call["response_id"]
        reason = _finish(payload.get("finish_reason"))
        if reason:
            attrs[gc.FINISH_REASONS] = [reason]
        if isinstance(payload.get("turn"), int):
            attrs["thoughtgate.turn"] = payload["turn"]
        if isinstance(call.get("stream"), bool):
            attrs[gc.REQUEST_STREAM] = call["stream"]
        if isinstance(call.get("max_tokens"), int):
            attrs[gc.REQUEST_MAX_TOKENS] = call["max_tokens"]
        if isinstance(call.get("temperature"), int | float):
            attrs[gc.REQUEST_TEMPERATURE] = float(call["temperature"])
        if _text(call.get("server_address")):
            attrs[gc.SERVER_ADDRESS] = call["server_address"]
            if isinstance(call.get("server_port"), int):
                attrs[gc.SERVER_PORT] = call["server_port"]
        first = call.get("first_chunk_at")
        if isinstance(first, int | float):
            attrs[gc.TIME_TO_FIRST_CHUNK] = max(0.0, float(first) - start)
        elif not call and task.first_chunk is not None:  # recorded before turns had times
            attrs[gc.TIME_TO_FIRST_CHUNK] = max(0.0, task.first_chunk - task.cursor)
        tokens = _Tokens.of(
            payload.get("usage"), _text(payload.get("provider")) or task.adapter, run.mode
        )
        if tokens is not None:
            attrs.update(tokens.attributes(reasoning_applies=run.reasoning_requested))
        return attrs

    def _reasoning(self, run: _Run, payload: Mapping[str, Any]) -> str | None:
        """The turn's reasoning for its output message: ``surface`` runs record it on the turn,
        ``telemetry_only`` runs in the turn's trace metadata. Never for ``hidden`` runs."""
        if run.mode == "surface":
            return _text(payload.get("reasoning"))
        if run.mode == "telemetry_only":
            trace_meta = payload.get("trace")
            return _text(trace_meta.get("reasoning")) if isinstance(trace_meta, Mapping) else None
        return None

    def _record_metrics(
        self, attrs: Mapping[str, AttributeValue], duration: float, error_type: str | None
    ) -> None:
        if self._duration is None or self._tokens is None:
            return
        keys = (
            gc.OPERATION,
            gc.PROVIDER,
            gc.REQUEST_MODEL,
            gc.RESPONSE_MODEL,
            gc.SERVER_ADDRESS,
            gc.SERVER_PORT,
        )
        common = {k: attrs[k] for k in keys if k in attrs}
        timing = dict(common)
        if error_type is not None:
            timing[gc.ERROR_TYPE] = error_type
        self._duration.record(max(0.0, duration), timing)
        for kind, key in (("input", gc.INPUT_TOKENS), ("output", gc.OUTPUT_TOKENS)):
            value = attrs.get(key)
            if isinstance(value, int):
                self._tokens.record(value, {**common, gc.TOKEN_TYPE: kind})

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
            gc.OPERATION: "execute_tool",
            gc.TOOL_NAME: str(payload.get("tool_key") or ""),
            gc.TOOL_CALL_ID: str(payload.get("call_id") or ""),
            gc.TOOL_TYPE: "function",
        }
        if self._content(run) and "input" in payload:
            attrs[gc.TOOL_ARGUMENTS] = _json(payload["input"])
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
        span.set_attribute("thoughtgate.tool.status", event.type.removeprefix("tool."))
        if self._content(run):
            result = _tool_result(event.type, payload)
            if result is not None:
                span.set_attribute(gc.TOOL_RESULT, result)
                task.results.append(
                    {"type": "tool_call_response", "id": payload.get("call_id"), "result": result}
                )
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
            gc.TOOL_NAME: str(event.payload.get("tool_key") or ""),
            gc.TOOL_CALL_ID: str(event.payload.get("call_id") or ""),
        }
        decision = event.payload.get("decision")
        if isinstance(decision, str):
            attrs["thoughtgate.approval.decision"] = decision
        task.span.add_event(event.type, attrs, timestamp=_ns(event.ts))
        # What the model is told in place of a result when the call did not run.
        told = None
        if event.type == EventType.TOOL_APPROVAL_TIMEOUT:
            told = NOT_APPROVED_IN_TIME
        elif decision == "reject":
            told = REJECTED_BY_USER
        if told is not None and self._content(run):
            call_id = event.payload.get("call_id")
            task.results.append({"type": "tool_call_response", "id": call_id, "result": told})

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
        **dict.fromkeys(_RUN_ENDS, _run_finished),
    }


def _tool_calls(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "type": "tool_call",
            "id": call.get("call_id"),
            "name": call.get("name"),
            "arguments": call.get("input"),
        }
        for call in payload.get("tool_calls") or ()
        if isinstance(call, Mapping)
    ]


def _history_parts(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The turn as it goes back to the model: its answer and tool calls, never its reasoning."""
    parts: list[dict[str, Any]] = []
    if _text(payload.get("answer")):
        parts.append({"type": "text", "content": payload["answer"]})
    return parts + _tool_calls(payload)


def _turn_message(payload: Mapping[str, Any], reasoning: str | None) -> dict[str, Any]:
    """The turn's output message: its reasoning (where allowed), answer and tool calls."""
    parts = [{"type": "reasoning", "content": reasoning}] if reasoning else []
    reason = _finish(payload.get("finish_reason"))
    return {
        "role": "assistant",
        "parts": parts + _history_parts(payload),
        "finish_reason": reason or "error",
    }


def _tool_result(event_type: str, payload: Mapping[str, Any]) -> str | None:
    """The text the model got back for a finished tool call (as the loop sends it)."""
    if event_type in (EventType.TOOL_COMPLETED, EventType.TOOL_DEGRADED):
        output = payload.get("output")
        return output if isinstance(output, str) else None
    if event_type == EventType.TOOL_FAILED:
        if payload.get("error_kind") == "unknown_tool":
            return unknown_tool_text(str(payload.get("tool_key") or ""))
        error = payload.get("error")
        return failed_tool_text(error) if isinstance(error, str) else None
    return None

"""The agent tool loop: model turn, tools, model turn ... until an answer or the turn limit.

Continuity: each assistant turn goes back to the model as its parts *minus* reasoning text; only
the provider's opaque continuity blocks (signed thinking, encrypted items, ``reasoning_details``,
DeepSeek ``reasoning_content``) ride along, and only inside this loop with this provider and model.
Reasoning text is never rehydrated into a request.

Recording: every turn ends with ``agent.response`` (reasoning per the disclosure mode, full, with
its size); a cut or failed stream keeps the partial turn and ends the task with
``message.partially_completed``; nothing the provider sent is lost -- except ``visible_step``
calls, whose one argument is a step for the reader and is stored only as the policy-checked
``cot.*`` event the observer makes of it (never as a tool call or tool card). The task is
``partial`` when some answer text had arrived before the failure, ``failed`` when none had: an
outage is never reported as an answer.

Narration: when the observer ``narrates``, the model is also offered ``visible_step``
(``events/narration.py``). Its calls never reach the tool registry; each is answered with a plain
acknowledgement in the same tool message as the turn's real calls, so narrating beside a tool
call costs no extra model turn. A turn that only narrates still goes back to the model (it asked
for a result), which is one more turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

from thoughtgate.disclosure import Disclosure
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.engine.history import keep_own_carriers
from thoughtgate.engine.tools import Tool, ToolArgumentsError, ToolRegistry
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ProviderError, UsageError
from thoughtgate.events.narration import (
    NARRATION_SPEC,
    NARRATION_TOOL,
    Narration,
    is_narration,
    narration_ack,
    narrations_of,
    without_narration,
)
from thoughtgate.events.payloads import (
    AgentResponsePayload,
    ContinuityBlockPayload,
    ContinuityDroppedPayload,
    MessageCompletedPayload,
    MessageDeltaPayload,
    MessagePartiallyCompletedPayload,
    ModelCallPayload,
    ReasoningDeltaPayload,
    ReasoningPartPayload,
    ToolApprovalRequiredPayload,
    ToolApprovalResponsePayload,
    ToolApprovalTimeoutPayload,
    ToolCardFields,
    ToolCompletedPayload,
    ToolDegradedPayload,
    ToolErrorKind,
    ToolFailedPayload,
    ToolProgressPayload,
    ToolStartedPayload,
    token_usage,
    trace_metadata,
)
from thoughtgate.events.schema import Event, EventType, NewEvent, now_ts
from thoughtgate.providers.base import (
    Provider,
    ReasoningRequest,
    ServerInfo,
    ToolSpec,
    TurnRequest,
)
from thoughtgate.types import (
    Chunk,
    Message,
    ReasoningDelta,
    ReasoningPart,
    TextDelta,
    ToolCallPart,
    ToolResultPart,
    Turn,
    Usage,
    part_to_dict,
)

__all__ = [
    "NOT_APPROVED_IN_TIME",
    "REJECTED_BY_USER",
    "LoopObserver",
    "LoopRecorder",
    "LoopResult",
    "error_type_of",
    "failed_tool_text",
    "offered_tools",
    "run_agent_loop",
    "strip_reasoning",
    "unknown_tool_text",
]


class LoopRecorder(Protocol):
    """Where the loop writes its events, in order (``orchestration.recorder.EventRecorder``)."""

    @property
    def run_id(self) -> str: ...

    async def emit(self, event: NewEvent) -> list[Event]: ...

    async def emit_all(self, events: Sequence[NewEvent]) -> list[Event]: ...

    async def emit_delta(self, event: NewEvent) -> None: ...

    async def flush(self) -> None: ...


class LoopObserver(Protocol):
    """Lifecycle hooks (the visible-reasoning pipeline); each returns events to record."""

    @property
    def narrates(self) -> bool:
        """Offer the model the ``visible_step`` tool and pass its calls to ``turn_finished``."""
        ...

    async def turn_finished(
        self, turn: Turn, *, task_id: str, narrations: Sequence[Narration] = ()
    ) -> Sequence[NewEvent]: ...

    async def tool_started(self, call: ToolCallPart, *, task_id: str) -> Sequence[NewEvent]: ...

    async def tool_finished(
        self, call: ToolCallPart, status: str, *, task_id: str, result: ToolResultPart | None = None
    ) -> Sequence[NewEvent]: ...

    async def task_finished(self, *, task_id: str) -> Sequence[NewEvent]:
        """The loop ended without a final answer turn (turn limit)."""
        ...


@dataclass(slots=True)
class LoopResult:
    """How a task's loop ended."""

    status: Literal["completed", "partial", "failed"]
    answer: str
    turns: int
    usage: Usage
    reasoning: str
    finish_reason: str | None
    error: str | None = None
    turn_records: list[Turn] = field(default_factory=list)
    error_type: str | None = None
    """What kind of failure ``error`` is (:func:`error_type_of`, or ``max_turns``)."""


def strip_reasoning(parts: Sequence[Any]) -> tuple[Any, ...]:
    """The parts that may go back to a model: everything but reasoning text."""
    return tuple(p for p in parts if not isinstance(p, ReasoningPart))


NOT_APPROVED_IN_TIME = "The tool call was not approved in time and was not executed."
"""What the model is told when nobody answered an approval in time."""
REJECTED_BY_USER = "The user rejected this tool call; it was not executed."
"""What the model is told when a person rejected a tool call."""


def unknown_tool_text(name: str) -> str:
    """What the model is told when it called a tool that does not exist."""
    return f"Error: there is no tool named {name!r}."


def failed_tool_text(error: str) -> str:
    """What the model is told when a tool (and its fallback) failed."""
    return f"Error: {error}"


def error_type_of(exc: ProviderError) -> str:
    """A low-cardinality name for a provider failure: the provider's own error code
    (``overloaded_error``, ``rate_limit_error``, ...), else the error's class."""
    return exc.error_type or type(exc).__name__


def offered_tools(tools: ToolRegistry, observer: LoopObserver | None) -> tuple[ToolSpec, ...]:
    """The tools a model is offered: the registry's, plus ``visible_step`` when narrating."""
    if observer is not None and observer.narrates:
        return (*tools.specs, NARRATION_SPEC)
    return tools.specs


def _error_kind(exc: Exception, *, fallback_failed: bool = False) -> ToolErrorKind:
    if isinstance(exc, ToolArgumentsError):
        return "invalid_arguments"
    return "fallback_failed" if fallback_failed else "tool_error"


class _Loop:
    def __init__(
        self,
        *,
        provider: Provider,
        recorder: LoopRecorder,
        task_id: str,
        disclosure: Disclosure,
        tools: ToolRegistry,
        approvals: ApprovalBroker,
        approval_timeout: float,
        observer: LoopObserver | None,
        max_tokens: int,
    ) -> None:
        self.provider = provider
        self.recorder = recorder
        self.task_id = task_id
        self.disclosure = disclosure
        self.tools = tools
        self.approvals = approvals
        self.approval_timeout = approval_timeout
        self.observer = observer
        self.max_tokens = max_tokens
        self.turn_no = 0
        self.first_chunk_at: float | None = None
        self.stream_ended_at: float | None = None
        self.cards_seen: set[str] = set()
        self.narrating = observer is not None and observer.narrates
        if self.narrating and tools.get(NARRATION_TOOL) is not None:
            raise UsageError(
                f"a tool may not be named {NARRATION_TOOL!r} while visible_reasoning.summarizers "
                "includes narration: that name is the built-in narration tool"
            )

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """The tools offered to the model: the registry's, plus ``visible_step`` when narrating."""
        return offered_tools(self.tools, self.observer)

    def narrations(self, turn: Turn) -> list[Narration]:
        if not self.narrating:
            return []
        return narrations_of(turn, registered=lambda name: self.tools.get(name) is not None)

    def real_calls(self, turn: Turn) -> tuple[ToolCallPart, ...]:
        """The turn's calls that become tool cards (all of them unless narrating)."""
        return without_narration(turn.tool_calls) if self.narrating else turn.tool_calls

    async def answer(self, call: ToolCallPart) -> ToolResultPart:
        """A narration gets its acknowledgement; any other call runs as a tool."""
        if self.narrating and is_narration(call):
            return narration_ack(call)
        return await self.run_tool(call)

    def ev(self, type_: str, payload: Mapping[str, Any]) -> NewEvent:
        return NewEvent(type_, payload, task_id=self.task_id)

    async def on_chunk(self, chunk: Chunk) -> None:
        if self.first_chunk_at is None:
            self.first_chunk_at = now_ts()
        if isinstance(chunk, TextDelta) and chunk.text:
            delta: MessageDeltaPayload = {"text": chunk.text, "turn": self.turn_no}
            await self.recorder.emit_delta(self.ev(EventType.MESSAGE_DELTA, delta))
        elif isinstance(chunk, ReasoningDelta) and chunk.text and self.disclosure.on_display:
            thought: ReasoningDeltaPayload = {
                "text": chunk.text,
                "reasoning_kind": chunk.reasoning_kind,
                "index": chunk.index,
                "turn": self.turn_no,
            }
            await self.recorder.emit_delta(self.ev(EventType.REASONING_DELTA, thought))

    def captured(self, turn: Turn) -> Turn:
        """``hidden`` keeps no reasoning even if a provider sent some anyway.

        Continuity blocks stay: an adapter only emits them in ``hidden`` mode when the API demands
        them back inside this loop (its endpoint rule says so), and then they live in this loop's
        history only -- ``response_events`` and the trace leave them out in ``hidden`` mode.
        """
        if self.disclosure.captures:
            return turn
        from dataclasses import replace

        return replace(turn, parts=strip_reasoning(turn.parts))

    def call_info(self, request: TurnRequest, turn: Turn, started_at: float) -> ModelCallPayload:
        """How this turn was requested and answered (telemetry reads it from the log)."""
        call: ModelCallPayload = {
            "stream": True,
            "max_tokens": request.max_tokens,
            "started_at": started_at,
        }
        if self.first_chunk_at is not None:
            call["first_chunk_at"] = self.first_chunk_at
        if self.stream_ended_at is not None:
            call["ended_at"] = self.stream_ended_at
        if request.temperature is not None:
            call["temperature"] = request.temperature
        if turn.response_id:
            call["response_id"] = turn.response_id
        if turn.response_model:
            call["response_model"] = turn.response_model
        server = getattr(self.provider, "server", None)
        if isinstance(server, ServerInfo):
            call["server"] = server.name
            if server.address:
                call["server_address"] = server.address
            if server.port is not None:
                call["server_port"] = server.port
        return call

    async def response_events(
        self,
        turn: Turn,
        *,
        call: ModelCallPayload | None = None,
        error: ProviderError | None = None,
    ) -> list[NewEvent]:
        """``agent.response`` and the observer's visible steps for the turn, to record together."""
        payload: AgentResponsePayload = {
            "turn": self.turn_no,
            "answer": turn.text,
            "complete": turn.complete,
            "finish_reason": turn.finish_reason,
            "raw_finish_reason": turn.raw_finish_reason,
            "provider": turn.provider,
            "model": turn.model,
            "usage": token_usage(turn.usage),
            "tool_calls": [
                {"call_id": c.call_id, "name": c.name, "input": c.arguments}
                for c in self.real_calls(turn)
            ],
        }
        if error is not None:
            payload["error"] = str(error)
            payload["error_type"] = error_type_of(error)
        if call is not None:
            payload["call"] = call
        if self.disclosure.in_trace and not self.disclosure.on_display:
            # telemetry_only: this turn's reasoning for the trace surface (and telemetry) only
            payload["trace"] = trace_metadata(turn.reasoning_text, turn.continuity)
        if self.disclosure.on_display:
            text = turn.reasoning_text
            payload["reasoning"] = text
            payload["reasoning_chars"] = len(text)
            payload["reasoning_bytes"] = len(text.encode("utf-8"))
            # part_to_dict writes exactly these payload shapes (checked against the catalogue)
            payload["reasoning_parts"] = [
                cast(ReasoningPartPayload, part_to_dict(p)) for p in turn.reasoning_parts
            ]
            payload["continuity"] = [
                cast(ContinuityBlockPayload, part_to_dict(b)) for b in turn.continuity
            ]
        events = [self.ev(EventType.AGENT_RESPONSE, payload)]
        if self.observer is not None:
            narrations = self.narrations(turn)
            events += await self.observer.turn_finished(
                turn, task_id=self.task_id, narrations=narrations
            )
        return events

    async def run_tool(self, call: ToolCallPart) -> ToolResultPart:
        tool = self.tools.get(call.name)
        base: ToolCardFields = {
            "call_id": call.call_id,
            "tool_key": call.name,
            "turn": self.turn_no,
            "label": tool.label if tool is not None else call.name,
        }
        if tool is None:
            failed: ToolFailedPayload = {
                **base,
                "error": f"unknown tool {call.name!r}",
                "error_kind": "unknown_tool",
            }
            await self.recorder.emit(self.ev(EventType.TOOL_FAILED, failed))
            return ToolResultPart(
                call.call_id,
                unknown_tool_text(call.name),
                is_error=True,
                name=call.name,
            )
        if tool.requires_approval:
            verdict = await self.approve(tool, call, base)
            if verdict is not None:
                return verdict
        return await self.execute(tool, call, base)

    async def approve(
        self, tool: Tool, call: ToolCallPart, base: ToolCardFields
    ) -> ToolResultPart | None:
        asked: ToolApprovalRequiredPayload = {**base, "input": call.arguments}
        await self.recorder.emit(self.ev(EventType.TOOL_APPROVAL_REQUIRED, asked))
        await self.observe_tool_started(call)
        outcome = await self.approvals.wait(
            self.recorder.run_id,
            call.call_id,
            tool.name,
            call.arguments,
            timeout=self.approval_timeout,
        )
        if outcome.decision == "timeout":
            expired: ToolApprovalTimeoutPayload = {**base, "timeout_s": self.approval_timeout}
            await self.recorder.emit(self.ev(EventType.TOOL_APPROVAL_TIMEOUT, expired))
            text = NOT_APPROVED_IN_TIME
        else:
            answered: ToolApprovalResponsePayload = {
                **base,
                "decision": outcome.decision,
                "by": outcome.by,
            }
            await self.recorder.emit(self.ev(EventType.TOOL_APPROVAL_RESPONSE, answered))
            if outcome.decision == "approve":
                return None
            text = REJECTED_BY_USER
        result = ToolResultPart(call.call_id, text, is_error=True, name=call.name)
        status = "skipped" if outcome.decision == "timeout" else "rejected"
        await self.observe_tool_finished(call, status, result)
        return result

    async def execute(self, tool: Tool, call: ToolCallPart, base: ToolCardFields) -> ToolResultPart:
        started: ToolStartedPayload = {**base, "input": call.arguments}
        await self.recorder.emit(self.ev(EventType.TOOL_STARTED, started))
        await self.observe_tool_started(call)

        async def progress(message: str) -> None:
            note: ToolProgressPayload = {**base, "message": message}
            await self.recorder.emit(self.ev(EventType.TOOL_PROGRESS, note))

        status = "completed"
        try:
            output = await tool.call(call.arguments, progress)
            done: ToolCompletedPayload = {**base, "output": output}
            await self.recorder.emit(self.ev(EventType.TOOL_COMPLETED, done))
            result = ToolResultPart(call.call_id, output, name=call.name)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            result, status = await self.fail(tool, call, base, error, exc)
        await self.observe_tool_finished(call, status, result)
        return result

    async def observe_tool_started(self, call: ToolCallPart) -> None:
        """Once per card, after its first event (approval request or start)."""
        if self.observer is None or call.call_id in self.cards_seen:
            return
        self.cards_seen.add(call.call_id)
        for event in await self.observer.tool_started(call, task_id=self.task_id):
            await self.recorder.emit(event)

    async def observe_tool_finished(
        self, call: ToolCallPart, status: str, result: ToolResultPart
    ) -> None:
        if self.observer is not None:
            for event in await self.observer.tool_finished(
                call, status, task_id=self.task_id, result=result
            ):
                await self.recorder.emit(event)

    async def fail(
        self, tool: Tool, call: ToolCallPart, base: ToolCardFields, error: str, exc: Exception
    ) -> tuple[ToolResultPart, str]:
        kind = _error_kind(exc)
        if tool.fallback is not None and not isinstance(exc, ToolArgumentsError):
            try:
                output = await tool.call_fallback(call.arguments)
            except Exception as fexc:
                error = f"{error}; fallback failed: {type(fexc).__name__}: {fexc}"
                kind = _error_kind(exc, fallback_failed=True)
            else:
                degraded: ToolDegradedPayload = {
                    **base,
                    "output": output,
                    "error": error,
                    "error_kind": kind,
                }
                await self.recorder.emit(self.ev(EventType.TOOL_DEGRADED, degraded))
                return ToolResultPart(call.call_id, output, name=call.name), "degraded"
        failed: ToolFailedPayload = {**base, "error": error, "error_kind": kind}
        await self.recorder.emit(self.ev(EventType.TOOL_FAILED, failed))
        return (
            ToolResultPart(call.call_id, failed_tool_text(error), is_error=True, name=call.name),
            "failed",
        )


async def run_agent_loop(
    provider: Provider,
    messages: Sequence[Message],
    *,
    recorder: LoopRecorder,
    task_id: str,
    disclosure: Disclosure,
    tools: ToolRegistry | None = None,
    approvals: ApprovalBroker | None = None,
    max_turns: int = 14,
    approval_timeout: float = 300.0,
    system: str | None = None,
    observer: LoopObserver | None = None,
    max_tokens: int = 4096,
) -> LoopResult:
    """Run model turns and tools until the model answers without calling a tool."""
    loop = _Loop(
        provider=provider,
        recorder=recorder,
        task_id=task_id,
        disclosure=disclosure,
        tools=tools or ToolRegistry(),
        approvals=approvals or ApprovalBroker(),
        approval_timeout=approval_timeout,
        observer=observer,
        max_tokens=max_tokens,
    )
    history = list(messages)
    usage = Usage()
    reasoning: list[str] = []
    turns: list[Turn] = []
    for turn_no in range(max_turns):
        loop.turn_no = turn_no
        outgoing, dropped = keep_own_carriers(history, provider.name, provider.model)
        for gone in dropped:
            note: ContinuityDroppedPayload = {
                "carrier": gone.carrier,
                "from_provider": gone.provider,
                "from_model": gone.model,
                "reason": gone.reason,
                "turn": turn_no,
            }
            await recorder.emit(NewEvent(EventType.CONTINUITY_DROPPED, note, task_id=task_id))
        history = outgoing
        request = TurnRequest(
            history,
            system=system,
            tools=loop.specs,
            reasoning=ReasoningRequest(disclosure.requests_reasoning),
            max_tokens=max_tokens,
        )
        started_at = now_ts()
        loop.first_chunk_at = loop.stream_ended_at = None
        try:
            turn = loop.captured(await stream_llm_turn(provider, request, loop.on_chunk))
        except ProviderError as exc:
            loop.stream_ended_at = now_ts()
            partial = loop.captured(exc.partial) if exc.partial is not None else None
            closing: list[NewEvent] = []
            if partial is not None:
                usage = usage + partial.usage
                reasoning.append(partial.reasoning_text)
                turns.append(partial)
                call = loop.call_info(request, partial, started_at)
                closing += await loop.response_events(partial, call=call, error=exc)
            answer = partial.text if partial is not None else ""
            cut: MessagePartiallyCompletedPayload = {
                "text": answer,
                "reason": "provider_error",
                "error": str(exc),
                "status": exc.status,
                "error_type": exc.error_type,
            }
            closing.append(NewEvent(EventType.MESSAGE_PARTIALLY_COMPLETED, cut, task_id=task_id))
            await recorder.emit_all(closing)  # after the deltas still buffered, in one batch
            return LoopResult(
                "partial" if answer else "failed",
                answer,
                turn_no + 1,
                usage,
                _join(reasoning),
                partial.finish_reason if partial else None,
                str(exc),
                turns,
                error_type_of(exc),
            )
        loop.stream_ended_at = now_ts()
        usage = usage + turn.usage
        reasoning.append(turn.reasoning_text)
        turns.append(turn)
        closing = await loop.response_events(turn, call=loop.call_info(request, turn, started_at))
        if turn.tool_calls:
            await recorder.emit_all(closing)  # after the deltas still buffered, in one batch
        else:
            final: MessageCompletedPayload = {
                "text": turn.text,
                "finish_reason": turn.finish_reason,
            }
            closing.append(NewEvent(EventType.MESSAGE_COMPLETED, final, task_id=task_id))
            await recorder.emit_all(closing)
            return LoopResult(
                "completed",
                turn.text,
                turn_no + 1,
                usage,
                _join(reasoning),
                turn.finish_reason,
                None,
                turns,
            )
        results = [await loop.answer(call) for call in turn.tool_calls]
        history.append(Message("assistant", strip_reasoning(turn.parts)))
        history.append(Message("tool", tuple(results)))
    limit = f"stopped after reaching the turn limit of {max_turns} model turns"
    last = turns[-1].text if turns else ""
    if observer is not None:
        for event in await observer.task_finished(task_id=task_id):
            await recorder.emit(event)
    stopped: MessagePartiallyCompletedPayload = {
        "text": last,
        "reason": "max_turns",
        "error": limit,
    }
    await recorder.emit(NewEvent(EventType.MESSAGE_PARTIALLY_COMPLETED, stopped, task_id=task_id))
    return LoopResult(
        "partial", last, max_turns, usage, _join(reasoning), "max_turns", limit, turns, "max_turns"
    )


def _join(parts: list[str]) -> str:
    return "\n\n".join(p for p in parts if p)

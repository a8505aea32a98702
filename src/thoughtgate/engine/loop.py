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

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

from thoughtgate.disclosure import Disclosure, kept_detail
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.engine.history import DroppedCarrier, keep_own_carriers
from thoughtgate.engine.steps import DirectSteps, StepCodec, Steps
from thoughtgate.engine.tools import Tool, ToolArgumentsError, ToolRegistry
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import (
    ProviderError,
    UsageError,
    failure_detail,
    failure_text,
    identifier,
)
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
    part_from_dict,
    part_to_dict,
)

__all__ = [
    "NOT_APPROVED_IN_TIME",
    "REJECTED_BY_USER",
    "TURN_CUT",
    "TURN_CUT_TYPE",
    "TURN_UNRECORDED",
    "TURN_UNRECORDED_TYPE",
    "Billing",
    "LoopObserver",
    "LoopRecorder",
    "LoopResult",
    "error_type_of",
    "failed_tool_text",
    "offered_tools",
    "run_agent_loop",
    "strip_reasoning",
    "turn_from_json",
    "turn_to_json",
    "unknown_tool_text",
]

TURN_CUT = "cut: the process executing the run stopped during this turn; the turn is asked again"
"""The error of a turn a stopped process left unfinished (ADR 0013)."""
TURN_UNRECORDED = (
    "cut: the task ended after the provider answered this turn and billed it, before the turn "
    "was recorded"
)
"""The error of the ``agent.response`` that stands in for a turn whose own record was never
stored (``Billing.billed``): its answer and usage, nothing else (ADR 0131, amended)."""
TURN_CUT_TYPE = "interrupted"
"""The ``error_type`` of a :data:`TURN_CUT` turn: its call did not return (not the provider's
error: telemetry's ``error.type`` would otherwise blame it)."""
TURN_UNRECORDED_TYPE = "unrecorded"
"""The ``error_type`` of a :data:`TURN_UNRECORDED` stand-in: its call returned and was billed;
only its record was cut off, so telemetry does not count the call as failed."""
TOOL_INTERRUPTED = (
    "the process executing the run stopped while this tool ran; it was not run again, since it "
    "may already have had its effect"
)


class LoopRecorder(Protocol):
    """Where the loop writes its events, in order (``orchestration.recorder.EventRecorder``)."""

    @property
    def run_id(self) -> str: ...

    async def emit(self, event: NewEvent) -> list[Event]: ...

    async def emit_all(self, events: Sequence[NewEvent]) -> list[Event]:
        """Append ``events`` in one atomic batch (a resumed run finds all of them or none)."""
        ...

    async def emit_delta(self, event: NewEvent) -> None: ...

    async def emit_last(self, events: Sequence[NewEvent]) -> None:
        """The task's last events (its last turn's record): appended like ``emit_all``, or held
        by the recorder for its caller to store with the run's ending (one commit)."""
        ...

    def extend_delta(self, event: NewEvent | None, text: str) -> bool:
        """Join ``text`` to ``event`` (a delta this caller emitted) if it still waits in the
        buffer; ``False`` when it does not and ``text`` must go in a delta of its own."""
        ...

    async def flush(self) -> None: ...


class Billing(Protocol):
    """What a task's model turns were billed, told as each turn returns (ADR 0131)."""

    def billed(self, usage: Usage, unrecorded: NewEvent) -> None:
        """A turn returned with ``usage``, before it is recorded. ``unrecorded``: the
        ``agent.response`` to record in its place if its own record is never stored (a cancel
        or a failure lands first), so that the log says what the turn was billed."""
        ...

    def recorded(self) -> None:
        """The last billed turn's record was stored, or held for the run's end."""
        ...


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
    error_detail: str | None = None
    """The failure's words thoughtgate did not write (a provider's, a worker's): developer-only
    (``error_detail`` in the events, ADR 0071)."""


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
    (``overloaded_error``, ``rate_limit_error``, ...) when it is an identifier, else the error's
    class (a public field: never the provider's free text, ADR 0071)."""
    return identifier(exc.error_type) or type(exc).__name__


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
        steps: Steps,
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
        self.steps = steps
        self.turn_no = 0
        self.first_chunk_at: float | None = None
        self.stream_ended_at: float | None = None
        self.live_reasoning = disclosure.on_display
        self.delta_part: tuple[object, ...] = ()
        """What the last recorded delta belongs to: its type, part and turn."""
        self.last_delta: NewEvent | None = None
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

    def on_chunk(self, chunk: Chunk) -> Awaitable[None] | None:
        """Record a streamed delta: ``None`` when the chunk needs no wait (it was joined to the
        delta waiting in the recorder, or is not recorded), else the recorder's append."""
        if self.first_chunk_at is None:
            self.first_chunk_at = now_ts()
        payload: MessageDeltaPayload | ReasoningDeltaPayload
        if isinstance(chunk, TextDelta) and chunk.text:
            part: tuple[object, ...] = (EventType.MESSAGE_DELTA, self.turn_no)
            if part == self.delta_part and self.recorder.extend_delta(self.last_delta, chunk.text):
                return None  # joined to the delta still waiting in the recorder's buffer
            type_, payload = EventType.MESSAGE_DELTA, {"text": chunk.text, "turn": self.turn_no}
        elif isinstance(chunk, ReasoningDelta) and chunk.text and self.live_reasoning:
            part = (EventType.REASONING_DELTA, chunk.reasoning_kind, chunk.index, self.turn_no)
            if part == self.delta_part and self.recorder.extend_delta(self.last_delta, chunk.text):
                return None
            type_ = EventType.REASONING_DELTA
            payload = {
                "text": chunk.text,
                "reasoning_kind": chunk.reasoning_kind,
                "index": chunk.index,
                "turn": self.turn_no,
            }
        else:
            return None
        event = self.ev(type_, payload)
        self.delta_part, self.last_delta = part, event
        return self.recorder.emit_delta(event)

    def captured(self, turn: Turn) -> Turn:
        """``hidden`` keeps no reasoning even if a provider sent some anyway.

        Continuity blocks stay: an adapter only emits them in ``hidden`` mode when the API demands
        them back inside this loop (its endpoint rule says so), and then they live in this loop's
        history only -- ``record_response`` and the trace leave them out in ``hidden`` mode.
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

    # -- one model turn: a step that streams it, then a step that records it --------------
    async def model_turn(
        self, history: list[Message], system: str | None, dropped: Sequence[DroppedCarrier]
    ) -> _TurnOutcome:
        """Stream one turn (its deltas go to the log as they arrive) and return it, or what
        arrived before the provider failed. A turn a stopped process left unfinished is first
        recorded as cut, and this one gets the next turn number."""
        resumed = self.steps.resumed
        if resumed is not None:
            seen = resumed.last_turn(self.task_id, self.turn_no)
            if seen is not None:
                if not resumed.turn_recorded(self.task_id, seen):
                    await self.record_cut(seen, resumed.turn_text(self.task_id, seen))
                self.turn_no = seen + 1
        notes = [self.ev(EventType.CONTINUITY_DROPPED, _dropped(d, self.turn_no)) for d in dropped]
        if notes:
            await self.recorder.emit_all(notes)
        request = TurnRequest(
            history,
            system=system,
            tools=self.specs,
            reasoning=ReasoningRequest(self.disclosure.requests_reasoning),
            max_tokens=self.max_tokens,
        )
        started_at = now_ts()
        self.first_chunk_at = self.stream_ended_at = None
        try:
            turn = self.captured(await stream_llm_turn(self.provider, request, self.on_chunk))
        except ProviderError as exc:
            self.stream_ended_at = now_ts()
            await self.flush_tail(ending=True)
            partial = self.captured(exc.partial) if exc.partial is not None else None
            call = self.call_info(request, partial, started_at) if partial is not None else None
            return _TurnOutcome(
                self.turn_no, partial, _ProviderFailure.of(exc, self.disclosure), call
            )
        self.stream_ended_at = now_ts()
        await self.flush_tail(ending=not turn.tool_calls)
        return _TurnOutcome(self.turn_no, turn, None, self.call_info(request, turn, started_at))

    async def flush_tail(self, *, ending: bool) -> None:
        """The stream's last deltas. A checkpointed turn stores them before its step ends (a
        resume finds the turn's text in the log); one that is not checkpointed (a direct run's,
        or a durable run's last: ``Steps.checkpoints``) leaves them to the turn's record, which
        takes them in its own append: one commit for both (ADR 0021, amended; ADR 0029).
        ``ending``: the turn ends the task."""
        if self.steps.checkpoints(ending=ending):
            await self.recorder.flush()

    async def record_cut(self, turn_no: int, text: str) -> None:
        cut: AgentResponsePayload = {
            "turn": turn_no,
            "answer": text,
            "complete": False,
            "finish_reason": None,
            "raw_finish_reason": "",
            "provider": self.provider.name,
            "model": self.provider.model,
            "usage": token_usage(Usage()),
            "tool_calls": [],
            "error": TURN_CUT,
            "error_type": TURN_CUT_TYPE,
        }
        await self.recorder.emit_all([self.ev(EventType.AGENT_RESPONSE, cut)])

    def unrecorded(self, turn_no: int, turn: Turn) -> NewEvent:
        """The ``agent.response`` that stands in for turn ``turn_no`` if its own record is never
        stored: what it answered and was billed, cut (no calls ran; no reasoning, whatever the
        mode: the record that would have carried it was not made)."""
        cut: AgentResponsePayload = {
            "turn": turn_no,
            "answer": turn.text,
            "complete": False,
            "finish_reason": turn.finish_reason,
            "raw_finish_reason": turn.raw_finish_reason,
            "provider": turn.provider,
            "model": turn.model,
            "usage": token_usage(turn.usage),
            "tool_calls": [],
            "error": TURN_UNRECORDED,
            "error_type": TURN_UNRECORDED_TYPE,
        }
        return self.ev(EventType.AGENT_RESPONSE, cut)

    async def record_turn(self, outcome: _TurnOutcome) -> None:
        """``agent.response``, the observer's steps and, when the task ends here, its last
        message: one atomic append."""
        resumed = self.steps.resumed
        if resumed is not None and resumed.turn_recorded(self.task_id, outcome.turn_no):
            return
        turn, failure = outcome.turn, outcome.failure
        events: list[NewEvent] = []
        if turn is not None:
            events += await self.response_events(turn, call=outcome.call, failure=failure)
        if failure is not None:
            answer = turn.text if turn is not None else ""
            cut: MessagePartiallyCompletedPayload = {
                "text": answer,
                "reason": "provider_error",
                "error": failure.message,
                "status": failure.status,
                "error_type": failure.error_type,
            }
            if failure.detail and self.disclosure.in_trace:  # recorded where reasoning is
                cut["error_detail"] = failure.detail
            events.append(self.ev(EventType.MESSAGE_PARTIALLY_COMPLETED, cut))
        elif turn is not None and not turn.tool_calls:
            final: MessageCompletedPayload = {
                "text": turn.text,
                "finish_reason": turn.finish_reason,
            }
            events.append(self.ev(EventType.MESSAGE_COMPLETED, final))
        if _ends_task(outcome):  # the task's last turn
            await self.recorder.emit_last(events)
        else:
            await self.recorder.emit_all(events)

    async def response_events(
        self,
        turn: Turn,
        *,
        call: ModelCallPayload | None = None,
        failure: _ProviderFailure | None = None,
    ) -> list[NewEvent]:
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
        if failure is not None:
            payload["error"] = failure.message
            payload["error_type"] = failure.kind
            if failure.detail and self.disclosure.in_trace:  # recorded where reasoning is
                payload["error_detail"] = failure.detail
        if call is not None:
            payload["call"] = call
        if self.disclosure.in_trace and not self.disclosure.on_display:
            # telemetry_only: this turn's reasoning for the trace surface (and telemetry) only
            payload["trace"] = trace_metadata(turn.reasoning_text, turn.continuity)
        if self.disclosure.on_display:
            text = turn.reasoning_text
            payload["reasoning"] = text
            payload["reasoning_chars"] = len(text)
            payload["reasoning_bytes"] = len(text.encode("utf-8", "surrogatepass"))
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

    # -- tools: each call is a step; an approval is two steps around a durable wait -------
    async def run_tool(self, call: ToolCallPart) -> ToolResultPart:
        tool = self.tools.get(call.name)
        base: ToolCardFields = {
            "call_id": call.call_id,
            "tool_key": call.name,
            "turn": self.turn_no,
            "label": tool.label if tool is not None else call.name,
        }
        if tool is None:
            return await self.step(f"unknown tool {call.call_id}", lambda: self.unknown(call, base))
        if tool.requires_approval:
            verdict = await self.approve(tool, call, base)
            if verdict is not None:
                return verdict
        return await self.step(f"tool {call.call_id}", lambda: self.execute(tool, call, base))

    async def step(self, name: str, fn: Callable[[], Awaitable[ToolResultPart]]) -> ToolResultPart:
        result: ToolResultPart = await self.steps.run(f"{self.task_id}: {name}", fn, _RESULT)
        return result

    async def unknown(self, call: ToolCallPart, base: ToolCardFields) -> ToolResultPart:
        resumed = self.steps.resumed
        if resumed is None or resumed.tool_end(self.task_id, call.call_id) is None:
            failed: ToolFailedPayload = {
                **base,
                "error": f"unknown tool {call.name!r}",
                "error_kind": "unknown_tool",
            }
            await self.recorder.emit_all([self.ev(EventType.TOOL_FAILED, failed)])
        return ToolResultPart(
            call.call_id, unknown_tool_text(call.name), is_error=True, name=call.name
        )

    async def approve(
        self, tool: Tool, call: ToolCallPart, base: ToolCardFields
    ) -> ToolResultPart | None:
        async def ask() -> None:
            resumed = self.steps.resumed
            if resumed is not None and resumed.approval_asked(self.task_id, call.call_id):
                self.cards_seen.add(call.call_id)
                return
            asked: ToolApprovalRequiredPayload = {**base, "input": call.arguments}
            events = [self.ev(EventType.TOOL_APPROVAL_REQUIRED, asked)]
            events += await self.tool_started_events(call)
            await self.recorder.emit_all(events)

        await self.steps.effect(f"{self.task_id}: ask approval {call.call_id}", ask)
        self.cards_seen.add(call.call_id)
        outcome = await self.approvals.wait(
            self.recorder.run_id,
            call.call_id,
            tool.name,
            call.arguments,
            timeout=self.approval_time_left(call.call_id),
        )

        async def settle() -> ToolResultPart | None:
            resumed = self.steps.resumed
            done = resumed is not None and resumed.approval_settled(self.task_id, call.call_id)
            events: list[NewEvent] = []
            if outcome.decision == "timeout":
                expired: ToolApprovalTimeoutPayload = {**base, "timeout_s": self.approval_timeout}
                events.append(self.ev(EventType.TOOL_APPROVAL_TIMEOUT, expired))
                text = NOT_APPROVED_IN_TIME
            else:
                answered: ToolApprovalResponsePayload = {
                    **base,
                    "decision": outcome.decision,
                    "by": outcome.by,
                }
                events.append(self.ev(EventType.TOOL_APPROVAL_RESPONSE, answered))
                text = REJECTED_BY_USER
            result = None
            if outcome.decision != "approve":
                result = ToolResultPart(call.call_id, text, is_error=True, name=call.name)
                status = "skipped" if outcome.decision == "timeout" else "rejected"
                events += await self.tool_finished_events(call, status, result)
            if not done:
                await self.recorder.emit_all(events)
            return result

        codec = StepCodec(
            lambda r: None if r is None else part_to_dict(r),
            lambda d: None if d is None else part_from_dict(d),
        )
        verdict: ToolResultPart | None = await self.steps.run(
            f"{self.task_id}: approval answer {call.call_id}", settle, codec
        )
        return verdict

    def approval_time_left(self, call_id: str) -> float:
        """How long the approval of ``call_id`` may still wait: its whole timeout, less the time
        since the log recorded the request when a resumed run finds it there. The engine records
        the wait's deadline only once the wait begins, in its own database: a process that
        stopped between the two left a request without a deadline, which must not wait a whole
        timeout again from the resume (a deadline the engine did record stands either way)."""
        resumed = self.steps.resumed
        asked_at = None if resumed is None else resumed.approval_asked_at(self.task_id, call_id)
        if asked_at is None:
            return self.approval_timeout
        return max(0.0, min(self.approval_timeout, asked_at + self.approval_timeout - now_ts()))

    async def execute(self, tool: Tool, call: ToolCallPart, base: ToolCardFields) -> ToolResultPart:
        resumed = self.steps.resumed
        if resumed is not None:
            recorded = resumed.tool_end(self.task_id, call.call_id)
            if recorded is not None:  # it ran before the stop: its result stands
                return _recorded_result(call, recorded)
            if resumed.tool_started(self.task_id, call.call_id):
                return await self.interrupted(call, base)
        started: ToolStartedPayload = {**base, "input": call.arguments}
        await self.recorder.emit_all(
            [self.ev(EventType.TOOL_STARTED, started), *await self.tool_started_events(call)]
        )

        async def progress(message: str) -> None:
            note: ToolProgressPayload = {**base, "message": message}
            await self.recorder.emit(self.ev(EventType.TOOL_PROGRESS, note))

        status = "completed"
        try:
            output = await tool.call(call.arguments, progress)
            done: ToolCompletedPayload = {**base, "output": output}
            ended = [self.ev(EventType.TOOL_COMPLETED, done)]
            result = ToolResultPart(call.call_id, output, name=call.name)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            result, status, ended = await self.fail(tool, call, base, error, exc)
        await self.recorder.emit_all(
            [*ended, *await self.tool_finished_events(call, status, result)]
        )
        return result

    async def interrupted(self, call: ToolCallPart, base: ToolCardFields) -> ToolResultPart:
        """A tool the stopped process had started and not finished: never run twice."""
        failed: ToolFailedPayload = {
            **base,
            "error": TOOL_INTERRUPTED,
            "error_kind": "interrupted",
        }
        result = ToolResultPart(
            call.call_id,
            f"Error: {TOOL_INTERRUPTED}. Check its effect before you call it again.",
            is_error=True,
            name=call.name,
        )
        events = [self.ev(EventType.TOOL_FAILED, failed)]
        events += await self.tool_finished_events(call, "failed", result)
        await self.recorder.emit_all(events)
        return result

    async def tool_started_events(self, call: ToolCallPart) -> list[NewEvent]:
        """Once per card, after its first event (approval request or start)."""
        if self.observer is None or call.call_id in self.cards_seen:
            return []
        self.cards_seen.add(call.call_id)
        return list(await self.observer.tool_started(call, task_id=self.task_id))

    async def tool_finished_events(
        self, call: ToolCallPart, status: str, result: ToolResultPart
    ) -> list[NewEvent]:
        if self.observer is None:
            return []
        return list(
            await self.observer.tool_finished(call, status, task_id=self.task_id, result=result)
        )

    async def fail(
        self, tool: Tool, call: ToolCallPart, base: ToolCardFields, error: str, exc: Exception
    ) -> tuple[ToolResultPart, str, list[NewEvent]]:
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
                return (
                    ToolResultPart(call.call_id, output, name=call.name),
                    "degraded",
                    [self.ev(EventType.TOOL_DEGRADED, degraded)],
                )
        failed: ToolFailedPayload = {**base, "error": error, "error_kind": kind}
        return (
            ToolResultPart(call.call_id, failed_tool_text(error), is_error=True, name=call.name),
            "failed",
            [self.ev(EventType.TOOL_FAILED, failed)],
        )


@dataclass(frozen=True, slots=True)
class _ProviderFailure:
    """What a ``ProviderError`` said, in the form a checkpoint keeps."""

    message: str
    """thoughtgate's description (:func:`failure_text`): the public ``error``."""
    status: int | None
    error_type: str | None
    """The provider's own error code, when it sent one."""
    kind: str
    """``error_type_of``: that code, else the error's class."""
    detail: str | None = None
    """The provider's own words (:func:`failure_detail`): the developer-only ``error_detail``."""

    @classmethod
    def of(cls, exc: ProviderError, disclosure: Disclosure) -> _ProviderFailure:
        """``disclosure``: the run's. A ``hidden`` run keeps no detail even here: this is a model
        turn step's result, which the durable engine checkpoints (ADR 0073)."""
        return cls(
            failure_text(exc),
            exc.status,
            identifier(exc.error_type),
            error_type_of(exc),
            kept_detail(disclosure.mode, failure_detail(exc)),
        )


@dataclass(frozen=True, slots=True)
class _TurnOutcome:
    """A model turn step's result: the turn number it used, the (possibly partial) turn, and the
    provider's failure when there was one."""

    turn_no: int
    turn: Turn | None
    failure: _ProviderFailure | None
    call: ModelCallPayload | None = None
    """How the turn was requested and answered (``agent.response.call``)."""

    def to_json(self) -> dict[str, Any]:
        failure = self.failure
        return {
            "turn_no": self.turn_no,
            "turn": None if self.turn is None else turn_to_json(self.turn),
            "failure": None
            if failure is None
            else {
                "message": failure.message,
                "status": failure.status,
                "type": failure.error_type,
                "kind": failure.kind,
                "detail": failure.detail,
            },
            "call": None if self.call is None else dict(self.call),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _TurnOutcome:
        raw = data.get("failure")
        failure = (
            None
            if raw is None
            else _ProviderFailure(
                raw["message"], raw["status"], raw["type"], raw["kind"], raw.get("detail")
            )
        )
        turn = data.get("turn")
        call = data.get("call")
        return cls(
            int(data["turn_no"]),
            None if turn is None else turn_from_json(turn),
            failure,
            None if call is None else cast(ModelCallPayload, dict(call)),
        )


def turn_to_json(turn: Turn) -> dict[str, Any]:
    """A turn for a checkpoint: every part (continuity carriers byte-identical), usage, finish."""
    return {
        "parts": [part_to_dict(p) for p in turn.parts],
        "usage": turn.usage.to_dict(),
        "finish_reason": turn.finish_reason,
        "raw_finish_reason": turn.raw_finish_reason,
        "provider": turn.provider,
        "model": turn.model,
        "complete": turn.complete,
        "response_id": turn.response_id,
        "response_model": turn.response_model,
    }


def turn_from_json(data: Mapping[str, Any]) -> Turn:
    return Turn(
        tuple(part_from_dict(p) for p in data["parts"]),
        usage=Usage.from_dict(data.get("usage") or {}),
        finish_reason=data.get("finish_reason"),
        raw_finish_reason=str(data.get("raw_finish_reason", "")),
        provider=str(data.get("provider", "")),
        model=str(data.get("model", "")),
        complete=bool(data.get("complete", True)),
        response_id=data.get("response_id"),
        response_model=data.get("response_model"),
    )


_OUTCOME = StepCodec(lambda o: o.to_json(), _TurnOutcome.from_json)
_RESULT = StepCodec(part_to_dict, part_from_dict)


def _ends_task(outcome: _TurnOutcome) -> bool:
    """Whether the loop returns after this turn (a failure, or an answer without tool calls)."""
    return outcome.failure is not None or outcome.turn is None or not outcome.turn.tool_calls


def _dropped(gone: DroppedCarrier, turn_no: int) -> ContinuityDroppedPayload:
    return {
        "carrier": gone.carrier,
        "from_provider": gone.provider,
        "from_model": gone.model,
        "reason": gone.reason,
        "turn": turn_no,
    }


def _recorded_result(call: ToolCallPart, event: Event) -> ToolResultPart:
    """The result a tool call got before the stop, from its recorded end event."""
    if event.type in (EventType.TOOL_COMPLETED, EventType.TOOL_DEGRADED):
        return ToolResultPart(call.call_id, str(event.payload.get("output", "")), name=call.name)
    return ToolResultPart(
        call.call_id, f"Error: {event.payload.get('error', '')}", is_error=True, name=call.name
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
    steps: Steps | None = None,
    billed: Billing | None = None,
) -> LoopResult:
    """Run model turns and tools until the model answers without calling a tool.

    Each model turn, its recording and each tool call is a step of ``steps``
    (:mod:`thoughtgate.engine.steps`): a durable engine checkpoints them, so a run resumed in
    another process continues from its last completed step with the same conversation.

    ``billed`` is told each model turn's usage as soon as the turn returns, before it is
    recorded -- a turn replayed from its checkpoint too (its execution counts the run's turns
    from none, so each counts once): a task that fails or is cut later was billed all the same
    (ADR 0131) -- and then that the turn's record was stored; until then it holds the turn's
    stand-in record (``TURN_UNRECORDED``) for whoever ends the task first (ADR 0131, amended).
    """
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
        steps=steps or DirectSteps(),
    )
    history = list(messages)
    usage = Usage()
    reasoning: list[str] = []
    turns: list[Turn] = []
    planned = 0
    while planned < max_turns:
        loop.turn_no = planned
        history, dropped = keep_own_carriers(history, provider.name, provider.model)
        outcome: _TurnOutcome = await loop.steps.run(
            f"{task_id}: model turn {planned}",
            lambda h=history, d=dropped: loop.model_turn(h, system, d),  # type: ignore[misc]
            _OUTCOME,
            ends=_ends_task,
        )
        loop.turn_no = outcome.turn_no
        turn = outcome.turn
        if turn is not None and billed is not None:
            billed.billed(turn.usage, loop.unrecorded(outcome.turn_no, turn))
        await loop.steps.effect(
            f"{task_id}: record turn {outcome.turn_no}",
            lambda o=outcome: loop.record_turn(o),  # type: ignore[misc]
        )
        if turn is not None and billed is not None:
            billed.recorded()
        if turn is not None:
            usage = usage + turn.usage
            reasoning.append(turn.reasoning_text)
            turns.append(turn)
        if outcome.failure is not None:
            answer = turn.text if turn is not None else ""
            return LoopResult(
                "partial" if answer else "failed",
                answer,
                outcome.turn_no + 1,
                usage,
                _join(reasoning),
                turn.finish_reason if turn is not None else None,
                outcome.failure.message,
                turns,
                outcome.failure.kind,
                outcome.failure.detail,
            )
        assert turn is not None
        if not turn.tool_calls:
            return LoopResult(
                "completed",
                turn.text,
                outcome.turn_no + 1,
                usage,
                _join(reasoning),
                turn.finish_reason,
                None,
                turns,
            )
        results = [await loop.answer(call) for call in turn.tool_calls]
        history.append(Message("assistant", strip_reasoning(turn.parts)))
        history.append(Message("tool", tuple(results)))
        planned = outcome.turn_no + 1
    limit = f"stopped after reaching the turn limit of {max_turns} model turns"
    last = turns[-1].text if turns else ""

    async def stop() -> None:
        events: list[NewEvent] = []
        if observer is not None:
            events += await observer.task_finished(task_id=task_id)
        stopped: MessagePartiallyCompletedPayload = {
            "text": last,
            "reason": "max_turns",
            "error": limit,
        }
        events.append(NewEvent(EventType.MESSAGE_PARTIALLY_COMPLETED, stopped, task_id=task_id))
        resumed = loop.steps.resumed
        if resumed is None or not resumed.task_has(task_id, EventType.MESSAGE_PARTIALLY_COMPLETED):
            await recorder.emit_all(events)

    await loop.steps.effect(f"{task_id}: turn limit", stop)
    return LoopResult(
        "partial", last, max_turns, usage, _join(reasoning), "max_turns", limit, turns, "max_turns"
    )


def _join(parts: list[str]) -> str:
    return "\n\n".join(p for p in parts if p)

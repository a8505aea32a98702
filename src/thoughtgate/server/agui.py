"""AG-UI events from a run's *filtered* events: the translation behind ``POST /v1/agui``.

The translator only ever sees events that already passed the one output filter for the reader's
role and the run's mode, and it reads only the fields it names; so what an AG-UI client gets is
what the filter allows, shaped as AG-UI 1.0 (``ag-ui-protocol``) events:

=============================================  ================================================
thoughtgate event (as the reader sees it)      AG-UI events
=============================================  ================================================
(the stream opens)                             ``RUN_STARTED`` (metadata: run id, mode)
``task.started`` / ``task.completed``          ``STEP_STARTED`` / ``STEP_FINISHED`` "task N"
``message.delta``                              ``TEXT_MESSAGE_START`` / ``_CONTENT``, one message
                                               per model turn, ended with the turn
``message.completed`` (nothing streamed)       one whole text message
``reasoning.delta`` (developer+, ``surface``)  ``REASONING_START`` / ``REASONING_MESSAGE_*`` /
                                               ``REASONING_END``, per model turn
``agent.response`` tool calls (member+)        ``TOOL_CALL_START`` / ``_ARGS`` / ``_END``
tool results (member+)                         ``TOOL_CALL_RESULT``
every tool card (every reader)                 ``ACTIVITY_SNAPSHOT`` ``thoughtgate.tool``: label,
                                               status, the failure's kind
``cot.step`` / ``cot.phase`` / ``cot.tool.*``  ``ACTIVITY_SNAPSHOT`` ``thoughtgate.step``
``cot.completed``                              ``CUSTOM`` ``thoughtgate.receipt``
``tool.approval_*``                            ``CUSTOM`` ``thoughtgate.approval_required`` /
                                               ``_response`` / ``_timeout``
``run.settlement.completed`` (completed)       ``RUN_FINISHED`` with the run's token usage
any other end (partial, failed, interrupted)   ``RUN_ERROR`` (``code`` = the run's status)
=============================================  ================================================

Never emitted: ``REASONING_ENCRYPTED_VALUE`` (continuity carriers never leave the process) and any
reasoning the filter withheld. A viewer sees no ``TOOL_CALL_*`` events at all: AG-UI reads a call
without a result as a frontend tool call left for the application to answer, and a viewer may not
read results, so its tool cards are activities only (nothing is invented to fill the gap).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ag_ui.core import (
    PROTOCOL_VERSION,
    ActivitySnapshotEvent,
    BaseEvent,
    CustomEvent,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from thoughtgate.engine.loop import (
    NOT_APPROVED_IN_TIME,
    REJECTED_BY_USER,
    failed_tool_text,
    unknown_tool_text,
)
from thoughtgate.events.schema import Event, EventType, is_run_terminal
from thoughtgate.providers.base import total_input_tokens

__all__ = ["AguiTranslator"]

STEP_ACTIVITY = "thoughtgate.step"
TOOL_ACTIVITY = "thoughtgate.tool"

_TOOL_STATUS = {
    EventType.TOOL_APPROVAL_REQUIRED: "waiting_for_approval",
    EventType.TOOL_STARTED: "running",
    EventType.TOOL_PROGRESS: "running",
    EventType.TOOL_COMPLETED: "completed",
    EventType.TOOL_DEGRADED: "degraded",
    EventType.TOOL_FAILED: "failed",
    EventType.TOOL_APPROVAL_TIMEOUT: "skipped",
}
_APPROVALS = {
    EventType.TOOL_APPROVAL_REQUIRED: "thoughtgate.approval_required",
    EventType.TOOL_APPROVAL_RESPONSE: "thoughtgate.approval_response",
    EventType.TOOL_APPROVAL_TIMEOUT: "thoughtgate.approval_timeout",
}
_STEPS = frozenset({EventType.COT_STEP, EventType.COT_PHASE, EventType.COT_TOOL_REASONING})


def _ms(ts: float) -> int:
    return int(ts * 1000)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(slots=True)
class _Card:
    call_id: str
    tool: str
    label: str
    status: str = "requested"
    error_kind: str | None = None
    progress: str | None = None
    result_sent: bool = False


@dataclass(slots=True)
class AguiTranslator:
    """Turns one reader's filtered events of one run into AG-UI events, in order.

    ``thread_id`` and ``run_id`` are the AG-UI client's own (from its ``RunAgentInput``);
    ``tg_run_id`` is thoughtgate's. ``member`` says whether the reader may see tool arguments and
    results (the filter already removed them otherwise; this only decides whether ``TOOL_CALL_*``
    events are emitted at all). ``model`` is the run's ``PROVIDER:MODEL`` (for token usage).
    """

    thread_id: str
    run_id: str
    tg_run_id: str
    mode: str
    member: bool
    model: str | None = None
    text: str | None = None
    """The open text message's id."""
    reasoning: tuple[str, str] | None = None
    """The open reasoning span's id and its open message's id."""
    streamed: set[tuple[str, int]] = field(default_factory=set)
    """``(task, turn)`` whose answer text was streamed (a final ``message.completed`` then adds
    nothing)."""
    last_turn: dict[str, int] = field(default_factory=dict)
    """Each task's latest recorded model turn (``agent.response``)."""
    step: str | None = None
    cards: dict[str, _Card] = field(default_factory=dict)
    pieces: int = 0
    finished: bool = False

    # ------------------------------------------------------------------ the run
    def started(self) -> list[BaseEvent]:
        return [
            RunStartedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                protocol_version=PROTOCOL_VERSION,
                metadata={"thoughtgate": {"run_id": self.tg_run_id, "chain_of_thought": self.mode}},
            )
        ]

    def feed(self, event: Event) -> list[BaseEvent]:
        """The AG-UI events for one filtered event (none once the run has ended)."""
        if self.finished:
            return []
        out = self._translate(event)
        stamp = _ms(event.ts)
        for produced in out:
            if produced.timestamp is None:
                produced.timestamp = stamp
        return out

    def _translate(self, event: Event) -> list[BaseEvent]:
        kind = event.type
        payload = event.payload
        if kind == EventType.MESSAGE_DELTA:
            return self._text_delta(event)
        if kind == EventType.REASONING_DELTA:
            return self._reasoning_delta(event)
        if kind == EventType.TASK_STARTED:
            return self._task_started(event)
        if kind == EventType.TASK_COMPLETED:
            return [*self._close_turn(), *self._close_step(event)]
        if kind == EventType.AGENT_RESPONSE:
            return [*self._close_turn(), *self._tool_calls(event)]
        if kind in (EventType.MESSAGE_COMPLETED, EventType.MESSAGE_PARTIALLY_COMPLETED):
            return self._answer(event)
        if kind in _STEPS:
            return self._step(event)
        if kind == EventType.COT_COMPLETED:
            return [
                CustomEvent(name="thoughtgate.receipt", value=dict(payload.get("receipt") or {}))
            ]
        if kind.startswith("tool."):
            return self._tool(event)
        if is_run_terminal(kind):
            return self._ended(event)
        return []

    def _ended(self, event: Event) -> list[BaseEvent]:
        self.finished = True
        out = [*self._close_turn(), *self._close_step(event)]
        payload = event.payload
        status = _str(payload.get("status")) or event.type
        usage = self._usage(payload.get("usage"))
        if event.type == EventType.RUN_SETTLEMENT_COMPLETED and status == "completed":
            out.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, usage=usage))
            return out
        why = _str(payload.get("error")) or _str(payload.get("reason"))
        message = f"the run is {status}" + (f": {why}" if why else "")
        out.append(RunErrorEvent(message=message, code=status, usage=usage))
        return out

    def _usage(self, usage: Any) -> list[TokenUsage] | None:
        if not isinstance(usage, Mapping):
            return None
        provider, _, model = (self.model or "").partition(":")
        counts = {k: v for k, v in usage.items() if isinstance(v, int)}
        if "input_tokens" not in counts and "output_tokens" not in counts:
            return None  # billed counts are a developer's (ADR 0163): no zeros in their place
        inputs = total_input_tokens(counts, provider or None)
        outputs = counts.get("output_tokens", 0)
        entry: dict[str, Any] = {
            "input_tokens": inputs,
            "output_tokens": outputs,
            "total_tokens": inputs + outputs,
        }
        if provider:
            entry["provider"] = provider
        if model:
            entry["model"] = model
        if "reasoning_tokens" in counts:  # present only where the filter shows reasoning
            entry["reasoning_tokens"] = counts["reasoning_tokens"]
        if counts.get("cache_read_tokens"):
            entry["cached_input_tokens"] = counts["cache_read_tokens"]
        if counts.get("cache_write_tokens"):
            entry["cache_write_input_tokens"] = counts["cache_write_tokens"]
        return [TokenUsage(**entry)]

    # ------------------------------------------------------------------ steps (tasks)
    def _task_started(self, event: Event) -> list[BaseEvent]:
        out = self._close_step(event)
        index = event.payload.get("index")
        self.step = f"task {index + 1 if isinstance(index, int) else 1}"
        return [*out, StepStartedEvent(step_name=self.step, timestamp=_ms(event.ts))]

    def _close_step(self, event: Event) -> list[BaseEvent]:
        if self.step is None:
            return []
        name, self.step = self.step, None
        return [StepFinishedEvent(step_name=name, timestamp=_ms(event.ts))]

    # ------------------------------------------------------------------ text and reasoning
    def _piece(self, event: Event, what: str) -> str:
        self.pieces += 1
        return f"{event.task_id or 'run'}.{event.payload.get('turn', 0)}.{what}.{self.pieces}"

    def _text_delta(self, event: Event) -> list[BaseEvent]:
        delta = _str(event.payload.get("text"))
        if not delta:
            return []
        out = self._close_reasoning()
        if self.text is None:
            self.text = self._piece(event, "text")
            out.append(TextMessageStartEvent(message_id=self.text, role="assistant"))
        turn = event.payload.get("turn")
        self.streamed.add((event.task_id or "", turn if isinstance(turn, int) else 0))
        out.append(TextMessageContentEvent(message_id=self.text, delta=delta))
        return out

    def _reasoning_delta(self, event: Event) -> list[BaseEvent]:
        delta = _str(event.payload.get("text"))
        if not delta:
            return []
        out = self._close_text()
        if self.reasoning is None:
            span = self._piece(event, "reasoning")
            self.reasoning = (span, f"{span}.message")
            out.append(ReasoningStartEvent(message_id=span))
            out.append(ReasoningMessageStartEvent(message_id=self.reasoning[1]))
        out.append(ReasoningMessageContentEvent(message_id=self.reasoning[1], delta=delta))
        return out

    def _close_text(self) -> list[BaseEvent]:
        if self.text is None:
            return []
        message, self.text = self.text, None
        return [TextMessageEndEvent(message_id=message)]

    def _close_reasoning(self) -> list[BaseEvent]:
        if self.reasoning is None:
            return []
        (span, message), self.reasoning = self.reasoning, None
        return [ReasoningMessageEndEvent(message_id=message), ReasoningEndEvent(message_id=span)]

    def _close_turn(self) -> list[BaseEvent]:
        return [*self._close_reasoning(), *self._close_text()]

    def _answer(self, event: Event) -> list[BaseEvent]:
        """The task's final text: already streamed (nothing to add), or whole (an inline worker,
        or a reader that joined after the deltas)."""
        out = self._close_turn()
        text = _str(event.payload.get("text"))
        task = event.task_id or ""
        turn = self.last_turn.get(task)
        if text and (turn is None or (task, turn) not in self.streamed):
            message = self._piece(event, "answer")
            out += [
                TextMessageStartEvent(message_id=message, role="assistant"),
                TextMessageContentEvent(message_id=message, delta=text),
                TextMessageEndEvent(message_id=message),
            ]
        return out

    # ------------------------------------------------------------------ tools
    def _tool_calls(self, event: Event) -> list[BaseEvent]:
        """A turn's tool calls: a card for every reader, the call itself for member+."""
        turn = event.payload.get("turn")
        if isinstance(turn, int):
            self.last_turn[event.task_id or ""] = turn
        out: list[BaseEvent] = []
        for call in event.payload.get("tool_calls") or ():
            if not isinstance(call, Mapping) or not _str(call.get("call_id")):
                continue
            call_id, name = str(call["call_id"]), str(call.get("name") or "")
            card = self.cards.setdefault(call_id, _Card(call_id, name, name))
            out.append(self._card(card))
            if not self.member:
                continue
            out.append(ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name))
            if "input" in call:  # tool detail: only where the filter left it
                out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=json.dumps(call["input"])))
            out.append(ToolCallEndEvent(tool_call_id=call_id))
        return out

    def _card(self, card: _Card) -> ActivitySnapshotEvent:
        content: dict[str, Any] = {
            "call_id": card.call_id,
            "tool": card.tool,
            "label": card.label,
            "status": card.status,
        }
        if card.error_kind:
            content["error_kind"] = card.error_kind
        if card.progress:
            content["progress"] = card.progress
        return ActivitySnapshotEvent(
            message_id=f"tool.{card.call_id}", activity_type=TOOL_ACTIVITY, content=content
        )

    def _tool(self, event: Event) -> list[BaseEvent]:
        payload = event.payload
        call_id = _str(payload.get("call_id"))
        if call_id is None:
            return []
        tool = str(payload.get("tool_key") or "")
        card = self.cards.setdefault(call_id, _Card(call_id, tool, tool))
        card.label = _str(payload.get("label")) or card.label
        out: list[BaseEvent] = []
        custom = _APPROVALS.get(event.type)
        if custom is not None:
            out.append(CustomEvent(name=custom, value=self._approval(event, card)))
        decision = payload.get("decision")
        if event.type in _TOOL_STATUS:
            card.status = _TOOL_STATUS[event.type]
        elif decision == "reject":
            card.status = "rejected"
        card.error_kind = _str(payload.get("error_kind")) or card.error_kind
        if event.type == EventType.TOOL_PROGRESS:
            card.progress = _str(payload.get("message"))  # tool detail: absent for viewers
        out.append(self._card(card))
        result = self._result(event, decision)
        if result is not None and self.member and not card.result_sent:
            card.result_sent = True
            out.append(
                ToolCallResultEvent(
                    message_id=f"tool.{call_id}.result",
                    tool_call_id=call_id,
                    content=result,
                    role="tool",
                )
            )
        return out

    def _result(self, event: Event, decision: Any) -> str | None:
        """What the model got back for the call, as the loop sends it (member+ only)."""
        payload = event.payload
        if event.type in (EventType.TOOL_COMPLETED, EventType.TOOL_DEGRADED):
            return _str(payload.get("output"))
        if event.type == EventType.TOOL_FAILED:
            if payload.get("error_kind") == "unknown_tool":
                return unknown_tool_text(str(payload.get("tool_key") or ""))
            error = _str(payload.get("error"))
            return failed_tool_text(error) if error is not None else None
        if event.type == EventType.TOOL_APPROVAL_TIMEOUT:
            return NOT_APPROVED_IN_TIME
        if event.type == EventType.TOOL_APPROVAL_RESPONSE and decision == "reject":
            return REJECTED_BY_USER
        return None

    def _approval(self, event: Event, card: _Card) -> dict[str, Any]:
        """The approval custom event's value: what the filter left of the payload, and where a
        member answers it."""
        value = dict(event.payload)
        value["run_id"] = self.tg_run_id
        if event.type == EventType.TOOL_APPROVAL_REQUIRED:
            value["answer"] = {
                "method": "POST",
                "path": f"/v1/runs/{self.tg_run_id}/approvals/{card.call_id}",
                "body": {"decision": "approve | reject"},
            }
        return value

    # ------------------------------------------------------------------ visible steps
    def _step(self, event: Event) -> list[BaseEvent]:
        payload = event.payload
        step_id = _str(payload.get("step_id"))
        if step_id is None:
            return []
        content = {k: v for k, v in payload.items() if k != "marker"}
        content["kind"] = event.type.removeprefix("cot.")
        # step ids count per task: the task id keeps them apart across tasks
        message = f"step.{event.task_id or 'run'}.{step_id}"
        return [
            ActivitySnapshotEvent(message_id=message, activity_type=STEP_ACTIVITY, content=content)
        ]

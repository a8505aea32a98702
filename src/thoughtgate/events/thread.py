"""Tool cards and the thread view, rebuilt from (already filtered) events alone.

One :class:`ThreadBuilder` serves both live delivery and reload: feed it events one by one as they
arrive, or all persisted events at once (:func:`rebuild`); either way the same events give the
same :class:`ThreadView`. Events at or below the last applied ``seq`` are ignored, so a client
that resumes with an overlap (SSE ``Last-Event-ID``) does not double anything.

What the view holds, in the order each thing first appeared (think → tool → think stays so):

* visible steps and phases from ``cot.step`` / ``cot.phase`` (a repeated ``step_id`` updates the
  step in place); ``cot.tool.reasoning`` attaches to the card it names, if that card is present;
* tool cards from ``tool.*`` (keyed by ``call_id``; see :data:`TOOL_EVENT_STATUS`);
* the run's ``capability.resolved`` notice;
* what the model said in each turn (:class:`TextItem`, from that turn's ``message.delta``),
  placed where it was said: text before a tool call stays before it;
* the answer text (``message.delta``; the final text of ``message.completed`` /
  ``message.partially_completed`` replaces it) and the terminal state. ``tool.failed`` is not
  terminal.

Beside the items: one :class:`TurnInfo` per model turn (``agent.response``: model, tokens, time
to first token, duration, finish reason, error and its type), the run's start and end times and
how it ended (:class:`RunEnding`), and :class:`Totals` over all of it. Every item records the task
and model turn it belongs to: its own ``turn`` when its event carries one, else the turn of the
last event of its task that did (a step narrated after a turn belongs to that turn).

Payloads are read as the vocabulary declares them (``thoughtgate.events.payloads``), with no
aliases. A reader's copy lacks what its role may not see (a viewer's cards have no ``input``,
``output`` or ``error`` text, only the public ``error_kind``), and the builder never needs it.

Client rules kept here: an unmarked or malformed ``cot.*`` payload is discarded (counted in
``discarded``); reasoning is never taken from tool input or output, ``agent.response`` or any other
provider field; ``reasoning.delta`` never becomes a step. Its text goes only into a
:class:`ReasoningItem` per model turn (placed where that turn's reasoning first arrived, so next
to the turn's tool calls, and labelled by its kind: "Raw reasoning" only for raw reasoning,
"Reasoning (provider summary)" for a provider's summary) and into ``raw_reasoning``, all turns
joined. Both exist only when the reader's (filtered) stream contained such events: a developer's
view has them, a viewer's does not. A missing or rejected step never blocks a card or the
message: nothing here waits for one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, asdict, dataclass, field, replace
from typing import Any, Final, Literal, TypeAlias, get_args

from thoughtgate.events.schema import DISPLAY_TERMINAL_TYPES, RUN_TERMINAL_TYPES, Event, EventType
from thoughtgate.events.visible import (
    DisclosureReceipt,
    VisibleStep,
    parse_receipt,
    parse_visible_payload,
)

__all__ = [
    "REASONING_LABELS",
    "TOOL_EVENT_STATUS",
    "TOOL_STATUSES",
    "MessageView",
    "NoticeItem",
    "PhaseItem",
    "ReasoningItem",
    "ReasoningSegment",
    "RunEnding",
    "StepItem",
    "TextItem",
    "ThreadBuilder",
    "ThreadItem",
    "ThreadStatus",
    "ThreadView",
    "ToolCallRecord",
    "ToolCard",
    "ToolStatus",
    "Totals",
    "TurnInfo",
    "reasoning_label",
    "rebuild",
]

ToolStatus: TypeAlias = Literal[
    "pending", "executing", "completed", "failed", "degraded", "rejected", "skipped"
]
TOOL_STATUSES: tuple[str, ...] = get_args(ToolStatus)
_FINAL_TOOL_STATUSES: Final = frozenset({"completed", "failed", "degraded", "rejected", "skipped"})

TOOL_EVENT_STATUS: Final[Mapping[str, ToolStatus]] = {
    EventType.TOOL_APPROVAL_REQUIRED: "pending",
    EventType.TOOL_STARTED: "executing",
    EventType.TOOL_PROGRESS: "executing",
    EventType.TOOL_COMPLETED: "completed",
    EventType.TOOL_FAILED: "failed",
    EventType.TOOL_DEGRADED: "degraded",
    # Nobody answered, so the tool was never run: "skipped". "rejected" is kept for an explicit no.
    EventType.TOOL_APPROVAL_TIMEOUT: "skipped",
}
"""The card status each ``tool.*`` event sets. ``tool.approval_response`` sets ``rejected`` when
the decision is ``reject`` and leaves the card ``pending`` (until ``tool.started``) when it is
``approve``; ``tool.progress`` never reopens a finished card."""

ThreadStatus: TypeAlias = Literal["running", "completed", "partial", "failed", "interrupted"]

_TERMINAL_STATUS: Final[Mapping[str, ThreadStatus]] = {
    EventType.MESSAGE_COMPLETED: "completed",
    EventType.MESSAGE_PARTIALLY_COMPLETED: "partial",
    EventType.RUN_FAILED: "failed",
    EventType.RUN_ERROR: "failed",
    EventType.RUN_INTERRUPTED: "interrupted",
}

_RUN_OUTCOME: Final[Mapping[str, ThreadStatus]] = {
    "completed": "completed",
    "partial": "partial",
    "failed": "failed",
    "error": "failed",
    "interrupted": "interrupted",
}
"""A run-terminal event's ``payload.status`` -> the thread's status (it wins over a task's)."""


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _opt_num(value: Any) -> float | None:
    """A finite JSON number (not a boolean), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _coalesce(*values: Any) -> Any:
    """JavaScript ``??``: the first value that is not ``None`` (empty strings count)."""
    for value in values:
        if value is not None:
            return value
    return None


# --------------------------------------------------------------------------- view model


@dataclass(frozen=True, slots=True)
class ToolCard:
    """One tool call as a reader sees it (a viewer's filtered events carry no input, output or
    error text: the card then shows label, status and ``error_kind``)."""

    call_id: str
    tool_key: str | None
    status: ToolStatus
    label: str
    _: KW_ONLY
    input: Any = None
    output: Any = None
    error: str | None = None
    error_kind: str | None = None
    reasoning: tuple[VisibleStep, ...] = ()
    task_id: str | None = None
    turn: int | None = None
    """The model turn that called the tool."""
    kind: Literal["tool"] = "tool"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "call_id": self.call_id,
            "tool_key": self.tool_key,
            "status": self.status,
            "label": self.label,
            "input": self.input,
            "output": self.output,
            "error": self.error,
            "error_kind": self.error_kind,
            "reasoning": [s.to_payload() for s in self.reasoning],
            "task_id": self.task_id,
            "turn": self.turn,
        }


def _step_dict(
    kind: str, step: VisibleStep, task_id: str | None, turn: int | None
) -> dict[str, Any]:
    return {"kind": kind, **step.to_payload(), "task_id": task_id, "turn": turn}


@dataclass(frozen=True, slots=True)
class StepItem:
    step: VisibleStep
    _: KW_ONLY
    task_id: str | None = None
    turn: int | None = None
    kind: Literal["step"] = "step"

    def to_dict(self) -> dict[str, Any]:
        return _step_dict(self.kind, self.step, self.task_id, self.turn)


@dataclass(frozen=True, slots=True)
class PhaseItem:
    step: VisibleStep
    _: KW_ONLY
    task_id: str | None = None
    turn: int | None = None
    kind: Literal["phase"] = "phase"

    def to_dict(self) -> dict[str, Any]:
        return _step_dict(self.kind, self.step, self.task_id, self.turn)


@dataclass(frozen=True, slots=True)
class TextItem:
    """What the model said in one turn (its ``message.delta`` text), where it said it: text
    before a tool call stays before that call. ``key`` is ``"{task_id}:{turn}"``."""

    key: str
    task_id: str | None
    turn: int | None
    text: str = ""
    _: KW_ONLY
    kind: Literal["text"] = "text"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "task_id": self.task_id,
            "turn": self.turn,
            "text": self.text,
        }


@dataclass(frozen=True, slots=True)
class NoticeItem:
    """The run's ``capability.resolved`` notice ("Mode: surface"), updated in place."""

    key: str
    label: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    _: KW_ONLY
    kind: Literal["capability"] = "capability"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key, "label": self.label, "attrs": dict(self.attrs)}


REASONING_LABELS: Final[Mapping[str, str]] = {
    "raw": "Raw reasoning",
    "summary": "Reasoning (provider summary)",
}
"""What a reader is told a reasoning segment is, by its ``reasoning_kind``; any other or missing
kind is plain "Reasoning" (never called raw unless it is)."""


def reasoning_label(kind: str | None) -> str:
    return REASONING_LABELS.get(kind or "", "Reasoning")


@dataclass(frozen=True, slots=True)
class ReasoningSegment:
    """Consecutive ``reasoning.delta`` text of one kind and index within a turn."""

    kind: str | None
    index: int | None
    text: str

    @property
    def label(self) -> str:
        return reasoning_label(self.kind)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "index": self.index, "label": self.label, "text": self.text}


@dataclass(frozen=True, slots=True)
class ReasoningItem:
    """One model turn's reasoning as the provider returned it (developer+ on surface runs only:
    nobody else's stream carries ``reasoning.delta``). ``key`` is ``"{task_id}:{turn}"``."""

    key: str
    task_id: str | None
    turn: int | None
    segments: tuple[ReasoningSegment, ...] = ()
    _: KW_ONLY
    kind: Literal["reasoning"] = "reasoning"

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "task_id": self.task_id,
            "turn": self.turn,
            "segments": [s.to_dict() for s in self.segments],
        }


ThreadItem: TypeAlias = StepItem | PhaseItem | ToolCard | NoticeItem | ReasoningItem | TextItem


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """One model turn as ``agent.response`` recorded it, for a reader debugging the run. A field
    the reader's role may not see (``usage.reasoning_tokens`` below developer) is absent from
    ``usage``; fields of another type than declared read as ``None``."""

    task_id: str | None
    turn: int | None
    _: KW_ONLY
    model: str | None = None
    provider: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None
    started_at: float | None = None
    """When the turn's request was sent (``call.started_at``)."""
    ttft_s: float | None = None
    """``call.first_chunk_at - call.started_at``."""
    duration_s: float | None = None
    """``call.ended_at - call.started_at``."""
    error: str | None = None
    error_type: str | None = None
    error_detail: str | None = None
    """The failure's own words: only in a payload the one output filter passed them in (ADR
    0073: developers and above, where the run records reasoning)."""
    tool_calls: int = 0
    ts: float | None = None
    """When the turn was recorded (its event's ``ts``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RunEnding:
    """How the run ended, from its terminal event (the error in words, and its type)."""

    type: str
    status: str | None = None
    error: str | None = None
    error_type: str | None = None
    reason: str | None = None
    """Why an interrupted run stopped."""
    error_detail: str | None = None
    """The failure's own words, when the reader's copy of the event has them (ADR 0073)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Totals:
    """A run's totals as the reader may see them: model turns, tool calls, tokens summed over its
    turns (a count is ``None`` when no turn showed it: billed counts below developer, ADR 0163,
    and ``reasoning_tokens`` where reasoning is withheld or was never counted -- never a zero
    summed from nothing), and its duration from ``run.started`` to its terminal event (``None``
    while it runs)."""

    turns: int = 0
    tool_calls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    duration_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """An entry of ``message.tool_calls`` (the card's id, tool and status)."""

    call_id: str
    tool_key: str | None
    status: ToolStatus

    def to_dict(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "tool_key": self.tool_key, "status": self.status}


@dataclass(frozen=True, slots=True)
class MessageView:
    text: str = ""
    final: bool = False
    tool_calls: tuple[ToolCallRecord, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "final": self.final,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
        }


@dataclass(frozen=True, slots=True)
class ThreadView:
    items: tuple[ThreadItem, ...] = ()
    message: MessageView = MessageView()
    status: ThreadStatus = "running"
    terminal: str | None = None
    """The type of the last display-terminal event seen."""
    receipt: DisclosureReceipt | None = None
    raw_reasoning: str | None = None
    discarded: int = 0
    """``cot.*`` events discarded: unmarked, malformed, or naming a card that is not here."""
    last_seq: int = 0
    turns: tuple[TurnInfo, ...] = ()
    """One per model turn, in the order they were recorded."""
    started_at: float | None = None
    """When the run started (``run.started``'s ``ts``)."""
    ended_at: float | None = None
    """When it ended (its terminal event's ``ts``)."""
    ending: RunEnding | None = None

    @property
    def steps(self) -> tuple[VisibleStep, ...]:
        return tuple(i.step for i in self.items if isinstance(i, StepItem))

    @property
    def cards(self) -> tuple[ToolCard, ...]:
        return tuple(i for i in self.items if isinstance(i, ToolCard))

    @property
    def reasoning_turns(self) -> tuple[ReasoningItem, ...]:
        return tuple(i for i in self.items if isinstance(i, ReasoningItem))

    @property
    def said(self) -> tuple[TextItem, ...]:
        return tuple(i for i in self.items if isinstance(i, TextItem))

    @property
    def totals(self) -> Totals:
        usage = [t.usage for t in self.turns]

        def total(name: str) -> int | None:
            shown = [u[name] for u in usage if name in u]
            return sum(shown) if shown else None

        ended = self.ended_at is not None and self.started_at is not None
        return Totals(
            turns=len(self.turns),
            tool_calls=len(self.cards),
            input_tokens=total("input_tokens"),
            output_tokens=total("output_tokens"),
            reasoning_tokens=total("reasoning_tokens"),
            duration_s=(self.ended_at or 0.0) - (self.started_at or 0.0) if ended else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "items": [i.to_dict() for i in self.items],
            "message": self.message.to_dict(),
            "status": self.status,
            "terminal": self.terminal,
            "receipt": self.receipt.to_payload() if self.receipt else None,
            "raw_reasoning": self.raw_reasoning,
            "discarded": self.discarded,
            "last_seq": self.last_seq,
            "turns": [t.to_dict() for t in self.turns],
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "ending": self.ending.to_dict() if self.ending else None,
            "totals": self.totals.to_dict(),
        }


# --------------------------------------------------------------------------- the builder

_Key: TypeAlias = tuple[str, str]


def _text_of(payload: Mapping[str, Any]) -> str | None:
    return _opt_str(payload.get("text"))


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ThreadBuilder:
    """Builds a :class:`ThreadView` event by event; ``view()`` is a snapshot (items are frozen)."""

    def __init__(self) -> None:
        self._order: list[_Key] = []
        self._items: dict[_Key, ThreadItem] = {}
        self._text: list[str] = []
        self._final = False
        self._status: ThreadStatus = "running"
        self._terminal: str | None = None
        self._receipt: DisclosureReceipt | None = None
        self._raw: list[str] | None = None
        self._discarded = 0
        self._last_seq = 0
        self._anonymous = 0
        self._task_id: str | None = None
        self._turn_of: dict[str | None, int] = {}
        """Each task's current model turn (of the last event that named one)."""
        self._turns: dict[tuple[str | None, int | None], TurnInfo] = {}
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._ending: RunEnding | None = None
        self._ts: float | None = None

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def feed_all(self, events: Iterable[Event | Mapping[str, Any]]) -> ThreadBuilder:
        for event in events:
            self.feed(event)
        return self

    def feed(self, event: Event | Mapping[str, Any]) -> bool:
        """Apply one event (an :class:`Event` or its ``to_dict()`` / SSE JSON form).

        Returns ``False`` when it was ignored as already applied (``seq`` not above the last).
        """
        etype: Any
        payload: Any
        seq: int | None
        if isinstance(event, Event):
            etype, payload, seq = event.type, event.payload, event.seq
            self._task_id = event.task_id
            self._ts = _opt_num(event.ts)
        else:
            etype, payload, seq = event.get("type"), event.get("payload"), None
            raw_seq = event.get("seq")
            if isinstance(raw_seq, int) and not isinstance(raw_seq, bool):
                seq = raw_seq
            self._task_id = _opt_str(event.get("task_id"))
            self._ts = _opt_num(event.get("ts"))
        if seq is not None:
            if seq <= self._last_seq:
                return False
            self._last_seq = seq
        if isinstance(etype, str):
            self._apply(etype, payload if isinstance(payload, Mapping) else {})
        return True

    def _turn(self) -> int | None:
        return self._turn_of.get(self._task_id)

    def _apply(self, etype: str, payload: Mapping[str, Any]) -> None:
        turn = _opt_int(payload.get("turn"))
        if turn is not None:
            self._turn_of[self._task_id] = turn
        family = etype.split(".", 1)[0]
        if family == "cot":
            self._apply_cot(etype, payload)
        elif etype in TOOL_EVENT_STATUS or etype == EventType.TOOL_APPROVAL_RESPONSE:
            self._apply_tool(etype, payload)
        elif etype == EventType.MESSAGE_DELTA:
            self._text.append(_text_of(payload) or "")
            self._apply_said(_text_of(payload) or "")
        elif etype == EventType.AGENT_RESPONSE:
            self._apply_response(payload)
        elif etype == EventType.RUN_STARTED:
            self._started_at = self._ts
        elif etype == EventType.REASONING_DELTA:
            if self._raw is None:
                self._raw = []
            self._raw.append(_text_of(payload) or "")
            self._apply_reasoning(payload)
        elif etype == EventType.CAPABILITY_RESOLVED:
            self._apply_notice(payload)
        if etype in DISPLAY_TERMINAL_TYPES:
            self._apply_terminal(etype, payload)
        if etype in RUN_TERMINAL_TYPES:
            self._ended_at = self._ts
            self._ending = RunEnding(
                etype,
                _opt_str(payload.get("status")),
                _opt_str(payload.get("error")),
                _opt_str(payload.get("error_type")),
                _opt_str(payload.get("reason")),
                _opt_str(payload.get("error_detail")),
            )

    def _apply_said(self, text: str) -> None:
        """Into the text of the current turn (placed where that turn first said something)."""
        turn = self._turn()
        key = f"{self._task_id or ''}:{'' if turn is None else turn}"
        old = self._items.get(("text", key))
        said = old if isinstance(old, TextItem) else TextItem(key, self._task_id, turn)
        self._upsert(("text", key), replace(said, text=said.text + text))

    def _apply_response(self, payload: Mapping[str, Any]) -> None:
        """One :class:`TurnInfo` per (task, turn); a repeated one replaces it in place."""
        turn = _opt_int(payload.get("turn"))
        raw_usage = payload.get("usage")
        usage = (
            {k: v for k, v in raw_usage.items() if _opt_int(v) is not None}
            if isinstance(raw_usage, Mapping)
            else {}
        )
        calls = payload.get("tool_calls")
        call = payload.get("call")
        times = call if isinstance(call, Mapping) else {}
        started = _opt_num(times.get("started_at"))
        first = _opt_num(times.get("first_chunk_at"))
        ended = _opt_num(times.get("ended_at"))
        self._turns[(self._task_id, turn)] = TurnInfo(
            self._task_id,
            turn,
            model=_opt_str(payload.get("model")),
            provider=_opt_str(payload.get("provider")),
            usage=usage,
            finish_reason=_opt_str(payload.get("finish_reason")),
            started_at=started,
            ttft_s=None if first is None or started is None else first - started,
            duration_s=None if ended is None or started is None else ended - started,
            error=_opt_str(payload.get("error")),
            error_type=_opt_str(payload.get("error_type")),
            error_detail=_opt_str(payload.get("error_detail")),
            tool_calls=len(calls) if isinstance(calls, list) else 0,
            ts=self._ts,
        )

    def _upsert(self, key: _Key, item: ThreadItem) -> None:
        if key not in self._items:
            self._order.append(key)
        self._items[key] = item

    def _apply_reasoning(self, payload: Mapping[str, Any]) -> None:
        """Into the section of its turn; a change of kind or index starts a new segment."""
        turn = _opt_int(payload.get("turn"))
        key = f"{self._task_id or ''}:{'' if turn is None else turn}"
        old = self._items.get(("reasoning", key))
        item = old if isinstance(old, ReasoningItem) else ReasoningItem(key, self._task_id, turn)
        kind = _opt_str(payload.get("reasoning_kind"))
        index = _opt_int(payload.get("index"))
        text = _text_of(payload) or ""
        segments = item.segments
        last = segments[-1] if segments else None
        if last is not None and (last.kind, last.index) == (kind, index):
            segments = (*segments[:-1], replace(last, text=last.text + text))
        else:
            segments = (*segments, ReasoningSegment(kind, index, text))
        self._upsert(("reasoning", key), replace(item, segments=segments))

    def _apply_cot(self, etype: str, payload: Mapping[str, Any]) -> None:
        if etype == EventType.COT_COMPLETED:
            receipt = parse_receipt(payload)
            if receipt is None:
                self._discarded += 1
            else:
                self._receipt = receipt
            return
        step = parse_visible_payload(payload, event_type=etype)
        if step is None or etype not in (
            EventType.COT_STEP,
            EventType.COT_PHASE,
            EventType.COT_TOOL_REASONING,
        ):
            self._discarded += 1
            return
        if etype == EventType.COT_STEP:
            old = self._items.get(("step", step.step_id))
            if isinstance(old, StepItem):  # updated in place: it stays where it was said
                self._upsert(("step", step.step_id), replace(old, step=step))
            else:
                item = StepItem(step, task_id=self._task_id, turn=self._turn())
                self._upsert(("step", step.step_id), item)
        elif etype == EventType.COT_PHASE:
            was = self._items.get(("phase", step.step_id))
            if isinstance(was, PhaseItem):
                self._upsert(("phase", step.step_id), replace(was, step=step))
            else:
                phase = PhaseItem(step, task_id=self._task_id, turn=self._turn())
                self._upsert(("phase", step.step_id), phase)
        else:
            self._attach_tool_reasoning(step)

    def _attach_tool_reasoning(self, step: VisibleStep) -> None:
        card = self._items.get(("tool", step.tool_call_id or ""))
        if not isinstance(card, ToolCard):
            self._discarded += 1  # a step grants nothing: no card, nothing to attach to
            return
        others = tuple(s for s in card.reasoning if s.step_id != step.step_id)
        if len(others) == len(card.reasoning):
            reasoning = (*card.reasoning, step)
        else:
            reasoning = tuple(step if s.step_id == step.step_id else s for s in card.reasoning)
        self._items[("tool", card.call_id)] = replace(card, reasoning=reasoning)

    def _apply_tool(self, etype: str, payload: Mapping[str, Any]) -> None:
        call_id = _opt_str(payload.get("call_id"))
        if call_id is None:
            self._anonymous += 1
            call_id = f"anonymous-{self._anonymous}"
        key: _Key = ("tool", call_id)
        old = self._items.get(key)
        card = (
            old
            if isinstance(old, ToolCard)
            else ToolCard(call_id, None, "pending", "", task_id=self._task_id, turn=self._turn())
        )
        tool_key = _coalesce(_opt_str(payload.get("tool_key")), card.tool_key)
        self._upsert(
            key,
            replace(
                card,
                tool_key=tool_key,
                status=self._tool_status(etype, payload, card.status),
                label=_opt_str(payload.get("label")) or card.label or tool_key or "tool",
                input=_coalesce(payload.get("input"), card.input),
                output=_coalesce(payload.get("output"), card.output),
                error=_opt_str(payload.get("error")) or card.error,
                error_kind=_opt_str(payload.get("error_kind")) or card.error_kind,
            ),
        )

    @staticmethod
    def _tool_status(etype: str, payload: Mapping[str, Any], current: ToolStatus) -> ToolStatus:
        if etype == EventType.TOOL_APPROVAL_RESPONSE:
            return "rejected" if payload.get("decision") == "reject" else current
        if etype == EventType.TOOL_PROGRESS and current in _FINAL_TOOL_STATUSES:
            return current
        return TOOL_EVENT_STATUS.get(etype, current)

    def _apply_notice(self, payload: Mapping[str, Any]) -> None:
        """One run-level notice, updated in place."""
        mode = _opt_str(payload.get("chain_of_thought"))
        label = f"Mode: {mode}" if mode else "run"
        self._upsert(("capability", "run"), NoticeItem("run", label, dict(payload)))

    def _apply_terminal(self, etype: str, payload: Mapping[str, Any]) -> None:
        self._terminal = etype
        if etype in (EventType.MESSAGE_COMPLETED, EventType.MESSAGE_PARTIALLY_COMPLETED):
            final = _text_of(payload)
            if final is not None:
                self._text = [final]
            self._final = True
        outcome = payload.get("status") if etype in RUN_TERMINAL_TYPES else None
        if isinstance(outcome, str) and outcome in _RUN_OUTCOME:
            self._status = _RUN_OUTCOME[outcome]  # the run's own verdict covers all its tasks
        elif etype in _TERMINAL_STATUS:
            self._status = _TERMINAL_STATUS[etype]
        elif self._status == "running":
            self._status = "completed"  # run.settlement.completed with no message outcome

    def view(self) -> ThreadView:
        items = tuple(self._items[k] for k in self._order)
        calls = tuple(
            ToolCallRecord(i.call_id, i.tool_key, i.status)
            for i in items
            if isinstance(i, ToolCard)
        )
        return ThreadView(
            items=items,
            message=MessageView("".join(self._text), self._final, calls),
            status=self._status,
            terminal=self._terminal,
            receipt=self._receipt,
            raw_reasoning="".join(self._raw) if self._raw is not None else None,
            discarded=self._discarded,
            last_seq=self._last_seq,
            turns=tuple(self._turns.values()),
            started_at=self._started_at,
            ended_at=self._ended_at,
            ending=self._ending,
        )


def rebuild(events: Iterable[Event | Mapping[str, Any]]) -> ThreadView:
    """The thread from persisted events (what a reload shows)."""
    return ThreadBuilder().feed_all(events).view()

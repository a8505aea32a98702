"""The event envelope and the names of the event types every writer and reader shares.

An event is ``{seq, run_id, task_id?, type, ts, v, payload}``. ``seq`` is assigned by the store:
strictly increasing per run, starting at 1, no gaps, so it can be the SSE ``id:`` and a resume
point. ``v`` is the version of the vocabulary the payload was written in (the store stamps the
current one, ``thoughtgate.events.payloads.EVENT_VERSION``, on every append; the payload itself
carries no version, so the hot deltas stay small). Writers build :class:`NewEvent` (no ``seq``);
the store returns :class:`Event`. Each type's payload is declared in
``thoughtgate.events.payloads``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final

__all__ = [
    "DISPLAY_TERMINAL_TYPES",
    "EVENT_VERSION",
    "RUN_TERMINAL_TYPES",
    "Event",
    "EventType",
    "NewEvent",
    "is_run_terminal",
    "now_ts",
]


EVENT_VERSION: Final = 1
"""Version of the event vocabulary (``thoughtgate.events.payloads``). Bump it when a field changes
meaning, type or name, or goes away (adding an optional field does not), and teach
``thoughtgate.events.payloads.upgrade_payload`` to read the old version."""


class EventType:
    """Names of the event types (their payloads: ``thoughtgate.events.payloads``)."""

    RUN_STARTED: Final = "run.started"
    CAPABILITY_RESOLVED: Final = "capability.resolved"
    RUN_FAILED: Final = "run.failed"
    RUN_ERROR: Final = "run.error"
    RUN_SETTLEMENT_COMPLETED: Final = "run.settlement.completed"
    RUN_INTERRUPTED: Final = "run.interrupted"
    RUN_RESUMED: Final = "run.resumed"

    TASK_STARTED: Final = "task.started"
    TASK_COMPLETED: Final = "task.completed"

    MESSAGE_DELTA: Final = "message.delta"
    MESSAGE_COMPLETED: Final = "message.completed"
    MESSAGE_PARTIALLY_COMPLETED: Final = "message.partially_completed"

    REASONING_DELTA: Final = "reasoning.delta"
    AGENT_RESPONSE: Final = "agent.response"
    WORKER_COMPLETED: Final = "worker.completed"

    COT_STEP: Final = "cot.step"
    COT_PHASE: Final = "cot.phase"
    COT_TOOL_REASONING: Final = "cot.tool.reasoning"
    COT_COMPLETED: Final = "cot.completed"

    TOOL_STARTED: Final = "tool.started"
    TOOL_PROGRESS: Final = "tool.progress"
    TOOL_APPROVAL_REQUIRED: Final = "tool.approval_required"
    TOOL_APPROVAL_RESPONSE: Final = "tool.approval_response"
    TOOL_APPROVAL_TIMEOUT: Final = "tool.approval_timeout"
    TOOL_COMPLETED: Final = "tool.completed"
    TOOL_FAILED: Final = "tool.failed"
    TOOL_DEGRADED: Final = "tool.degraded"
    CONTINUITY_DROPPED: Final = "continuity.dropped"


RUN_TERMINAL_TYPES: Final = frozenset(
    {
        EventType.RUN_FAILED,
        EventType.RUN_ERROR,
        EventType.RUN_SETTLEMENT_COMPLETED,
        EventType.RUN_INTERRUPTED,
    }
)
"""After one of these nothing more is appended to the run; live readers stop there."""

DISPLAY_TERMINAL_TYPES: Final = RUN_TERMINAL_TYPES | {
    EventType.MESSAGE_COMPLETED,
    EventType.MESSAGE_PARTIALLY_COMPLETED,
}
"""Terminal for a displayed message (``tool.failed`` is deliberately not here)."""


def is_run_terminal(event_type: str) -> bool:
    return event_type in RUN_TERMINAL_TYPES


def now_ts() -> float:
    return time.time()


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event not yet appended (no sequence number yet)."""

    type: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    _: KW_ONLY
    task_id: str | None = None
    ts: float = field(default_factory=now_ts)


@dataclass(frozen=True, slots=True)
class Event:
    """An appended event; ``seq`` is its per-run position (1, 2, 3, ... with no gaps)."""

    seq: int
    run_id: str
    type: str
    payload: Mapping[str, Any]
    _: KW_ONLY
    task_id: str | None = None
    ts: float = 0.0
    v: int = EVENT_VERSION
    """The vocabulary version the payload was written in."""

    def to_dict(self) -> dict[str, Any]:
        """The wire shape shared by ``events --json``, HTTP reads and SSE frames."""
        return {
            "seq": self.seq,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "type": self.type,
            "ts": self.ts,
            "v": self.v,
            "payload": dict(self.payload),
        }

"""Narration: the built-in ``visible_step`` tool through which a model writes steps for the reader.

When ``visible_reasoning.summarizers`` names ``narration``, the agent loop offers the model one
extra tool, :data:`NARRATION_SPEC`. Its calls are not tools: they never reach the tool registry,
never become tool cards (no ``tool.*`` event, no entry in ``agent.response.tool_calls``) and go
back to the model only as :data:`NARRATION_ACK`, answered in the same tool message as any real
calls of that turn. Each call's ``summary`` is a *draft* for the visible-reasoning pipeline, which
checks it against the policy like any other step; the persisted ``cot.*`` event is the only place
the text is kept, so a reload reads the steps from there and never from the call's input.

Which call a narration explains: a narration immediately followed, in the turn's own order, by a
call of a registered tool explains that call (``cot.tool.reasoning`` on its card); any other
narration is a ``cot.step``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Final

from thoughtgate.providers.base import ToolSpec
from thoughtgate.types import ToolCallPart, ToolResultPart, Turn

__all__ = [
    "NARRATION_ACK",
    "NARRATION_DESCRIPTION",
    "NARRATION_SPEC",
    "NARRATION_TOOL",
    "Narration",
    "is_narration",
    "narration_ack",
    "narrations_of",
    "without_narration",
]

NARRATION_TOOL: Final = "visible_step"

NARRATION_DESCRIPTION: Final = (
    "One short sentence for the person watching: what you are about to do or what you found, "
    "with no secrets, links, paths or data."
)

NARRATION_SPEC: Final = ToolSpec(
    NARRATION_TOOL,
    NARRATION_DESCRIPTION,
    {
        "type": "object",
        "properties": {"summary": {"type": "string", "description": NARRATION_DESCRIPTION}},
        "required": ["summary"],
        "additionalProperties": False,
    },
)

NARRATION_ACK: Final = "Noted."
"""All the model ever hears back, whether the step was shown, dropped by policy or malformed:
the result tells it nothing about the policy or the reader."""


@dataclass(frozen=True, slots=True)
class Narration:
    """One ``visible_step`` call of a turn: its ``summary`` (``None`` when the arguments hold no
    usable string) and the call id of the registered tool call it explains, if any."""

    call_id: str
    summary: str | None
    _: KW_ONLY
    explains: str | None = None


def is_narration(call: ToolCallPart) -> bool:
    return call.name == NARRATION_TOOL


def narration_ack(call: ToolCallPart) -> ToolResultPart:
    return ToolResultPart(call.call_id, NARRATION_ACK, name=NARRATION_TOOL)


def _summary(call: ToolCallPart) -> str | None:
    value = call.arguments.get("summary")
    return value if isinstance(value, str) and value.strip() else None


def narrations_of(turn: Turn, *, registered: Callable[[str], bool]) -> list[Narration]:
    """The turn's ``visible_step`` calls in order; ``registered(name)`` says whether a tool of
    that name will get a card (only such a call can be explained)."""
    calls = turn.tool_calls
    out = []
    for i, call in enumerate(calls):
        if not is_narration(call):
            continue
        following = calls[i + 1] if i + 1 < len(calls) else None
        explains = None
        if following is not None and not is_narration(following) and registered(following.name):
            explains = following.call_id
        out.append(Narration(call.call_id, _summary(call), explains=explains))
    return out


def without_narration(calls: Sequence[ToolCallPart]) -> tuple[ToolCallPart, ...]:
    """The calls that are real tool calls."""
    return tuple(c for c in calls if not is_narration(c))

"""Conversation history for a new turn: what may be sent back to a model, and what may not.

Two rules (ADR 0005): a conversation rebuilt from stored events carries no reasoning text and no
continuity carriers at all; inside a live loop, carriers go back only to the provider and model
that produced them, and any other carrier is dropped with a recorded reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from thoughtgate.events.schema import Event, EventType
from thoughtgate.types import (
    ContinuityBlock,
    Message,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

__all__ = ["DroppedCarrier", "conversation_from_events", "history_payload", "keep_own_carriers"]


@dataclass(frozen=True, slots=True)
class DroppedCarrier:
    carrier: str
    provider: str
    model: str
    reason: str


def keep_own_carriers(
    messages: Sequence[Message], provider: str, model: str
) -> tuple[list[Message], list[DroppedCarrier]]:
    """Drop reasoning parts everywhere and carriers produced by another provider or model."""
    kept: list[Message] = []
    dropped: list[DroppedCarrier] = []
    for message in messages:
        parts = []
        for part in message.parts:
            if isinstance(part, ReasoningPart):
                continue
            if isinstance(part, ContinuityBlock) and (part.provider, part.model) != (
                provider,
                model,
            ):
                dropped.append(
                    DroppedCarrier(
                        part.carrier,
                        part.provider,
                        part.model,
                        f"produced by {part.provider}:{part.model}, not {provider}:{model}; "
                        "carriers only go back to the model that signed them",
                    )
                )
                continue
            parts.append(part)
        kept.append(Message(message.role, tuple(parts)))
    return kept, dropped


def conversation_from_events(events: Iterable[Event]) -> list[Message]:
    """User prompts and final answers of a stored run, in order, with no reasoning of any kind.

    Only ``task.started`` prompts and ``message.completed`` / ``message.partially_completed``
    texts are read; reasoning events, ``agent.response`` and trace metadata are never looked at,
    so nothing the model thought can re-enter a prompt.
    """
    messages: list[Message] = []
    for event in events:
        if event.type == EventType.TASK_STARTED:
            prompt = event.payload.get("prompt")
            if isinstance(prompt, str) and prompt:
                messages.append(Message.user(prompt))
        elif event.type in (EventType.MESSAGE_COMPLETED, EventType.MESSAGE_PARTIALLY_COMPLETED):
            text = event.payload.get("text")
            if isinstance(text, str) and text:
                messages.append(Message("assistant", (TextPart(text),)))
    return messages


def history_payload(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Messages as the trace records them (``task.started`` ``history``), in the shape the
    OpenTelemetry GenAI conventions give ``gen_ai.input.messages``: text, tool calls and tool
    results only -- reasoning parts and continuity carriers are left out, whatever they hold."""
    out: list[dict[str, Any]] = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                parts.append({"type": "text", "content": part.text})
            elif isinstance(part, ToolCallPart):
                parts.append(
                    {
                        "type": "tool_call",
                        "id": part.call_id,
                        "name": part.name,
                        "arguments": part.arguments,
                    }
                )
            elif isinstance(part, ToolResultPart):
                parts.append(
                    {"type": "tool_call_response", "id": part.call_id, "result": part.content}
                )
        if parts:
            out.append({"role": message.role, "parts": parts})
    return out

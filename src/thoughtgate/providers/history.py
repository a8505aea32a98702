"""History walking the wire formats share: where the running tool loop starts, which carrier
goes back to which model, and the tool results of a message.

Continuity goes back only where the provider's API demands it, and only to the provider and model
that made it; :func:`current_loop_start` finds where the running tool loop begins (after the last
user message that carries text).
"""

from __future__ import annotations

from collections.abc import Sequence

from thoughtgate.types import ContinuityBlock, Message, TextPart, ToolResultPart

__all__ = ["current_loop_start", "matching_block", "tool_results"]


def current_loop_start(messages: Sequence[Message]) -> int:
    """Index of the first message of the running tool loop.

    The loop starts after the last ``user`` message that carries text; a user message that only
    carries tool results belongs to the loop.
    """
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.role == "user" and any(isinstance(p, TextPart) for p in msg.parts):
            return i + 1
    return 0


def matching_block(
    message: Message, carrier: str, *, provider: str, model: str
) -> ContinuityBlock | None:
    """The message's continuity block of ``carrier`` made by this provider and model, if any.

    Blocks from another provider or model are never sent: the provider could not read them and
    would reject the request (signatures are bound to the model that made them).
    """
    for part in message.parts:
        if (
            isinstance(part, ContinuityBlock)
            and part.carrier == carrier
            and part.provider == provider
            and part.model == model
        ):
            return part
    return None


def tool_results(message: Message) -> list[ToolResultPart]:
    return [p for p in message.parts if isinstance(p, ToolResultPart)]

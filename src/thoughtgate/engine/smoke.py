"""A live capability check: prove with the user's own key what an adapter really does.

``smoke("PROVIDER:MODEL", settings)`` runs two short conversations through the normal runtime path
(``stream_llm_turn``) and reports, per capability, whether it was *proven* and why or why not:

1. a one-sentence question in ``surface`` mode: ``streaming``, ``reasoning_text``,
   ``reasoning_summary``;
2. a two-turn tool call in ``surface`` mode: ``tools`` (the model called the offered tool) and
   ``continuity`` (the provider's continuity blocks went back with the tool result and the provider
   accepted them).

It only uses the :class:`~thoughtgate.providers.base.Provider` protocol, so it works for every
adapter and against the emulator. A failing call does not raise: it becomes the reason the
affected capabilities are not proven. A bad ``PROVIDER:MODEL`` or a missing key still raises the
``UsageError`` that names what to fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ProviderError
from thoughtgate.providers.base import (
    Provider,
    ProviderSettings,
    ReasoningRequest,
    ToolSpec,
    TurnRequest,
    create_provider,
)
from thoughtgate.types import Message, ToolResultPart, Turn

__all__ = ["CAPABILITIES", "SECRET_NUMBER", "SMOKE_TOOL", "CapabilityResult", "smoke"]

CAPABILITIES = ("streaming", "reasoning_text", "reasoning_summary", "tools", "continuity")
QUESTION = "In one short sentence: why is the sky blue?"
TOOL_PROMPT = "Call the get_secret_number tool, then tell me the number it returns."
SECRET_NUMBER = "4817"
SMOKE_TOOL = ToolSpec(
    "get_secret_number",
    "Returns the user's secret number. Takes no arguments.",
    {"type": "object", "properties": {}},
)


@dataclass(frozen=True, slots=True)
class CapabilityResult:
    """One capability: proven or not, why, and what the adapter claims (``Capabilities``)."""

    name: str
    proven: bool
    detail: str
    _: KW_ONLY
    claimed: bool | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "proven": self.proven,
            "detail": self.detail,
            "claimed": self.claimed,
        }


async def smoke(
    model: str, settings: ProviderSettings | None = None, *, max_tokens: int = 1024
) -> list[CapabilityResult]:
    """Run the live check against ``model`` (``"PROVIDER:MODEL"``); one result per capability."""
    provider = create_provider(model, settings)
    try:
        results = await _answer_checks(provider, max_tokens)
        results += await _tool_checks(provider, max_tokens)
    finally:
        await provider.aclose()
    claims = {
        "streaming": provider.capabilities.streaming,
        "reasoning_text": provider.capabilities.reasoning_text,
        "reasoning_summary": provider.capabilities.reasoning_summary,
        "tools": provider.capabilities.tools,
        "continuity": provider.capabilities.continuity,
    }
    return [
        CapabilityResult(r.name, r.proven, r.detail, claimed=claims.get(r.name)) for r in results
    ]


def _request(messages: Sequence[Message], max_tokens: int, *, tools: bool) -> TurnRequest:
    return TurnRequest(
        list(messages),
        tools=[SMOKE_TOOL] if tools else [],
        reasoning=ReasoningRequest.for_mode("surface"),
        max_tokens=max_tokens,
    )


def _failed(names: Sequence[str], why: str) -> list[CapabilityResult]:
    return [CapabilityResult(name, False, why) for name in names]


async def _answer_checks(provider: Provider, max_tokens: int) -> list[CapabilityResult]:
    names = ("streaming", "reasoning_text", "reasoning_summary")
    try:
        turn = await stream_llm_turn(
            provider, _request([Message.user(QUESTION)], max_tokens, tools=False)
        )
    except ProviderError as exc:
        return _failed(names, f"the request failed: {exc}")
    return [_streaming(turn), _reasoning(turn, summary=False), _reasoning(turn, summary=True)]


def _streaming(turn: Turn) -> CapabilityResult:
    if turn.text.strip():
        return CapabilityResult(
            "streaming", True, f"{len(turn.text)} characters of answer text streamed"
        )
    reason = turn.raw_finish_reason or turn.finish_reason
    return CapabilityResult(
        "streaming", False, f"the stream finished without answer text (finish reason {reason})"
    )


def _reasoning(turn: Turn, *, summary: bool) -> CapabilityResult:
    name = "reasoning_summary" if summary else "reasoning_text"
    readable = [p for p in turn.reasoning_parts if p.text]
    if summary:
        readable = [p for p in readable if p.reasoning_kind == "summary"]
    if readable:
        size = sum(len(p.text) for p in readable)
        kinds = ", ".join(sorted({p.reasoning_kind for p in readable}))
        return CapabilityResult(name, True, f"{size} characters of {kinds} reasoning returned")
    if summary and any(p.text for p in turn.reasoning_parts):
        return CapabilityResult(name, False, "reasoning came back as raw text, not as a summary")
    if turn.reasoning_parts or turn.continuity:
        why = "reasoning came back without readable text (redacted, encrypted or display omitted)"
    else:
        why = "no reasoning came back (the model may not reason, or skipped it for this prompt)"
    return CapabilityResult(name, False, why)


async def _tool_checks(provider: Provider, max_tokens: int) -> list[CapabilityResult]:
    history = [Message.user(TOOL_PROMPT)]
    try:
        first = await stream_llm_turn(provider, _request(history, max_tokens, tools=True))
    except ProviderError as exc:
        return _failed(("tools", "continuity"), f"the tool request failed: {exc}")
    calls = [c for c in first.tool_calls if c.name == SMOKE_TOOL.name]
    if not calls:
        why = f"the model answered without calling {SMOKE_TOOL.name}"
        return [
            CapabilityResult("tools", False, why),
            CapabilityResult("continuity", False, "not tried: it needs a tool call first"),
        ]
    tools = CapabilityResult("tools", True, f"the model called {SMOKE_TOOL.name}")
    history.append(first.as_message())
    results = tuple(ToolResultPart(c.call_id, SECRET_NUMBER, name=c.name) for c in calls)
    history.append(Message("tool", results))
    try:
        second = await stream_llm_turn(provider, _request(history, max_tokens, tools=True))
    except ProviderError as exc:
        return [tools, CapabilityResult("continuity", False, f"the second turn failed: {exc}")]
    blocks = len(first.continuity)
    if not blocks:
        why = "the tool loop worked, but the provider returned no continuity blocks to carry"
        return [tools, CapabilityResult("continuity", False, why)]
    answered = (
        "and the answer used the tool result"
        if SECRET_NUMBER in second.text
        else ("(the answer did not quote the tool result)")
    )
    detail = f"{blocks} continuity block(s) sent back with the tool result and accepted, {answered}"
    return [tools, CapabilityResult("continuity", True, detail)]

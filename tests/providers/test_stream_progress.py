"""What a stream's progress is: events of a kind its format defines (ADR 0161).

ADR 0147 made ``timeout_s`` of keep-alive comments a timeout and ADR 0155 Anthropic's pings; an
endless stream of event types the format does not define, or of chunks that carry nothing, still
reset that rule, so only the turn's deadline (4 h) ended it. Now the parser each read is fed to
judges it: the turn times out after ``timeout_s`` of such reads, what arrived kept. A signature
delta is the model's output and counts. Each stream here, served from a real HTTP server on
loopback, would otherwise complete, so without the rule the turn succeeds. The sets of event
types are checked against the official SDKs' type definitions.
"""

from __future__ import annotations

import asyncio
import json
import typing
from typing import Any

import pytest
from support.replay import SSE_HEADERS, ReplayServer, Reply, fixture, split_events

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ProviderError, ProviderTimeoutError
from thoughtgate.providers import anthropic, chat_completions, openai_responses
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.types import Message

pytestmark = pytest.mark.inprocess

REQUEST = TurnRequest([Message.user("Go.")], reasoning=ReasoningRequest(True))
NOISE_PIECES = 400
"""Noise pieces, one every 20 ms: 8 s of a stream that brings nothing, against 0.3 s."""

COMMENT = b": keep-alive\n\n"
FORMATS: dict[str, tuple[Any, str, str, int]] = {
    # adapter, model, transcript, events before the noise (after the first reasoning delta)
    "anthropic": (AnthropicProvider, "claude-sonnet-4-5", "anthropic/thinking_text.sse", 6),
    "responses": (
        OpenAIResponsesProvider,
        "gpt-oss-120b",
        "openai_responses/raw_reasoning_text.sse",
        4,
    ),
    "chat": (OpenAICompatibleProvider, "deepseek-reasoner", "compat/deepseek_reasoner.sse", 2),
}


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


NOISE: dict[str, dict[str, list[bytes]]] = {
    "anthropic": {
        "unknown events": [_sse({"type": "heartbeat"}, "heartbeat")],
        "unknown deltas": [
            _sse(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "glow_delta"}},
                "content_block_delta",
            )
        ],
        "unknown events and comments": [_sse({"type": "status"}, "status"), COMMENT],
    },
    "responses": {
        "unknown events": [_sse({"type": "keepalive"}, "keepalive")],
        "unknown events and comments": [_sse({"type": "response.heartbeat"}), COMMENT],
    },
    "chat": {
        "empty deltas": [
            _sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}}]})
        ],
        "role and empty content": [
            _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        ],
        "chunks without choices": [_sse({"choices": [], "obfuscation": "Zm9v"}), COMMENT],
    },
}
CASES = [(fmt, kind) for fmt, kinds in NOISE.items() for kind in kinds]


def _model(fmt: str, server: ReplayServer, **bounds: float) -> Any:
    cls, model, _, _ = FORMATS[fmt]
    settings = ProviderSettings(
        base_url=server.url, api_key="k", connect_timeout_s=5.0, max_retries=0, **bounds
    )
    return cls(model, settings)


def _stream(fmt: str, noise: list[bytes]) -> list[bytes]:
    """The format's transcript with ``noise`` sent between its events."""
    _, _, name, before = FORMATS[fmt]
    events = split_events(fixture(name))
    return [*events[:before], *noise, *events[before:]]


async def _reasoning_before(fmt: str) -> str:
    """The reasoning of the transcript's events before the noise: the partial of a stream cut
    there."""
    _, _, name, before = FORMATS[fmt]
    events = split_events(fixture(name))[:before]
    async with ReplayServer([Reply(events, headers=dict(SSE_HEADERS))]) as server:
        model = _model(fmt, server, timeout_s=30.0)
        with pytest.raises(ProviderError) as info:
            await stream_llm_turn(model, REQUEST)
        await model.aclose()
    assert info.value.partial is not None
    return info.value.partial.reasoning_text


@pytest.mark.parametrize(("fmt", "kind"), CASES)
async def test_a_stream_that_brings_nothing_of_the_turn_times_out(fmt: str, kind: str) -> None:
    """After the first reasoning, only noise every 20 ms for 8 s, then the rest of the turn:
    with ``timeout_s`` 0.3 and no deadline, the turn times out, its reasoning kept."""
    noise = NOISE[fmt][kind] * NOISE_PIECES
    pieces = _stream(fmt, noise)
    before = await _reasoning_before(fmt)
    async with ReplayServer([Reply(pieces, headers=dict(SSE_HEADERS), pause_s=0.02)]) as server:
        model = _model(fmt, server, timeout_s=0.3, turn_timeout_s=0)
        with pytest.raises(ProviderTimeoutError) as info:
            await stream_llm_turn(model, REQUEST)
        await asyncio.wait_for(server.hung_up.wait(), 10)
        await model.aclose()
    assert "no event for 0.3 s" in info.value.message
    assert "timeout_s" in info.value.message
    assert info.value.partial is not None
    assert before and info.value.partial.reasoning_text == before


async def test_signature_deltas_are_progress() -> None:
    """A signature delta is the model's output (it replaces the one before, holding nothing
    more): 100 of them every 20 ms (2 s) with ``timeout_s`` 0.5 do not end the turn."""
    delta = {"type": "signature_delta", "signature": "EqQBCkgIAxABGAIiQL"}
    signature = _sse(
        {"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"
    )
    pieces = _stream("anthropic", [signature] * 100)
    async with ReplayServer([Reply(pieces, headers=dict(SSE_HEADERS), pause_s=0.02)]) as server:
        model = _model("anthropic", server, timeout_s=0.5, turn_timeout_s=0)
        turn = await stream_llm_turn(model, REQUEST)
        await model.aclose()
    assert turn.text and turn.reasoning_text


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_the_whole_transcript_paced_completes(fmt: str) -> None:
    """The control: each transcript's own events, one every 20 ms, complete with ``timeout_s``
    0.3: everything a real stream sends is progress."""
    _, _, name, _ = FORMATS[fmt]
    pieces = split_events(fixture(name))
    async with ReplayServer([Reply(pieces, headers=dict(SSE_HEADERS), pause_s=0.02)]) as server:
        model = _model(fmt, server, timeout_s=0.3, turn_timeout_s=0)
        turn = await stream_llm_turn(model, REQUEST)
        await model.aclose()
    assert turn.reasoning_text


def _literal_types(union: Any) -> set[str]:
    names: set[str] = set()
    for member in typing.get_args(union):
        names |= set(typing.get_args(member.model_fields["type"].annotation))
    return names


def test_the_event_types_that_count_are_the_sdks() -> None:
    """The types that are progress are types the official SDKs define: none invented. (A newer
    SDK may define more than the lists hold -- the test extras are not pinned, so checking
    "no fewer" would turn CI red on an upstream release; a type added upstream is one the lists
    gain when it is read.)"""
    from anthropic.types.raw_content_block_delta import RawContentBlockDelta
    from anthropic.types.raw_message_stream_event import RawMessageStreamEvent
    from openai.types.chat.chat_completion_chunk import ChoiceDelta
    from openai.types.responses.response_stream_event import ResponseStreamEvent

    assert _literal_types(typing.get_args(RawMessageStreamEvent)[0]) >= anthropic.EVENT_TYPES
    assert _literal_types(typing.get_args(RawContentBlockDelta)[0]) >= anthropic.DELTA_TYPES
    sdk_responses = _literal_types(typing.get_args(ResponseStreamEvent)[0])
    assert sdk_responses >= openai_responses.EVENT_TYPES
    # the Chat Completions fields that count are the SDK's delta fields, or the reasoning fields
    # servers add (the SDK's ChoiceDelta does not define them); "role" is no output
    servers_reasoning = {"reasoning_content", "reasoning", "reasoning_details"}
    assert set(chat_completions._OUTPUT_KEYS) - servers_reasoning <= set(ChoiceDelta.model_fields)
    assert "role" not in chat_completions._OUTPUT_KEYS

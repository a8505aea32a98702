"""Conformance of the Anthropic capture over recorded-format transcripts.

Each transcript in ``tests/fixtures/anthropic`` is replayed through the real HTTP client (a loopback
server or a MockTransport byte stream) in many chunkings; every replay must read the transcript to
its last byte and build the same turn. The non-streamed path is checked against the streamed one
on the message the official SDK assembles from the same bytes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import anthropic
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.replay import (
    ReplayServer,
    Reply,
    loopback_provider,
    mock_transport,
    provider_with,
    split_at,
    split_events,
    split_every,
    transcript,
)

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import MalformedResponseError, ProviderError, ProviderStreamError
from thoughtgate.providers.anthropic import STOP_REASONS, THINKING_CARRIER, AnthropicCapture
from thoughtgate.providers.base import ReasoningRequest, TurnRequest
from thoughtgate.providers.sse import SSEMessage
from thoughtgate.types import (
    ContinuityBlock,
    FinishChunk,
    ReasoningDelta,
    ReasoningPart,
    TextDelta,
    TextPart,
    ToolCallPart,
    Turn,
    TurnAccumulator,
    Usage,
)

SURFACE = TurnRequest([], reasoning=ReasoningRequest(True))
HIDDEN = TurnRequest([], reasoning=ReasoningRequest(False))

SIG1 = transcript("thinking_text.sse").split(b'"signature":"')[2].split(b'"')[0].decode()


@dataclass(frozen=True)
class Expected:
    kinds: tuple[str, ...]
    reasoning: str
    text: str
    raw_finish: str
    usage: Usage


EXPECTED = {
    "thinking_text.sse": Expected(
        ("reasoning", "continuity", "text"),
        "The user wants to know why bread dough rises. Yeast ferments sugars and releases CO2, "
        "which gluten traps. Keep it short.",
        "Bread rises because yeast ferments the sugars in the dough and gives off carbon dioxide; "
        "the gluten network traps the gas, so the dough swells.",
        "end_turn",
        Usage(input_tokens=52, output_tokens=131),
    ),
    "redacted.sse": Expected(
        ("reasoning", "continuity", "reasoning", "continuity", "text"),
        "Part of my reasoning was redacted; the visible part: answer politely.",
        "I can help with that.",
        "end_turn",
        Usage(input_tokens=88, output_tokens=96),
    ),
    "tool_use.sse": Expected(
        ("reasoning", "continuity", "text", "tool_call"),
        "I need the user's country before naming its largest city. Call get_user_country.",
        "Let me look up your country first.",
        "tool_use",
        Usage(
            input_tokens=398,
            output_tokens=155,
            reasoning_tokens=67,
            cache_read_tokens=1024,
            cache_write_tokens=210,
        ),
    ),
    "adaptive_text_first.sse": Expected(
        ("text", "reasoning", "continuity", "text"),
        "Simple arithmetic: 17 times 3 is 51.",
        "\n\n17 × 3 = 51.",
        "end_turn",
        Usage(input_tokens=61, output_tokens=44),
    ),
    "unknown_events.sse": Expected(
        ("text",),
        "",
        "Tides follow the moon",
        "max_tokens",
        Usage(input_tokens=12, output_tokens=8),
    ),
    "refusal.sse": Expected(
        ("text",), "", "I can't help with that.", "refusal", Usage(input_tokens=20, output_tokens=9)
    ),
}
EXPECTED["thinking_text_crlf.sse"] = EXPECTED["thinking_text.sse"]
COMPLETE = sorted(EXPECTED)


def check(turn: Turn, expected: Expected) -> None:
    assert tuple(p.kind for p in turn.parts) == expected.kinds
    assert turn.reasoning_text.replace("\n\n", "") == expected.reasoning
    assert turn.text == expected.text
    assert turn.raw_finish_reason == expected.raw_finish
    assert turn.finish_reason == STOP_REASONS[expected.raw_finish]
    assert turn.usage == expected.usage
    assert turn.complete
    assert turn.provider == "anthropic"


async def replay(
    name: str, pieces: list[bytes], request: TurnRequest = SURFACE, server: str | None = None
) -> Turn:
    transport = mock_transport(pieces)
    provider = provider_with(transport, server=server)
    try:
        turn = await stream_llm_turn(provider, request)
    finally:
        await provider.aclose()
    transport.tallies[0].assert_fully_read(transcript(name))
    return turn


@pytest.mark.parametrize("name", COMPLETE)
async def test_transcript_over_loopback_one_event_per_chunk(name: str) -> None:
    data = transcript(name)
    async with ReplayServer([Reply(split_events(data))]) as server:
        provider, transport = loopback_provider(server)
        turn = await stream_llm_turn(provider, SURFACE)
        await provider.aclose()
    check(turn, EXPECTED[name])
    transport.tallies[0].assert_fully_read(data)
    assert server.bodies[0]["stream"] is True


@pytest.mark.parametrize("name", COMPLETE)
@pytest.mark.parametrize("size", [1, 7, 64, 4096])
async def test_transcript_in_fixed_chunkings(name: str, size: int) -> None:
    check(await replay(name, split_every(transcript(name), size)), EXPECTED[name])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["thinking_text.sse", "thinking_text_crlf.sse", "tool_use.sse"]),
    cuts=st.lists(st.integers(min_value=1, max_value=3500), max_size=40),
)
async def test_any_chunking_gives_the_same_turn(name: str, cuts: list[int]) -> None:
    check(await replay(name, split_at(transcript(name), cuts)), EXPECTED[name])


def test_thinking_block_is_kept_byte_identical_for_continuity() -> None:
    turn = _sync_replay("thinking_text.sse", server="anthropic")
    (block,) = turn.continuity
    assert block.carrier == THINKING_CARRIER
    assert dict(block.data) == {
        "type": "thinking",
        "thinking": EXPECTED["thinking_text.sse"].reasoning,
        "signature": SIG1,
    }
    assert list(block.data) == ["type", "thinking", "signature"]
    (reasoning,) = turn.reasoning_parts
    assert reasoning.signature == SIG1
    assert reasoning.reasoning_kind == "summary"  # Claude 4+ returns summarized thinking
    # ... on Anthropic's API: the same bytes from a server that is not are raw (ADR 0078)
    (elsewhere,) = _sync_replay("thinking_text.sse").reasoning_parts
    assert elsewhere.reasoning_kind == "raw"
    assert (block.provider, block.model) == ("anthropic", "claude-sonnet-4-5")


def test_redacted_thinking_is_opaque_reasoning_plus_its_exact_block() -> None:
    turn = _sync_replay("redacted.sse")
    redacted, visible = turn.reasoning_parts
    assert redacted.redacted and redacted.text == "" and redacted.index == 0
    assert not visible.redacted and visible.index == 1
    first, second = turn.continuity
    assert first.carrier == "anthropic.redacted_thinking"
    assert first.data["type"] == "redacted_thinking"
    assert str(first.data["data"]).startswith("EmwKAhgBEgy3va3pzGmdd6HbRhUaDFhS")
    assert second.carrier == THINKING_CARRIER


def test_tool_arguments_streamed_in_pieces_arrive_whole() -> None:
    (call,) = _sync_replay("tool_use.sse").tool_calls
    assert call == ToolCallPart(
        "toolu_01YGxq7tHq3PbXbHnu5Tq8wB",
        "get_user_country",
        arguments_json='{"format":"iso","include_region":true}',
    )


def test_text_block_before_thinking_keeps_its_place() -> None:
    turn = _sync_replay("adaptive_text_first.sse")
    assert isinstance(turn.parts[0], TextPart) and turn.parts[0].text == "\n\n"
    assert isinstance(turn.parts[1], ReasoningPart) and turn.parts[1].index == 1


def test_hidden_mode_emits_no_reasoning_but_keeps_the_continuity_block() -> None:
    turn = _sync_replay("thinking_text.sse", HIDDEN)
    assert turn.reasoning_parts == ()
    assert [type(p) for p in turn.parts] == [ContinuityBlock, TextPart]


def _sync_replay(name: str, request: TurnRequest = SURFACE, server: str | None = None) -> Turn:
    return asyncio.run(replay(name, split_events(transcript(name)), request, server))


# --------------------------------------------------------------------------- parity with the SDK


async def sdk_final_message(data: bytes) -> dict[str, object]:
    async with ReplayServer([Reply(split_events(data))]) as server:
        client = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
        async with client.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=9000,
            messages=[{"role": "user", "content": "hi"}],
        ) as stream:
            message = await stream.get_final_message()
        await client.close()
    return message.to_dict(mode="json")


@pytest.mark.parametrize("name", COMPLETE)
async def test_non_streamed_message_gives_the_identical_turn(name: str) -> None:
    streamed = await replay(name, split_events(transcript(name)))
    body = json.dumps(await sdk_final_message(transcript(name))).encode()
    headers = {"content-type": "application/json", "request-id": "req_json"}
    async with ReplayServer([Reply([body], headers=headers)]) as server:
        provider, transport = loopback_provider(server)
        turn = await provider.request(SURFACE)
        await provider.aclose()
    assert turn == streamed
    assert "stream" not in server.bodies[0]
    transport.tallies[0].assert_fully_read(body)


@pytest.mark.parametrize("name", ["thinking_text.sse", "tool_use.sse", "redacted.sse"])
async def test_sdk_and_adapter_agree_on_every_block(name: str) -> None:
    message = await sdk_final_message(transcript(name))
    turn = await replay(name, split_events(transcript(name)))
    sdk_blocks = [b for b in message["content"] if isinstance(b, dict)]
    ours = [dict(c.data) for c in turn.continuity]
    assert ours == [b for b in sdk_blocks if b["type"] in ("thinking", "redacted_thinking")]
    assert turn.text == "".join(str(b["text"]) for b in sdk_blocks if b["type"] == "text")
    sdk_calls = [(b["id"], b["name"], b["input"]) for b in sdk_blocks if b["type"] == "tool_use"]
    assert [(c.call_id, c.name, c.arguments) for c in turn.tool_calls] == sdk_calls


# --------------------------------------------------------------------------- errors and cuts


async def test_in_stream_error_event_keeps_the_partial_turn() -> None:
    with pytest.raises(ProviderStreamError) as info:
        await replay("error_event.sse", split_events(transcript("error_event.sse")))
    error = info.value
    assert (error.error_type, error.message) == ("overloaded_error", "Overloaded")
    assert error.request_id == "req_011CErrInStream5"
    assert error.status is None  # the HTTP status was 200; the failure came inside the stream
    assert error.partial is not None and not error.partial.complete
    assert error.partial.reasoning_text == "Let me think about the migration order"
    assert error.partial.continuity == ()  # no signature arrived: nothing replayable


def _events(name: str) -> list[bytes]:
    return split_events(transcript(name))


async def _fail(pieces: list[bytes], **kw: object) -> ProviderError:
    transport = mock_transport(pieces, **kw)  # type: ignore[arg-type]
    provider = provider_with(transport)
    with pytest.raises(ProviderError) as info:
        await stream_llm_turn(provider, SURFACE)
    await provider.aclose()
    return info.value


@pytest.mark.parametrize(
    ("upto", "arguments"),
    [
        (17, '{"format": "iso", "inclu'),  # cut inside the JSON: kept as it came
        (18, '{"format":"iso","include_region":true}'),  # every piece arrived, no block stop
    ],
)
async def test_cut_inside_a_tool_call_keeps_the_argument_fragments(
    upto: int, arguments: str
) -> None:
    events = _events("tool_use.sse")[:upto]
    error = await _fail(events, error=httpx.RemoteProtocolError("peer closed connection"))
    assert isinstance(error, ProviderStreamError)
    assert error.partial is not None and not error.partial.complete
    (call,) = error.partial.tool_calls
    assert (call.name, call.arguments_json) == ("get_user_country", arguments)


async def test_malformed_json_chunk_is_a_typed_error_with_the_partial() -> None:
    events = _events("thinking_text.sse")
    events[5] = events[5].replace(b'"thinking":"', b'"thinking":', 1)
    error = await _fail(events)
    assert isinstance(error, MalformedResponseError)
    assert "malformed JSON" in error.message
    assert error.partial is not None
    assert error.partial.reasoning_text == "The user wants to know why bread dough rises."


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        (b'"index":0,"delta"', b'"delta"', "'index'"),
        (b'"thinking":" Yeast ferments sugars"', b'"thinking":7', "must be a string"),
        (b'"thinking_delta","thinking":" Yeast', b'"thinking_delta","x":" Yeast', "'thinking'"),
    ],
)
async def test_missing_or_mistyped_field_is_malformed(old: bytes, new: bytes, why: str) -> None:
    events = [e.replace(old, new) if b" Yeast" in e else e for e in _events("thinking_text.sse")]
    error = await _fail(events)
    assert isinstance(error, MalformedResponseError)
    assert why in error.message
    assert error.partial is not None and error.partial.reasoning_text.startswith("The user wants")


async def test_message_delta_without_output_tokens_is_malformed() -> None:
    events = [e.replace(b',"output_tokens":131', b"") for e in _events("thinking_text.sse")]
    error = await _fail(events)
    assert isinstance(error, MalformedResponseError) and "output_tokens" in error.message


async def test_events_before_message_start_or_for_unknown_blocks_are_malformed() -> None:
    events = _events("thinking_text.sse")
    assert isinstance(await _fail(events[1:]), MalformedResponseError)
    orphan = [*events[:3], events[3].replace(b'"index":0', b'"index":9'), *events[4:]]
    error = await _fail(orphan)
    assert isinstance(error, MalformedResponseError) and "never started" in error.message


async def test_wrong_content_type_is_malformed() -> None:
    headers = {"content-type": "application/json", "request-id": "req_ct"}
    error = await _fail([b'{"type":"message"}'], headers=headers)
    assert isinstance(error, MalformedResponseError)
    assert "text/event-stream" in error.message and error.request_id == "req_ct"


async def test_stream_ending_before_message_stop_is_a_stream_error() -> None:
    events = _events("thinking_text.sse")
    error = await _fail(events[:-2])  # drops message_delta and message_stop
    assert isinstance(error, ProviderStreamError)
    assert "before message_stop" in error.message and error.request_id == "req_replay_1"
    assert error.partial is not None
    assert error.partial.text == EXPECTED["thinking_text.sse"].text
    assert error.partial.finish_reason is None


_FULL: dict[str, Turn] = {}


async def full_turn(name: str) -> Turn:
    if name not in _FULL:
        _FULL[name] = await replay(name, split_events(transcript(name)))
    return _FULL[name]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["thinking_text.sse", "tool_use.sse", "redacted.sse"]),
    fraction=st.floats(min_value=0.0, max_value=1.0),
    broken=st.booleans(),
)
async def test_cut_anywhere_never_escapes_and_keeps_a_prefix(
    name: str, fraction: float, broken: bool
) -> None:
    data = transcript(name)
    offset = int(len(data) * fraction)
    error = httpx.RemoteProtocolError("peer closed connection") if broken else None
    transport = mock_transport([data[:offset]], error=error)
    provider = provider_with(transport)
    full = await full_turn(name)
    try:
        turn = await stream_llm_turn(provider, SURFACE)
    except ProviderError as exc:
        assert isinstance(exc, ProviderStreamError | MalformedResponseError)
        assert exc.partial is not None and not exc.partial.complete
        turn = exc.partial
    else:
        assert turn == full  # only a cut after message_stop's data line can still complete
    finally:
        await provider.aclose()
    assert full.reasoning_text.startswith(turn.reasoning_text)
    assert full.text.startswith(turn.text)
    for block in turn.continuity:
        assert block in full.continuity  # a continuity block is never half a block


@pytest.mark.parametrize(
    ("raw", "normalized"), sorted(i for i in STOP_REASONS.items() if i[0] != "pause_turn")
)
async def test_every_stop_reason_is_mapped_and_kept(raw: str, normalized: str) -> None:
    events = [e.replace(b'"end_turn"', f'"{raw}"'.encode()) for e in _events("thinking_text.sse")]
    turn = await replay_pieces(events)
    assert (turn.finish_reason, turn.raw_finish_reason) == (normalized, raw)


def test_a_pause_turn_answer_leaves_the_turn_open() -> None:
    """``pause_turn`` is not the end of the turn: the capture emits no finish and the adapter
    continues the turn (test_anthropic_pause)."""
    capture = AnthropicCapture("claude-sonnet-4-5", kind="summary")
    chunks = capture.whole(
        {
            "content": [{"type": "text", "text": "Searching"}],
            "stop_reason": "pause_turn",
            "usage": {"output_tokens": 3},
        }
    )
    assert capture.stop_reason == "pause_turn" and STOP_REASONS["pause_turn"] == "pause"
    assert not any(isinstance(c, FinishChunk) for c in chunks)
    assert TurnAccumulator().feed_all(chunks).partial().text == "Searching"


async def test_an_unknown_stop_reason_is_other_and_kept() -> None:
    events = [e.replace(b'"end_turn"', b'"new_reason"') for e in _events("thinking_text.sse")]
    turn = await replay_pieces(events)
    assert (turn.finish_reason, turn.raw_finish_reason) == ("other", "new_reason")


async def replay_pieces(pieces: list[bytes]) -> Turn:
    provider = provider_with(mock_transport(pieces))
    try:
        return await stream_llm_turn(provider, SURFACE)
    finally:
        await provider.aclose()


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(),
    thinking=st.booleans(),
    index=st.integers(min_value=0, max_value=10_000),
    pad=st.text(alphabet=" \t", max_size=16),
    ascii_only=st.booleans(),
)
def test_delta_lines_read_as_json_loads_reads_them(
    text: str, thinking: bool, index: int, pad: str, ascii_only: bool
) -> None:
    """Whatever path a delta line takes (the compiled fast path or json.loads), same result."""
    kind, field = ("thinking_delta", "thinking") if thinking else ("text_delta", "text")
    block = (
        {"type": "thinking", "thinking": "", "signature": ""}
        if thinking
        else {"type": "text", "text": ""}
    )
    start = {"type": "content_block_start", "index": index, "content_block": block}
    delta = {"type": "content_block_delta", "index": index, "delta": {"type": kind, field: text}}
    data = json.dumps(delta, separators=(",", ":"), ensure_ascii=ascii_only)[:-1] + pad + "}"
    capture = AnthropicCapture("m", kind="summary")
    messages = [
        SSEMessage("message_start", '{"type":"message_start","message":{}}'),
        SSEMessage("content_block_start", json.dumps(start)),
        SSEMessage("content_block_delta", data),
    ]
    chunks = capture.feed(messages)
    assert capture.failure is None
    assert "".join(getattr(c, "text", "") for c in chunks) == text
    assert all(getattr(c, "index", index) == index for c in chunks)
    assert all(isinstance(c, ReasoningDelta if thinking else TextDelta) for c in chunks)
    broken = SSEMessage("content_block_delta", data.replace('"index"', '"Index"'))
    other = AnthropicCapture("m", kind="summary")
    other.feed([*messages[:2], broken])
    assert isinstance(other.failure, MalformedResponseError)  # not accepted by the fast path either


async def test_deltas_of_one_read_are_merged_and_no_read_waits_for_the_next() -> None:
    async def thinking_chunks(pieces: list[bytes]) -> list[str]:
        seen: list[str] = []

        async def record(chunk: object) -> None:
            if isinstance(chunk, ReasoningDelta) and chunk.text:
                seen.append(chunk.text)

        provider = provider_with(mock_transport(pieces))
        await stream_llm_turn(provider, SURFACE, record)
        await provider.aclose()
        return seen

    events = _events("thinking_text.sse")
    per_event = await thinking_chunks(events)
    assert len(per_event) == 6  # one chunk per thinking_delta when each arrives on its own
    whole = await thinking_chunks([b"".join(events)])
    assert whole == ["".join(per_event)]  # one read, one merged chunk, the same text


async def test_a_later_signature_delta_replaces_the_earlier_one() -> None:
    events = _events("thinking_text.sse")
    at = next(i for i, e in enumerate(events) if b"signature_delta" in e)
    stale = events[at].replace(SIG1.encode(), b"EqStaleSignature==")
    turn = await replay_pieces([*events[:at], stale, *events[at:]])
    (block,) = turn.continuity
    assert block.data["signature"] == SIG1 == turn.reasoning_parts[0].signature

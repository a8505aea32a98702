"""OpenRouter adapter: recorded transcripts, request shaping per mode, continuity, errors, emulator."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support.provider_conformance import Emulated
from support.replay import (
    CHUNKINGS,
    Replay,
    fixture,
    make,
    run_tool_loop,
    streamed,
    turn_request,
)

from thoughtgate.errors import (
    ConfigError,
    MalformedResponseError,
    ProviderHTTPError,
    ProviderStreamError,
)
from thoughtgate.providers.base import ProviderSettings, create_provider
from thoughtgate.providers.openrouter import CARRIER, OpenRouterProvider
from thoughtgate.testing.emulator import EmulatorServer
from thoughtgate.types import (
    ContinuityBlock,
    Message,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

ANTHROPIC = "anthropic/claude-sonnet-4.5"
SIG = (
    "Et0BCkgICxACGAIqQNnFzt8yP0rYkq3a1mXx7QzW2bTn5cVd4eRf6gHj8iKl9oPm0qRs1tUv2wXy3zA4bC5dE6fG7hI8jK9l"
    "M0nO1pQ2EgxKR3z0aX5Yb6Wc7VdGgwQ8jN4mT2pL9sR1uKjAiMFfYx"
)


#: The transcripts were recorded on openrouter.ai, which vouches for its summaries (ADR 0078).
ON_OPENROUTER: dict[str, Any] = {"thoughtgate": {"server": "openrouter"}}


def replay_provider(name: str, *, chunking: str = "whole", model: str = ANTHROPIC, **kw: Any):
    replay = Replay(fixture(f"openrouter/{name}"), chunking=chunking, **kw)
    return make(OpenRouterProvider, model, replay, **ON_OPENROUTER), replay


# --------------------------------------------------------------------------- transcripts


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_anthropic_thinking_transcript(chunking: str) -> None:
    provider, replay = replay_provider("anthropic_thinking.sse", chunking=chunking)
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    (reasoning,) = turn.reasoning_parts
    assert reasoning.text == "This is simple arithmetic: 2 + 2."
    # Claude 4.5's thinking is a summary, via OpenRouter as directly (the Anthropic family row)
    assert (reasoning.reasoning_kind, reasoning.index, reasoning.signature) == ("summary", 0, SIG)
    assert turn.text == "2 + 2 = 4"
    assert turn.finish_reason == "stop" and turn.raw_finish_reason == "stop"
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.usage.reasoning_tokens) == (
        43,
        36,
        13,
    )
    (block,) = turn.continuity
    assert block.carrier == CARRIER and (block.provider, block.model) == ("openrouter", ANTHROPIC)
    assert block.data == {
        "reasoning_details": [
            {
                "type": "reasoning.text",
                "text": "This is simple arithmetic: 2 + 2.",
                "signature": SIG,
                "format": "anthropic-claude-v1",
                "index": 0,
            }
        ]
    }
    # parts keep their arrival order: reasoning, answer, then the continuity block
    assert [p.kind for p in turn.parts] == ["reasoning", "text", "continuity"]


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_summary_and_encrypted_details_share_an_index_without_double_counting(
    chunking: str,
) -> None:
    provider, replay = replay_provider(
        "gpt5mini_summary_tool_call.sse", chunking=chunking, model="openai/gpt-5-mini"
    )
    turn = await streamed(provider, turn_request(tools=True))
    replay.assert_fully_read()
    summary, encrypted = turn.reasoning_parts
    # delta.reasoning mirrors the summary text: counted once
    assert (
        summary.text
        == "**Checking the weather**\n\nI need the forecast for Paris before answering."
    )
    assert summary.reasoning_kind == "summary"
    assert (encrypted.reasoning_kind, encrypted.text, encrypted.index) == ("encrypted", "", 0)
    (call,) = turn.tool_calls
    assert (call.call_id, call.name, call.arguments) == (
        "call_Qm8Xb2pLk9",
        "get_weather",
        {"city": "Paris"},
    )
    assert turn.finish_reason == "tool_calls" and turn.usage.reasoning_tokens == 704
    details = turn.continuity[0].data["reasoning_details"]
    assert [d["type"] for d in details] == ["reasoning.summary", "reasoning.encrypted"]
    assert details[0]["summary"] == summary.text
    assert details[1]["id"] == "rs_0e67c3a1b2d4f5e6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2"


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_gemini_text_and_encrypted_under_one_index(chunking: str) -> None:
    provider, replay = replay_provider(
        "gemini_shared_index.sse", chunking=chunking, model="google/gemini-3-pro-preview"
    )
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    kinds = [(p.reasoning_kind, p.index, p.text) for p in turn.reasoning_parts]
    assert kinds == [("raw", 0, "Let me think about primes."), ("encrypted", 0, "")]
    assert turn.text == "7 is prime."
    assert len(turn.continuity[0].data["reasoning_details"]) == 2


async def test_plain_reasoning_string_is_captured_when_no_details_come() -> None:
    provider, replay = replay_provider("reasoning_string_only.sse", model="z-ai/glm-4.6")
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    assert turn.reasoning_text == "The user greets me; reply kindly."
    assert turn.text == "Hello!" and turn.continuity == ()
    assert turn.usage.reasoning_tokens == 0  # reported as 0 although text came: not reliable


async def test_hidden_mode_captures_nothing_even_if_reasoning_arrives() -> None:
    """Hidden mode switches Claude's thinking off (``effort: none``); thinking that arrives anyway
    is no reasoning part, while its details stay in memory: Anthropic demands them back in a
    tool loop whenever thinking happened."""
    provider, replay = replay_provider("anthropic_thinking.sse", chunking="random")
    turn = await streamed(provider, turn_request("hidden"))
    replay.assert_fully_read()
    assert turn.reasoning_parts == () and turn.reasoning_text == ""
    assert [b.carrier for b in turn.continuity] == ["openrouter.reasoning_details"]
    assert turn.text == "2 + 2 = 4"
    assert replay.requests[0]["reasoning"] == {"effort": "none"}
    # a model without that requirement keeps nothing at all
    provider, replay = replay_provider("gemini_shared_index.sse", model="google/gemini-3-pro")
    turn = await streamed(provider, turn_request("hidden"))
    replay.assert_fully_read()
    assert turn.reasoning_parts == () and turn.continuity == ()
    assert replay.requests[0]["reasoning"] == {"exclude": True}


async def test_non_streamed_body_keeps_the_exact_detail_list() -> None:
    raw = fixture("openrouter/gpt5mini_nonstream.json")
    replay = Replay(raw, content_type="application/json")
    provider = make(OpenRouterProvider, "openai/gpt-5-mini", replay, **ON_OPENROUTER)
    turn = await provider.request(turn_request())
    replay.assert_fully_read()
    assert replay.requests[0]["stream"] is False and "stream_options" not in replay.requests[0]
    message = json.loads(raw)["choices"][0]["message"]
    assert turn.continuity[0].data == {"reasoning_details": message["reasoning_details"]}
    assert turn.reasoning_text == message["reasoning"]  # from the summary detail, not doubled
    assert turn.text == message["content"]
    assert turn.raw_finish_reason == "stop" and turn.usage.output_tokens == 1457


# --------------------------------------------------------------------------- failures


async def test_in_stream_error_keeps_the_partial_turn() -> None:
    provider, replay = replay_provider("mid_stream_error.sse", chunking="bytes")
    with pytest.raises(ProviderStreamError) as info:
        await streamed(provider, turn_request())
    replay.assert_fully_read(to_eof=False)  # the error is the transcript's last event
    err = info.value
    assert err.error_type == "server_error"
    assert err.message == "Provider disconnected unexpectedly"
    assert err.request_id == "req_replay_0001"
    assert err.partial is not None and not err.partial.complete
    assert err.partial.reasoning_text == "Working on it" and err.partial.text == "Partial ans"


async def test_stream_without_done_is_a_cut_stream() -> None:
    provider, replay = replay_provider("no_done.sse", model="openai/gpt-5-mini")
    with pytest.raises(ProviderStreamError, match=r"\[DONE\]") as info:
        await streamed(provider, turn_request())
    replay.assert_fully_read()
    assert info.value.partial is not None and info.value.partial.text == "Hi"


async def test_connection_dropped_mid_body() -> None:
    data = fixture("openrouter/anthropic_thinking.sse")
    replay = Replay(data, chunking="random", cut_after=len(data) // 2)
    provider = make(OpenRouterProvider, ANTHROPIC, replay, **ON_OPENROUTER)
    with pytest.raises(ProviderStreamError, match="cut") as info:
        await streamed(provider, turn_request())
    assert info.value.partial is not None
    assert info.value.partial.reasoning_text.startswith("This")


async def test_malformed_chunk_is_typed_and_keeps_partial() -> None:
    good = fixture("openrouter/reasoning_string_only.sse").split(b"\n\n")
    data = b"\n\n".join([*good[:3], b"data: {not json", *good[3:]])
    replay = Replay(data)
    provider = make(OpenRouterProvider, "z-ai/glm-4.6", replay, **ON_OPENROUTER)
    with pytest.raises(MalformedResponseError) as info:
        await streamed(provider, turn_request())
    assert info.value.partial is not None
    assert info.value.partial.reasoning_text == "The user greets me; reply kindly."


async def test_wrong_content_type_is_malformed() -> None:
    replay = Replay(b'{"ok": true}', content_type="application/json")
    provider = make(OpenRouterProvider, ANTHROPIC, replay, **ON_OPENROUTER)
    with pytest.raises(MalformedResponseError, match="text/event-stream"):
        await streamed(provider, turn_request())


async def test_http_error_body_is_mapped() -> None:
    body = {
        "error": {
            "message": "Provider returned error",
            "code": 400,
            "metadata": {"raw": '{"error":{"message":"bad thing"}}', "provider_name": "Anthropic"},
        }
    }
    replay = Replay(json.dumps(body).encode(), status=400, content_type="application/json")
    provider = make(OpenRouterProvider, ANTHROPIC, replay, **ON_OPENROUTER)
    with pytest.raises(ProviderHTTPError) as info:
        await streamed(provider, turn_request())
    err = info.value
    assert (err.status, err.error_type, err.request_id) == (400, "400", "req_replay_0001")
    assert err.message == 'Provider returned error: {"error":{"message":"bad thing"}}'
    assert not err.retryable


# --------------------------------------------------------------------------- request shaping


def body_for(request: Any, *, model: str = ANTHROPIC, **extra: Any) -> dict[str, Any]:
    settings = ProviderSettings(base_url="http://x.invalid/v1", api_key="k", extra=extra)
    return OpenRouterProvider(model, settings).build_body(request, stream=True)


@pytest.mark.parametrize(
    ("model", "mode", "kw", "expected", "on_top"),
    [
        # Claude families that take a budget: the Anthropic adapter's budget, on top
        (ANTHROPIC, "hidden", {}, {"effort": "none"}, 0),
        (ANTHROPIC, "hidden", {"effort": "high"}, {"effort": "none"}, 0),
        (ANTHROPIC, "surface", {}, {"max_tokens": 4096}, 4096),
        (ANTHROPIC, "surface", {"effort": "low"}, {"max_tokens": 2048}, 2048),
        (ANTHROPIC, "telemetry_only", {"budget_tokens": 2000, "effort": "high"}, None, 2000),
        # adaptive Claude: an effort, nothing on top
        ("anthropic/claude-opus-4.7", "surface", {"effort": "max"}, {"effort": "xhigh"}, 0),
        ("anthropic/claude-opus-4.7", "hidden", {}, {"effort": "none"}, 0),
        # Claude that thinks unasked and refuses `disabled`: no parameter at all in hidden mode
        ("anthropic/claude-fable-5", "hidden", {}, "absent", 0),
        # others
        ("deepseek/deepseek-r1", "hidden", {}, {"exclude": True}, 0),
        ("deepseek/deepseek-r1", "surface", {}, {"enabled": True}, 0),
        ("deepseek/deepseek-r1", "telemetry_only", {"effort": "low"}, {"effort": "low"}, 0),
        ("deepseek/deepseek-r1", "surface", {"budget_tokens": 2000}, {"max_tokens": 2000}, 2000),
        ("openai/o3", "hidden", {}, {"exclude": True}, 0),
        ("z-ai/glm-4.6", "hidden", {}, {"enabled": False}, 0),
    ],
)
def test_reasoning_parameter_per_mode(
    model: str, mode: str, kw: dict[str, Any], expected: Any, on_top: int
) -> None:
    body = body_for(turn_request(mode, **kw), model=model)
    if expected == "absent":
        assert "reasoning" not in body
    else:
        assert body["reasoning"] == (expected or {"max_tokens": kw.get("budget_tokens")})
        assert body["reasoning"] != {}  # an empty object is a no-op on OpenRouter
    # OpenRouter counts reasoning inside max_tokens: a budget comes on top of the turn's room,
    # as the Anthropic adapter adds it, so the answer keeps the same room on both routes
    assert body["max_tokens"] == 4096 + on_top
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == model and body["messages"][-1]["role"] == "user"


def test_settings_extra_is_merged_and_none_removes() -> None:
    body = body_for(turn_request(), provider={"order": ["Anthropic"]}, stream_options=None)
    assert body["provider"] == {"order": ["Anthropic"]} and "stream_options" not in body


def _loop_history(*, block_model: str = ANTHROPIC) -> list[Message]:
    details = {"reasoning_details": [{"type": "reasoning.text", "text": "t", "signature": "s"}]}
    assistant = Message(
        "assistant",
        (
            ReasoningPart("secret chain of thought", provider="openrouter", model=block_model),
            TextPart("Looking it up."),
            ToolCallPart("call_1", "get_country", "{}"),
            ContinuityBlock(CARRIER, details, provider="openrouter", model=block_model),
        ),
    )
    return [
        Message.user("Where?"),
        assistant,
        Message("tool", (ToolResultPart("call_1", "Mexico"),)),
    ]


def test_details_go_back_unmodified_on_the_tool_call_turn() -> None:
    body = body_for(turn_request(messages=_loop_history(), tools=True))
    _user, assistant, tool = body["messages"]
    assert assistant == {
        "role": "assistant",
        "content": "Looking it up.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_country", "arguments": "{}"},
            }
        ],
        "reasoning_details": [{"type": "reasoning.text", "text": "t", "signature": "s"}],
    }
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "Mexico"}
    assert "secret chain of thought" not in json.dumps(body)


def test_details_from_another_model_or_an_earlier_loop_stay_home() -> None:
    body = body_for(turn_request(messages=_loop_history(block_model="openai/gpt-5"), tools=True))
    assert "reasoning_details" not in body["messages"][1]
    later = [
        *_loop_history(),
        Message("assistant", (TextPart("Mexico City."),)),
        Message.user("And?"),
    ]
    body = body_for(turn_request(messages=later, tools=True))
    assert all("reasoning_details" not in m for m in body["messages"])


def test_configuration() -> None:
    with pytest.raises(ConfigError, match="OPENROUTER_API_KEY"):
        OpenRouterProvider(ANTHROPIC, ProviderSettings())
    provider = create_provider(f"openrouter:{ANTHROPIC}", ProviderSettings(api_key="k"))
    assert isinstance(provider, OpenRouterProvider)
    assert (
        provider.transport.url("chat/completions")
        == "https://openrouter.ai/api/v1/chat/completions"
    )


def test_base_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENROUTER_BASE_URL", "http://127.0.0.1:9/api/v1/")
    monkeypatch.setenv("OPENROUTER_API_KEY", "from-env")
    provider = OpenRouterProvider(ANTHROPIC, ProviderSettings())
    assert (
        provider.transport.url("chat/completions") == "http://127.0.0.1:9/api/v1/chat/completions"
    )
    assert provider.transport._headers["authorization"] == "Bearer from-env"


# --------------------------------------------------------------------------- against the emulator


@pytest.fixture
async def emulated(server: EmulatorServer) -> AsyncIterator[Callable[..., Any]]:
    """Adapters pointed at the emulator (closed after the test)."""
    flavor = {"x-emulator-flavor": "openrouter"}
    adapters = Emulated(server, f"openrouter:{ANTHROPIC}", headers=flavor)
    yield lambda scenario, **kw: adapters(scenario, **kw)[0]
    await adapters.aclose()


async def test_tool_loop_round_trips_signed_details(server: EmulatorServer, emulated: Any) -> None:
    turns = await run_tool_loop(emulated("tool-loop"))
    assert [t.finish_reason for t in turns] == ["tool_calls", "tool_calls", "stop"]
    assert turns[-1].text == "The largest city in your country is Mexico City."
    assert all(p.signature for t in turns for p in t.reasoning_parts)
    sent = server.emulator.bodies("/chat/completions")[-1]["messages"]
    assert sent[1]["reasoning_details"] == dict(turns[0].continuity[0].data)["reasoning_details"]


async def test_emulator_rejects_a_loop_without_details(
    server: EmulatorServer, emulated: Any
) -> None:
    provider = emulated("tool-loop")
    first = await streamed(provider, turn_request(tools=True))
    stripped = Message("assistant", tuple(p for p in first.parts if p.kind != "continuity"))
    history = [
        Message.user("Q"),
        stripped,
        Message("tool", (ToolResultPart(first.tool_calls[0].call_id, "MX"),)),
    ]
    with pytest.raises(ProviderHTTPError) as info:
        await streamed(provider, turn_request(messages=history, tools=True))
    assert info.value.status == 400
    assert info.value.message.startswith("Provider returned error: ")
    assert "Expected `thinking` or `redacted_thinking`, but found `tool_use`" in info.value.message


async def test_emulator_rejects_tampered_details(server: EmulatorServer, emulated: Any) -> None:
    provider = emulated("tool-loop")
    first = await streamed(provider, turn_request(tools=True))
    block = first.continuity[0]
    details = [dict(d) for d in block.data["reasoning_details"]]
    details[0]["text"] += " (edited)"
    forged = ContinuityBlock(
        CARRIER, {"reasoning_details": details}, provider="openrouter", model=ANTHROPIC
    )
    parts = tuple(forged if p is block else p for p in first.parts)
    call = first.tool_calls[0].call_id
    history = [
        Message.user("Q"),
        Message("assistant", parts),
        Message("tool", (ToolResultPart(call, "MX"),)),
    ]
    with pytest.raises(ProviderHTTPError) as info:
        await streamed(provider, turn_request(messages=history, tools=True))
    assert info.value.status == 400
    assert "Invalid `signature` in `thinking` block" in info.value.message


async def test_cut_and_stream_error_from_the_emulator(
    server: EmulatorServer, emulated: Any
) -> None:
    with pytest.raises(ProviderStreamError, match="cut") as info:
        await streamed(emulated("cut"), turn_request())
    assert info.value.partial is not None
    assert (info.value.partial.reasoning_text, info.value.partial.text) == (
        "Partial reasoning",
        "Partial ans",
    )
    with pytest.raises(ProviderStreamError) as info:
        await streamed(emulated("stream-error"), turn_request())
    assert (info.value.error_type, info.value.message) == ("overloaded_error", "Overloaded")
    assert info.value.partial is not None and info.value.partial.reasoning_text == "Halfway"

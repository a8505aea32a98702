"""Transcripts in the exact wire shapes of recordings of the live APIs (origins in each fixture
folder's ``ORIGINS.md``), replayed through the real adapters and HTTP client in several chunkings;
every replay must read its transcript to the last byte.

One test per edge the recordings show: nested Responses errors, a model that does not reason,
reasoning parameters refused, OpenRouter's error chunk that carries usage, OpenRouter's hidden
switches accepted and refused, Groq's raw ``<think>`` and its usage in the finish chunk, Groq's and
Cerebras's ``reasoning`` field, xAI's usage on every chunk with reasoning apart from completion,
Kimi's and Groq's 400s about ``reasoning_content``, an Anthropic ``pause_turn`` with server tool
blocks, and a Claude tool call with fields the SDK types do not know yet.
"""

from __future__ import annotations

import json

import pytest
from support.replay import (
    CHUNKINGS,
    Replay,
    fixture,
    make,
    streamed,
    turn_request,
)

from thoughtgate.errors import ProviderHTTPError, ProviderStreamError
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.types import Message, ToolResultPart

JSON = "application/json"


def replay(
    name: str, *, chunking: str = "whole", status: int = 200, content_type: str | None = None
) -> Replay:
    kind = content_type or (JSON if name.endswith(".json") else "text/event-stream; charset=utf-8")
    return Replay(fixture(name), chunking=chunking, status=status, content_type=kind)


# --------------------------------------------------------------------------- OpenAI Responses


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_nested_error_event_keeps_message_type_code_and_request_id(chunking: str) -> None:
    rp = replay("openai_responses/error_event_nested.sse", chunking=chunking)
    provider = make(OpenAIResponsesProvider, "gpt-5", rp)
    with pytest.raises(ProviderStreamError) as info:
        await streamed(provider, turn_request())
    rp.assert_fully_read()  # the response.failed after the error is read too
    err = info.value
    assert err.message.startswith("You exceeded your current quota, please check your plan")
    assert (err.error_type, err.code, err.request_id) == (
        "insufficient_quota",
        "insufficient_quota",
        "req_replay_0001",
    )
    assert err.status is None  # the HTTP status said 200
    assert err.partial is not None and err.partial.text == "" and not err.partial.complete


async def test_a_model_that_does_not_reason_gets_no_reasoning_parameter() -> None:
    rp = replay("openai_responses/gpt41_function_call.json")
    provider = make(OpenAIResponsesProvider, "gpt-4.1", rp)
    turn = await provider.request(turn_request("surface", tools=True, effort="high"))
    rp.assert_fully_read()
    assert "reasoning" not in rp.requests[0] and "include" not in rp.requests[0]
    (call,) = turn.tool_calls
    assert call.name == "get_country" and turn.reasoning_parts == () and turn.continuity == ()
    assert (turn.usage.output_tokens, turn.usage.reasoning_tokens) == (11, 0)


async def test_refused_reasoning_parameter_is_a_clear_error() -> None:
    rp = replay("openai_responses/reasoning_effort_refused.json", status=400)
    forced = {"rules": {"surface": {"reasoning": {"effort": "high"}}}}
    provider = make(OpenAIResponsesProvider, "gpt-4o", rp, thoughtgate=forced)
    with pytest.raises(ProviderHTTPError) as info:
        await streamed(provider, turn_request())
    err = info.value
    assert (err.status, err.error_type, err.code) == (
        400,
        "invalid_request_error",
        "unsupported_parameter",
    )
    assert (
        err.message == "Unsupported parameter: 'reasoning.effort' is not supported with this model."
    )
    assert "unsupported_parameter" in str(err) and "req_replay_0001" in str(err)


# --------------------------------------------------------------------------- OpenRouter


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_openrouter_error_chunk_keeps_its_usage(chunking: str) -> None:
    """The recorded shape: reasoning, ``finish_reason: "length"``, then a chunk with the error
    *and* the usage (OpenRouter bills the failed request), then ``[DONE]``."""
    rp = replay("openrouter/error_with_usage.sse", chunking=chunking)
    provider = make(OpenRouterProvider, "minimax/minimax-m2", rp)
    with pytest.raises(ProviderStreamError) as info:
        await streamed(provider, turn_request())
    rp.assert_fully_read()
    err = info.value
    assert (err.message, err.code, err.request_id) == (
        "Token limit reached",
        "400",
        "req_replay_0001",
    )
    partial = err.partial
    assert partial is not None and partial.text == ""
    assert partial.reasoning_text == "Weighing the two routes first"
    usage = partial.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (31, 12, 12)


async def test_openrouter_hidden_switch_refused_on_o3_as_recorded() -> None:
    rp = replay("openrouter/o3_effort_none_refused.json", status=400)
    forced = {"rules": {"hidden": {"reasoning": {"effort": "none"}}}}
    provider = make(OpenRouterProvider, "openai/o3", rp, thoughtgate=forced)
    with pytest.raises(ProviderHTTPError) as info:
        await streamed(provider, turn_request("hidden"))
    assert rp.requests[0]["reasoning"] == {"effort": "none"}
    err = info.value
    assert err.status == 400 and err.code == "400"
    assert (
        "Unsupported value: 'none' is not supported with the 'o3-2025-04-16' model." in err.message
    )
    # the row itself never sends it: o3 cannot switch reasoning off, so hidden mode excludes it
    accepted = replay("openrouter/sonnet_effort_none.json")
    plain = make(OpenRouterProvider, "openai/o3", accepted)
    await plain.request(turn_request("hidden"))
    assert accepted.requests[0]["reasoning"] == {"exclude": True}


async def test_openrouter_hidden_switch_accepted_on_claude() -> None:
    rp = replay("openrouter/sonnet_effort_none.json")
    provider = make(OpenRouterProvider, "anthropic/claude-sonnet-4.5", rp)
    turn = await provider.request(turn_request("hidden"))
    rp.assert_fully_read()
    assert rp.requests[0]["reasoning"] == {"effort": "none"}
    assert turn.text == "Blue." and turn.reasoning_parts == () and turn.continuity == ()
    assert turn.usage.reasoning_tokens == 0, "no thinking billed"


# --------------------------------------------------------------------------- Groq, Cerebras, xAI


GROQ = {"server": "groq"}


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_groq_raw_think_and_usage_in_the_finish_chunk(chunking: str) -> None:
    rp = replay("compat/groq_qwen3_raw_think.sse", chunking=chunking)
    provider = make(OpenAICompatibleProvider, "qwen/qwen3-32b", rp, thoughtgate=GROQ)
    turn = await streamed(provider, turn_request())
    rp.assert_fully_read()
    assert rp.requests[0]["reasoning_format"] == "parsed"
    assert turn.reasoning_text == "Okay, the user wants a sky color."
    assert turn.text == "Blue, mostly."
    usage = turn.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (21, 19, 12)


async def test_groq_hidden_mode_switches_qwen3_off_and_keeps_tags_out() -> None:
    rp = replay("compat/groq_qwen3_raw_think.sse", chunking="random")
    provider = make(OpenAICompatibleProvider, "qwen/qwen3-32b", rp, thoughtgate=GROQ)
    turn = await streamed(provider, turn_request("hidden"))
    rp.assert_fully_read()
    assert rp.requests[0]["reasoning_effort"] == "none"
    assert turn.reasoning_parts == () and turn.text == "Blue, mostly."


async def test_groq_reasoning_field_never_goes_back() -> None:
    rp = replay("compat/groq_gpt_oss_tool_call.json")
    provider = make(OpenAICompatibleProvider, "openai/gpt-oss-120b", rp, thoughtgate=GROQ)
    turn = await provider.request(turn_request(tools=True))
    assert turn.reasoning_text.startswith("The user asks for the largest city")
    (call,) = turn.tool_calls
    assert call.name == "get_country" and turn.continuity == ()
    history = [Message.user("Largest city?"), turn.as_message()]
    history.append(Message("tool", (ToolResultPart(call.call_id, "Mexico"),)))
    body = provider.build_body(turn_request("surface", history, tools=True), stream=True)
    assert "reasoning" not in json.dumps(body["messages"])
    (sent,) = [m for m in body["messages"] if m["role"] == "assistant"]
    assert set(sent) == {"role", "content", "tool_calls"}, "Groq refuses anything more"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "compat/groq_reasoning_content_refused.json",
            "'messages.1' : for 'role:assistant' the following must be satisfied"
            "[('messages.1' : property 'reasoning_content' is unsupported)]",
        ),
        (
            "compat/kimi_reasoning_content_missing.json",
            "thinking is enabled but reasoning_content is missing in assistant tool call "
            "message at index 1",
        ),
    ],
)
async def test_reasoning_content_400s_are_clear_errors(name: str, message: str) -> None:
    rp = replay(name, status=400)
    provider = make(OpenAICompatibleProvider, "m", rp)
    with pytest.raises(ProviderHTTPError) as info:
        await streamed(provider, turn_request())
    err = info.value
    assert (err.status, err.error_type, err.message) == (400, "invalid_request_error", message)
    assert not err.retryable


async def test_cerebras_reasoning_field() -> None:
    rp = replay("compat/cerebras_gpt_oss.json")
    provider = make(
        OpenAICompatibleProvider, "gpt-oss-120b", rp, thoughtgate={"server": "cerebras"}
    )
    turn = await provider.request(turn_request())
    assert turn.reasoning_text == "Simple question about sky colour. Answer briefly."
    assert turn.text == "The sky is **blue**."
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (70, 31)


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_xai_usage_on_every_chunk_and_reasoning_apart(chunking: str) -> None:
    rp = replay("compat/xai_grok3mini_usage_every_chunk.sse", chunking=chunking)
    provider = make(OpenAICompatibleProvider, "grok-3-mini", rp, thoughtgate={"server": "xai"})
    turn = await streamed(provider, turn_request())
    rp.assert_fully_read()
    assert (turn.reasoning_text, turn.text) == ("First, the sky.", "Blue.")
    # completion_tokens (2) leaves the reasoning (4) out: the output billed is their sum
    assert (turn.usage.output_tokens, turn.usage.reasoning_tokens) == (6, 4)


# --------------------------------------------------------------------------- Anthropic


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_pause_turn_sends_the_paused_blocks_back_and_continues(chunking: str) -> None:
    transport = Replay(
        [fixture("anthropic/pause_turn_1.sse"), fixture("anthropic/pause_turn_2.sse")],
        chunking=chunking,
    )
    settings = ProviderSettings(base_url="http://replay.invalid", api_key="k", max_retries=0)
    provider = AnthropicProvider("claude-sonnet-4-0", settings, client=transport.client())
    turn = await streamed(provider, turn_request())
    transport.assert_fully_read()
    assert turn.text == "Checking the timetable: the next ferry leaves at 9:40."
    assert turn.reasoning_text == (
        "Ferry times change daily; search for today's schedule.\n\nThe result lists 9:40."
    )
    assert (turn.finish_reason, turn.raw_finish_reason) == ("stop", "end_turn")
    assert len(turn.continuity) == 2
    usage = turn.usage
    assert (usage.input_tokens, usage.output_tokens) == (2101 + 2650, 96 + 41)
    first, second = transport.requests
    assert first["messages"] == second["messages"][:-1]
    paused = second["messages"][-1]
    assert paused["role"] == "assistant"
    assert [b["type"] for b in paused["content"]] == [
        "thinking",
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    sent = fixture("anthropic/pause_turn_1.sse").decode()
    thinking, tool_use, result, text = paused["content"]
    assert thinking["signature"] in sent and thinking["thinking"] == (
        "Ferry times change daily; search for today's schedule."
    )
    assert tool_use == {
        "type": "server_tool_use",
        "id": "srvtoolu_01FixtureFerrySearch01",
        "name": "web_search",
        "input": {"query": "ferry schedule today"},
    }
    assert json.dumps(result, separators=(",", ":")) in sent, (
        "the result block goes back as it came"
    )
    assert text == {"type": "text", "text": "Checking the timetable"}


async def test_a_claude_tool_call_with_fields_the_types_do_not_know_yet() -> None:
    rp = replay("anthropic/fable_tool_use_caller.json")
    settings = ProviderSettings(base_url="http://replay.invalid", api_key="k", max_retries=0)
    provider = AnthropicProvider("claude-fable-5", settings, client=rp.client())
    turn = await provider.request(turn_request("hidden", tools=True))
    rp.assert_fully_read()
    assert "thinking" not in rp.requests[0], "Fable refuses the switch: none is sent"
    (call,) = turn.tool_calls
    assert (call.name, call.arguments) == ("largest_city", {"country": "Mexico"})
    assert turn.reasoning_parts == () and turn.usage.reasoning_tokens == 0

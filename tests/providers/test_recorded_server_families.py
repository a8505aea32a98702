"""Together, DashScope (Qwen), LM Studio and Azure OpenAI, in the exact wire shapes of recordings
of their live APIs (origins in ``tests/fixtures/*/ORIGINS.md``), replayed through the real
adapters and HTTP client in several chunkings; every replay must read its transcript to the last
byte, and answer and reasoning come out byte for byte.

The edges these servers show: Azure's filter-only first chunk (``choices: []``, empty ``id``) and
``content_filter_results`` on every choice, Azure's ``content_filters`` on Responses objects;
DashScope's ``reasoning_content`` and usage chunk, its tool-call fragments with ``"id": ""`` and a
trailing empty fragment, its refusal of thinking on a request that is not streamed (also played
by the emulator); Together's usage in a ``choices: []`` chunk with ``reasoning_tokens`` at the top
of ``usage``, and the bare ``<think>`` it sends before its ``reasoning`` deltas; LM Studio's
``<think>`` and ``</think>`` as deltas of their own, tool-call fragments with an empty name, no
usage chunk, its ``reasoning_content``, and its Responses endpoint with raw ``reasoning_text``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx
import pytest
from support.replay import CHUNKINGS, Replay, fixture, streamed, turn_request
from support.sse import json_payloads

from thoughtgate.errors import ProviderHTTPError
from thoughtgate.providers.base import ProviderSettings
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator
from thoughtgate.types import Message, ToolResultPart, Turn, Usage

AZURE = "https://thoughtgate-fixture.openai.azure.com/openai/v1"
TOGETHER = "https://api.together.xyz/v1"
DASHSCOPE = "https://dashscope-intl.aliyuncs.com/compatible-mode/v1"
LM_STUDIO = "http://localhost:1234/v1"


def replay(name: str, *, chunking: str = "whole", status: int = 200) -> Replay:
    kind = "application/json" if name.endswith(".json") else "text/event-stream; charset=utf-8"
    return Replay(fixture(name), chunking=chunking, status=status, content_type=kind)


def at(cls: Any, model: str, base_url: str, rp: Replay, **extra: Any) -> Any:
    """An adapter on ``base_url`` (the server is found from its host) answered by ``rp``."""
    settings = ProviderSettings(base_url=base_url, api_key="k", max_retries=0, extra=extra)
    return cls(model, settings, client=rp.client())


class Replayed(NamedTuple):
    turn: Turn
    sent: dict[str, Any]
    """The request body the adapter sent."""
    provider: Any


async def replayed(
    name: str,
    model: str,
    base_url: str,
    request: Any,
    *,
    chunking: str,
    cls: Any = OpenAICompatibleProvider,
) -> Replayed:
    """One streamed replay, read to the last byte."""
    rp = replay(name, chunking=chunking)
    provider = at(cls, model, base_url, rp)
    turn = await streamed(provider, request)
    rp.assert_fully_read()
    return Replayed(turn, rp.requests[0], provider)


# --------------------------------------------------------------------------- Azure OpenAI


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_azure_chat_filter_chunk_and_content_filter_results(chunking: str) -> None:
    turn, sent, provider = await replayed(
        "compat/azure_chat_content_filters.sse",
        "gpt-5-mini",
        AZURE,
        turn_request(),
        chunking=chunking,
    )
    assert provider.rule.server == "azure"
    assert turn.text == "The Danube flows through ten countries."
    assert turn.reasoning_parts == () and turn.continuity == ()
    assert (turn.finish_reason, turn.raw_finish_reason) == ("stop", "stop")
    usage = turn.usage
    # an OpenAI reasoning model on chat completions: counted and billed, never shown
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (15, 78, 64)
    assert sent["stream_options"] == {"include_usage": True}
    assert not {"reasoning_content", "thinking", "enable_thinking"} & set(sent)


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_azure_deepseek_reasoning_content(chunking: str) -> None:
    turn, sent, _ = await replayed(
        "compat/azure_deepseek_reasoning.sse",
        "deepseek-v4-pro",
        AZURE,
        turn_request(effort="high"),
        chunking=chunking,
    )
    assert sent["reasoning_effort"] == "high"
    assert turn.reasoning_text == "We need the boiling point of water at sea level. It is 100 °C."
    assert turn.text == "Water boils at 100 °C at sea level."
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (12, 57)


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_azure_responses_summary_with_content_filters(chunking: str) -> None:
    name = "openai_responses/azure_reasoning_summary.sse"
    turn, sent, _ = await replayed(
        name, "gpt-5.1", AZURE, turn_request(), chunking=chunking, cls=OpenAIResponsesProvider
    )
    assert sent["reasoning"]["summary"] == "auto"
    assert sent["include"] == ["reasoning.encrypted_content"]
    summary, encrypted = turn.reasoning_parts
    assert (summary.reasoning_kind, summary.text) == (
        "summary",
        "**Checking the units**\n\nA marathon is 42.195 km.",
    )
    assert (encrypted.reasoning_kind, encrypted.text) == ("encrypted", "")
    assert turn.text == "A marathon is 42.195 km long."
    (block,) = turn.continuity
    done = [f for f in json_payloads(fixture(name)) if f["type"] == "response.output_item.done"]
    assert block.data["item"] == done[0]["item"], "the whole item of .done, not the .added copy"
    usage = turn.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (41, 203, 180)


# --------------------------------------------------------------------------- DashScope (Qwen)


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_dashscope_reasoning_content_and_usage_chunk(chunking: str) -> None:
    turn, sent, provider = await replayed(
        "compat/dashscope_qwen_reasoning.sse",
        "qwen3-max",
        DASHSCOPE,
        turn_request(),
        chunking=chunking,
    )
    assert provider.rule.server == "dashscope"
    assert sent["enable_thinking"] is True
    assert turn.reasoning_text == "The user asks how many moons Mars has.\nPhobos and Deimos: two."
    assert turn.text == "Mars has two moons: **Phobos** and **Deimos**."
    assert turn.reasoning_parts[0].reasoning_kind == "raw"
    usage = turn.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (18, 41, 27)
    assert turn.continuity == (), "DashScope does not need reasoning back"


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_dashscope_tool_call_fragments_with_empty_ids(chunking: str) -> None:
    turn, sent, provider = await replayed(
        "compat/dashscope_tool_call.sse",
        "qwen3-max",
        DASHSCOPE,
        turn_request("hidden", tools=True),
        chunking=chunking,
    )
    assert sent["enable_thinking"] is False
    (call,) = turn.tool_calls
    assert (call.call_id, call.name, call.arguments_json) == (
        "call_7c1e4a2f9b3d4e6a8c0b1d2e",
        "largest_city",
        '{"country": "Portugal"}',
    )
    assert turn.finish_reason == "tool_calls" and turn.reasoning_parts == ()
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (301, 24)
    history = [Message.user("Largest city?"), turn.as_message()]
    history.append(Message("tool", (ToolResultPart(call.call_id, "Lisbon"),)))
    body = provider.build_body(turn_request("hidden", history, tools=True), stream=True)
    (sent,) = [m for m in body["messages"] if m["role"] == "assistant"]
    assert set(sent) == {"role", "content", "tool_calls"}


async def test_dashscope_refuses_thinking_on_a_request_that_is_not_streamed() -> None:
    rp = replay("compat/dashscope_enable_thinking_refused.json", status=400)
    forced = {"rules": {"thinking_streams_only": False}}
    provider = at(OpenAICompatibleProvider, "qwen3-32b", DASHSCOPE, rp, thoughtgate=forced)
    with pytest.raises(ProviderHTTPError) as info:
        await provider.request(turn_request())
    assert rp.requests[0]["enable_thinking"] is True and rp.requests[0]["stream"] is False
    err = info.value
    assert (err.status, err.error_type, err.code) == (
        400,
        "invalid_request_error",
        "invalid_parameter_error",
    )
    assert err.message == "parameter.enable_thinking must be set to false for non-streaming calls"
    assert not err.retryable


@pytest.mark.parametrize("model", ["qwen3-32b", "qwen3.5-plus", "qwen-plus"])
def test_dashscope_thinks_only_on_streamed_requests(model: str) -> None:
    settings = ProviderSettings(base_url=DASHSCOPE, api_key="k")
    provider = OpenAICompatibleProvider(model, settings)
    streamed_body = provider.build_body(turn_request(), stream=True)
    whole = provider.build_body(turn_request(), stream=False)
    assert (streamed_body["enable_thinking"], whole["enable_thinking"]) == (True, False)
    hidden = provider.build_body(turn_request("hidden"), stream=True)
    assert hidden["enable_thinking"] is False


def test_qwen35_and_open_weight_qwen3_think_unasked_and_get_the_switch() -> None:
    for model in ("qwen3.5-plus", "qwen3-235b-a22b", "qwen3-8b"):
        rule = OpenAICompatibleProvider(model, ProviderSettings(base_url=DASHSCOPE)).rule
        assert rule.thinks_unasked and rule.hidden == {"enable_thinking": False}, model
    for model in ("qwq-plus", "qwen3-235b-a22b-thinking-2507"):
        rule = OpenAICompatibleProvider(model, ProviderSettings(base_url=DASHSCOPE)).rule
        assert rule.thinks_unasked and rule.hidden is None, "no switch on thinking-only models"
    instruct = OpenAICompatibleProvider(
        "qwen3-235b-a22b-instruct-2507", ProviderSettings(base_url=DASHSCOPE)
    ).rule
    assert instruct.surface is None and instruct.hidden is None


@pytest.fixture
def dashscope() -> Iterator[EmulatorServer]:
    with serve_emulator(Emulator()) as server:
        yield server


def on_emulator(server: EmulatorServer, model: str, scenario: str) -> OpenAICompatibleProvider:
    settings = ProviderSettings(
        base_url=f"{server.url}/dashscope/v1",
        max_retries=0,
        extra={"thoughtgate": {"server": "dashscope"}},
    )
    client = httpx.AsyncClient(headers={"x-emulator-scenario": scenario})
    return OpenAICompatibleProvider(model, settings, client=client)


async def test_the_emulator_refuses_what_dashscope_refuses(dashscope: EmulatorServer) -> None:
    url = f"{dashscope.url}/dashscope/v1/chat/completions"
    ask = {"messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with httpx.AsyncClient() as client:
        on = await client.post(url, json={**ask, "model": "qwen3-32b"})  # thinks by default
        off = await client.post(url, json={**ask, "model": "qwen3-32b", "enable_thinking": False})
        qwq = await client.post(url, json={**ask, "model": "qwq-plus", "enable_thinking": False})
    assert on.status_code == 400
    assert on.json()["error"] == {
        "code": "invalid_parameter_error",
        "param": None,
        "message": "parameter.enable_thinking must be set to false for non-streaming calls",
        "type": "invalid_request_error",
    }
    assert off.status_code == 200 and "reasoning_content" in off.json()["choices"][0]["message"]
    assert qwq.status_code == 400 and qwq.json()["error"]["message"].startswith(
        "This model only support stream mode"
    )


@pytest.mark.parametrize("model", ["qwen3-32b", "qwen3.5-plus"])
async def test_dashscope_on_the_emulator_streamed_and_not(
    dashscope: EmulatorServer, model: str
) -> None:
    provider = on_emulator(dashscope, model, "think-and-answer")
    try:
        thought = await streamed(provider, turn_request())
        whole = await provider.request(turn_request())  # a 400 if it asked for thinking
        quiet = await streamed(provider, turn_request("hidden"))
        summary = await provider.request(turn_request("hidden"))  # the step summarizer's call
    finally:
        await provider.aclose()
    assert thought.reasoning_text and thought.text
    assert whole.text == thought.text and whole.reasoning_parts == ()
    assert quiet.text == thought.text and quiet.usage.reasoning_tokens == 0, "no thinking paid"
    assert summary.text == thought.text
    sent = [r.body for r in dashscope.emulator.requests]
    assert [b["enable_thinking"] for b in sent] == [True, False, False, False]


# --------------------------------------------------------------------------- Together


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_together_stray_think_then_reasoning_field(chunking: str, mode: str) -> None:
    turn, sent, provider = await replayed(
        "compat/together_deepseek_stray_think.sse",
        "deepseek-ai/DeepSeek-V3.1",
        TOGETHER,
        turn_request(mode),
        chunking=chunking,
    )
    assert provider.rule.server == "together"
    assert "thinking" not in sent, "Together does not take DeepSeek's switch"
    # the bare <think> opened nothing: the answer is not swallowed as unclosed reasoning
    assert turn.text == "The Moon is about 384,400 km away on average."
    expected = "The user asks how far the Moon is. About 384,400 km on average."
    assert turn.reasoning_text == (expected if mode == "surface" else "")
    usage = turn.usage
    # usage in a `choices: []` chunk, reasoning_tokens at the top of `usage`
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (14, 48, 31)
    assert "<think>" not in turn.text + turn.reasoning_text


# --------------------------------------------------------------------------- LM Studio


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_lmstudio_think_tags_as_own_deltas_and_nameless_fragments(chunking: str) -> None:
    turn, *_ = await replayed(
        "compat/lmstudio_qwen3_think_tool_call.sse",
        "qwen/qwen3-4b",
        LM_STUDIO,
        turn_request(tools=True),
        chunking=chunking,
    )
    assert turn.reasoning_text == "The user asks which country they are in; a tool says."
    assert turn.text == ""
    (call,) = turn.tool_calls
    assert (call.call_id, call.name, call.arguments_json) == ("614805532", "get_country", "{}")
    assert turn.finish_reason == "tool_calls"
    assert turn.usage == Usage(), "LM Studio streams no usage: none is made up"
    # reasoning came inline, not as reasoning_content: nothing goes back in the loop
    assert turn.continuity == ()


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_lmstudio_reasoning_content(chunking: str, mode: str) -> None:
    turn, sent, _ = await replayed(
        "compat/lmstudio_reasoning_content.sse",
        "deepseek-r1-distill-qwen-7b",
        LM_STUDIO,
        turn_request(mode),
        chunking=chunking,
    )
    assert turn.text == "I wanted to learn cartography, but I lost the plot."
    expected = "A short joke about maps is fine." if mode == "surface" else ""
    assert turn.reasoning_text == expected
    assert not {"thinking", "enable_thinking", "chat_template_kwargs"} & set(sent)


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_lmstudio_responses_reasoning_text_and_arguments_only_in_done(
    chunking: str,
) -> None:
    turn, sent, _ = await replayed(
        "openai_responses/lmstudio_reasoning_text_tool_call.sse",
        "zai-org/glm-4.7-flash",
        LM_STUDIO,
        turn_request(tools=True),
        chunking=chunking,
        cls=OpenAIResponsesProvider,
    )
    assert "reasoning" not in sent, "an unknown model gets no reasoning parameter"
    (part,) = turn.reasoning_parts
    assert (part.reasoning_kind, part.text) == (
        "raw",
        "The user wants the largest city of their country. I need the country first.",
    )
    assert turn.text == "Let me look up your country first."
    (call,) = turn.tool_calls
    assert (call.call_id, call.name, call.arguments_json) == (
        "call_7305169844220001",
        "get_country",
        "{}",
    )
    usage = turn.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (176, 37, 19)
    assert turn.continuity == (), "LM Studio sends no encrypted reasoning to carry"

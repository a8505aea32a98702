"""OpenAI-compatible adapter: DeepSeek, vLLM, Ollama and inline <think> transcripts, modes, emulator."""

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

from thoughtgate.errors import ConfigError, ProviderHTTPError, ProviderStreamError
from thoughtgate.providers.base import ProviderSettings, create_provider
from thoughtgate.providers.openai_compatible import CARRIER, OpenAICompatibleProvider
from thoughtgate.testing.emulator import EmulatorServer
from thoughtgate.types import ContinuityBlock, Message, TextPart, ToolCallPart, ToolResultPart

COMPAT = OpenAICompatibleProvider


def replay_provider(name: str, *, chunking: str = "whole", model: str = "m", **extra: Any):
    replay = Replay(fixture(f"compat/{name}"), chunking=chunking)
    return make(COMPAT, model, replay, **extra), replay


# --------------------------------------------------------------------------- transcripts


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_deepseek_reasoner(chunking: str) -> None:
    provider, replay = replay_provider("deepseek_reasoner.sse", chunking=chunking)
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    assert turn.reasoning_text == "Okay, the user wants 9.11 vs 9.8. 9.8 is larger."
    assert turn.text == "9.8 is larger."
    assert (turn.usage.input_tokens, turn.usage.reasoning_tokens, turn.usage.cache_read_tokens) == (
        17,
        98,
        0,
    )
    assert turn.continuity == ()  # no tool call: DeepSeek ignores reasoning sent back


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_deepseek_tool_call_keeps_reasoning_for_the_loop(chunking: str) -> None:
    provider, replay = replay_provider(
        "deepseek_tool_call.sse", chunking=chunking, model="deepseek-chat"
    )
    turn = await streamed(provider, turn_request(tools=True))
    replay.assert_fully_read()
    (call,) = turn.tool_calls
    assert (call.call_id, call.name, call.arguments_json) == (
        "call_00_Xk2mQ9pLr8",
        "get_date",
        "{}",
    )
    (block,) = turn.continuity
    assert block.carrier == CARRIER and block.data == {
        "reasoning_content": "I need the date first."
    }
    assert (block.provider, block.model) == ("openai-compatible", "deepseek-chat")
    assert turn.usage.cache_read_tokens == 192  # DeepSeek's prompt_cache_hit_tokens


async def test_non_streamed_deepseek_matches_the_stream() -> None:
    provider, _ = replay_provider(
        "deepseek_tool_call.sse", chunking="random", model="deepseek-chat"
    )
    stream_turn = await streamed(provider, turn_request(tools=True))
    replay = Replay(fixture("compat/deepseek_tool_call.json"), content_type="application/json")
    whole = await make(COMPAT, "deepseek-chat", replay).request(turn_request(tools=True))
    assert whole == stream_turn


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_vllm_reasoning_field(chunking: str) -> None:
    provider, replay = replay_provider("vllm_reasoning.sse", chunking=chunking)
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    assert turn.reasoning_text == "\nThe user says hi.\n"  # field text is kept exactly
    assert turn.text == "\n\nHello! How can I help?"
    assert (turn.usage.output_tokens, turn.usage.reasoning_tokens) == (30, 0)


async def test_both_field_names_are_not_counted_twice() -> None:
    provider, replay = replay_provider("vllm_both_fields.sse", chunking="bytes")
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    assert turn.reasoning_text == "Both fields carry this." and turn.text == "Done."


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_ollama_whole_tool_call(chunking: str) -> None:
    provider, replay = replay_provider("ollama_tool_call.sse", chunking=chunking, model="qwen3:8b")
    turn = await streamed(provider, turn_request(tools=True))
    replay.assert_fully_read()
    assert turn.reasoning_text == "Okay, weather in Paris needs a tool."
    (call,) = turn.tool_calls
    assert (call.call_id, call.arguments) == ("call_k2j3h4g5", {"city": "Paris"})
    # the reasoning came in `reasoning`, not DeepSeek's `reasoning_content`: nothing goes back
    assert turn.continuity == ()


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_think_tags_split_across_deltas(chunking: str) -> None:
    provider, replay = replay_provider("think_tags_split.sse", chunking=chunking)
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    assert turn.reasoning_text == "The user wants JSON. Give one keye."
    assert turn.text == '{"a": 1}'
    assert "<think" not in turn.text and "think>" not in turn.text


async def test_unclosed_think_is_reasoning_never_answer() -> None:
    provider, replay = replay_provider("think_tags_unclosed.sse", chunking="bytes")
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    assert turn.reasoning_text == "Let me enumerate cases <t" and turn.text == ""
    assert turn.finish_reason == "length"


async def test_hidden_mode_drops_fields_and_tags() -> None:
    for name in ("think_tags_split.sse", "deepseek_tool_call.sse"):
        provider, replay = replay_provider(name, chunking="random")
        turn = await streamed(provider, turn_request("hidden", tools=True))
        replay.assert_fully_read()
        assert turn.reasoning_parts == ()
        assert "think" not in turn.text and "date" not in turn.text
        if name == "think_tags_split.sse":
            assert turn.continuity == ()


async def test_hidden_mode_keeps_a_demanded_carrier_only_for_the_loop() -> None:
    """A DeepSeek-style tool turn that thought although hidden mode asked for nothing: its
    reasoning is no reasoning part (nothing records or shows it) but stays in memory as the
    carrier the server demands back on the next request of the loop."""
    provider, replay = replay_provider("deepseek_tool_call.sse", chunking="random")
    turn = await streamed(provider, turn_request("hidden", tools=True))
    replay.assert_fully_read()
    assert turn.reasoning_parts == () and turn.reasoning_text == ""
    (block,) = turn.continuity
    assert block.data == {"reasoning_content": "I need the date first."}
    history = [Message.user("What day is it?"), turn.as_message()]
    history.append(Message("tool", (ToolResultPart(turn.tool_calls[0].call_id, "Monday"),)))
    body = provider.build_body(turn_request("hidden", history, tools=True), stream=True)
    (sent,) = [m for m in body["messages"] if m["role"] == "assistant"]
    assert sent["reasoning_content"] == "I need the date first."


async def test_end_without_done() -> None:
    provider, replay = replay_provider("no_done_after_finish.sse")
    turn = await streamed(provider, turn_request())  # lenient by default once finish_reason came
    replay.assert_fully_read()
    assert turn.text == "Hi" and turn.finish_reason == "stop"
    provider, _ = replay_provider("no_done_after_finish.sse", thoughtgate={"lenient_end": False})
    with pytest.raises(ProviderStreamError, match="DONE"):
        await streamed(provider, turn_request())


async def test_starts_in_think_for_templates_that_inject_the_tag() -> None:
    body = (
        b"".join(
            b"data: "
            + json.dumps({"choices": [{"index": 0, "delta": {"content": c}}]}).encode()
            + b"\n\n"
            for c in ["Hmm, two", " options.</th", "ink>\n\nOption A."]
        )
        + b"data: [DONE]\n\n"
    )
    replay = Replay(body, chunking="bytes")
    provider = make(COMPAT, "qwen3", replay, thoughtgate={"starts_in_think": True})
    turn = await streamed(provider, turn_request())
    assert (turn.reasoning_text, turn.text) == ("Hmm, two options.", "Option A.")


# --------------------------------------------------------------------------- request shaping


def body_for(
    request: Any, base_url: str = "http://localhost:8000/v1", model: str = "qwen3", **extra: Any
) -> dict[str, Any]:
    settings = ProviderSettings(base_url=base_url, extra=extra)
    return COMPAT(model, settings).build_body(request, stream=True)


def test_default_requests_send_nothing_reasoning_specific() -> None:
    for mode in ("hidden", "surface", "telemetry_only"):
        body = body_for(turn_request(mode))
        assert not {"thinking", "reasoning", "reasoning_effort", "chat_template_kwargs"} & set(body)
        assert body["stream_options"] == {"include_usage": True}


def test_hidden_switch_only_on_servers_that_take_it() -> None:
    hidden = turn_request("hidden")
    # DeepSeek's own API (by host, or named) takes its thinking switch ...
    assert body_for(hidden, "https://api.deepseek.com/v1")["thinking"] == {"type": "disabled"}
    assert body_for(hidden, thoughtgate={"server": "deepseek"})["thinking"] == {"type": "disabled"}
    assert body_for(hidden, thoughtgate={"dialect": "deepseek"})["thinking"] == {
        "type": "disabled"
    }, "the old dialect option still names the server"
    assert "thinking" not in body_for(turn_request("surface"), "https://api.deepseek.com/v1")
    # ... a DeepSeek-named model on Groq, Together or an unknown host does not get it
    for url in ("https://api.groq.com/openai/v1", "https://api.together.xyz/v1", "http://h/v1"):
        body = body_for(hidden, url, model="deepseek-r1-distill-llama-70b")
        assert "thinking" not in body, url
    # Qwen3 on vLLM / SGLang, and on Groq, have their own switches
    qwen = body_for(hidden, thoughtgate={"dialect": "qwen3"}, model="Qwen/Qwen3-8B")
    assert qwen["chat_template_kwargs"] == {"enable_thinking": False}
    groq = body_for(hidden, "https://api.groq.com/openai/v1", model="qwen/qwen3-32b")
    assert groq["reasoning_effort"] == "none"
    surface = body_for(turn_request("surface"), "https://api.groq.com/openai/v1", "qwen/qwen3-32b")
    assert surface["reasoning_format"] == "parsed"
    with pytest.raises(ConfigError, match="dialect"):
        body_for(turn_request(), thoughtgate={"dialect": "nope"})


def test_effort_and_extra_body_fields() -> None:
    body = body_for(turn_request("surface", effort="high"), thinking={"type": "enabled"})
    assert body["reasoning_effort"] == "high" and body["thinking"] == {"type": "enabled"}
    assert "thoughtgate" not in body_for(turn_request(), thoughtgate={"think_tags": False})
    assert "reasoning_effort" not in body_for(turn_request("hidden", effort="high"))


def _history(model: str = "qwen3", reasoning: str = "") -> list[Message]:
    block = ContinuityBlock(
        CARRIER, {"reasoning_content": reasoning}, provider="openai-compatible", model=model
    )
    assistant = Message("assistant", (ToolCallPart("call_1", "get_date", "{}"), block))
    answer = Message("assistant", (TextPart("It is Monday."),))
    return [
        Message.user("Day?"),
        assistant,
        Message("tool", (ToolResultPart("call_1", "Mon"),)),
        answer,
        Message.user("And tomorrow?"),
    ]


def test_reasoning_content_goes_back_on_tool_call_turns_even_when_empty() -> None:
    messages = body_for(turn_request(messages=_history()))["messages"]
    assert messages[1]["reasoning_content"] == "" and messages[1]["content"] == ""
    assert "reasoning_content" not in messages[3]  # a plain answer turn
    messages = body_for(turn_request(messages=_history(reasoning="I need the date.")))["messages"]
    assert messages[1]["reasoning_content"] == "I need the date."
    other = body_for(turn_request(messages=_history(model="deepseek-chat")))["messages"]
    assert "reasoning_content" not in other[1]


def test_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="OPENAI_BASE_URL"):
        COMPAT("m", ProviderSettings())
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    provider = create_provider("openai-compatible:qwen3:8b")
    assert isinstance(provider, COMPAT) and provider.model == "qwen3:8b"
    assert "authorization" not in provider.transport._headers  # local servers need no key
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    assert COMPAT("m").transport._headers["authorization"] == "Bearer sk-local"


# --------------------------------------------------------------------------- against the emulator

FLAVORS = ("deepseek", "vllm", "ollama", "think-tags")


@pytest.fixture
async def emulated(server: EmulatorServer) -> AsyncIterator[Callable[..., Any]]:
    adapters = Emulated(server, "openai-compatible:deepseek-chat")

    def factory(flavor: str, scenario: str, **kw: Any) -> Any:
        adapters.headers = {"x-emulator-flavor": flavor}
        return adapters(scenario, **kw)[0]

    yield factory
    await adapters.aclose()


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_tool_loop_per_flavor(emulated: Any, flavor: str) -> None:
    turns = await run_tool_loop(emulated(flavor, "tool-loop"))
    assert [t.finish_reason for t in turns] == ["tool_calls", "tool_calls", "stop"]
    assert turns[0].reasoning_text == (
        "I need the user's country before I can name its largest city. I will call get_country."
    )
    assert turns[-1].text == "The largest city in your country is Mexico City."
    # only DeepSeek's `reasoning_content` goes back; `reasoning` and <think> never do
    carried = flavor == "deepseek"
    assert [bool(t.continuity) for t in turns] == [carried, carried, False]


async def test_deepseek_400_when_reasoning_content_is_missing(emulated: Any) -> None:
    provider = emulated("deepseek", "tool-loop", thoughtgate={"send_back": False})
    with pytest.raises(ProviderHTTPError) as info:
        await run_tool_loop(provider)
    err = info.value
    assert err.status == 400 and err.error_type == "invalid_request_error"
    assert (
        err.message
        == "The `reasoning_content` in the thinking mode must be passed back to the API."
    )


async def test_hidden_deepseek_dialect_turns_thinking_off_and_loops_fine(emulated: Any) -> None:
    provider = emulated("deepseek", "tool-loop", thoughtgate={"dialect": "deepseek"})
    turns = await run_tool_loop(provider, mode="hidden")
    assert [t.finish_reason for t in turns] == ["tool_calls", "tool_calls", "stop"]
    assert all(not t.reasoning_parts and not t.continuity for t in turns)


async def test_emulator_failures(server: EmulatorServer, emulated: Any) -> None:
    with pytest.raises(ProviderStreamError, match="cut") as info:
        await streamed(emulated("vllm", "cut"), turn_request())
    assert info.value.partial is not None
    assert (info.value.partial.reasoning_text, info.value.partial.text) == (
        "Partial reasoning",
        "Partial ans",
    )
    with pytest.raises(ProviderStreamError) as info:
        await streamed(emulated("deepseek", "stream-error"), turn_request())
    assert (info.value.error_type, info.value.message) == ("overloaded_error", "Overloaded")
    server.emulator.attempts.clear()
    with pytest.raises(ProviderHTTPError) as err:
        await streamed(emulated("ollama", "overloaded"), turn_request())
    assert (err.value.status, err.value.error_type) == (529, "overloaded_error")


# --------------------------------------------------------------------------- a stream cut mid-tag


def _chat_chunk(content: str) -> bytes:
    data = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "qwen3",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return f"data: {json.dumps(data)}\n\n".encode()


@pytest.mark.inprocess
@pytest.mark.parametrize("provider_class", ["openai_compatible", "openrouter"])
async def test_a_stream_cut_inside_a_think_block_keeps_what_the_splitter_held_as_reasoning(
    provider_class: str,
) -> None:
    """The splitter holds back a suffix that could still become ``</think>``; when the
    connection breaks there, those characters belong to the open block (reasoning), so the
    partial turn keeps them on the right side instead of losing them."""
    import httpx
    from support.replay import ReplayServer, Reply

    from thoughtgate.engine.turn import stream_llm_turn
    from thoughtgate.providers.openrouter import OpenRouterProvider

    pieces = ["<think>", "SECRET hm </thi"]
    async with ReplayServer([Reply([_chat_chunk(p) for p in pieces])]) as server:
        settings = ProviderSettings(base_url=f"{server.url}/v1", api_key="k", max_retries=0)
        cls = COMPAT if provider_class == "openai_compatible" else OpenRouterProvider
        provider = cls("qwen3", settings, client=httpx.AsyncClient())
        try:
            with pytest.raises(ProviderStreamError) as caught:
                await stream_llm_turn(provider, turn_request())
        finally:
            await provider.aclose()
    partial = caught.value.partial
    assert partial is not None
    assert partial.text == ""
    assert partial.reasoning_text == "SECRET hm </thi"

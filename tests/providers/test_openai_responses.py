"""OpenAI Responses adapter: recorded transcripts, modes, reasoning-item pairing, errors, emulator."""

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
from support.sse import json_payloads

from thoughtgate.errors import (
    ConfigError,
    MalformedResponseError,
    ProviderHTTPError,
    ProviderStreamError,
)
from thoughtgate.providers.base import ProviderSettings, create_provider
from thoughtgate.providers.openai_responses import CARRIER, OpenAIResponsesProvider
from thoughtgate.testing.emulator import EmulatorServer
from thoughtgate.types import (
    ContinuityBlock,
    Message,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)


def replay_provider(name: str, *, chunking: str = "whole", model: str = "o3", **kw: Any):
    replay = Replay(fixture(f"openai_responses/{name}"), chunking=chunking, **kw)
    # recorded on api.openai.com, whose summaries are summaries (ADR 0078)
    return make(OpenAIResponsesProvider, model, replay, thoughtgate={"server": "openai"}), replay


def done_item(name: str, index: int) -> dict[str, Any]:
    for event in json_payloads(fixture(f"openai_responses/{name}")):
        if event["type"] == "response.output_item.done" and event["output_index"] == index:
            item: dict[str, Any] = event["item"]
            return item
    raise AssertionError("no such item")


# --------------------------------------------------------------------------- transcripts


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_summary_parts_then_message(chunking: str) -> None:
    provider, replay = replay_provider("summary_then_message.sse", chunking=chunking)
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    first, second, encrypted = turn.reasoning_parts
    assert (first.reasoning_kind, first.index) == ("summary", 0)
    assert first.text == "**Providing street-crossing advice**\n\nLook both ways."
    assert (second.index, second.text) == (1, "**Adding safety notes**\n\nUse crosswalks.")
    assert (encrypted.reasoning_kind, encrypted.text) == ("encrypted", "")
    assert turn.text == "To cross the street, look left, right, then left again."
    assert (turn.finish_reason, turn.raw_finish_reason) == ("stop", "completed")
    usage = turn.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (13, 1680, 1408)
    (block,) = turn.continuity
    # the exact item of output_item.done (the .added copy is truncated), and what followed it
    assert block.data == {
        "item": done_item("summary_then_message.sse", 0),
        "next_item": {
            "type": "message",
            "id": "msg_68f1a2b3c4d5e6f7bb11cc22dd33ee44ff55006677889900",
        },
    }
    assert [p.kind for p in turn.parts] == [
        "reasoning",
        "reasoning",
        "reasoning",
        "continuity",
        "text",
    ]


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_function_call_and_unknown_events(chunking: str) -> None:
    provider, replay = replay_provider("reasoning_function_call.sse", chunking=chunking)
    turn = await streamed(provider, turn_request(tools=True))
    replay.assert_fully_read()
    (call,) = turn.tool_calls
    assert (call.call_id, call.name, call.arguments) == (
        "call_w9XkL2mQp7",
        "get_weather",
        {"city": "Paris"},
    )
    assert turn.finish_reason == "tool_calls"
    assert turn.reasoning_parts[0].text == "**Planning a weather lookup**"
    assert turn.usage.cache_read_tokens == 32
    assert turn.continuity[0].data["next_item"] == {
        "type": "function_call",
        "id": "fc_0105b6f6953fb71a0068c66139634081a28a5703ef87918674",
        "call_id": "call_w9XkL2mQp7",
    }


async def test_non_streamed_response_matches_the_stream() -> None:
    provider, _ = replay_provider("reasoning_function_call.sse", chunking="random")
    stream_turn = await streamed(provider, turn_request(tools=True))
    replay = Replay(
        fixture("openai_responses/reasoning_function_call.json"), content_type="application/json"
    )
    openai = {"server": "openai"}
    whole = await make(OpenAIResponsesProvider, "o3", replay, thoughtgate=openai).request(
        turn_request(tools=True)
    )
    replay.assert_fully_read()
    assert replay.requests[0]["stream"] is False
    assert whole == stream_turn


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_raw_reasoning_text(chunking: str) -> None:
    provider, replay = replay_provider(
        "raw_reasoning_text.sse", chunking=chunking, model="gpt-oss-120b"
    )
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    (part,) = turn.reasoning_parts
    assert (part.reasoning_kind, part.text) == ("raw", "User asks 2+2. Simple: 4.")
    assert turn.text == "4" and turn.continuity == ()  # no encrypted content: nothing to send back


async def test_incomplete_is_a_length_finish() -> None:
    provider, replay = replay_provider("incomplete_max_output_tokens.sse", chunking="random")
    turn = await streamed(provider, turn_request())
    replay.assert_fully_read()
    assert (turn.finish_reason, turn.raw_finish_reason) == ("length", "max_output_tokens")
    assert turn.text == "The history of" and turn.complete
    assert turn.usage.output_tokens == 64


async def test_failed_and_error_events_raise_typed_errors() -> None:
    provider, replay = replay_provider("failed.sse", chunking="bytes")
    with pytest.raises(ProviderStreamError) as info:
        await streamed(provider, turn_request())
    replay.assert_fully_read(to_eof=False)
    assert info.value.error_type == "server_error"
    assert info.value.message.startswith("The server had an error")
    assert info.value.partial is not None and info.value.partial.reasoning_text == "**Thinking**"
    assert info.value.request_id == "req_replay_0001"

    provider, replay = replay_provider("error_event.sse")
    with pytest.raises(ProviderStreamError) as info:
        await streamed(provider, turn_request())
    assert info.value.error_type == "rate_limit_exceeded"
    assert "Rate limit reached" in info.value.message


@pytest.mark.parametrize("chunking", CHUNKINGS)
async def test_stream_ending_before_completed(chunking: str) -> None:
    provider, replay = replay_provider("truncated.sse", chunking=chunking)
    with pytest.raises(ProviderStreamError, match=r"response\.completed") as info:
        await streamed(provider, turn_request())
    replay.assert_fully_read()
    partial = info.value.partial
    assert partial is not None and not partial.complete
    assert (partial.reasoning_text, partial.text) == ("**Half a thought**", "Partial answer")


async def test_hidden_mode_drops_reasoning_and_continuity() -> None:
    provider, replay = replay_provider("summary_then_message.sse", chunking="random")
    turn = await streamed(provider, turn_request("hidden"))
    replay.assert_fully_read()
    assert turn.reasoning_parts == () and turn.continuity == ()
    assert turn.text.startswith("To cross the street")


# --------------------------------------------------------------------------- request shaping


def body_for(request: Any, model: str = "o3", **extra: Any) -> dict[str, Any]:
    settings = ProviderSettings(base_url="http://x.invalid/v1", api_key="k", extra=extra)
    return OpenAIResponsesProvider(model, settings).build_body(request, stream=True)


@pytest.mark.parametrize(
    ("mode", "kw", "reasoning", "include"),
    [
        ("hidden", {}, None, None),
        ("hidden", {"effort": "low"}, {"effort": "low"}, None),
        ("surface", {}, {"summary": "auto"}, ["reasoning.encrypted_content"]),
        (
            "telemetry_only",
            {"effort": "high"},
            {"summary": "auto", "effort": "high"},
            ["reasoning.encrypted_content"],
        ),
    ],
)
def test_reasoning_parameters_per_mode(mode: str, kw: Any, reasoning: Any, include: Any) -> None:
    body = body_for(turn_request(mode, tools=True, **kw))
    assert body.get("reasoning") == reasoning
    assert body.get("include") == include
    assert body["store"] is False and body["stream"] is True
    assert body["input"] == [{"role": "user", "content": "Why is the sky blue?"}]
    assert body["tools"][0] == {
        "type": "function",
        "name": "get_country",
        "description": "The user's country",
        "parameters": {"type": "object", "properties": {}},
        "strict": False,
    }
    assert "temperature" not in body  # reasoning models reject it; sent only when set


RS = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "sum"}],
    "encrypted_content": "gAAAA-blob",
}


def _history(model: str = "o3", next_type: str = "function_call") -> list[Message]:
    next_item = {"type": "function_call", "id": "fc_1", "call_id": "call_1"}
    if next_type == "message":
        next_item = {"type": "message", "id": "msg_1"}
    block = ContinuityBlock(
        CARRIER, {"item": RS, "next_item": next_item}, provider="openai", model=model
    )
    assistant = Message(
        "assistant",
        (
            ReasoningPart("sum", reasoning_kind="summary", provider="openai", model=model),
            block,
            TextPart("Looking."),
            ToolCallPart("call_1", "get_country", "{}"),
        ),
    )
    return [Message.user("Q"), assistant, Message("tool", (ToolResultPart("call_1", "MX"),))]


def test_reasoning_item_goes_back_right_before_its_follower() -> None:
    body = body_for(turn_request(messages=_history(next_type="message"), tools=True))
    assert body["input"] == [
        {"role": "user", "content": "Q"},
        {**RS, "summary": []},  # the item without its text (ADR 0156)
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Looking.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "get_country", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "MX"},
    ]


def test_follower_out_of_place_drops_the_reasoning_item() -> None:
    # recorded follower is the function call, but a text part comes first: never send an orphan
    body = body_for(turn_request(messages=_history(), tools=True))
    assert body["input"][1] == {"role": "assistant", "content": "Looking."}
    assert all(item.get("type") != "reasoning" for item in body["input"])
    assert all("id" not in item for item in body["input"])


def test_no_reasoning_from_other_models_or_earlier_loops() -> None:
    body = body_for(turn_request(messages=_history(model="gpt-5", next_type="message"), tools=True))
    assert all(item.get("type") != "reasoning" for item in body["input"])
    later = [
        *_history(next_type="message"),
        Message("assistant", (TextPart("MX City"),)),
        Message.user("Thanks"),
    ]
    body = body_for(turn_request(messages=later, tools=True))
    assert all(item.get("type") != "reasoning" and "id" not in item for item in body["input"])
    assert "sum" not in json.dumps([i for i in body["input"] if i.get("type") != "reasoning"])


def test_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIResponsesProvider("o3", ProviderSettings())
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    provider = create_provider("openai:o3")
    assert isinstance(provider, OpenAIResponsesProvider)
    assert provider.transport.url("responses") == "https://api.openai.com/v1/responses"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    assert (
        OpenAIResponsesProvider("o3").transport.url("responses")
        == "http://127.0.0.1:1/v1/responses"
    )


# --------------------------------------------------------------------------- against the emulator


@pytest.fixture
async def emulated(server: EmulatorServer) -> AsyncIterator[Callable[..., Any]]:
    adapters = Emulated(server, "openai:gpt-5")
    yield lambda scenario, model="gpt-5", retries=0: adapters(
        scenario, model=model, retries=retries
    )[0]
    await adapters.aclose()


@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_tool_loop_against_the_emulator(
    server: EmulatorServer, emulated: Any, mode: str
) -> None:
    turns = await run_tool_loop(emulated("tool-loop"), mode=mode)
    assert [t.finish_reason for t in turns] == ["tool_calls", "tool_calls", "stop"]
    assert turns[-1].text == "The largest city in your country is Mexico City."
    last_input = server.emulator.bodies("/responses")[-1]["input"]
    kinds = [i.get("type", i.get("role")) for i in last_input]
    if mode == "surface":
        assert all(t.continuity for t in turns)
        assert kinds == [
            "user",
            "reasoning",
            "message",
            "function_call",
            "function_call_output",
            "reasoning",
            "function_call",
            "function_call_output",
        ]
    else:
        assert all(not t.reasoning_parts and not t.continuity for t in turns)
        assert kinds == [
            "user",
            "assistant",
            "function_call",
            "function_call_output",
            "function_call",
            "function_call_output",
        ]


async def test_emulator_rejects_tampered_encrypted_content(emulated: Any) -> None:
    provider = emulated("tool-loop")
    first = await streamed(provider, turn_request(tools=True))
    block = first.continuity[0]
    item = dict(
        block.data["item"], encrypted_content=block.data["item"]["encrypted_content"][:-4] + "AAAA"
    )
    forged = ContinuityBlock(
        CARRIER, {**block.data, "item": item}, provider="openai", model="gpt-5"
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
    assert info.value.status == 400 and info.value.error_type == "invalid_request_error"
    assert "could not be verified" in info.value.message


async def test_malformed_event_and_wrong_content_type() -> None:
    frames = fixture("openai_responses/summary_then_message.sse").split(b"\n\n")
    data = b"\n\n".join(
        [*frames[:8], b"event: response.output_text.delta\ndata: {oops", *frames[8:]]
    )
    replay = Replay(data, chunking="random")
    with pytest.raises(MalformedResponseError, match="malformed JSON") as info:
        await streamed(make(OpenAIResponsesProvider, "o3", replay), turn_request())
    assert info.value.partial is not None
    assert info.value.partial.reasoning_text.startswith("**Providing street-crossing")

    replay = Replay(
        fixture("openai_responses/reasoning_function_call.json"), content_type="application/json"
    )
    with pytest.raises(MalformedResponseError, match="text/event-stream"):
        await streamed(make(OpenAIResponsesProvider, "o3", replay), turn_request())
    replay = Replay(b"data: not an sse answer", content_type="text/event-stream")
    with pytest.raises(MalformedResponseError, match="expected content-type application/json"):
        await make(OpenAIResponsesProvider, "o3", replay).request(turn_request())


@pytest.mark.parametrize(
    ("event", "said"),
    [(b'{"sequence_number": 0}', "without a type"), (b'{"type": 7}', "whose type is not a string")],
)
async def test_an_event_without_a_usable_type_says_which(event: bytes, said: str) -> None:
    """A proxy's stray event names what is wrong with its type: absent, or not a string."""
    replay = Replay(b"data: " + event + b"\n\n", content_type="text/event-stream")
    with pytest.raises(MalformedResponseError, match=said):
        await streamed(make(OpenAIResponsesProvider, "o3", replay), turn_request())

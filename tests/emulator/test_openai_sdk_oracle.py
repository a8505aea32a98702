"""The official ``openai`` SDK as an oracle for the emulator's chat and Responses formats.

If the SDK's parsers and stream helpers accept what the emulator sends, and see the same reasoning
and text as our adapters, the emulator is faithful where it matters; the validation tests check
that each realistic 400 reaches the SDK as ``BadRequestError`` with the real message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, ToolSpec, TurnRequest
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.providers.think_tags import split_think_tags
from thoughtgate.testing.emulator import (
    Call,
    Emulator,
    EmulatorServer,
    Fail,
    Say,
    Scenario,
    ScriptedTurn,
    StreamError,
    Summary,
    Think,
    serve_emulator,
)
from thoughtgate.types import Message, Turn

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_country", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "largest_city", "parameters": {"type": "object"}}},
]
RESPONSES_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": t["function"]["name"],
        "parameters": {"type": "object"},
        "strict": False,
    }
    for t in TOOLS
]
CHAT_MODELS = {
    "openrouter": "anthropic/claude-sonnet-4.5",
    "deepseek": "deepseek-chat",
    "vllm": "Qwen/Qwen3-8B",
    "ollama": "qwen3:8b",
    "think-tags": "deepseek-r1-distill",
}
REASONING_FIELD = {
    "openrouter": "reasoning",
    "deepseek": "reasoning_content",
    "vllm": "reasoning",
    "ollama": "reasoning",
    "think-tags": None,
}
ON = {"reasoning": {"enabled": True}}


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator()
    emulator.add(
        Scenario(
            "summary-call",
            (
                ScriptedTurn(
                    (
                        Summary("**Planning**\n\nLook up the country."),
                        Say("One moment."),
                        Call("get_country", {}),
                    )
                ),
                ScriptedTurn((Summary("**Answering**"), Say("Mexico City."))),
            ),
        )
    )
    emulator.add(
        Scenario(
            "flaky-sdk",
            (ScriptedTurn((Fail(503, "server_error", "Try again", retry_after=0.01), Say("ok"))),),
        )
    )
    emulator.add(
        Scenario("chat-error", (ScriptedTurn((Think("hm"), StreamError("server_error", "boom"))),))
    )
    with serve_emulator(emulator) as srv:
        yield srv


_OPENED: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Every SDK client a test opened is closed after it (no socket is left to the collector)."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def client(
    server: EmulatorServer, scenario: str, flavor: str | None = None, **kw: Any
) -> openai.OpenAI:
    headers = {"x-emulator-scenario": scenario}
    if flavor:
        headers["x-emulator-flavor"] = flavor
    kw.setdefault("max_retries", 0)
    sdk = openai.OpenAI(base_url=server.v1, api_key="sk-test", default_headers=headers, **kw)
    _OPENED.append(sdk)
    return sdk


async def adapter_turn(
    server: EmulatorServer, cls: Any, model: str, scenario: str, flavor: str | None = None
) -> Turn:
    headers = {"x-emulator-scenario": scenario, **({"x-emulator-flavor": flavor} if flavor else {})}
    provider = cls(
        model,
        ProviderSettings(base_url=server.v1, api_key="k"),
        client=httpx.AsyncClient(headers=headers),
    )
    try:
        tools = [ToolSpec(t["function"]["name"], "", {"type": "object"}) for t in TOOLS]
        request = TurnRequest([Message.user("hi")], tools=tools, reasoning=ReasoningRequest(True))
        return await stream_llm_turn(provider, request)
    finally:
        await provider.aclose()


def _adapter_class(flavor: str) -> Any:
    return OpenRouterProvider if flavor == "openrouter" else OpenAICompatibleProvider


# --------------------------------------------------------------------------- chat completions


@pytest.mark.parametrize("flavor", list(CHAT_MODELS))
async def test_raw_chat_stream_matches_the_adapter(server: EmulatorServer, flavor: str) -> None:
    model = CHAT_MODELS[flavor]
    stream = client(server, "think-and-answer", flavor).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body=ON,
    )
    reasoning, content, usage = [], [], None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        usage = chunk.usage or usage
        for choice in chunk.choices:
            field = REASONING_FIELD[flavor]
            extra = choice.delta.model_extra or {}
            if field and isinstance(extra.get(field), str):
                reasoning.append(extra[field])
            content.append(choice.delta.content or "")
    turn = await adapter_turn(server, _adapter_class(flavor), model, "think-and-answer", flavor)
    sdk_reasoning, sdk_text = "".join(reasoning), "".join(content)
    if flavor == "think-tags":
        sdk_reasoning, sdk_text = split_think_tags(sdk_text)
    assert (sdk_reasoning, sdk_text) == (turn.reasoning_text, turn.text)
    assert usage is not None and usage.completion_tokens == turn.usage.output_tokens


@pytest.mark.parametrize("flavor", list(CHAT_MODELS))
async def test_chat_stream_helper_accumulates_tool_calls(
    server: EmulatorServer, flavor: str
) -> None:
    model = CHAT_MODELS[flavor]
    sdk = client(server, "tool-loop", flavor)
    with sdk.chat.completions.stream(
        model=model, messages=[{"role": "user", "content": "hi"}], tools=TOOLS, extra_body=ON
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    turn = await adapter_turn(server, _adapter_class(flavor), model, "tool-loop", flavor)
    assert (call.id, call.function.name, call.function.arguments) == (
        turn.tool_calls[0].call_id,
        turn.tool_calls[0].name,
        turn.tool_calls[0].arguments_json,
    )
    extra = choice.message.model_extra or {}
    field = REASONING_FIELD[flavor]
    if field:
        assert extra[field] == turn.reasoning_text
    if flavor == "openrouter":
        # the SDK merges list items by index; texts concatenate like ours (it also concatenates
        # repeated string fields such as `format`, which is why the adapter merges by itself)
        details = extra["reasoning_details"]
        assert details[0]["text"] == turn.reasoning_text
        assert details[0]["signature"] == turn.reasoning_parts[0].signature


@pytest.mark.parametrize("flavor", list(CHAT_MODELS))
async def test_non_streamed_chat_matches_the_adapter(server: EmulatorServer, flavor: str) -> None:
    model = CHAT_MODELS[flavor]
    completion = client(server, "tool-loop", flavor).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], tools=TOOLS, extra_body=ON
    )
    message = completion.choices[0].message
    turn = await adapter_turn(server, _adapter_class(flavor), model, "tool-loop", flavor)
    extra = message.model_extra or {}
    if flavor == "think-tags":
        assert split_think_tags(message.content or "") == (turn.reasoning_text, turn.text)
    else:
        assert (extra[REASONING_FIELD[flavor] or ""], message.content) == (
            turn.reasoning_text,
            turn.text,
        )
    if flavor == "openrouter":
        assert extra["reasoning_details"] == turn.continuity[0].data["reasoning_details"]


def test_chat_stream_error_reaches_the_sdk(server: EmulatorServer) -> None:
    for flavor in ("openrouter", "deepseek"):
        stream = client(server, "chat-error", flavor).chat.completions.create(
            model=CHAT_MODELS[flavor], messages=[{"role": "user", "content": "hi"}], stream=True
        )
        with pytest.raises(openai.APIError, match="boom"):
            list(stream)


def test_sdk_retries_a_failed_attempt_honouring_retry_after(server: EmulatorServer) -> None:
    server.emulator.attempts.clear()
    with pytest.raises(openai.InternalServerError) as info:
        client(server, "flaky-sdk", "vllm").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.status_code == 503 and info.value.body == {
        "message": "Try again",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    server.emulator.attempts.clear()
    done = client(server, "flaky-sdk", "vllm", max_retries=1)
    completion = done.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}]
    )
    assert completion.choices[0].message.content == "ok"


# --------------------------------------------------------------------------- responses


def test_responses_stream_helper(server: EmulatorServer) -> None:
    sdk = client(server, "summary-call")
    with sdk.responses.stream(
        model="gpt-5",
        input="hi",
        tools=RESPONSES_TOOLS,
        store=False,
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "One moment."
    reasoning = final.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.summary[0].text == "**Planning**\n\nLook up the country."
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens > 0


async def test_responses_match_the_adapter_streamed_and_not(server: EmulatorServer) -> None:
    turn = await adapter_turn(server, OpenAIResponsesProvider, "gpt-5", "summary-call")
    sdk = client(server, "summary-call")
    response = sdk.responses.create(
        model="gpt-5",
        input="hi",
        tools=RESPONSES_TOOLS,
        store=False,
        reasoning={"summary": "auto"},
        include=["reasoning.encrypted_content"],
    )
    item = response.output[0].model_dump(exclude_none=True)
    assert turn.continuity[0].data["item"] == item
    assert response.output[0].summary[0].text == turn.reasoning_parts[0].text
    assert response.output_text == turn.text
    assert turn.usage.reasoning_tokens == response.usage.output_tokens_details.reasoning_tokens  # type: ignore[union-attr]


def test_sdk_driven_tool_loop_replays_items(server: EmulatorServer) -> None:
    sdk = client(server, "tool-loop")
    inputs: list[Any] = [{"role": "user", "content": "Largest city in my country?"}]
    for _ in range(4):
        response = sdk.responses.create(
            model="gpt-5",
            input=inputs,
            tools=RESPONSES_TOOLS,
            store=False,
            reasoning={"summary": "auto"},
        )
        output = [item.model_dump(exclude_none=True) for item in response.output]
        inputs += output
        calls = [item for item in output if item["type"] == "function_call"]
        if not calls:
            break
        inputs += [
            {"type": "function_call_output", "call_id": c["call_id"], "output": "Mexico"}
            for c in calls
        ]
    assert response.output_text == "The largest city in your country is Mexico City."


# --------------------------------------------------------------------------- validation errors


def _first_responses_output(server: EmulatorServer) -> list[dict[str, Any]]:
    response = client(server, "tool-loop").responses.create(model="gpt-5", input="q", store=False)
    return [item.model_dump(exclude_none=True) for item in response.output]


def test_reasoning_item_without_its_follower(server: EmulatorServer) -> None:
    rs, _msg, fc = _first_responses_output(server)
    with pytest.raises(openai.BadRequestError) as info:
        client(server, "tool-loop").responses.create(
            model="gpt-5", input=[{"role": "user", "content": "q"}, rs, fc]
        )
    assert info.value.body == {
        "message": f"Item '{rs['id']}' of type 'reasoning' was provided without its required following item.",
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
    }


def test_follower_without_its_reasoning_item(server: EmulatorServer) -> None:
    _rs, msg, fc = _first_responses_output(server)
    with pytest.raises(openai.BadRequestError) as info:
        client(server, "tool-loop").responses.create(
            model="gpt-5", input=[{"role": "user", "content": "q"}, msg, fc]
        )
    required = "rs_" + msg["id"][4:-2]
    assert info.value.message.endswith(
        f"Item '{msg['id']}' of type 'message' was provided without its required 'reasoning' item: '{required}'."
    )


def test_tampered_or_foreign_encrypted_content(server: EmulatorServer) -> None:
    rs, msg, _fc = _first_responses_output(server)
    for model, blob in (
        ("gpt-5", rs["encrypted_content"][:-6] + "AAAAAA"),
        ("o3", rs["encrypted_content"]),
    ):
        with pytest.raises(openai.BadRequestError, match="could not be verified") as info:
            client(server, "tool-loop").responses.create(
                model=model, input=[dict(rs, encrypted_content=blob), msg]
            )
        assert info.value.code == "invalid_encrypted_content"
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]\.summary"):
        client(server, "tool-loop").responses.create(
            model="gpt-5", input=[{k: v for k, v in rs.items() if k != "summary"}, msg]
        )


def test_deepseek_requires_reasoning_content_on_tool_turns(server: EmulatorServer) -> None:
    sdk = client(server, "tool-loop", "deepseek")
    first = sdk.chat.completions.create(
        model="deepseek-chat", messages=[{"role": "user", "content": "q"}], tools=TOOLS
    )
    message = first.choices[0].message.model_dump(exclude_none=True)
    call = message["tool_calls"][0]["id"]
    history = [
        {"role": "user", "content": "q"},
        message,
        {"role": "tool", "tool_call_id": call, "content": "MX"},
    ]
    second = sdk.chat.completions.create(model="deepseek-chat", messages=history, tools=TOOLS)
    assert second.choices[0].message.tool_calls  # passing the message back as returned works
    stripped = {k: v for k, v in message.items() if k != "reasoning_content"}
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(
            model="deepseek-chat", messages=[history[0], stripped, history[2]], tools=TOOLS
        )
    assert info.value.body == {
        "message": "The `reasoning_content` in the thinking mode must be passed back to the API.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request_error",
    }
    # thinking off: nothing to pass back
    sdk.chat.completions.create(
        model="deepseek-chat",
        messages=[history[0], stripped, history[2]],
        tools=TOOLS,
        extra_body={"thinking": {"type": "disabled"}},
    )


def test_openrouter_anthropic_details_are_required_and_checked(server: EmulatorServer) -> None:
    sdk = client(server, "tool-loop", "openrouter")
    model = CHAT_MODELS["openrouter"]
    first = sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "q"}], tools=TOOLS, extra_body=ON
    )
    message = first.choices[0].message.model_dump(exclude_none=True)
    tool = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "MX"}
    ok = sdk.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "q"}, message, tool],
        tools=TOOLS,
        extra_body=ON,
    )
    assert ok.choices[0].message.tool_calls
    stripped = {k: v for k, v in message.items() if k != "reasoning_details"}
    tampered = dict(
        message, reasoning_details=[dict(message["reasoning_details"][0], text="edited")]
    )
    for bad, expected in (
        (stripped, "Expected `thinking` or `redacted_thinking`"),
        (tampered, "Invalid `signature` in `thinking` block"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            sdk.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "q"}, bad, tool],
                tools=TOOLS,
                extra_body=ON,
            )
        body = info.value.body
        assert isinstance(body, dict) and body["message"] == "Provider returned error"
        assert expected in json.loads(body["metadata"]["raw"])["error"]["message"]


def test_tool_message_must_answer_a_call(server: EmulatorServer) -> None:
    with pytest.raises(openai.BadRequestError, match="must be a response to a preceeding message"):
        client(server, "tool-loop", "vllm").chat.completions.create(
            model="m",
            messages=[
                {"role": "user", "content": "q"},
                {"role": "tool", "tool_call_id": "x", "content": "y"},
            ],
        )

"""The emulator's Anthropic format, checked with the official ``anthropic`` SDK as the oracle.

The SDK must parse every emulator stream and body, agree with our adapter on thinking text,
signature, text and tool calls, and see each emulated 400 as a ``BadRequestError`` with the real
API's message.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import pytest
from support.sse import frames

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.testing.emulator import (
    Call,
    Cut,
    Emulator,
    EmulatorServer,
    Say,
    Scenario,
    ScriptedTurn,
    Think,
    serve_emulator,
)
from thoughtgate.testing.emulator.anthropic_format import thinking_signature
from thoughtgate.testing.emulator.scenarios import builtin_scenarios
from thoughtgate.types import Message

HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
BUDGET = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator()
    for scenario in builtin_scenarios().values():
        emulator.add(scenario)
    emulator.add(
        Scenario(
            "unicode-tool",
            (
                ScriptedTurn(
                    (
                        Think("Convert 25 °C — easy: 77 °F."),
                        Say("Converting… "),
                        Call("convert", {"value": 25, "unit": "°C", "to": ["°F", "K"]}),
                    ),
                    chunk_chars=5,
                ),
            ),
        )
    )
    emulator.add(Scenario("cut-json", (ScriptedTurn((Say("half"), Cut())),)))
    emulator.default = "think-and-answer"
    with serve_emulator(emulator) as running:
        yield running


@pytest.fixture
async def sdk(server: EmulatorServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
    yield client
    await client.close()


def scenario(name: str) -> dict[str, Any]:
    return {"extra_headers": {"x-emulator-scenario": name}}


def adapter(
    server: EmulatorServer, name: str, model: str = "claude-sonnet-4-5"
) -> AnthropicProvider:
    settings = ProviderSettings(
        base_url=server.url,
        api_key="k",
        extra={"thoughtgate": {"headers": {"x-emulator-scenario": name}}},
    )
    return AnthropicProvider(model, settings)


USER = [{"role": "user", "content": "Go."}]

# --------------------------------------------------------------------------- SDK oracle


@pytest.mark.parametrize("name", ["think-and-answer", "tool-loop", "redacted", "unicode-tool"])
async def test_sdk_stream_and_create_agree_with_the_adapter(
    server: EmulatorServer, sdk: anthropic.AsyncAnthropic, name: str
) -> None:
    kw = dict(model="claude-sonnet-4-5", max_tokens=5120, thinking=BUDGET, messages=USER)
    async with sdk.messages.stream(**kw, **scenario(name)) as stream:  # type: ignore[arg-type]
        streamed = await stream.get_final_message()
    created = await sdk.messages.create(**kw, **scenario(name))  # type: ignore[call-overload]
    ours = adapter(server, name)
    request = TurnRequest([Message.user("Go.")], reasoning=ReasoningRequest(True), max_tokens=4096)
    turn = await stream_llm_turn(ours, request)
    assert await ours.request(request) == turn
    await ours.aclose()

    blocks = [b.to_dict() for b in streamed.content]
    assert blocks == [b.to_dict() for b in created.content]
    assert [dict(c.data) for c in turn.continuity] == [
        b for b in blocks if b["type"] in ("thinking", "redacted_thinking")
    ]
    thinking = [b for b in blocks if b["type"] == "thinking"]
    assert [p.text for p in turn.reasoning_parts if not p.redacted] == [
        b["thinking"] for b in thinking
    ]
    assert [p.signature for p in turn.reasoning_parts if not p.redacted] == [
        b["signature"] for b in thinking
    ]
    assert turn.text == "".join(b["text"] for b in blocks if b["type"] == "text")
    assert [(c.call_id, c.name, c.arguments) for c in turn.tool_calls] == [
        (b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"
    ]
    assert streamed.stop_reason == turn.raw_finish_reason
    assert streamed.usage.output_tokens == turn.usage.output_tokens > 0


async def test_sdk_tool_loop_replays_blocks_and_the_emulator_verifies_them(
    sdk: anthropic.AsyncAnthropic,
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Largest city?"}]
    for _ in range(3):
        reply = await sdk.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=5120,
            thinking=BUDGET,
            messages=messages,  # type: ignore[arg-type]
            **scenario("tool-loop"),
        )
        messages.append({"role": "assistant", "content": [b.to_dict() for b in reply.content]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "Mexico"}
            for b in reply.content
            if b.type == "tool_use"
        ]
        if results:
            messages.append({"role": "user", "content": results})
    assert reply.stop_reason == "end_turn"
    assert reply.content[-1].type == "text"


async def test_no_thinking_requested_means_no_thinking_blocks(
    sdk: anthropic.AsyncAnthropic,
) -> None:
    reply = await sdk.messages.create(
        model="claude-sonnet-4-5", max_tokens=500, messages=USER, **scenario("redacted")
    )  # type: ignore[call-overload]
    assert [b.type for b in reply.content] == ["text"]
    assert reply.usage.output_tokens_details is None


@pytest.mark.parametrize(
    ("model", "display", "shown"),
    [
        ("claude-opus-4-7", None, False),  # omitted is the default from Opus 4.7 on
        ("claude-opus-4-7", "summarized", True),
        ("claude-sonnet-4-6", None, True),
        ("claude-sonnet-4-6", "omitted", False),
    ],
)
async def test_display_setting_is_honoured(
    sdk: anthropic.AsyncAnthropic, model: str, display: str | None, shown: bool
) -> None:
    thinking: dict[str, Any] = {"type": "adaptive"}
    if display:
        thinking["display"] = display
    async with sdk.messages.stream(
        model=model,
        max_tokens=500,
        thinking=thinking,
        messages=USER,  # type: ignore[arg-type]
    ) as stream:
        message = await stream.get_final_message()
    block = message.content[0]
    assert block.type == "thinking"
    text = block.thinking
    assert bool(text) == shown
    assert block.signature == thinking_signature(model, text)
    assert message.usage.output_tokens_details is not None  # thinking is billed either way


async def test_stream_bytes_have_the_real_shape(server: EmulatorServer) -> None:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 5000, "stream": True, "thinking": BUDGET}
    async with httpx.AsyncClient() as client:
        response = await client.post(
            server.url + "/v1/messages", json=body | {"messages": USER}, headers=HEADERS
        )
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["request-id"].startswith("req_")
    text = response.text
    events = [e for e in text.split("\n\n") if e]
    names = [frame.event for frame in frames(text)]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert 'data: {"type": "ping"}' in text
    assert '"content_block":{"type":"thinking","thinking":"","signature":""}' in text
    assert any(e.endswith(" }") for e in events)  # the API's padding before the last brace
    deltas = [e for e in events if "thinking_delta" in e or "signature_delta" in e]
    assert '"thinking":""' in deltas[-2] and "signature_delta" in deltas[-1]


# --------------------------------------------------------------------------- control steps


async def test_scripted_failure_then_retry_succeeds_with_the_sdk(server: EmulatorServer) -> None:
    client = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=2)
    server.emulator.attempts.pop(("flaky", 0), None)
    reply = await client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=5000,
        thinking=BUDGET,
        messages=USER,
        **scenario("flaky"),
    )  # type: ignore[call-overload]
    await client.close()
    assert reply.content[-1].text == "Recovered after one retry."
    assert server.emulator.attempts[("flaky", 0)] == 2


async def test_in_stream_error_reaches_the_sdk(sdk: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.APIStatusError) as info:
        async with sdk.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=5000,
            thinking=BUDGET,
            messages=USER,
            **scenario("stream-error"),
        ) as stream:  # type: ignore[arg-type]
            await stream.get_final_message()
    assert info.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}  # type: ignore[index]


@pytest.mark.parametrize("stream", [True, False])
async def test_cut_breaks_the_connection_mid_body(server: EmulatorServer, stream: bool) -> None:
    body = {"model": "m", "max_tokens": 50, "messages": USER, "stream": stream}
    headers = HEADERS | {"x-emulator-scenario": "cut" if stream else "cut-json"}
    received = b""
    async with (
        httpx.AsyncClient() as client,
        client.stream("POST", server.url + "/v1/messages", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            async for piece in r.aiter_bytes():
                received += piece
    assert received  # some of the body arrived before the cut
    if stream:
        assert b"Partial ans" in received and b"message_stop" not in received


# --------------------------------------------------------------------------- validation


def _thinking_history(**changes: Any) -> list[dict[str, Any]]:
    signature = thinking_signature("claude-sonnet-4-5", "Plan.")
    block = {"type": "thinking", "thinking": "Plan.", "signature": signature}
    block |= changes
    return [
        {"role": "user", "content": "Go."},
        {
            "role": "assistant",
            "content": [block, {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}],
        },
    ]


LOOP_MESSAGE = (
    "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. "
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block "
    "(preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you "
    "include thinking blocks from previous turns. To avoid this requirement, disable `thinking`. "
    "Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)


def _without_thinking(first: str) -> list[dict[str, Any]]:
    history = _thinking_history()
    content = history[1]["content"]
    history[1]["content"] = (
        [{"type": "text", "text": "Checking."}, content[1]] if first == "text" else [content[1]]
    )
    return history


CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "budget below 1024",
        {"thinking": {"type": "enabled", "budget_tokens": 500}},
        "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
    ),
    (
        "max_tokens not above budget",
        {"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 2048}},
        "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
        "documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        "#max-tokens-and-context-window-size",
    ),
    *[
        (
            f"budget form on {model}",
            {"model": model, "thinking": BUDGET},
            '"thinking.type.enabled" is not supported for this model. Use '
            '"thinking.type.adaptive" and "output_config.effort" to control thinking behavior.',
        )
        for model in ("claude-opus-4-7", "claude-fable-5", "claude-mythos-5-20260901")
    ],
    (
        "tool loop without thinking (text first)",
        {"thinking": BUDGET, "messages": _without_thinking("text")},
        LOOP_MESSAGE.format(found="text"),
    ),
    (
        "tool loop without thinking (tool_use first)",
        {"thinking": BUDGET, "messages": _without_thinking("tool_use")},
        LOOP_MESSAGE.format(found="tool_use"),
    ),
    (
        "thinking block not first",
        {
            "thinking": BUDGET,
            "messages": [
                *_thinking_history()[:1],
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        _thinking_history()[1]["content"][0],
                    ],
                },
                {"role": "user", "content": "More."},
            ],
        },
        "messages.1.content.0: If an assistant message contains any thinking blocks, the first "
        "block must be thinking or redacted_thinking. Found text.",
    ),
    (
        "edited thinking text",
        {"thinking": BUDGET, "messages": _thinking_history(thinking="Plan!")},
        "messages.1.content.0: `thinking` or `redacted_thinking` blocks in the latest assistant "
        "message cannot be modified. These blocks must remain as they were in the original "
        "response.",
    ),
    (
        "forged signature",
        {"thinking": BUDGET, "messages": _thinking_history(signature="EqNotARealSignature")},
        "messages.1.content.0: Invalid `signature` in `thinking` block",
    ),
    (
        "thinking sent while disabled",
        {"messages": _thinking_history()},
        "messages.1.content.0: When thinking is disabled, an `assistant` message in the final "
        "position cannot contain `thinking`. To use thinking blocks, enable `thinking` in your "
        "request.",
    ),
    (
        "temperature with thinking",
        {"thinking": BUDGET, "extra_body": {"temperature": 0.5}},
        "`temperature` may only be set to 1 when thinking is enabled.",
    ),
    (
        "tool_use without tool_result",
        {
            "messages": [
                {"role": "user", "content": "Go."},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_9", "name": "t", "input": {}}],
                },
                {"role": "user", "content": "Well?"},
            ]
        },
        "messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: "
        "toolu_9.",
    ),
]


@pytest.mark.parametrize(("why", "change", "message"), CASES, ids=[c[0] for c in CASES])
async def test_invalid_requests_get_the_real_400(
    sdk: anthropic.AsyncAnthropic, why: str, change: dict[str, Any], message: str
) -> None:
    kw: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 5000, "messages": USER}
    kw |= copy.deepcopy(change)
    with pytest.raises(anthropic.BadRequestError) as info:
        await sdk.messages.create(**kw)
    error = info.value
    assert error.status_code == 400
    body: Any = error.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(message), why
    assert error.request_id == body["request_id"] and error.request_id.startswith("req_")


async def test_intact_history_passes_the_same_checks(sdk: anthropic.AsyncAnthropic) -> None:
    reply = await sdk.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=5000,
        thinking=BUDGET,
        messages=_thinking_history(),  # type: ignore[arg-type]
    )
    assert reply.content


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "The request body is not valid JSON: "),
        (b'{"max_tokens": 5, "messages": []}', "model: Field required"),
        (b'{"model": "m", "messages": []}', "max_tokens: Field required"),
        (b'{"model": "m", "max_tokens": 5}', "messages: Field required"),
    ],
)
async def test_unparseable_or_incomplete_bodies(
    server: EmulatorServer, body: bytes, message: str
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(server.url + "/v1/messages", content=body, headers=HEADERS)
    assert response.status_code == 400
    payload = response.json()
    assert payload["error"]["message"].startswith(message)
    assert response.headers["request-id"] == payload["request_id"]


async def test_missing_credentials_and_version_headers(server: EmulatorServer) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": USER}
    async with httpx.AsyncClient() as client:
        no_key = await client.post(
            server.url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}
        )
        no_version = await client.post(
            server.url + "/v1/messages", json=body, headers={"x-api-key": "k"}
        )
    assert no_key.status_code == 401
    assert no_key.json()["error"] == {
        "type": "authentication_error",
        "message": "x-api-key header is required",
    }
    assert no_version.status_code == 400
    assert no_version.json()["error"]["message"] == "anthropic-version: header is required"

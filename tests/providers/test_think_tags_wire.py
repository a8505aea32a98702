"""Inline ``<think>`` in the Responses and Messages formats is reasoning, never answer (ADR 0077).

vLLM, llama.cpp and others serve ``/v1/responses``, and several vendors serve an
Anthropic-compatible ``/v1/messages``; a model served there without a reasoning parser writes its
thoughts into ``output_text`` deltas / ``text_delta``s. Both adapters split them out exactly as the
Chat Completions path does (``think_tags``: ``leading`` by default on any server but the vendor's
own): the tag content is reasoning, recorded as reasoning and filtered by the one output filter,
dropped in ``hidden`` mode, and never sent back to the model as the assistant's text.

Every test here speaks to a real HTTP server on loopback: scripted bytes (:class:`ReplayServer`,
one HTTP chunk per SSE event) or the emulator, whose bytes the official SDKs read as the oracle.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.replay import ReplayServer, Reply
from support.viewer import role_reads

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ConfigError, ProviderStreamError
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, ToolSpec, TurnRequest
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.think_tags import DELIMITER_PRESETS, split_think_tags
from thoughtgate.testing.emulator import (
    Emulator,
    EmulatorServer,
    Say,
    Scenario,
    ScriptedTurn,
    serve_emulator,
)
from thoughtgate.types import Message, ToolResultPart, Turn

pytestmark = pytest.mark.inprocess

TAG = "SECRETREASONING"
FORMATS = ("responses", "messages")
MODELS = {"responses": "Qwen/Qwen3-8B", "messages": "claude-sonnet-4-5"}
TOOL = ToolSpec("get_country", "The user's country", {"type": "object", "properties": {}})


# --------------------------------------------------------------------------- the servers' bytes


def _sse(event: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def responses_stream(pieces: list[str], *, call: bool = False) -> list[bytes]:
    """``/v1/responses`` events of a message item whose ``output_text`` comes in ``pieces``
    (as vLLM sends them), then a ``function_call`` item when ``call``."""
    model = MODELS["responses"]
    text = "".join(pieces)
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    part = {"type": "output_text", "text": text, "annotations": []}
    events = [
        {"type": "response.created", "response": {"id": "resp_1", "model": model, "output": []}},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**message, "content": []},
        },
        *(
            {
                "type": "response.output_text.delta",
                "output_index": 0,
                "content_index": 0,
                "delta": p,
            }
            for p in pieces
        ),
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**message, "content": [part]},
        },
    ]
    if call:
        item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": TOOL.name}
        events.append({"type": "response.output_item.added", "output_index": 1, "item": item})
        done = {**item, "arguments": "{}"}
        events.append({"type": "response.output_item.done", "output_index": 1, "item": done})
    usage = {"input_tokens": 5, "output_tokens": 9}
    completed = {"id": "resp_1", "model": model, "status": "completed", "usage": usage}
    events.append({"type": "response.completed", "response": completed})
    return [_sse(None, e) for e in events]


def messages_stream(
    pieces: list[str], *, call: bool = False, stop: str | None = None
) -> list[bytes]:
    """``/v1/messages`` events of a text block whose ``text_delta``s are ``pieces``, then a
    ``tool_use`` block when ``call``; compact JSON, as Anthropic-compatible servers send it."""
    start = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODELS["messages"],
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    out = [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    for p in pieces:
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": p},
        }
        out.append(_sse("content_block_delta", delta))
    out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    if call:
        block = {"type": "tool_use", "id": "toolu_1", "name": TOOL.name, "input": {}}
        out.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": 1, "content_block": block},
            )
        )
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 1}))
    stop = stop or ("tool_use" if call else "end_turn")
    delta = {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 9}}
    out.append(_sse("message_delta", delta))
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return out


def whole_body(fmt: str, text: str) -> bytes:
    """A non-streamed answer of ``fmt`` whose one text part is ``text``."""
    if fmt == "responses":
        part = {"type": "output_text", "text": text, "annotations": []}
        message = {"type": "message", "id": "msg_1", "role": "assistant", "content": [part]}
        body: dict[str, Any] = {
            "id": "resp_1",
            "object": "response",
            "model": MODELS[fmt],
            "status": "completed",
            "output": [message],
            "usage": {"input_tokens": 5, "output_tokens": 9},
        }
    else:
        body = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODELS[fmt],
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "output_tokens": 9},
        }
    return json.dumps(body).encode()


def stream_of(fmt: str, pieces: list[str], **kw: Any) -> Reply:
    events = responses_stream(pieces, **kw) if fmt == "responses" else messages_stream(pieces, **kw)
    return Reply(events)


# --------------------------------------------------------------------------- the adapters


def adapter(fmt: str, base: str, think_tags: Any = None, **options: Any) -> Any:
    if think_tags is not None:
        options["think_tags"] = think_tags
    extra = {"thoughtgate": options} if options else {}
    if fmt == "responses":
        settings_ = ProviderSettings(base_url=f"{base}/v1", api_key="k", max_retries=0, extra=extra)
        return OpenAIResponsesProvider(MODELS[fmt], settings_, client=httpx.AsyncClient())
    settings_ = ProviderSettings(base_url=base, api_key="k", max_retries=0, extra=extra)
    return AnthropicProvider(MODELS[fmt], settings_, client=httpx.AsyncClient())


def request(mode: str = "surface", messages: list[Message] | None = None) -> TurnRequest:
    return TurnRequest(
        messages or [Message.user("Why?")],
        tools=(TOOL,),
        reasoning=ReasoningRequest.for_mode(mode),
    )


async def served_turn(
    fmt: str,
    reply: Reply,
    *,
    mode: str = "surface",
    stream: bool = True,
    think_tags: Any = None,
    **options: Any,
) -> Turn:
    async with ReplayServer([reply]) as server:
        provider = adapter(fmt, server.url, think_tags, **options)
        try:
            if stream:
                return await stream_llm_turn(provider, request(mode))
            turn: Turn = await provider.request(request(mode))
            return turn
        finally:
            await provider.aclose()


def cut(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


# --------------------------------------------------------------------------- splitting


CONTENT = f"\n<think>\n{TAG} so the answer is 4\n</think>\n\nIt is 4."


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(FORMATS),
    cuts=st.lists(st.integers(0, len(CONTENT)), max_size=14),
    capture=st.booleans(),
)
def test_a_leading_think_block_is_reasoning_however_the_deltas_are_cut(
    fmt: str, cuts: list[int], capture: bool
) -> None:
    mode = "surface" if capture else "hidden"
    turn = asyncio.run(served_turn(fmt, stream_of(fmt, cut(CONTENT, cuts)), mode=mode))
    reasoning, answer = split_think_tags(CONTENT, leading_only=True)
    assert turn.text == answer and answer.strip() == "It is 4."
    assert turn.reasoning_text == (reasoning if capture else ""), "hidden: dropped, never answer"
    if capture:
        (part,) = turn.reasoning_parts
        assert part.reasoning_kind == "raw"


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_whole_answer_splits_as_the_stream_does(fmt: str) -> None:
    streamed = await served_turn(fmt, stream_of(fmt, cut(CONTENT, [2, 5, 11, 40])))
    headers = {"content-type": "application/json"}
    whole = await served_turn(fmt, Reply([whole_body(fmt, CONTENT)], headers=headers), stream=False)
    assert (whole.reasoning_text, whole.text) == (streamed.reasoning_text, streamed.text)
    assert whole.text.strip() == "It is 4." and TAG in whole.reasoning_text


@pytest.mark.parametrize("fmt", FORMATS)
async def test_an_unclosed_leading_block_is_reasoning_never_answer(fmt: str) -> None:
    turn = await served_turn(fmt, stream_of(fmt, ["<thi", f"nk>{TAG} still thinking <"]))
    assert turn.text == "" and turn.reasoning_text == f"{TAG} still thinking <"


@pytest.mark.parametrize("fmt", FORMATS)
async def test_tags_inside_an_answer_stay_answer_by_default(fmt: str) -> None:
    turn = await served_turn(fmt, stream_of(fmt, ["Write ", "<think>x</think>", " to mark it."]))
    assert turn.text == "Write <think>x</think> to mark it." and turn.reasoning_text == ""


@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_option_per_adapter_and_per_model(fmt: str) -> None:
    model = MODELS[fmt]
    inline = stream_of(fmt, ["A <think>", f"{TAG}</think> B"])
    assert TAG in (await served_turn(fmt, inline, think_tags="anywhere")).reasoning_text
    table = {model: "anywhere", "*": "off"}
    assert TAG in (await served_turn(fmt, inline, think_tags=table)).reasoning_text
    leading = stream_of(fmt, [f"<think>{TAG}</think>OK"])
    assert TAG in (await served_turn(fmt, leading, think_tags="off")).text, "off: all answer"
    other = {"other-model": "off"}
    assert TAG in (await served_turn(fmt, leading, think_tags=other)).reasoning_text
    with pytest.raises(ConfigError):
        adapter(fmt, "http://127.0.0.1:9", "sometimes")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(FORMATS),
    preset=st.sampled_from(sorted(DELIMITER_PRESETS)),
    named=st.booleans(),
    cuts=st.lists(st.integers(0, 60), max_size=14),
    stream=st.booleans(),
)
def test_a_leading_block_in_any_known_spelling_is_reasoning(
    fmt: str, preset: str, named: bool, cuts: list[int], stream: bool
) -> None:
    """ADR 0157: Magistral's ``[THINK]``, Seed-OSS's ``<seed:think>``, Kimi-VL's ``◁think▷`` and
    ``<thinking>`` at the start of the answer are reasoning -- named per model or not --
    streamed however cut or whole, and the answer is exactly what follows."""
    pair = DELIMITER_PRESETS[preset]
    content = f"{pair.open}\n{TAG} so the answer is 4\n{pair.close}\n\nIt is 4."
    options = {"think_delimiters": {MODELS[fmt]: preset}} if named else {}
    if stream:
        reply = stream_of(fmt, cut(content, cuts))
    else:
        reply = Reply([whole_body(fmt, content)], headers={"content-type": "application/json"})
    turn = asyncio.run(served_turn(fmt, reply, stream=stream, **options))
    assert turn.text == "It is 4." and turn.reasoning_text == f"{TAG} so the answer is 4"


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_named_pair_is_the_only_one_read(fmt: str) -> None:
    """Naming a pair narrows to it: ``think`` leaves a leading ``[THINK]`` in the answer (for
    a model whose answers start with it), and ``mistral`` leaves ``<think>`` there."""
    quoted = stream_of(fmt, ["[THINK] is a token.", " Done."])
    turn = await served_turn(fmt, quoted, think_delimiters="think")
    assert turn.text == "[THINK] is a token. Done." and turn.reasoning_text == ""
    inline = stream_of(fmt, [f"<think>{TAG}</think>[THI", "NK]x[/THINK]OK"])
    turn = await served_turn(fmt, inline, think_delimiters="mistral")
    assert turn.text == f"<think>{TAG}</think>[THINK]x[/THINK]OK"
    with pytest.raises(ConfigError):
        adapter(fmt, "http://127.0.0.1:9", think_delimiters=["<r>", "<r>"])


OPENED = f"{TAG} the template opened the block\n</think>\n\nIt is 4."


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(FORMATS), cuts=st.lists(st.integers(0, len(OPENED)), max_size=12))
def test_opened_reads_the_start_as_reasoning_up_to_the_close_tag(fmt: str, cuts: list[int]) -> None:
    """``opened`` (ADR 0156): a chat template put ``<think>`` into the prompt, so the output
    starts mid-thought and only ``</think>`` marks the answer; without it that text would be
    the answer, shown to every viewer and sent back as what the model said."""
    reply = stream_of(fmt, cut(OPENED, cuts))
    turn = asyncio.run(served_turn(fmt, reply, think_tags="opened"))
    assert turn.text == "It is 4." and TAG in turn.reasoning_text


@pytest.mark.parametrize("fmt", FORMATS)
async def test_opened_opens_only_the_turns_first_part(fmt: str) -> None:
    """A turn whose first part is the server's own reasoning (a thinking block, a reasoning
    item) or a call: the text after it is answer, and a later ``<think>`` still opens a block."""
    if fmt == "messages":
        events = messages_stream(["Done. <think>", f"{TAG}</think> Bye."])
        # a thinking block first, at index 0; the text block moves to index 1
        thinking = {"type": "thinking", "thinking": "x", "signature": "s"}
        start = [e for e in events if b"message_start" in e]
        rest = [e.replace(b'"index":0', b'"index":1') for e in events if b"message_start" not in e]
        block = [
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": thinking},
            ),
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        reply = Reply([*start, *block, *rest])
    else:
        events = responses_stream(["Done. <think>", f"{TAG}</think> Bye."])
        item = {"type": "reasoning", "id": "rs_1", "summary": []}
        added = {"type": "response.output_item.added", "output_index": 5, "item": item}
        done = {"type": "response.output_item.done", "output_index": 5, "item": item}
        reply = Reply([events[0], _sse(None, added), _sse(None, done), *events[1:]])
    turn = await served_turn(fmt, reply, think_tags="opened")
    assert turn.text == "Done. Bye." and turn.reasoning_parts[-1].text == TAG


@pytest.mark.parametrize(
    ("fmt", "base", "expected"),
    [
        ("responses", "https://api.openai.com", "off"),
        ("responses", "https://example-resource.openai.azure.com/openai", "leading"),
        ("responses", "http://127.0.0.1:8000", "leading"),
        ("messages", "https://api.anthropic.com", "off"),
        ("messages", "https://api.deepseek.com/anthropic", "leading"),
        ("messages", "http://127.0.0.1:8000", "leading"),
    ],
)
async def test_off_by_default_only_on_the_vendors_own_api(
    fmt: str, base: str, expected: str
) -> None:
    provider = adapter(fmt, base)
    try:
        assert provider.think_tags == expected
    finally:
        await provider.aclose()


@pytest.mark.parametrize("fmt", FORMATS)
async def test_naming_the_vendors_server_turns_the_default_off(fmt: str) -> None:
    """Behind a gateway the host says nothing; ``server`` names what is behind it."""
    vendor = "openai" if fmt == "responses" else "anthropic"
    provider = adapter(fmt, "http://127.0.0.1:9", server=vendor)
    try:
        assert provider.think_tags == "off"
    finally:
        await provider.aclose()


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_stream_cut_inside_the_block_keeps_it_as_reasoning(fmt: str) -> None:
    pieces = ["<think>", f"{TAG} hm </thi"]
    events = stream_of(fmt, pieces).pieces
    deltas = 2 + len(pieces)  # the stream breaks right after its last text delta
    with pytest.raises(ProviderStreamError) as caught:
        await served_turn(fmt, Reply(events[:deltas]))
    partial = caught.value.partial
    assert partial is not None
    assert partial.text == "" and partial.reasoning_text == f"{TAG} hm </thi"


# --------------------------------------------------------------------------- what goes back


@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_tag_reasoning_never_goes_back_in_a_tool_loop(fmt: str) -> None:
    first = stream_of(fmt, [f"<think>{TAG} I should ", "ask</think>Let me look."], call=True)
    async with ReplayServer([first, stream_of(fmt, ["Mexico City."])]) as server:
        provider = adapter(fmt, server.url)
        try:
            history = [Message.user("Largest city in my country?")]
            turn = await stream_llm_turn(provider, request("surface", history))
            assert TAG in turn.reasoning_text and turn.text == "Let me look."
            (call,) = turn.tool_calls
            results = (ToolResultPart(call.call_id, "Mexico", name=call.name),)
            history += [turn.as_message(), Message("tool", results)]
            answer = await stream_llm_turn(provider, request("surface", history))
        finally:
            await provider.aclose()
    assert answer.text == "Mexico City."
    sent = json.dumps(server.bodies[1])
    assert "Let me look." in sent, "the answer text goes back"
    assert TAG not in sent and "<think>" not in sent


async def test_a_paused_messages_turn_sends_no_tag_reasoning_back() -> None:
    """``pause_turn``: the continuation carries the paused text, without its reasoning."""
    paused = Reply(messages_stream([f"<think>{TAG}</think>", "Searching."], stop="pause_turn"))
    async with ReplayServer([paused, stream_of("messages", [" Found it."])]) as server:
        provider = adapter("messages", server.url)
        try:
            turn = await stream_llm_turn(provider, request())
        finally:
            await provider.aclose()
    assert len(server.bodies) == 2
    continuation = json.dumps(server.bodies[1]["messages"][-1])
    assert "Searching." in continuation and TAG not in continuation
    assert TAG in turn.reasoning_text and TAG not in turn.text


# --------------------------------------------------------------------------- the SDKs as oracle


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorServer]:
    emu = Emulator()
    for size in (1, 3, 7, 12):
        emu.add(
            Scenario(f"inline-think-{size}", (ScriptedTurn((Say(CONTENT),), chunk_chars=size),))
        )
    with serve_emulator(emu) as server:
        yield server


async def _adapter_on_emulator(fmt: str, server: EmulatorServer, scenario: str) -> Turn:
    headers = {"x-emulator-scenario": scenario}
    base = server.v1 if fmt == "responses" else server.url
    settings_ = ProviderSettings(base_url=base, api_key="k", max_retries=0)
    cls: Any = OpenAIResponsesProvider if fmt == "responses" else AnthropicProvider
    provider = cls(MODELS[fmt], settings_, client=httpx.AsyncClient(headers=headers))
    try:
        turn: Turn = await stream_llm_turn(provider, request())
        return turn
    finally:
        await provider.aclose()


async def _sdk_text(fmt: str, server: EmulatorServer, scenario: str) -> str:
    """The answer text the official SDK assembles from the same server's bytes."""
    headers = {"x-emulator-scenario": scenario}
    if fmt == "responses":
        oai = openai.AsyncOpenAI(
            base_url=server.v1, api_key="k", max_retries=0, default_headers=headers
        )
        async with oai.responses.stream(model=MODELS[fmt], input="Why?") as stream:
            response = await stream.get_final_response()
        await oai.close()
        return response.output_text
    ant = anthropic.AsyncAnthropic(
        base_url=server.url, api_key="k", max_retries=0, default_headers=headers
    )
    async with ant.messages.stream(
        model=MODELS[fmt], max_tokens=100, messages=[{"role": "user", "content": "Why?"}]
    ) as stream:
        message = await stream.get_final_message()
    await ant.close()
    return "".join(b.text for b in message.content if b.type == "text")


@pytest.mark.parametrize("size", [1, 3, 7, 12])
@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_sdk_reads_the_tags_as_text_and_the_adapter_splits_them(
    emulator: EmulatorServer, fmt: str, size: int
) -> None:
    scenario = f"inline-think-{size}"
    sdk_text = await _sdk_text(fmt, emulator, scenario)
    assert sdk_text == CONTENT, "the server sent the tags as answer text"
    turn = await _adapter_on_emulator(fmt, emulator, scenario)
    assert (turn.reasoning_text, turn.text) == split_think_tags(sdk_text, leading_only=True)


# --------------------------------------------------------------------------- what a viewer reads


@pytest.mark.parametrize("mode", ["hidden", "surface", "telemetry_only"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_viewer_never_reads_the_tag_content(fmt: str, mode: str) -> None:
    content = f"<think>{TAG}</think>The answer."
    prefix = "openai" if fmt == "responses" else "anthropic"

    async def main() -> dict[str, str]:
        async with ReplayServer([stream_of(fmt, cut(content, [3, 9, 17]))]) as server:

            def factory(model: str) -> Any:
                return adapter(fmt, server.url)

            return await role_reads(factory, f"{prefix}:{MODELS[fmt]}", mode)

    reads = asyncio.run(main())
    assert "The answer." in reads["viewer"]
    assert TAG not in reads["viewer"]
    assert (TAG in reads["developer"]) == (mode == "surface")

"""What a tool loop sends back to the model: the answer and its tool calls, plus only the carriers
an API demands -- never reasoning text of its own accord (ADR 0005, ADR 0156).

A sloppy or hostile provider is played here: reasoning inline in ``content`` cut at any
character, blocks that open after a tool call's text, a reasoning field next to inline tags, and
reasoning items whose ``summary`` and ``content`` carry text. Each test reads the body of the
*next* request, as the server receives it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, ToolSpec, TurnRequest
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import CARRIER, OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.providers.think_tags import DELIMITER_PRESETS, split_think_tags
from thoughtgate.types import (
    ContinuityBlock,
    Message,
    ReasoningPart,
    ToolCallPart,
    ToolResultPart,
    Turn,
)

pytestmark = pytest.mark.unit

TAG = "SECRETREASONING"
TOOL = ToolSpec("get_country", "The user's country", {"type": "object", "properties": {}})


# --------------------------------------------------------------------------- Chat Completions


def _chat(pieces: list[str], *, call: bool, extra: dict[str, Any] | None = None) -> str:
    """A chat completion stream: ``content`` in ``pieces`` (each delta also carrying ``extra``),
    then one tool call when ``call``."""
    events: list[dict[str, Any]] = [
        {
            "id": "c1",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": p, **(extra or {})}}],
        }
        for p in pieces
    ]
    if call:
        fn = {"name": "get_country", "arguments": "{}"}
        delta = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": fn}]}
        events.append({"choices": [{"index": 0, "delta": delta}]})
    reason = "tool_calls" if call else "stop"
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def _loop(
    adapter: str, first: str, *, capture: bool = True, **options: Any
) -> tuple[Turn, dict[str, Any]]:
    """One tool-call turn answered with ``first``, its tool result, and the body of the request
    that follows it."""
    replies = [first, _chat(["Mexico City."], call=False)]
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        text = replies[len(bodies) - 1]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=text)

    cls: Any = OpenAICompatibleProvider if adapter == "compat" else OpenRouterProvider
    model = "m" if adapter == "compat" else "deepseek/deepseek-r1"
    base = "http://replay.invalid/v1" if adapter == "compat" else "http://replay.invalid"
    settings_ = ProviderSettings(
        base_url=base, api_key="k", max_retries=0, extra={"thoughtgate": options}
    )

    async def main() -> Turn:
        provider = cls(
            model, settings_, client=httpx.AsyncClient(transport=httpx.MockTransport(answer))
        )
        reasoning = ReasoningRequest(enabled=capture)
        try:
            history = [Message.user("Largest city in my country?")]
            turn = await stream_llm_turn(
                provider, TurnRequest(history, tools=(TOOL,), reasoning=reasoning)
            )
            results = tuple(
                ToolResultPart(c.call_id, "Mexico", name=c.name) for c in turn.tool_calls
            )
            history += [turn.as_message(), Message("tool", results)]
            await stream_llm_turn(
                provider, TurnRequest(history, tools=(TOOL,), reasoning=reasoning)
            )
            return turn
        finally:
            await provider.aclose()

    turn = asyncio.run(main())
    assert len(bodies) == 2
    return turn, bodies[1]


def _cut(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def _assistant(body: dict[str, Any]) -> dict[str, Any]:
    (message,) = [m for m in body["messages"] if m["role"] == "assistant"]
    return dict(message)


# Inline reasoning as servers without a reasoning parser write it: leading newlines, two blocks,
# an unclosed one after the answer (anywhere), whitespace around the tags.
ANYWHERE = (
    f"\n<think>\n{TAG} one\n</think>\n\nLet me look.<think>{TAG} two</think> Calling.<think>{TAG}"
)
LEADING = f"\n\n<think>{TAG} one</think><think>\n{TAG} two\n</think>\n\nLet me look."


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(0, 120), max_size=16), capture=st.booleans())
def test_no_cut_of_inline_reasoning_goes_back_on_a_compatible_server(
    cuts: list[int], capture: bool
) -> None:
    """An unknown server (``think_tags`` anywhere) that never sent ``reasoning_content``: the
    assistant message goes back with its answer text only, and no reasoning field at all."""
    turn, body = _loop("compat", _chat(_cut(ANYWHERE, cuts), call=True), capture=capture)
    assert TAG not in turn.text and "<think>" not in turn.text
    assert turn.text == split_think_tags(ANYWHERE)[1]
    assert turn.text.strip() == "Let me look.Calling."
    sent = _assistant(body)
    assert TAG not in json.dumps(body) and "think>" not in json.dumps(body)
    assert "reasoning_content" not in sent and "reasoning" not in sent
    assert sent["content"] == turn.text and sent["tool_calls"][0]["id"] == "call_1"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(0, 120), max_size=16), capture=st.booleans())
def test_no_cut_of_leading_reasoning_goes_back_through_openrouter(
    cuts: list[int], capture: bool
) -> None:
    """OpenRouter (``think_tags`` leading): blocks before the answer are reasoning, and none of
    it goes back -- no ``reasoning_details`` came, so none are invented."""
    turn, body = _loop("openrouter", _chat(_cut(LEADING, cuts), call=True), capture=capture)
    assert turn.text.strip() == "Let me look."
    assert TAG not in json.dumps(body) and "think>" not in json.dumps(body)
    assert set(_assistant(body)) == {"role", "content", "tool_calls"}


OPENED = f"{TAG} the template opened the block\n</think>\n\nLet me look."


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    adapter=st.sampled_from(["compat", "openrouter"]),
    cuts=st.lists(st.integers(0, 80), max_size=12),
    capture=st.booleans(),
)
def test_opened_keeps_a_template_opened_block_out_of_the_answer_and_the_loop(
    adapter: str, cuts: list[int], capture: bool
) -> None:
    """``think_tags = "opened"``: the output starts mid-thought (the template put ``<think>``
    into the prompt), so everything before ``</think>`` is reasoning, however it is cut."""
    first = _chat(_cut(OPENED, cuts), call=True)
    turn, body = _loop(adapter, first, capture=capture, think_tags="opened")
    assert turn.text == "Let me look."
    assert (TAG in turn.reasoning_text) == capture
    assert TAG not in json.dumps(body) and "think>" not in json.dumps(body)


def test_opened_on_a_server_that_splits_reasoning_itself_leaves_the_answer_alone() -> None:
    """The reasoning came in a field of its own before any content: the block the option
    assumed was never opened, and the content is the answer."""
    thought = _chat([""], call=False, extra={"reasoning_content": f"{TAG} plan"}).split("\n\n")[0]
    first = "\n\n".join([thought, _chat(["Let me look."], call=True)])
    turn, body = _loop("compat", first, think_tags="opened")
    assert turn.text == "Let me look." and TAG in turn.reasoning_text
    assert _assistant(body)["content"] == "Let me look."


def _spelled(opener: str, closer: str) -> str:
    """Two leading blocks in one spelling, then the answer, as a server without the model's
    reasoning parser writes them (ADR 0157)."""
    return f"\n{opener}\n{TAG} one\n{closer}{opener}{TAG} two{closer}\n\nLet me look."


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    adapter=st.sampled_from(["compat", "openrouter"]),
    preset=st.sampled_from(sorted(DELIMITER_PRESETS)),
    named=st.booleans(),
    cuts=st.lists(st.integers(0, 90), max_size=16),
    capture=st.booleans(),
)
def test_no_cut_of_any_known_spelling_goes_back_or_reaches_the_answer(
    adapter: str, preset: str, named: bool, cuts: list[int], capture: bool
) -> None:
    """``[THINK]`` (Magistral), ``<seed:think>`` (Seed-OSS), ``◁think▷`` (Kimi-VL),
    ``<thinking>``: named per model (``think_delimiters``) or not named at all (a leading block
    in a known spelling), the reasoning is neither the answer nor in the next request, and the
    answer is the model's, character for character."""
    pair = DELIMITER_PRESETS[preset]
    options = {"think_delimiters": {"m": preset, "deepseek/deepseek-r1": preset}} if named else {}
    first = _chat(_cut(_spelled(pair.open, pair.close), cuts), call=True)
    turn, body = _loop(adapter, first, capture=capture, **options)
    assert turn.text == "\nLet me look."
    assert (TAG in turn.reasoning_text) == capture
    sent = json.dumps(body)
    assert TAG not in sent and pair.open not in sent and pair.close not in sent
    assert _assistant(body)["content"] == turn.text


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    preset=st.sampled_from(sorted(DELIMITER_PRESETS)),
    cuts=st.lists(st.integers(0, 80), max_size=12),
)
def test_opened_with_a_named_pair_waits_for_its_own_closer(preset: str, cuts: list[int]) -> None:
    """Seed-OSS's template ends the prompt with ``<seed:think>``: ``opened`` with the pair
    named reads everything up to ``</seed:think>`` as reasoning, ``</think>`` included."""
    pair = DELIMITER_PRESETS[preset]
    text = f"{TAG} a </think> b\n{pair.close}\n\nLet me look."
    if preset == "think":
        text = f"{TAG} b\n{pair.close}\n\nLet me look."
    first = _chat(_cut(text, cuts), call=True)
    turn, body = _loop("compat", first, think_tags="opened", think_delimiters=preset)
    assert turn.text == "Let me look." and TAG in turn.reasoning_text
    assert TAG not in json.dumps(body)


def test_deepseek_gets_its_reasoning_content_back_and_never_in_content() -> None:
    """DeepSeek demands ``reasoning_content`` back on a tool-call turn (400 without it): it goes
    there, the only place, and the answer goes back without it."""
    first = _chat(["Let me look."], call=True, extra={"reasoning_content": f"{TAG} plan"})
    turn, body = _loop("compat", first, server="deepseek")
    sent = _assistant(body)
    assert sent["reasoning_content"] == f"{TAG} plan"
    assert TAG not in sent["content"] and sent["content"] == "Let me look."
    others = [m for m in body["messages"] if m["role"] != "assistant"]
    assert TAG not in json.dumps(others)
    assert TAG in turn.reasoning_text


def test_a_reasoning_field_next_to_stray_tags_sends_no_tag_text_as_answer() -> None:
    """A server that puts a bare ``<think>`` into ``content`` and its reasoning in a field of its
    own (Together): the stray tag opened nothing, the answer goes back as answer."""
    stray = _chat(["<think>"], call=False).split("\n\n")[0]
    thought = _chat([""], call=False, extra={"reasoning": f"{TAG} plan"}).split("\n\n")[0]
    first = "\n\n".join([stray, thought, _chat(["\n", "Let me look."], call=True)])
    turn, body = _loop("compat", first, server="together")
    assert turn.text.strip() == "Let me look."
    assert TAG not in _assistant(body)["content"]


def _stray_beside(
    reasoning: list[str], answer: list[str], *, tag: str, together: bool, field: str
) -> str:
    """A stream whose reasoning comes in ``field``, its ``content`` a bare ``tag`` first: in the
    delta of the first reasoning piece (``together`` false) or in one of its own before it, then
    the answer in ``content``, then a tool call."""
    events: list[dict[str, Any]] = []
    if together:
        events.append({"content": tag, field: reasoning[0]})
    else:
        events += [{"content": tag}, {field: reasoning[0]}]
    events += [{field: piece} for piece in reasoning[1:]]
    events += [{"content": piece} for piece in answer]
    fn = {"name": "get_country", "arguments": "{}"}
    events.append(
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": fn}]}
    )
    lines = [{"id": "c1", "model": "m", "choices": [{"index": 0, "delta": e}]} for e in events]
    lines.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in lines) + "data: [DONE]\n\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    adapter=st.sampled_from(["compat", "openrouter"]),
    together=st.booleans(),
    tag=st.sampled_from(["<think>", "<think>\n", "<think>\n\n"]),
    reasoning_cuts=st.lists(st.integers(0, 40), max_size=6),
    answer_cuts=st.lists(st.integers(0, 30), max_size=8),
    capture=st.booleans(),
)
def test_a_stray_tag_beside_a_reasoning_field_keeps_the_answer(
    adapter: str,
    together: bool,
    tag: str,
    reasoning_cuts: list[int],
    answer_cuts: list[int],
    capture: bool,
) -> None:
    """A bare ``<think>`` in ``content`` opens nothing when the reasoning comes in a field of its
    own, whether the tag came in the field's first delta or before it, however the reasoning
    and the answer are cut: the answer survives whole, and no reasoning reaches it or goes back
    as what the model said."""
    reasoning = f"{TAG} plan: ask the tool for the country."
    answer = "Let me look it up."
    field = "reasoning_content" if adapter == "compat" else "reasoning"
    stream = _stray_beside(
        _cut(reasoning, reasoning_cuts) or [reasoning],
        _cut(answer, answer_cuts),
        tag=tag,
        together=together,
        field=field,
    )
    turn, body = _loop(adapter, stream, capture=capture)
    assert turn.text.strip() == answer
    assert TAG not in turn.text and "think>" not in turn.text
    if capture:
        assert turn.reasoning_text == reasoning
    sent = _assistant(body)
    assert sent["content"].strip() == answer
    assert TAG not in json.dumps(sent.get("content")) and "think>" not in json.dumps(body)


def test_inline_reasoning_after_a_tag_beside_a_field_stays_reasoning() -> None:
    """The stray rule leaves only an empty block: text that came after the tag in the same
    delta as the field (a server that writes reasoning inline as well) stays reasoning."""
    events = [
        {"content": f"<think>{TAG} inline", "reasoning_content": "field"},
        {"content": f"{TAG} more"},
    ]
    lines = [{"id": "c1", "model": "m", "choices": [{"index": 0, "delta": e}]} for e in events]
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in lines)
    stream += _chat(["</think>Let me look."], call=True)
    turn, body = _loop("compat", stream)
    assert TAG not in turn.text and TAG not in json.dumps(_assistant(body).get("content"))


# --------------------------------------------------------------------------- Responses


def _responses_history(item: dict[str, Any]) -> list[Message]:
    block = ContinuityBlock(
        CARRIER,
        {"item": item, "next_item": {"type": "function_call", "id": "fc_1", "call_id": "call_1"}},
        provider="openai",
        model="o3",
    )
    assistant = Message(
        "assistant",
        (
            ReasoningPart(
                f"{TAG} summary", reasoning_kind="summary", provider="openai", model="o3"
            ),
            block,
            ToolCallPart("call_1", "get_country", "{}"),
        ),
    )
    return [Message.user("Q"), assistant, Message("tool", (ToolResultPart("call_1", "MX"),))]


@pytest.mark.parametrize(
    "text_fields",
    [
        {"summary": [{"type": "summary_text", "text": f"{TAG} summary"}]},
        # a server that also hands the raw reasoning back in the item (gpt-oss on vLLM, Ollama)
        {"summary": [], "content": [{"type": "reasoning_text", "text": f"{TAG} raw"}]},
    ],
)
def test_a_reasoning_item_goes_back_without_its_text(text_fields: dict[str, Any]) -> None:
    """The API needs the item's id, its ``encrypted_content`` and a ``summary`` field, not the
    text: OpenAI's model does not read a replayed summary, and a server that decodes the item
    itself would put the text into the prompt."""
    item = {"id": "rs_1", "type": "reasoning", "encrypted_content": "gAAAA-blob", **text_fields}
    provider = OpenAIResponsesProvider(
        "o3", ProviderSettings(base_url="http://replay.invalid/v1", api_key="k")
    )
    request = TurnRequest(
        _responses_history(item), tools=(TOOL,), reasoning=ReasoningRequest(enabled=True)
    )
    body = provider.build_body(request, stream=True)
    assert TAG not in json.dumps(body)
    (replayed,) = [i for i in body["input"] if i.get("type") == "reasoning"]
    assert replayed == {
        "id": "rs_1",
        "type": "reasoning",
        "encrypted_content": "gAAAA-blob",
        "summary": [],
    }
    following = body["input"][body["input"].index(replayed) + 1]
    assert following["id"] == "fc_1", "the item still goes right before its follower"
    assert item["summary"] == text_fields["summary"], "the carrier itself is left as it came"


# --------------------------------------------------------------------------- Messages


def _messages(blocks: list[dict[str, Any]], *, stop: str) -> str:
    """A Messages stream of whole ``blocks``, each sent as its start, one delta and its stop."""
    start = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5"}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": {**start, "content": [], "usage": {"input_tokens": 5}}})
    ]
    for i, block in enumerate(blocks):
        kind = block["type"]
        opened = {
            "thinking": {"type": "thinking", "thinking": "", "signature": ""},
            "text": {"type": "text", "text": ""},
            "tool_use": {**block, "input": {}},
        }.get(kind, block)
        events.append(("content_block_start", {"index": i, "content_block": opened}))
        if kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
            events.append(("content_block_delta", {"index": i, "delta": delta}))
            signed = {"type": "signature_delta", "signature": block["signature"]}
            events.append(("content_block_delta", {"index": i, "delta": signed}))
        elif kind == "text":
            delta = {"type": "text_delta", "text": block["text"]}
            events.append(("content_block_delta", {"index": i, "delta": delta}))
        elif kind == "tool_use":
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events.append(("content_block_delta", {"index": i, "delta": delta}))
        events.append(("content_block_stop", {"index": i}))
    events.append(
        ("message_delta", {"delta": {"stop_reason": stop}, "usage": {"output_tokens": 9}})
    )
    events.append(("message_stop", {}))
    return "".join(
        f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n" for name, data in events
    )


SIGNED_1 = {"type": "thinking", "thinking": "SIGNED one", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "opaque-blob"}
SIGNED_2 = {"type": "thinking", "thinking": "SIGNED two", "signature": "sig-2"}
SIGNED_3 = {"type": "thinking", "thinking": "SIGNED three", "signature": "sig-3"}


def _call(n: int) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{n}", "name": "get_country", "input": {"n": n}}


def test_signed_blocks_go_back_first_in_order_across_turns_and_tag_text_never() -> None:
    """Three tool turns on an Anthropic-compatible server (``think_tags`` leading): each
    assistant message goes back with its own thinking and redacted_thinking blocks first, in the
    order they came and unchanged; the inline ``<think>`` text of a text block, and a block the
    stream never signed, never go back; the last turn thinks and calls no tool, and ends the
    loop with its thinking recorded, not sent anywhere."""
    replies = [
        # an adaptive model's whitespace text before its thinking, then inline tags in the text
        _messages(
            [
                {"type": "text", "text": "\n\n"},
                SIGNED_1,
                {"type": "text", "text": f"<think>{TAG} one</think>Let me look."},
                _call(1),
            ],
            stop="tool_use",
        ),
        _messages([REDACTED, SIGNED_2, _call(2)], stop="tool_use"),
        _messages(
            [{"type": "thinking", "thinking": f"{TAG} unsigned", "signature": ""}, _call(3)],
            stop="tool_use",
        ),
        _messages([SIGNED_3, {"type": "text", "text": "Mexico City."}], stop="end_turn"),
    ]
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        text = replies[len(bodies) - 1]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=text)

    async def main() -> list[Turn]:
        settings_ = ProviderSettings(base_url="http://replay.invalid", api_key="k", max_retries=0)
        client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
        provider = AnthropicProvider("claude-sonnet-4-5", settings_, client=client)
        reasoning = ReasoningRequest(enabled=True)
        history = [Message.user("Largest city in my country?")]
        turns: list[Turn] = []
        try:
            for _ in replies:
                request = TurnRequest(history, tools=(TOOL,), reasoning=reasoning)
                turn = await stream_llm_turn(provider, request)
                turns.append(turn)
                if not turn.tool_calls:
                    break
                results = tuple(
                    ToolResultPart(c.call_id, "MX", name=c.name) for c in turn.tool_calls
                )
                history += [turn.as_message(), Message("tool", results)]
        finally:
            await provider.aclose()
        return turns

    turns = asyncio.run(main())
    assert len(bodies) == 4 and turns[-1].text == "Mexico City."
    assert "SIGNED three" in turns[-1].reasoning_text
    last = bodies[-1]
    assert TAG not in json.dumps(last) and "think>" not in json.dumps(last)
    sent = [m["content"] for m in last["messages"] if m["role"] == "assistant"]
    assert sent == [
        [SIGNED_1, {"type": "text", "text": "Let me look."}, _call(1)],
        [REDACTED, SIGNED_2, _call(2)],
        [_call(3)],  # the unsigned block stays reasoning; that request went without thinking
    ]
    assert "thinking" not in last, "a loop whose last turn has no signed block cannot think"
    assert "thinking" in bodies[2], "the turns before it could"

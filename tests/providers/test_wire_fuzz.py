"""Bad input gets a clear error and loses nothing: every adapter, fed mutated provider answers
through its real HTTP path (an ``httpx`` mock transport), either completes a coherent turn or fails
with thoughtgate's own :class:`~thoughtgate.errors.ProviderError` -- never a bare ``KeyError``,
``TypeError``, ``AttributeError``, ``IndexError`` or ``UnicodeError``, never a hang.

The mutations start from recorded transcripts (``tests/fixtures``) and break them the way a
server, a gateway or a network does: a stream cut at any byte, any split into network reads, a
frame's JSON truncated or invalid or not UTF-8, a field of the wrong type (null, a number for a
string, a list for an object), unknown event and block types, events dropped, duplicated or
swapped (a delta for a block never started, a stop without a start, indexes out of order),
signatures missing or empty, huge, empty and odd-unicode deltas, ``<think>`` tags inserted and
split across events, an error event mid-stream, an HTTP error status with an odd body, and a
non-streamed body mutated alike.

What every example must keep (ADRs 0071/0073): the public text of a failure
(:func:`~thoughtgate.errors.failure_text`) never quotes the provider's words -- a canary planted
in the stream's strings, or the reasoning that arrived -- and the chunks that arrived before a
failure are what the partial turn holds.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.replay import Pieces, fixture, split_at

from thoughtgate.errors import (
    MalformedResponseError,
    ProviderError,
    failure_detail,
    failure_text,
)
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.providers.sse import SSEDecoder
from thoughtgate.types import Message, Turn, TurnAccumulator

pytestmark = pytest.mark.unit

CANARY = "Kanarienvogel, reasoning 7f3e"
"""Planted in the provider's strings: a failure's public text must never show it."""

EXAMPLES = 60
"""Examples per adapter and test: bounded by count, so the file runs in seconds."""


@dataclass(frozen=True)
class Adapter:
    cls: type[Any]
    model: str
    streams: tuple[str, ...]
    bodies: tuple[str, ...]


ADAPTERS: dict[str, Adapter] = {
    "anthropic": Adapter(
        AnthropicProvider,
        "claude-sonnet-4-5",
        (
            "anthropic/thinking_text.sse",
            "anthropic/redacted.sse",
            "anthropic/tool_use.sse",
            "anthropic/adaptive_text_first.sse",
            "anthropic/refusal.sse",
        ),
        ("anthropic/fable_tool_use_caller.json",),
    ),
    "openrouter": Adapter(
        OpenRouterProvider,
        "z-ai/glm-4.6",
        (
            "openrouter/anthropic_thinking.sse",
            "openrouter/gpt5mini_summary_tool_call.sse",
            "openrouter/reasoning_string_only.sse",
            "openrouter/gemini_shared_index.sse",
            "openrouter/error_with_usage.sse",
        ),
        ("openrouter/gpt5mini_nonstream.json", "openrouter/sonnet_effort_none.json"),
    ),
    "openai_responses": Adapter(
        OpenAIResponsesProvider,
        "gpt-5",
        (
            "openai_responses/summary_then_message.sse",
            "openai_responses/reasoning_function_call.sse",
            "openai_responses/raw_reasoning_text.sse",
            "openai_responses/incomplete_max_output_tokens.sse",
            "openai_responses/error_event.sse",
        ),
        (
            "openai_responses/reasoning_function_call.json",
            "openai_responses/gpt41_function_call.json",
        ),
    ),
    "compat": Adapter(
        OpenAICompatibleProvider,
        "deepseek-reasoner",
        (
            "compat/deepseek_reasoner.sse",
            "compat/deepseek_tool_call.sse",
            "compat/think_tags_split.sse",
            "compat/think_tags_unclosed.sse",
            "compat/groq_qwen3_raw_think.sse",
            "compat/vllm_both_fields.sse",
        ),
        ("compat/deepseek_tool_call.json", "compat/cerebras_gpt_oss.json"),
    ),
}

REQUEST = TurnRequest([Message.user("Why is the sky blue?")], reasoning=ReasoningRequest(True))

# -------------------------------------------------------------------------- the wire, as events

Event = list[Any]
"""``[event name, data]``: ``data`` a decoded JSON value, or raw text (``str``) when it is none."""


def events_of(raw: bytes) -> list[Event]:
    decoder = SSEDecoder()
    messages = [*decoder.feed(raw), *decoder.flush()]
    out: list[Event] = []
    for m in messages:
        try:
            data: Any = json.loads(m.data)
        except json.JSONDecodeError:
            data = m.data
        out.append([m.event, data])
    return out


def wire(events: list[Event], *, ascii_only: bool) -> bytes:
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=ascii_only)
        lines = "".join(f"data: {line}\n" for line in text.split("\n"))
        head = f"event: {name}\n" if name and name != "message" else ""
        # a lone surrogate goes out as the bytes a broken encoder writes: not UTF-8
        out.append((head + lines + "\n").encode("utf-8", "surrogatepass"))
    return b"".join(out)


def paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a node under ``value`` (not the root itself)."""
    out: list[tuple[Any, ...]] = []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        out.append((*here, key))
        out += paths(child, (*here, key))
    return out


def get(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def put(value: Any, path: tuple[Any, ...], new: Any) -> None:
    get(value, path[:-1])[path[-1]] = new


ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    7,
    2**63,
    1.5,
    "",
    CANARY,
    "\ud800",
    "a\udfffb",
    "e\u0301\u200b\u202e\U0001f9e0",
    [],
    [CANARY],
    [None],
    {},
    {"type": CANARY},
    {"type": "text", "text": CANARY},
    "x" * 40_000,
]

THINK_BITS = ["<think>", "</think>", "<think><think>", "</think></think>", "<thi", "nk>", "<think"]


def error_event(fmt: str) -> Event:
    if fmt == "anthropic":
        return [
            "error",
            {"type": "error", "error": {"type": "overloaded_error", "message": CANARY}},
        ]
    if fmt == "openai_responses":
        return [
            "error",
            {"type": "error", "code": "server_error", "message": CANARY, "param": None},
        ]
    return ["message", {"error": {"message": CANARY, "code": 502, "metadata": {"raw": CANARY}}}]


def unknown_event(fmt: str) -> Event:
    if fmt == "anthropic":
        return [
            "content_block_start",
            {"type": "content_block_start", "index": 9, "content_block": {"type": "hologram"}},
        ]
    return ["zz_unknown", {"type": "response.hologram.delta", "delta": CANARY, "choices": []}]


@st.composite
def mutated(draw: st.DrawFn, fmt: str, source: str) -> list[Event]:
    """The events of ``source`` with a few of the mutations a broken server or gateway makes."""
    events = events_of(fixture(source))
    for _ in range(draw(st.integers(1, 3))):
        if not events:
            break
        i = draw(st.integers(0, len(events) - 1))
        name, data = events[i]
        node_paths = paths(data)
        kind = draw(
            st.sampled_from(
                [
                    "odd value",
                    "odd value",
                    "drop key",
                    "think tags",
                    "split string",
                    "truncate",
                    "garbage",
                    "drop",
                    "duplicate",
                    "swap",
                    "retype",
                    "error event",
                    "unknown event",
                ]
            )
        )
        if kind == "odd value" and node_paths:
            put(
                data,
                draw(st.sampled_from(node_paths)),
                copy.deepcopy(draw(st.sampled_from(ODD_VALUES))),
            )
        elif kind == "drop key" and node_paths:
            path = draw(st.sampled_from(node_paths))
            parent = get(data, path[:-1])
            if isinstance(parent, dict):
                del parent[path[-1]]
        elif kind in ("think tags", "split string"):
            strings = [p for p in node_paths if isinstance(get(data, p), str)]
            if not strings:
                continue
            path = draw(st.sampled_from(strings))
            text = get(data, path)
            at = draw(st.integers(0, len(text)))
            if kind == "think tags":
                put(data, path, text[:at] + draw(st.sampled_from(THINK_BITS)) + text[at:])
            else:  # one delta as two events, split anywhere
                second = copy.deepcopy(data)
                put(data, path, text[:at])
                put(second, path, text[at:])
                events.insert(i + 1, [name, second])
        elif kind == "truncate":
            text = data if isinstance(data, str) else json.dumps(data)
            events[i] = [name, text[: draw(st.integers(0, max(0, len(text) - 1)))]]
        elif kind == "garbage":
            events[i] = [
                name,
                draw(st.sampled_from(["{", "[1, 2]", '"s"', "null", "NaN", "{]", "\udcff"])),
            ]
        elif kind == "drop":
            del events[i]
        elif kind == "duplicate":
            events.insert(i, copy.deepcopy(events[i]))
        elif kind == "swap" and i + 1 < len(events):
            events[i], events[i + 1] = events[i + 1], events[i]
        elif kind == "retype" and isinstance(data, dict):
            other = draw(st.sampled_from(events))[1]
            new = other.get("type") if isinstance(other, dict) else None
            new = new or draw(st.sampled_from(["zz_unknown", "content_block_stop", "message_stop"]))
            data["type"] = new
            events[i] = [new if name not in (None, "message") else name, data]
        elif kind == "error event":
            events.insert(i, error_event(fmt))
        elif kind == "unknown event":
            events.insert(i, unknown_event(fmt))
    return events


# -------------------------------------------------------------------------- driving an adapter


def provider(fmt: str, handler: Callable[[httpx.Request], httpx.Response]) -> Any:
    spec = ADAPTERS[fmt]
    settings_ = ProviderSettings(
        base_url="http://replay.invalid/v1", api_key="sk-test", max_retries=0, timeout_s=5.0
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return spec.cls(spec.model, settings_, client=client)


def answering(body: bytes, status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    """A handler answering every request with ``body`` as JSON, not streamed."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": "application/json"}, content=body)

    return handler


@dataclass
class Outcome:
    turn: Turn | None
    error: ProviderError | None
    partial: Turn


async def streamed(fmt: str, data: bytes, cuts: list[int], cut_after: int | None) -> Outcome:
    """One streamed turn over ``data`` read in the pieces ``cuts`` make, the connection dropped
    after ``cut_after`` bytes if given. Chunks are accumulated here, not by ``stream_llm_turn``
    (whose guard turns a stray ``KeyError`` into an error: the fuzz must see it bare)."""

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream", "x-request-id": "req_fuzz"}
        return httpx.Response(
            200, headers=headers, stream=Pieces(split_at(data, cuts), cut_after=cut_after)
        )

    adapter = provider(fmt, handler)
    acc = TurnAccumulator(provider=adapter.name, model=adapter.model)
    try:
        async with asyncio.timeout(20):  # a hang fails the example instead of the suite
            async for chunk in adapter.stream(REQUEST):
                acc.feed(chunk)
        return Outcome(acc.finish(), None, acc.partial())
    except ProviderError as exc:
        return Outcome(None, exc, acc.partial())
    finally:
        await adapter.aclose()


def check(outcome: Outcome) -> None:
    """A coherent turn, or thoughtgate's own error whose public text quotes nothing the provider
    said; either way the turn holds only strings where text goes."""
    if outcome.turn is not None:
        turn = outcome.turn
        assert isinstance(turn.text, str) and isinstance(turn.reasoning_text, str)
        for call in turn.tool_calls:
            assert isinstance(call.name, str) and isinstance(call.call_id, str)
        return
    error = outcome.error
    assert error is not None
    public = failure_text(error)
    assert isinstance(public, str) and public
    assert CANARY not in public, public
    reasoning = outcome.partial.reasoning_text
    for piece in reasoning.split("\n\n"):
        if len(piece) >= 12:
            assert piece not in public, public
    assert isinstance(error.partial, Turn | None)


def stream_strategy(fmt: str) -> st.SearchStrategy[tuple[bytes, list[int], int | None]]:
    sources = ADAPTERS[fmt].streams

    @st.composite
    def draw(d: st.DrawFn) -> tuple[bytes, list[int], int | None]:
        events = d(mutated(fmt, d(st.sampled_from(sources))))
        data = wire(events, ascii_only=d(st.booleans()))
        cuts = d(st.lists(st.integers(0, len(data)), max_size=8))
        cut_after = d(st.none() | st.integers(0, len(data)))
        return data, cuts, cut_after

    return draw()


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
@settings(max_examples=EXAMPLES)
@given(data=st.data())
async def test_a_mutated_stream_completes_a_turn_or_fails_with_a_provider_error(
    fmt: str, data: st.DataObject
) -> None:
    body, cuts, cut_after = data.draw(stream_strategy(fmt))
    check(await streamed(fmt, body, cuts, cut_after))


# -------------------------------------------------------------------------- cuts lose nothing


def _boundaries(data: bytes) -> list[int]:
    sep = b"\r\n\r\n" if b"\r\n\r\n" in data else b"\n\n"
    out, at = [], data.find(sep)
    while at >= 0:
        out.append(at + len(sep))
        at = data.find(sep, at + len(sep))
    return out


def unheld(text: str) -> str:
    """``text`` without a trailing start of a ``<think>`` tag: a splitter holds one back until it
    knows, and a cut releases it as it stands (its channel's text: ``think_tags``)."""
    for tag in ("<think>", "</think>"):
        for size in range(len(tag) - 1, 0, -1):
            if text.endswith(tag[:size]):
                return text[:-size].rstrip()
    return text.rstrip()  # the whitespace before a tag is held with it


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
@settings(max_examples=EXAMPLES // 2)
@given(data=st.data())
async def test_a_stream_cut_anywhere_keeps_what_every_whole_event_before_it_said(
    fmt: str, data: st.DataObject
) -> None:
    """A cut at any byte keeps (as the partial turn) at least what a cut at the last event
    boundary before it keeps, and no more than the whole stream says."""
    source = data.draw(st.sampled_from(ADAPTERS[fmt].streams))
    raw = fixture(source)
    offset = data.draw(st.integers(0, len(raw)))
    boundary = max([0, *(b for b in _boundaries(raw) if b <= offset)])
    whole = await streamed(fmt, raw, [], None)
    at_boundary = await streamed(fmt, raw, [], boundary if boundary < len(raw) else None)
    at_offset = await streamed(fmt, raw, [], offset if offset < len(raw) else None)
    for outcome in (at_boundary, at_offset):
        check(outcome)
    kept = (at_offset.turn or at_offset.partial, at_boundary.turn or at_boundary.partial)
    full = whole.turn or whole.partial
    assert kept[0].text.startswith(unheld(kept[1].text)), (offset, boundary)
    assert kept[0].reasoning_text.startswith(unheld(kept[1].reasoning_text)), (offset, boundary)
    assert full.text.startswith(unheld(kept[0].text)), offset
    assert full.reasoning_text.startswith(unheld(kept[0].reasoning_text)), offset
    if at_offset.error is not None:  # the adapter's error carries no turn that contradicts ours
        partial = at_offset.error.partial
        assert partial is None or partial.text == at_offset.partial.text


_TERMINALS = ("[DONE]", "message_stop", "response.completed", "response.incomplete")


def _terminal(events: list[Event]) -> int:
    """The index of the event that ends the turn (``len(events)`` when none does)."""
    for i, (_, data) in enumerate(events):
        kind = data.get("type") if isinstance(data, dict) else data
        if kind in _TERMINALS:
            return i
    return len(events)


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
@settings(max_examples=EXAMPLES // 3)
@given(data=st.data())
async def test_an_error_event_mid_stream_keeps_what_came_before_and_its_words_for_developers(
    fmt: str, data: st.DataObject
) -> None:
    """The provider's error, anywhere in the stream: a ``ProviderError`` whose public text names
    it by its identifiers only, whose developer-only detail holds the provider's words, and whose
    partial turn holds at least what a cut at the same place would have kept."""
    sources = [s for s in ADAPTERS[fmt].streams if "error" not in s]
    events = events_of(fixture(data.draw(st.sampled_from(sources))))
    at = data.draw(st.integers(0, _terminal(events)))  # what follows the turn's end is ignored
    before = wire(events[:at], ascii_only=True)
    body = before + wire([error_event(fmt), *events[at:]], ascii_only=True)
    errored = await streamed(fmt, body, [], None)
    cut = await streamed(fmt, before + b"data: {", [], len(before))
    assert errored.error is not None, "an error event was taken for an answer"
    check(errored)
    assert CANARY in (failure_detail(errored.error) or ""), failure_detail(errored.error)
    assert errored.partial.text.startswith(unheld(cut.partial.text))
    assert errored.partial.reasoning_text.startswith(unheld(cut.partial.reasoning_text))


# -------------------------------------------------------------------------- HTTP error statuses

ODD_BODIES: list[bytes] = [
    b"",
    b"<html><body>502 Bad Gateway " + CANARY.encode() + b"</body></html>",
    b"null",
    b"[]",
    b'"' + CANARY.encode() + b'"',
    b"42",
    b'{"error": null}',
    b'{"error": "' + CANARY.encode() + b'"}',
    b'{"error": {"message": 5, "type": ["x"], "code": {}}}',
    b'{"error": {"message": "' + CANARY.encode() + b'", "type": "rate_limit_error"}}',
    b'{"error": {"message": {"text": "' + CANARY.encode() + b'"}, "metadata": "raw"}}',
    b'{"error": {"message": "\\ud800 ' + CANARY.encode() + b'", "metadata": {"raw": 7}}}',
    b'{"type": "error", "error": {"type": null, "message": null}}',
    b'{"message": "' + CANARY.encode() + b'", "code": 3.5}',
    b"\xff\xfe\x00 not utf-8 " + CANARY.encode(),
    b'{"error": {"message": "' + CANARY.encode() + b'", "code": "' + b"c" * 5000 + b'"}}',
    # not UTF-8: a body cut inside a character, a gateway's Latin-1 page (a bare
    # UnicodeDecodeError before the fix), and JSON nested past the stack (a RecursionError)
    b'{"error": {"message": "caf\xc3',
    b"<html>Passerelle \xe9chou\xe9e " + CANARY.encode() + b"</html>",
    b"[" * 100_000,
]


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
@settings(max_examples=EXAMPLES // 2)
# a retry-after that is neither seconds nor a date raised a bare ValueError (fixed: no hint)
@example(status=429, body=b"", content_type="", retry_after="soon", stream=True)
@given(
    status=st.sampled_from([400, 401, 403, 404, 408, 413, 422, 429, 500, 502, 503, 529, 599]),
    body=st.sampled_from(ODD_BODIES),
    content_type=st.sampled_from(["application/json", "text/html", "text/event-stream", ""]),
    retry_after=st.sampled_from([None, "", "soon", "-3", "1e309", "Wed, 21 Oct 2015 07:28:00 GMT"]),
    stream=st.booleans(),
)
async def test_an_http_error_with_an_odd_body_is_a_provider_error_that_quotes_nothing(
    fmt: str, status: int, body: bytes, content_type: str, retry_after: str | None, stream: bool
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": content_type} if content_type else {}
        if retry_after is not None:
            headers["retry-after"] = retry_after
        return httpx.Response(status, headers=headers, content=body)

    adapter = provider(fmt, handler)
    try:
        async with asyncio.timeout(20):
            if stream:
                async for _ in adapter.stream(REQUEST):
                    pass
            else:
                await adapter.request(REQUEST)
    except ProviderError as exc:
        assert exc.status == status
        public = failure_text(exc)
        assert CANARY not in public and str(status) in public, public
    else:
        raise AssertionError(f"HTTP {status} was taken for an answer")
    finally:
        await adapter.aclose()


# -------------------------------------------------------------------------- regressions


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
@pytest.mark.parametrize(
    "body",
    [b'{"error": {"message": "caf\xc3', b"<html>\xe9chec</html>", b"[" * 100_000],
    ids=["cut-inside-a-character", "latin-1", "nested-past-the-stack"],
)
@pytest.mark.parametrize("status", [200, 503])
async def test_a_body_that_cannot_be_read_is_a_provider_error(
    fmt: str, body: bytes, status: int
) -> None:
    """A non-streamed answer or an error status whose body is not UTF-8, or is JSON nested past
    the stack: a bare ``UnicodeDecodeError`` / ``RecursionError`` escaped before."""

    adapter = provider(fmt, answering(body, status))
    with pytest.raises(ProviderError) as info:
        await adapter.request(REQUEST)
    await adapter.aclose()
    assert info.value.status == (status if status != 200 else None)
    assert "\ufffd" not in failure_text(info.value)


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
async def test_a_stream_event_nested_past_the_stack_is_a_malformed_response(fmt: str) -> None:
    """``data: [[[[...`` past the stack: orjson refuses it and ``json`` raised a bare
    ``RecursionError`` before; what came before it is kept."""
    events = events_of(fixture(ADAPTERS[fmt].streams[0]))
    at = _terminal(events) // 2
    body = wire(events[:at], ascii_only=True) + b"data: " + b"[" * 100_000 + b"\n\n"
    outcome = await streamed(fmt, body, [], None)
    assert isinstance(outcome.error, MalformedResponseError), outcome
    assert "nested too deeply" in failure_text(outcome.error)
    cut = await streamed(fmt, wire(events[:at], ascii_only=True), [], None)
    assert outcome.partial.text == cut.partial.text
    assert outcome.partial.reasoning_text == cut.partial.reasoning_text


async def test_tool_arguments_nested_past_the_stack_are_kept_as_sent() -> None:
    """An Anthropic tool call whose streamed arguments nest past the stack: the turn completes
    with the model's text as sent (broken JSON reads as ``{}``), no bare ``RecursionError``."""
    events = events_of(fixture("anthropic/tool_use.sse"))
    for _, data in events:
        delta = data.get("delta") if isinstance(data, dict) else None
        if isinstance(delta, dict) and delta.get("type") == "input_json_delta":
            delta["partial_json"] = "[" * 100_000
            break
    outcome = await streamed("anthropic", wire(events, ascii_only=True), [], None)
    assert outcome.turn is not None, outcome.error
    (call,) = outcome.turn.tool_calls
    assert call.arguments_json.startswith("[[[") and call.arguments == {}


@pytest.mark.parametrize("odd", [True, 7, 1.5])
@pytest.mark.parametrize("field", ["summary", "content"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_responses_item_parts_that_are_not_a_list_hold_none(
    odd: Any, field: str, stream: bool
) -> None:
    """An OpenAI Responses output item whose ``summary`` or ``content`` is not a list (found by
    the body fuzz: ``TypeError: 'bool' object is not iterable`` escaped): it holds no parts, and
    the turn completes with the other items' text."""
    if stream:
        events = events_of(fixture("openai_responses/summary_then_message.sse"))
        for _, data in events:
            if isinstance(data, dict) and data.get("type") == "response.output_item.done":
                data["item"][field] = odd
        outcome = await streamed("openai_responses", wire(events, ascii_only=True), [], None)
    else:
        value = json.loads(fixture("openai_responses/reasoning_function_call.json"))
        for item in value["output"]:
            item[field] = odd
        body = json.dumps(value).encode()

        adapter = provider("openai_responses", answering(body))
        turn = await adapter.request(REQUEST)
        await adapter.aclose()
        outcome = Outcome(turn, None, turn)
    assert outcome.turn is not None, outcome.error
    check(outcome)


# -------------------------------------------------------------------------- non-streamed bodies


@st.composite
def mutated_body(draw: st.DrawFn, fmt: str) -> bytes:
    value = json.loads(fixture(draw(st.sampled_from(ADAPTERS[fmt].bodies))))
    for _ in range(draw(st.integers(1, 3))):
        node_paths = paths(value)
        if not node_paths:
            break
        path = draw(st.sampled_from(node_paths))
        if draw(st.booleans()):
            put(value, path, copy.deepcopy(draw(st.sampled_from(ODD_VALUES))))
        elif isinstance(get(value, path[:-1]), dict):
            del get(value, path[:-1])[path[-1]]
    raw = json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 5)) == 0:  # cut anywhere, inside a character too
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
@settings(max_examples=EXAMPLES // 2)
@given(data=st.data())
async def test_a_mutated_whole_body_completes_a_turn_or_fails_with_a_provider_error(
    fmt: str, data: st.DataObject
) -> None:
    body = data.draw(mutated_body(fmt))

    adapter = provider(fmt, answering(body))
    try:
        async with asyncio.timeout(20):
            turn = await adapter.request(REQUEST)
        check(Outcome(turn, None, turn))
    except ProviderError as exc:
        check(Outcome(None, exc, exc.partial or Turn(())))
    finally:
        await adapter.aclose()

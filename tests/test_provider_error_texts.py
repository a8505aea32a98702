"""A provider's broken answer never puts what it said into an error message.

An adapter's error message becomes the task's and the run's ``error`` (and ``agent.response``'s,
``message.partially_completed``'s), which every reader sees: a viewer learns that a run failed,
and why. A malformed or mistyped stream event is as likely to be a reasoning delta, a signature
or a tool call's arguments as anything else, so a message that quoted the event (its first 200
characters, as the adapters once did) handed a viewer raw reasoning the one output filter keeps
from them, on a ``hidden`` run too. Each test here puts a canary into the reasoning of a real
transcript, breaks that event the ways a provider or a proxy breaks them, and looks for the
canary in the error, then in what a viewer reads of the run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import h11
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.replay import (
    Replay,
    fixture,
    make,
    mock_transport,
    provider_with,
    split_events,
    turn_request,
)
from support.viewer import viewer_reads

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ProviderError
from thoughtgate.providers.http import ErrorStage, parse_json_event, transport_error
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.providers.sse import SSEMessage

pytestmark = pytest.mark.unit

TAG = "SECRETREASONING"
Data = dict[str, Any]


def _drop(key: str) -> Callable[[Data], Data]:
    def drop(data: Data) -> Data:
        return {k: v for k, v in data.items() if k != key}

    return drop


def _content_parts(data: Data) -> Data:
    """Mistral-style: ``delta.content`` a list of parts, the thinking among them."""
    (choice,) = data["choices"]
    reasoning = choice["delta"]["reasoning"]
    delta = {**choice["delta"], "content": [{"type": "thinking", "thinking": reasoning}]}
    return {**data, "choices": [{**choice, "delta": delta}]}


def _choices_object(data: Data) -> Data:
    return {**data, "choices": data["choices"][0]}


def _thinking_renamed(data: Data) -> Data:
    delta = data["delta"]
    return {**data, "delta": {"type": delta["type"], "x": delta["thinking"]}}


def _thinking_mistyped(data: Data) -> Data:
    return {**data, "delta": {**data["delta"], "thinking": [data["delta"]["thinking"]]}}


FORMATS: dict[str, tuple[str, str, Callable[[Replay], Any], dict[str, Callable[[Data], Data]]]] = {
    # format: (fixture, the reasoning the canary replaces, the adapter, the field breakages)
    "anthropic": (
        "anthropic/thinking_text.sse",
        "The user wants to know",
        lambda replay: provider_with(replay.transport),
        {
            "no index": _drop("index"),
            "thinking renamed": _thinking_renamed,
            "thinking not a string": _thinking_mistyped,
        },
    ),
    "chat completions": (
        "openrouter/anthropic_thinking.sse",
        '"reasoning":"This"',
        lambda replay: make(OpenRouterProvider, "anthropic/claude-sonnet-4.5", replay),
        {"content as parts": _content_parts, "choices not a list": _choices_object},
    ),
    "responses": (
        "openai_responses/raw_reasoning_text.sse",
        "User asks 2+2.",
        lambda replay: make(OpenAIResponsesProvider, "o3", replay),
        {"no type": _drop("type")},
    ),
}


def _plant(name: str, canary: str) -> tuple[list[bytes], int]:
    """The format's transcript, one event at a time, with ``canary`` as the reasoning of the
    event at the index returned."""
    path, reasoning, _, _ = FORMATS[name]
    events = split_events(fixture(path))
    at = next(i for i, e in enumerate(events) if reasoning.encode() in e)
    if reasoning.startswith('"'):  # a JSON member: keep its shape
        key = reasoning.split(":")[0]
        planted = f"{key}:{json.dumps(canary)}"
    else:
        planted = json.dumps(canary)[1:-1]
    events[at] = events[at].replace(reasoning.encode(), planted.encode("utf-8"), 1)
    if name == "chat completions":  # its reasoning_details carry the same text
        events[at] = events[at].replace(b'"text":"This"', b'"text":' + json.dumps(canary).encode())
    return events, at


def _break(event: bytes, how: str, field_change: Callable[[Data], Data] | None) -> bytes:
    head, _, rest = event.partition(b"data: ")
    body, sep, tail = rest.partition(b"\n")
    data = json.loads(body)
    if field_change is not None:
        broken = json.dumps(field_change(data)).encode()
    elif how == "cut after the canary":
        text = json.dumps(data)
        broken = text[: text.index(TAG) + len(TAG)].encode()  # inside its string
    else:  # a JSON value that is not an object
        broken = json.dumps([data]).encode()
    return head + b"data: " + broken + sep + tail


BREAKAGES = ("cut after the canary", "not an object")
CASES = [(name, how) for name in FORMATS for how in (*BREAKAGES, *FORMATS[name][3])]

canaries = st.builds(
    lambda tail: f"{TAG}{tail}",
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40),
)


async def _error_of(name: str, events: list[bytes]) -> ProviderError:
    replay = Replay(b"".join(events))
    provider = FORMATS[name][2](replay)
    try:
        with pytest.raises(ProviderError) as info:
            await stream_llm_turn(provider, turn_request("surface"))
    finally:
        await provider.aclose()
    return info.value


@pytest.mark.parametrize(("name", "how"), CASES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(canary=canaries)
def test_a_broken_reasoning_event_is_described_never_quoted(
    name: str, how: str, canary: str
) -> None:
    events, at = _plant(name, canary)
    events[at] = _break(events[at], how, FORMATS[name][3].get(how))
    error = asyncio.run(_error_of(name, events))
    assert TAG not in str(error), (name, how, str(error))
    assert TAG not in error.message


@pytest.mark.parametrize(("name", "how"), CASES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.tuples(st.integers(0, 5000), st.integers(0, 5000)))
def test_a_broken_reasoning_event_s_public_error_does_not_vary_with_its_size(
    name: str, how: str, sizes: tuple[int, int]
) -> None:
    """Every format, every way of breaking the event that holds the reasoning: the public
    ``error`` is the same whatever the reasoning's length (ADR 0169); only the detail may
    measure it."""

    def public(size: int) -> str:
        events, at = _plant(name, "x" * size + TAG)
        events[at] = _break(events[at], how, FORMATS[name][3].get(how))
        return asyncio.run(_error_of(name, events)).described()

    assert public(sizes[0]) == public(sizes[1])


def test_a_json_event_s_public_error_says_json_s_reason_not_its_text_nor_its_length() -> None:
    """The event holds reasoning: where json stopped in it and how long it was measure the
    reasoning, so they are the developer-only detail, never the public ``error`` (ADR 0169)."""
    secret = '{"thinking": "' + TAG + " goes on"
    with pytest.raises(ProviderError) as info:
        parse_json_event("test", SSEMessage("delta", secret))
    error = info.value
    assert TAG not in str(error)
    public = "[test] malformed JSON in 'delta' stream event: Unterminated string starting at"
    assert error.described() == public
    assert error.detail == f"line 1 column 14 (char 13), in {len(secret)} characters"
    with pytest.raises(ProviderError) as info:
        parse_json_event("test", SSEMessage("delta", json.dumps([TAG])))
    error = info.value
    assert TAG not in str(error)
    assert error.described().endswith("is not a JSON object: it is a list")
    assert error.detail == "it is a list of 1 item"


def test_a_json_event_s_errors_name_its_event_only_when_it_looks_like_a_name() -> None:
    """A stream's ``event:`` line is the provider's text too: a malformed event is named by it
    when it looks like a field name (``content_block_delta``), else not at all."""
    named = f"{TAG} and then the model thought"
    for data in ("{oops", json.dumps([1])):
        with pytest.raises(ProviderError) as info:
            parse_json_event("test", SSEMessage(named, data))
        assert TAG not in str(info.value), str(info.value)
        assert TAG not in info.value.described()
    with pytest.raises(ProviderError) as info:
        parse_json_event("test", SSEMessage("content_block_delta", "{oops"))
    assert "'content_block_delta' stream event" in str(info.value)


def _h11_chunk_error(line: bytes) -> httpx.RemoteProtocolError:
    """What httpx raises when h11 reads ``line`` where a chunk's size line should be: h11's
    own words, as a misframed body gives them."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + line)
    with pytest.raises(h11.RemoteProtocolError) as info:
        while client.next_event() is not h11.NEED_DATA:
            pass
    return httpx.RemoteProtocolError(str(info.value))


@pytest.mark.parametrize("stage", ["request", "body"])
def test_a_misframed_body_s_text_in_an_http_library_error_is_withheld(stage: ErrorStage) -> None:
    line = f'data: {{"thinking": "{TAG} it\'s \\"quoted\\""}}\r\n'.encode()
    exc = _h11_chunk_error(line)
    assert TAG in str(exc), "h11 quotes the line it could not read (what this test guards)"
    error = transport_error(exc, stage, provider="test", base_url="http://x")
    assert TAG not in str(error)
    assert "illegal chunk header" in str(error), "what went wrong is still said"


MODES = ("hidden", "surface", "telemetry_only")


@pytest.mark.parametrize("mode", MODES)
def test_a_viewer_reads_no_reasoning_from_a_run_a_broken_event_ended(mode: str) -> None:
    """The whole way: the run fails, its error and its events say so to a viewer, and the
    reasoning the broken event carried is in none of it."""
    events, at = _plant("anthropic", f"{TAG}-whole-way")
    events[at] = _break(events[at], "thinking renamed", _thinking_renamed)

    read = viewer_reads(mock_transport(events), mode)
    assert read.status == "failed"
    assert "missing a field or has a wrong type" in read.view, "the viewer still learns why"
    assert TAG not in read.view
    assert TAG not in read.events


def _body_cut_in_its_reasoning(size: int) -> bytes:
    head = b'{"id": "msg_1", "content": [{"type": "thinking", "thinking": "'
    return head + b"x" * size


def _body_cut_in_a_character(size: int) -> bytes:
    return _body_cut_in_its_reasoning(size) + "\u00e9".encode()[:1]


def _body_too_deep(size: int) -> bytes:
    return _body_cut_in_its_reasoning(size) + b'", "x": ' + b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    "body", [_body_cut_in_its_reasoning, _body_cut_in_a_character, _body_too_deep]
)
def test_a_non_streamed_answer_s_public_error_does_not_measure_it(
    body: Callable[[int], bytes],
) -> None:
    """A whole answer's body holds every reasoning part of the turn: its length and where a
    decoder stopped in it are the developer-only detail; the public text is the same whatever
    the reasoning's size (ADR 0169)."""

    async def error_of(size: int) -> ProviderError:
        replay = Replay(body(size), content_type="application/json")
        provider = provider_with(replay.transport)
        try:
            with pytest.raises(ProviderError) as info:
                await provider.request(turn_request("surface"))
        finally:
            await provider.aclose()
        return info.value

    short, long = (asyncio.run(error_of(size)) for size in (7, 4093))
    assert short.described() == long.described(), long.described()
    assert "4093" not in long.described()
    assert short.detail != long.detail and long.detail is not None and "bytes" in long.detail

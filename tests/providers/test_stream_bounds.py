"""A provider stream cannot hold a turn's memory or time without bound (ADR 0147).

An event that never ends (one line without a line break, sent for ever) fails the turn once
``max_event_bytes`` of it are held, and a stream of nothing but keep-alive comments fails it after
``timeout_s``, as a silent one does; either way what arrived before is the partial turn. Both
against a real HTTP server on loopback, read as the daemon reads providers.
"""

from __future__ import annotations

import pytest
from support.replay import ReplayServer, Reply, split_events, transcript

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import MalformedResponseError, ProviderHTTPError, ProviderTimeoutError
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.types import Message

pytestmark = pytest.mark.inprocess

REQUEST = TurnRequest([Message.user("Go.")], reasoning=ReasoningRequest(True))
BEFORE = "The user wants to know why bread dough rises. Yeast ferments sugars"
"""The reasoning of the transcript's first six events."""
LIMIT = 64 * 1024


def provider(server: ReplayServer, *, timeout_s: float) -> AnthropicProvider:
    settings = ProviderSettings(
        base_url=server.url,
        api_key="k",
        timeout_s=timeout_s,
        connect_timeout_s=5.0,
        max_retries=0,
        max_event_bytes=LIMIT,
    )
    return AnthropicProvider("claude-sonnet-4-5", settings)


async def test_an_event_that_never_ends_fails_the_turn_at_the_limit_keeping_the_partial() -> None:
    """The attack: ``data: xxx...`` without a line break, for ever. It was held whole (a 300 MB
    line took the process to 900 MB) until the read timeout, which bytes that keep coming never
    reach. Here it stalls after 40 x 8 KiB: held whole, it would end as a read timeout."""
    start = split_events(transcript("thinking_text.sse"))[:6]
    endless = [b'event: content_block_delta\ndata: {"x": "', *([b"x" * 8192] * 40)]
    async with ReplayServer([Reply([*start, *endless], stall=True)]) as server:
        model = provider(server, timeout_s=30.0)
        with pytest.raises(MalformedResponseError) as info:
            await stream_llm_turn(model, REQUEST)
        await model.aclose()
    assert f"more than {LIMIT} bytes" in info.value.message
    assert "max_event_bytes" in info.value.message
    assert info.value.partial is not None
    assert info.value.partial.reasoning_text == BEFORE


async def test_an_event_up_to_the_limit_is_read() -> None:
    """The limit is on what is held of one event, not on the stream: a stream of many times the
    limit, in events below it, is one turn as always."""
    events = split_events(transcript("thinking_text.sse"))
    pad = b": " + b"p" * (LIMIT // 2) + b"\n\n"  # comments, each half the limit
    async with ReplayServer([Reply([pad] * 8 + events)]) as server:
        model = provider(server, timeout_s=30.0)
        turn = await stream_llm_turn(model, REQUEST)
        await model.aclose()
    assert turn.reasoning_text.startswith(BEFORE)


async def test_a_stream_of_only_keep_alive_comments_times_out_keeping_the_partial() -> None:
    """The attack: a comment every 20 ms, for ever. Each resets the read timeout, so the turn
    never ended; here the comments stop after 20 s and the stream ends without its last event,
    which, without the rule, is a cut stream and not a timeout."""
    start = split_events(transcript("thinking_text.sse"))[:6]
    comments = [b": keep-alive\n\n"] * 1000
    async with ReplayServer([Reply([*start, *comments], pause_s=0.02)]) as server:
        model = provider(server, timeout_s=0.3)
        with pytest.raises(ProviderTimeoutError) as info:
            await stream_llm_turn(model, REQUEST)
        await model.aclose()
    assert "no event for 0.3 s" in info.value.message
    assert info.value.partial is not None
    assert info.value.partial.reasoning_text == BEFORE


@pytest.mark.parametrize("streaming", [True, False])
async def test_an_error_body_that_never_ends_is_read_to_the_limit(streaming: bool) -> None:
    """The attack: ``500`` and a body that keeps coming. It was read whole before the error was
    made (until the read timeout, which bytes that keep coming never reach)."""
    endless = [b"x" * 8192] * 40
    headers = {"content-type": "text/plain"}
    async with ReplayServer([Reply(endless, status=500, headers=headers, stall=True)]) as server:
        model = provider(server, timeout_s=30.0)
        with pytest.raises(ProviderHTTPError) as info:
            if streaming:
                await stream_llm_turn(model, REQUEST)
            else:
                await model.request(REQUEST)
        await model.aclose()
    assert info.value.status == 500
    assert f"longer than {LIMIT} bytes" in info.value.message


async def test_an_answer_that_never_ends_is_read_to_the_limit() -> None:
    """The same for a non-streamed answer (the summarizer model's): a malformed answer."""
    endless = [b'{"content": "', *([b"x" * 8192] * 40)]
    headers = {"content-type": "application/json"}
    async with ReplayServer([Reply(endless, headers=headers, stall=True)]) as server:
        model = provider(server, timeout_s=30.0)
        with pytest.raises(MalformedResponseError) as info:
            await model.request(REQUEST)
        await model.aclose()
    assert f"longer than {LIMIT} bytes" in info.value.message

"""A provider that streams real events for ever cannot hold a turn without bound (ADR 0155).

Deltas that never stop grow the turn's output, pings that never stop (Anthropic's ``ping`` is
an event, not a comment) and slow deltas make it last: ``max_turn_output_chars`` and
``turn_timeout_s`` of the provider's section end such a turn, and a stream of nothing but
pings is no progress, as comments are not (``timeout_s``). Each ends the turn with what
arrived kept as its partial, read as the daemon reads providers, from a real HTTP server on
loopback; each stream here would otherwise complete, so without the bounds the turn succeeds.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from support.replay import ReplayServer, Reply, split_events, transcript

from thoughtgate.config import Config, ProviderEndpoint
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ProviderError, ProviderStreamError, ProviderTimeoutError
from thoughtgate.events.schema import EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime, provider_settings_from_config
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.types import Message

pytestmark = pytest.mark.inprocess

REQUEST = TurnRequest([Message.user("Go.")], reasoning=ReasoningRequest(True))
EVENTS = split_events(transcript("thinking_text.sse"))
START, END = EVENTS[:6], EVENTS[6:]
"""The transcript's first six events (the reasoning :data:`BEFORE`), and the rest of it."""
BEFORE = "The user wants to know why bread dough rises. Yeast ferments sugars"
PIECE = "0123456789"
PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def thinking(text: str) -> bytes:
    delta = {"type": "thinking_delta", "thinking": text}
    data = {"type": "content_block_delta", "index": 0, "delta": delta}
    return f"event: content_block_delta\ndata: {json.dumps(data)}\n\n".encode()


def provider(server: ReplayServer, *, max_retries: int = 0, **bounds: float) -> AnthropicProvider:
    settings = ProviderSettings(
        base_url=server.url,
        api_key="k",
        connect_timeout_s=5.0,
        max_retries=max_retries,
        **bounds,
    )
    return AnthropicProvider("claude-sonnet-4-5", settings)


async def failed_turn(
    pieces: list[bytes], kind: type[ProviderError], *, pause_s: float = 0.0, **bounds: float
) -> ProviderError:
    """The error a turn over ``pieces`` (one network write each) fails with, its partial set."""
    async with ReplayServer([Reply([*START, *pieces, *END], pause_s=pause_s)]) as server:
        model = provider(server, **bounds)
        with pytest.raises(kind) as info:
            await stream_llm_turn(model, REQUEST)
        # the connection is closed, not kept half read for the next request
        await asyncio.wait_for(server.hung_up.wait(), 10)
        await model.aclose()
    assert info.value.partial is not None
    return info.value


async def test_deltas_past_the_output_bound_fail_the_turn_keeping_the_partial() -> None:
    """400 deltas of 10 characters, then the turn's end: with a bound of 1,000 characters the
    turn fails once its output passes it, what arrived kept, the rest never read."""
    deltas = [thinking(PIECE)] * 400
    error = await failed_turn(
        deltas, ProviderStreamError, timeout_s=30.0, max_turn_output_chars=1000
    )
    assert "1000 characters" in error.message
    assert "max_turn_output_chars" in error.message
    assert error.partial is not None
    reasoning = error.partial.reasoning_text
    assert reasoning.startswith(BEFORE + PIECE)
    assert 1000 < len(reasoning) < len(BEFORE) + 400 * len(PIECE)
    assert PIECE not in error.described() and BEFORE not in error.described()


async def test_a_turn_past_its_deadline_fails_keeping_the_partial() -> None:
    """Deltas every 20 ms for 20 s, then the turn's end: with a deadline of 0.3 s the turn
    fails at the first read past it, with what arrived until then."""
    deltas = [thinking(PIECE)] * 1000
    error = await failed_turn(
        deltas, ProviderTimeoutError, pause_s=0.02, timeout_s=30.0, turn_timeout_s=0.3
    )
    assert "0.3 s" in error.message
    assert "turn_timeout_s" in error.message
    assert error.partial is not None
    # what arrived in time (a loaded host may not have read the first deltas), never all of it
    whole = BEFORE + PIECE * 1000
    assert whole.startswith(error.partial.reasoning_text)
    assert len(error.partial.reasoning_text) < len(whole)


async def test_a_stream_of_only_pings_is_no_progress() -> None:
    """Pings every 20 ms for 20 s, then the turn's end. Each ping is an event, which reset the
    rule for comments (ADR 0147); now a stream that sends nothing but pings for ``timeout_s``
    times out as a silent one does, with no deadline set."""
    error = await failed_turn(
        [PING] * 1000, ProviderTimeoutError, pause_s=0.02, timeout_s=0.3, turn_timeout_s=0
    )
    assert "no event for 0.3 s" in error.message
    assert error.partial is not None
    assert error.partial.reasoning_text == BEFORE


async def test_pings_between_deltas_do_not_end_a_turn_that_progresses() -> None:
    """A ping beside each delta: the deltas are progress, so the turn completes."""
    paced = [piece for _ in range(100) for piece in (PING, thinking(PIECE))]
    async with ReplayServer([Reply([*START, *paced, *END], pause_s=0.02)]) as server:
        model = provider(server, timeout_s=1.0)  # the pings alone last 4 s
        turn = await stream_llm_turn(model, REQUEST)
        await model.aclose()
    assert turn.reasoning_text.startswith(BEFORE + PIECE * 100)


async def test_bounds_of_zero_are_off() -> None:
    """``0`` turns either bound off: the same long stream completes."""
    deltas = [thinking(PIECE)] * 400
    async with ReplayServer([Reply([*START, *deltas, *END])]) as server:
        model = provider(server, timeout_s=30.0, max_turn_output_chars=0, turn_timeout_s=0)
        turn = await stream_llm_turn(model, REQUEST)
        await model.aclose()
    assert turn.reasoning_text.startswith(BEFORE + PIECE * 400)


def test_the_bounds_come_from_the_providers_section_with_defaults_that_hold_a_long_turn() -> None:
    """Each section sets its own; the defaults are those of the adapter's settings and hold a
    128k-token turn at 10 tokens a second, 4 characters a token, several times over."""
    default = ProviderEndpoint()
    settings = ProviderSettings()
    assert default.turn_timeout_s == settings.turn_timeout_s >= 128_000 / 10
    assert default.max_turn_output_chars == settings.max_turn_output_chars >= 4 * 128_000 * 4
    config = Config.from_mapping(
        {"providers": {"anthropic": {"turn_timeout_s": 90, "max_turn_output_chars": 0}}}
    )
    mine = provider_settings_from_config(config, "anthropic:claude-sonnet-4-5")
    assert (mine.turn_timeout_s, mine.max_turn_output_chars) == (90, 0)
    other = provider_settings_from_config(config, "openai:gpt-5")
    assert other.turn_timeout_s == settings.turn_timeout_s


async def test_a_run_whose_turn_passes_the_output_bound_fails_with_its_deltas_recorded() -> None:
    """The whole way: the run ends ``failed``, the deltas that arrived are in its events, and
    its public error names the bound and holds none of the reasoning."""
    deltas = [thinking(PIECE)] * 400
    async with ReplayServer([Reply([*START, *deltas, *END])]) as server:
        made: list[AnthropicProvider] = []

        def factory(model: str) -> AnthropicProvider:
            made.append(provider(server, timeout_s=30.0, max_turn_output_chars=1000))
            return made[-1]

        runtime = Runtime(MemoryStore(), provider_factory=factory)
        run = await runtime.run(
            RunRequest("Go.", model="anthropic:claude-sonnet-4-5"), chain_of_thought="surface"
        )
        for model in made:
            await model.aclose()
    assert run.status == "failed"
    assert run.error is not None and "max_turn_output_chars" in run.error
    assert PIECE not in run.error and "bread" not in run.error
    events = await runtime.store.read(run.run_id)
    recorded = "".join(
        e.payload.get("text", "") for e in events if e.type == EventType.REASONING_DELTA
    )
    assert recorded.startswith(BEFORE + PIECE)
    assert events[-1].type == EventType.RUN_FAILED
    assert PIECE not in json.dumps(events[-1].payload)


# --------------------------------------------------------------------------- non-streamed turns

JSON_HEADERS = {"content-type": "application/json", "request-id": "req_whole_1"}
PLAIN = TurnRequest([Message.user("Go.")])


def whole_message(*texts: str) -> bytes:
    """A non-streamed Messages answer whose content is one text block per ``texts``."""
    message = {
        "id": "msg_whole",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": text} for text in texts],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "output_tokens": 7},
    }
    return json.dumps(message).encode()


async def test_a_non_streamed_answer_that_trickles_in_fails_at_the_turns_deadline() -> None:
    """A JSON answer sent 10 bytes every 20 ms (about 10 s in all): each piece resets the read
    timeout, so only the turn's deadline (0.3 s) ends it -- with the same error as a streamed
    turn, the connection dropped, and the request not sent again (it would be billed again)."""
    body = whole_message(PIECE * 500)
    pieces = [body[i : i + 10] for i in range(0, len(body), 10)]
    reply = Reply(pieces, headers=dict(JSON_HEADERS), pause_s=0.02)
    async with ReplayServer([reply]) as server:
        model = provider(server, timeout_s=30.0, turn_timeout_s=0.3, max_retries=2)
        with pytest.raises(ProviderTimeoutError) as info:
            await model.request(PLAIN)
        await asyncio.wait_for(server.hung_up.wait(), 10)
        await model.aclose()
    assert "0.3 s" in info.value.message and "turn_timeout_s" in info.value.message
    assert info.value.partial is not None
    assert len(server.bodies) == 1


async def test_a_non_streamed_answer_past_the_output_bound_fails_keeping_what_came_before() -> None:
    """Three text blocks of 600 characters with a bound of 1,000: the turn fails with the
    streamed turn's error once its output passes the bound, the partial holding the blocks up
    to the one that passed it (as a streamed turn keeps the read that passed it), not the rest."""
    first, second, third = "a" * 600, "b" * 600, "c" * 600
    reply = Reply([whole_message(first, second, third)], headers=dict(JSON_HEADERS))
    async with ReplayServer([reply]) as server:
        model = provider(server, timeout_s=30.0, max_turn_output_chars=1000)
        with pytest.raises(ProviderStreamError) as info:
            await model.request(PLAIN)
        await model.aclose()
    assert "1000 characters" in info.value.message
    assert "max_turn_output_chars" in info.value.message
    assert info.value.partial is not None
    assert info.value.partial.text == first + second


async def test_a_non_streamed_answer_within_its_bounds_completes() -> None:
    """The control: the same answers complete with bounds of ``0``, and with the defaults."""
    trickled = whole_message(PIECE * 50)
    replies = [
        Reply([trickled[i : i + 10] for i in range(0, len(trickled), 10)], headers=JSON_HEADERS),
        Reply([whole_message("a" * 600, "b" * 600, "c" * 600)], headers=dict(JSON_HEADERS)),
    ]
    async with ReplayServer(replies) as server:
        off = provider(server, timeout_s=30.0, turn_timeout_s=0, max_turn_output_chars=0)
        assert (await off.request(PLAIN)).text == PIECE * 50
        assert (await off.request(PLAIN)).text == "a" * 600 + "b" * 600 + "c" * 600
        await off.aclose()
        default = provider(server, timeout_s=30.0)
        assert (await default.request(PLAIN)).text.startswith("a" * 600)
        await default.aclose()

"""Failure paths of the Anthropic adapter: HTTP errors, retries, in-stream errors, cuts, timeouts.

Every failure is a typed ``ProviderError`` carrying status, error type, message and request id;
whatever arrived before a mid-stream failure is kept as the partial turn; retries happen only
before any output and honour ``retry-after`` (the transport's ``sleep`` is replaced by a recorder
so no test waits).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from support.replay import (
    ReplayServer,
    Reply,
    blackhole_port,
    loopback_provider,
    split_events,
    transcript,
)
from support.servers import serving

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import (
    ProviderConnectionError,
    ProviderHTTPError,
    ProviderStreamError,
    ProviderTimeoutError,
)
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.testing.emulator import (
    Cut,
    Emulator,
    EmulatorServer,
    Fail,
    Say,
    Scenario,
    ScriptedTurn,
    Sleep,
    StreamError,
    Think,
    serve_emulator,
)
from thoughtgate.types import Message, ReasoningDelta

REQUEST = TurnRequest([Message.user("Go.")], reasoning=ReasoningRequest(True))
STATUSES = [
    (400, "invalid_request_error", "Bad field"),
    (401, "authentication_error", "invalid x-api-key"),
    (
        403,
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    (404, "not_found_error", "model: claude-nope"),
    (408, "timeout_error", "Request timed out"),
    (413, "request_too_large", "Request exceeds the maximum allowed number of bytes."),
    (429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
    (500, "api_error", "Internal server error"),
    (502, "api_error", "Bad gateway"),
    (503, "api_error", "Service unavailable"),
    (504, "timeout_error", "Gateway timeout"),
    (529, "overloaded_error", "Overloaded"),
]
RETRYABLE = {408, 429, 500, 502, 503, 504, 529}


def _scenarios() -> list[Scenario]:
    out = [
        Scenario(f"fail-{status}", (ScriptedTurn((Fail(status, etype, msg, times=99),)),))
        for status, etype, msg in STATUSES
    ]
    out += [
        Scenario(
            "retry-after",
            (
                ScriptedTurn(
                    (Fail(529, "overloaded_error", "Overloaded", retry_after=7, times=2), Say("ok"))
                ),
            ),
        ),
        Scenario(
            "rate-then-overload",
            (
                ScriptedTurn(
                    (
                        Fail(429, "rate_limit_error", "slow down", retry_after=3),
                        Fail(529, "overloaded_error", "Overloaded"),
                        Think("fine now"),
                        Say("done"),
                    )
                ),
            ),
        ),
        Scenario(
            "error-mid-text",
            (
                ScriptedTurn(
                    (
                        Think("Thought through."),
                        Say("Half an ans"),
                        StreamError("api_error", "Internal server error"),
                    )
                ),
            ),
        ),
        Scenario("cut-mid-thinking", (ScriptedTurn((Think("Partial reasoning"), Cut())),)),
        Scenario("sleepy", (ScriptedTurn((Think("Before the pause."), Sleep(5.0), Say("late"))),)),
    ]
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator()
    for scenario in _scenarios():
        emulator.add(scenario)
    with serve_emulator(emulator) as running:
        yield running


class Sleeps(list[float]):
    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


def adapter(
    server: EmulatorServer, scenario: str, *, retries: int = 0, timeout: float = 5.0
) -> tuple[AnthropicProvider, Sleeps]:
    settings = ProviderSettings(
        base_url=server.url,
        api_key="k",
        max_retries=retries,
        timeout_s=timeout,
        connect_timeout_s=timeout,
        extra={"thoughtgate": {"headers": {"x-emulator-scenario": scenario}}},
    )
    provider = AnthropicProvider("claude-sonnet-4-5", settings)
    sleeps = Sleeps()
    provider.transport.sleep = sleeps
    return provider, sleeps


def requests_for(server: EmulatorServer, scenario: str) -> int:
    return sum(
        1 for r in server.emulator.requests if r.headers.get("x-emulator-scenario") == scenario
    )


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize(("status", "etype", "message"), STATUSES)
async def test_http_errors_are_typed_with_status_type_message_and_request_id(
    server: EmulatorServer, status: int, etype: str, message: str, streaming: bool
) -> None:
    provider, sleeps = adapter(server, f"fail-{status}")
    with pytest.raises(ProviderHTTPError) as info:
        if streaming:
            await stream_llm_turn(provider, REQUEST)
        else:
            await provider.request(REQUEST)
    await provider.aclose()
    error = info.value
    assert (error.status, error.error_type, error.message) == (status, etype, message)
    assert error.request_id is not None and error.request_id.startswith("req_011Emu")
    assert error.retryable == (status in RETRYABLE)
    assert error.provider == "anthropic" and sleeps == []


@pytest.mark.parametrize(("status", "etype", "message"), STATUSES)
async def test_only_retryable_statuses_are_retried(
    server: EmulatorServer, status: int, etype: str, message: str
) -> None:
    name = f"fail-{status}"
    before = requests_for(server, name)
    provider, sleeps = adapter(server, name, retries=2)
    with pytest.raises(ProviderHTTPError):
        await stream_llm_turn(provider, REQUEST)
    await provider.aclose()
    attempts = requests_for(server, name) - before
    assert attempts == (3 if status in RETRYABLE else 1)
    assert len(sleeps) == attempts - 1
    assert all(0 < s <= 8 for s in sleeps)  # exponential backoff with jitter, capped


async def test_retry_after_is_honoured_and_the_retry_succeeds(server: EmulatorServer) -> None:
    provider, sleeps = adapter(server, "retry-after", retries=2)
    turn = await stream_llm_turn(provider, REQUEST)
    await provider.aclose()
    assert turn.text == "ok"
    assert sleeps == [7.0, 7.0]


async def test_each_failure_kind_is_retried_in_turn(server: EmulatorServer) -> None:
    provider, sleeps = adapter(server, "rate-then-overload", retries=3)
    turn = await provider.request(REQUEST)
    await provider.aclose()
    assert (turn.reasoning_text, turn.text) == ("fine now", "done")
    assert sleeps[0] == 3.0 and len(sleeps) == 2


async def test_in_stream_error_is_not_retried_and_keeps_the_partial(server: EmulatorServer) -> None:
    before = requests_for(server, "error-mid-text")
    provider, sleeps = adapter(server, "error-mid-text", retries=3)
    with pytest.raises(ProviderStreamError) as info:
        await stream_llm_turn(provider, REQUEST)
    await provider.aclose()
    error = info.value
    assert (error.error_type, error.message) == ("api_error", "Internal server error")
    assert error.request_id is not None and error.request_id.startswith("req_011Emu")
    assert requests_for(server, "error-mid-text") - before == 1 and sleeps == []
    partial = error.partial
    assert partial is not None and not partial.complete
    assert (partial.reasoning_text, partial.text) == ("Thought through.", "Half an ans")
    assert len(partial.continuity) == 1  # the thinking block closed before the error


async def test_cut_stream_is_a_stream_error_with_the_partial(server: EmulatorServer) -> None:
    before = requests_for(server, "cut-mid-thinking")
    provider, sleeps = adapter(server, "cut-mid-thinking", retries=3)
    with pytest.raises(ProviderStreamError) as info:
        await stream_llm_turn(provider, REQUEST)
    await provider.aclose()
    assert "cut" in info.value.message
    assert info.value.partial is not None
    assert info.value.partial.reasoning_text == "Partial reasoning"
    assert info.value.partial.continuity == ()  # the block never got its signature
    assert requests_for(server, "cut-mid-thinking") - before == 1 and sleeps == []


async def test_read_timeout_mid_stream_keeps_the_partial(server: EmulatorServer) -> None:
    # 1 s: the answer's start must arrive within it even on a loaded machine (the emulator
    # shares this process); the pause is five times longer
    provider, _ = adapter(server, "sleepy", timeout=1.0)
    started = time.monotonic()
    with pytest.raises(ProviderTimeoutError) as info:
        await stream_llm_turn(provider, REQUEST)
    await provider.aclose()
    assert time.monotonic() - started < 4.5, "the read timed out, not the pause's end"
    assert info.value.partial is not None
    assert info.value.partial.reasoning_text == "Before the pause."


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    """A server that accepts connections and reads requests but never answers."""

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):  # take the request, answer nothing, until it hangs up
            pass

    async with serving(never_answer) as silent:
        yield silent.sockets[0].getsockname()[1]


@pytest.mark.parametrize("streaming", [True, False])
async def test_server_that_never_answers_times_out(silent_port: int, streaming: bool) -> None:
    settings = ProviderSettings(
        base_url=f"http://127.0.0.1:{silent_port}", api_key="k", timeout_s=0.3, max_retries=0
    )
    provider = AnthropicProvider("claude-sonnet-4-5", settings)
    started = time.monotonic()
    with pytest.raises(ProviderTimeoutError):
        if streaming:
            await stream_llm_turn(provider, REQUEST)
        else:
            await provider.request(REQUEST)
    await provider.aclose()
    assert time.monotonic() - started < 1.5


async def test_connect_timeout() -> None:
    with blackhole_port() as port:
        settings = ProviderSettings(
            base_url=f"http://127.0.0.1:{port}",
            api_key="k",
            connect_timeout_s=0.3,
            timeout_s=5,
            max_retries=0,
        )
        provider = AnthropicProvider("claude-sonnet-4-5", settings)
        started = time.monotonic()
        with pytest.raises(ProviderTimeoutError):
            await stream_llm_turn(provider, REQUEST)
        await provider.aclose()
    assert time.monotonic() - started < 1.5


async def test_connection_refused_is_a_connection_error() -> None:
    with blackhole_port() as port:
        pass  # the port is closed again: nothing listens there now
    settings = ProviderSettings(base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0)
    provider = AnthropicProvider("claude-sonnet-4-5", settings)
    with pytest.raises(ProviderConnectionError, match="could not connect"):
        await stream_llm_turn(provider, REQUEST)
    await provider.aclose()


async def test_stall_after_partial_transcript_times_out_with_the_partial() -> None:
    events = split_events(transcript("thinking_text.sse"))
    live: list[str] = []

    async def record(chunk: object) -> None:
        if isinstance(chunk, ReasoningDelta):
            live.append(chunk.text)

    async with ReplayServer([Reply(events[:6], stall=True)]) as server:
        provider, _ = loopback_provider(server, timeout=1.0)  # the start arrives within it
        with pytest.raises(ProviderTimeoutError) as info:
            await stream_llm_turn(provider, REQUEST, record)
        await provider.aclose()
    expected = "The user wants to know why bread dough rises. Yeast ferments sugars"
    assert info.value.partial is not None
    assert info.value.partial.reasoning_text == expected
    assert "".join(live) == expected  # delivered as it arrived, not held back until the end

"""The one conformance suite every HTTP adapter must pass, unchanged, against the emulator.

An adapter's test class subclasses :class:`ProviderConformance`, names its ``model`` (a
``"provider:model"`` string the emulator plays) and says how its request body asks for reasoning
(:meth:`~ProviderConformance.asks_for_reasoning`). Nothing else here knows which adapter it is
talking to: every adapter is built from the registry and talks to the emulator over loopback HTTP,
through a transport that accounts for every byte of every response.

What each adapter proves:

* a streamed turn and a non-streamed one are the same turn (the parity test);
* the deltas of one network read come out joined, one delta per part, with the same text, parts
  and part order as the same bytes read one event at a time;
* every response body is read to its end, streamed or not;
* ``hidden`` mode asks for no reasoning and yields none, where ``surface`` asks and gets some;
* errors are mapped: an overload (HTTP 529) is a retryable :class:`ProviderHTTPError` with the
  provider's type and request id, an in-stream error a :class:`ProviderStreamError`, and a failed
  attempt is retried;
* a cut stream keeps its partial turn on the error.
"""

from __future__ import annotations

import importlib
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, ClassVar, cast

import httpx
import pytest

from support.replay import (
    CountingTransport,
    mock_transport,
    run_tool_loop,
    split_events,
    streamed,
    turn_request,
)
from thoughtgate.errors import ProviderHTTPError, ProviderStreamError
from thoughtgate.providers.base import Provider, ProviderSettings, split_model
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator
from thoughtgate.types import Chunk, ReasoningDelta, TextDelta, TurnAccumulator

__all__ = ["Emulated", "ProviderConformance"]


class _BodyRecorder(httpx.AsyncBaseTransport):
    """Passes requests through and keeps every response body it read, whole."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.bodies: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        self.bodies.append(body)
        return httpx.Response(response.status_code, headers=response.headers, content=body)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _part(chunk: Chunk) -> tuple[str, object] | None:
    """The part a plain text or reasoning delta adds to (``None`` for any other chunk)."""
    if isinstance(chunk, TextDelta):
        return ("text", chunk.index)
    if isinstance(chunk, ReasoningDelta) and chunk.signature is None and not chunk.redacted:
        return ("reasoning", (chunk.reasoning_kind, chunk.index))
    return None


def _texts(chunks: list[Chunk]) -> list[tuple[tuple[str, object], str]]:
    """Each part's text, parts in the order their first delta came."""
    texts: dict[tuple[str, object], list[str]] = {}
    for chunk in chunks:
        key = _part(chunk)
        if key is not None:
            texts.setdefault(key, []).append(cast(TextDelta | ReasoningDelta, chunk).text)
    return [(key, "".join(pieces)) for key, pieces in texts.items()]


class Emulated:
    """Builds adapters for one conformance class, each on a read-accounting transport."""

    def __init__(
        self,
        server: EmulatorServer,
        model: str,
        extra: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.server = server
        self.prefix, self.model = split_model(model)
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})
        """Sent with every request (the emulator's ``x-emulator-flavor``)."""
        self.made: list[tuple[Provider, CountingTransport]] = []

    def __call__(
        self,
        scenario: str,
        *,
        retries: int = 0,
        model: str | None = None,
        inner: httpx.AsyncBaseTransport | None = None,
        **extra: Any,
    ) -> tuple[Provider, CountingTransport]:
        """An adapter playing ``scenario`` (another ``model`` of the same provider, more
        ``extra`` settings), and the transport that accounts for its reads (over ``inner``, the
        emulator's loopback HTTP unless a test replays bodies of its own)."""
        endpoint = ENDPOINTS[self.prefix]
        base = self.server.url if endpoint.wire == "messages" else self.server.v1
        settings = ProviderSettings(
            base_url=base, api_key="k", max_retries=retries, extra={**self.extra, **extra}
        )
        transport = CountingTransport(inner or httpx.AsyncHTTPTransport())
        headers = {**self.headers, "x-emulator-scenario": scenario}
        client = httpx.AsyncClient(headers=headers, transport=transport)
        module, _, attr = endpoint.adapter.partition(":")
        factory: Callable[..., Provider] = getattr(importlib.import_module(module), attr)
        made = factory(model or self.model, settings, client=client), transport
        self.made.append(made)
        return made

    async def aclose(self) -> None:
        for provider, _ in self.made:
            await provider.aclose()


class ProviderConformance:
    """Behaviour every HTTP adapter shares. Subclasses set ``model`` and the body hook."""

    model: ClassVar[str]
    extra: ClassVar[Mapping[str, Any]] = {}
    """``ProviderSettings.extra`` the adapter needs on the emulator (a server option)."""

    def asks_for_reasoning(self, body: Mapping[str, Any]) -> bool:
        """Whether a request body asks the provider for reasoning."""
        raise NotImplementedError("an adapter's conformance class says how its body asks")

    @pytest.fixture(scope="class")
    def server(self) -> Iterator[EmulatorServer]:
        with serve_emulator(Emulator()) as srv:
            yield srv

    @pytest.fixture
    async def emulated(self, server: EmulatorServer) -> AsyncIterator[Emulated]:
        made = Emulated(server, self.model, self.extra)
        yield made
        await made.aclose()

    # ------------------------------------------------------------------ parity

    @pytest.mark.parametrize("scenario", ["think-and-answer", "tool-loop"])
    async def test_streamed_and_non_streamed_turns_are_identical(
        self, emulated: Emulated, scenario: str
    ) -> None:
        provider, _ = emulated(scenario)
        request = turn_request(tools=True)
        turn = await streamed(provider, request)
        assert turn == await provider.request(request)
        assert turn.complete and turn.reasoning_parts and (turn.text or turn.tool_calls)

    async def test_a_tool_loop_runs_to_its_answer(self, emulated: Emulated) -> None:
        provider, _ = emulated("tool-loop")
        turns = await run_tool_loop(provider)
        assert [t.finish_reason for t in turns] == ["tool_calls", "tool_calls", "stop"]
        assert turns[-1].text == "The largest city in your country is Mexico City."

    @pytest.mark.parametrize("scenario", ["think-and-answer", "tool-loop"])
    async def test_the_deltas_of_one_read_are_one_delta_per_part(
        self, emulated: Emulated, scenario: str
    ) -> None:
        recording = _BodyRecorder(httpx.AsyncHTTPTransport())
        provider, _ = emulated(scenario, inner=recording)
        request = turn_request(tools=True)
        await streamed(provider, request)
        (body,) = recording.bodies
        by_read = {}
        for name, pieces in (("one read", [body]), ("one event a read", split_events(body))):
            replayed, transport = emulated(scenario, inner=mock_transport(pieces))
            by_read[name] = [chunk async for chunk in replayed.stream(request)]
            transport.assert_fully_read()
        joined, apart = by_read["one read"], by_read["one event a read"]
        keys = [_part(c) for c in joined if _part(c) is not None]
        assert all(a != b for a, b in itertools.pairwise(keys)), "a part's deltas not joined"
        assert len(apart) > len(joined), "the scenario streams a part in several deltas"
        assert _texts(joined) == _texts(apart)  # the same parts, in the same order, same text
        turns = [TurnAccumulator().feed_all(chunks).finish() for chunks in (joined, apart)]
        assert turns[0] == turns[1] and turns[0].reasoning_parts

    # ------------------------------------------------------------------ reading

    @pytest.mark.parametrize("stream", [True, False])
    async def test_every_response_is_read_to_its_end(
        self, emulated: Emulated, stream: bool
    ) -> None:
        provider, transport = emulated("think-and-answer")
        request = turn_request()
        await (streamed(provider, request) if stream else provider.request(request))
        transport.assert_fully_read()

    # ------------------------------------------------------------------ disclosure

    async def test_hidden_mode_asks_for_and_yields_no_reasoning(self, emulated: Emulated) -> None:
        provider, transport = emulated("think-and-answer")
        shown = await streamed(provider, turn_request("surface"))
        hidden = await streamed(provider, turn_request("hidden"))
        hidden_whole = await provider.request(turn_request("hidden"))
        surface_body, hidden_body, whole_body = transport.requests
        assert self.asks_for_reasoning(surface_body) and shown.reasoning_parts
        assert not self.asks_for_reasoning(hidden_body)
        assert not self.asks_for_reasoning(whole_body)
        assert hidden.reasoning_parts == () and hidden_whole.reasoning_parts == ()
        assert hidden.text and hidden.text == hidden_whole.text
        assert "TG-MARK" not in json.dumps([hidden_body, whole_body])

    # ------------------------------------------------------------------ errors

    async def test_an_overload_is_a_retryable_http_error(self, emulated: Emulated) -> None:
        provider, _ = emulated("overloaded")
        for call in (
            lambda: streamed(provider, turn_request()),
            lambda: provider.request(turn_request()),
        ):
            with pytest.raises(ProviderHTTPError) as info:
                await call()
            err = info.value
            assert (err.status, err.error_type, err.retryable) == (529, "overloaded_error", True)
            assert err.provider == provider.name and err.request_id

    async def test_an_error_inside_the_stream_is_a_stream_error(self, emulated: Emulated) -> None:
        provider, _ = emulated("stream-error")
        with pytest.raises(ProviderStreamError) as info:
            await streamed(provider, turn_request())
        err = info.value
        assert (err.status, err.error_type, err.message) == (None, "overloaded_error", "Overloaded")
        assert err.partial is not None and not err.partial.complete

    async def test_a_failed_attempt_is_retried(
        self, server: EmulatorServer, emulated: Emulated
    ) -> None:
        server.emulator.attempts.clear()
        provider, transport = emulated("flaky", retries=1)
        turn = await streamed(provider, turn_request())
        assert turn.text == "Recovered after one retry."
        assert len(transport.requests) == 2

    async def test_a_cut_stream_keeps_its_partial_turn(self, emulated: Emulated) -> None:
        provider, _ = emulated("cut")
        with pytest.raises(ProviderStreamError, match="cut") as info:
            await streamed(provider, turn_request())
        partial = info.value.partial
        assert partial is not None and not partial.complete
        assert partial.text == "Partial ans"

"""The one conformance suite every HTTP adapter must pass, unchanged, against the emulator.

An adapter's test class subclasses :class:`ProviderConformance`, names its ``model`` (a
``"provider:model"`` string the emulator plays) and says how its request body asks for reasoning
(:meth:`~ProviderConformance.asks_for_reasoning`). Nothing else here knows which adapter it is
talking to: every adapter is built from the registry and talks to the emulator over loopback HTTP,
through a transport that accounts for every byte of every response.

What each adapter proves:

* a streamed turn and a non-streamed one are the same turn (the parity test);
* every response body is read to its end, streamed or not;
* ``hidden`` mode asks for no reasoning and yields none, where ``surface`` asks and gets some;
* errors are mapped: an overload (HTTP 529) is a retryable :class:`ProviderHTTPError` with the
  provider's type and request id, an in-stream error a :class:`ProviderStreamError`, and a failed
  attempt is retried;
* a cut stream keeps its partial turn on the error.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, ClassVar

import httpx
import pytest

from support.replay import CountingTransport, run_tool_loop, streamed, turn_request
from thoughtgate.errors import ProviderHTTPError, ProviderStreamError
from thoughtgate.providers.base import Provider, ProviderSettings, split_model
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator

__all__ = ["Emulated", "ProviderConformance"]


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
        self, scenario: str, *, retries: int = 0, model: str | None = None, **extra: Any
    ) -> tuple[Provider, CountingTransport]:
        """An adapter playing ``scenario`` (another ``model`` of the same provider, more
        ``extra`` settings), and the transport that accounts for its reads."""
        endpoint = ENDPOINTS[self.prefix]
        base = self.server.url if endpoint.wire == "messages" else self.server.v1
        settings = ProviderSettings(
            base_url=base, api_key="k", max_retries=retries, extra={**self.extra, **extra}
        )
        transport = CountingTransport(httpx.AsyncHTTPTransport())
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

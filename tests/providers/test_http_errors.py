"""Errors mapped once at the HTTP edge, from two tables: transport exceptions and retried statuses."""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable

import httpx
import pytest
from support.replay import (
    Pieces,
    fixture,
    mock_transport,
    provider_with,
    settings,
    split_events,
    streamed,
    transcript,
    turn_request,
)

from thoughtgate.errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderStreamError,
    ProviderTimeoutError,
)
from thoughtgate.providers import http
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import Provider, split_model
from thoughtgate.providers.http import RETRYABLE_STATUSES, transport_error
from thoughtgate.providers.registry import ENDPOINTS

ANSWER = transcript("thinking_text.sse")
SSE = {"content-type": "text/event-stream; charset=utf-8"}
Answer = Callable[[httpx.Request], httpx.Response]


def _spans(statuses: frozenset[int]) -> str:
    """``408, 409, 429 or 500-599``: the statuses as a sentence names them."""
    spans = []
    for _, run in itertools.groupby(enumerate(sorted(statuses)), lambda p: p[1] - p[0]):
        values = [v for _, v in run]
        spans += [f"{values[0]}-{values[-1]}"] if len(values) > 2 else [str(v) for v in values]
    return ", ".join(spans[:-1]) + " or " + spans[-1]


def test_the_docstring_names_the_statuses_the_table_retries() -> None:
    assert " ".join((http.__doc__ or "").split()).count(_spans(RETRYABLE_STATUSES)) == 1
    assert {408, 409, 429, 500, 501, 505, 529, 599} <= RETRYABLE_STATUSES
    assert not {400, 401, 403, 404, 413, 422} & RETRYABLE_STATUSES


def adapter(*answers: Answer, retries: int = 1) -> tuple[AnthropicProvider, list[httpx.Request]]:
    """An adapter whose request ``n`` gets ``answers[n]`` (then the transcript, whole)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) <= len(answers):
            return answers[len(seen) - 1](request)
        return httpx.Response(200, headers=SSE, stream=Pieces(split_events(ANSWER)))

    provider = provider_with(httpx.MockTransport(handler), max_retries=retries)

    async def no_wait(_: float) -> None:
        return None

    provider.transport.sleep = no_wait
    return provider, seen


def status(code: int, **headers: str) -> Answer:
    body = {"type": "error", "error": {"type": "some_error", "message": f"status {code}"}}
    return lambda _: httpx.Response(code, json=body, headers=headers)


def raises(exc: Exception) -> Answer:
    def answer(_: httpx.Request) -> httpx.Response:
        raise exc

    return answer


@pytest.mark.parametrize("code", sorted({408, 409, 429, 500, 501, 503, 505, 529, 599}))
async def test_retried_statuses_are_retried(code: int) -> None:
    provider, seen = adapter(status(code))
    turn = await streamed(provider, turn_request())
    assert turn.complete and len(seen) == 2


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
async def test_caller_errors_are_not_retried(code: int) -> None:
    provider, seen = adapter(status(code))
    with pytest.raises(ProviderHTTPError) as info:
        await streamed(provider, turn_request())
    assert (info.value.status, info.value.retryable, len(seen)) == (code, False, 1)
    assert info.value.message == f"status {code}"


@pytest.mark.parametrize(
    ("code", "verdict", "retried"), [(400, "true", True), (503, "false", False)]
)
async def test_x_should_retry_overrides_the_table(code: int, verdict: str, retried: bool) -> None:
    provider, seen = adapter(status(code, **{"x-should-retry": verdict}))
    if retried:
        assert (await streamed(provider, turn_request())).complete
    else:
        with pytest.raises(ProviderHTTPError) as info:
            await streamed(provider, turn_request())
        assert info.value.retryable is False
    assert len(seen) == (2 if retried else 1)


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectTimeout("connect"),
        httpx.ReadTimeout("no status line in time"),
        httpx.ConnectError("refused"),
        httpx.RemoteProtocolError("closed before the status line"),
    ],
)
async def test_failures_before_the_first_byte_are_retried(exc: Exception) -> None:
    provider, seen = adapter(raises(exc))
    assert (await streamed(provider, turn_request())).complete
    assert len(seen) == 2


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ReadTimeout("stalled mid-body"), ProviderTimeoutError),
        (httpx.RemoteProtocolError("peer closed"), ProviderStreamError),
        (httpx.ReadError("reset"), ProviderStreamError),
    ],
)
async def test_failures_mid_body_are_never_retried_and_keep_the_partial(
    exc: Exception, kind: type[ProviderError]
) -> None:
    pieces = split_events(ANSWER)[:5]
    provider, seen = adapter(
        lambda _: httpx.Response(200, headers=SSE, stream=Pieces(pieces, error=exc))
    )
    with pytest.raises(kind) as info:
        await streamed(provider, turn_request())
    assert info.value.retryable is False and len(seen) == 1
    assert info.value.partial is not None and info.value.partial.reasoning_text


@pytest.mark.parametrize(
    ("exc", "request_kind", "body_kind"),
    [
        (httpx.ConnectTimeout("x"), ProviderTimeoutError, ProviderTimeoutError),
        (httpx.PoolTimeout("x"), ProviderTimeoutError, ProviderTimeoutError),
        (httpx.ConnectError("x"), ProviderConnectionError, ProviderStreamError),
        (httpx.ReadError("x"), ProviderConnectionError, ProviderStreamError),
        (httpx.DecodingError("x"), ProviderConnectionError, ProviderStreamError),
    ],
)
def test_the_most_specific_row_of_the_table_wins(
    exc: httpx.HTTPError, request_kind: type, body_kind: type
) -> None:
    before = transport_error(exc, "request", provider="p", base_url="http://x")
    during = transport_error(exc, "body", provider="p", base_url="http://x")
    assert (type(before), type(during)) == (request_kind, body_kind)
    assert (before.retryable, during.retryable) == (True, False)


def test_a_connection_error_names_the_provider_without_a_password_or_query_in_its_url() -> None:
    """The message is the run's ``error``, which every reader sees: a gateway's password in the
    base URL (``http://user:secret@host``) or a key in its query is not part of it."""
    failed = transport_error(
        httpx.ConnectError("x"),
        "request",
        provider="p",
        base_url="http://bob:hunter2-secret@gateway.internal:8443/v1?key=sk-query-secret",
    )
    said = str(failed)
    assert "could not connect to http://gateway.internal:8443/v1 (ConnectError)" in said, said
    assert "hunter2" not in said and "sk-query-secret" not in said and "bob" not in said


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("anthropic:claude-sonnet-4-5", "anthropic/thinking_text.sse"),
        ("openrouter:anthropic/claude-sonnet-4.5", "openrouter/anthropic_thinking.sse"),
        ("openai:o3", "openai_responses/summary_then_message.sse"),
        ("openai-compatible:deepseek-reasoner", "compat/deepseek_reasoner.sse"),
    ],
)
async def test_a_connection_lost_after_a_complete_stream_loses_nothing(
    model: str, name: str
) -> None:
    """Every adapter, one rule: after the terminal event the turn is whole, so a connection that
    drops then (as proxies do instead of closing cleanly) does not fail it."""
    prefix, bare = split_model(model)
    data = fixture(name)
    whole = await streamed(adapter_on(prefix, bare, mock_transport([data])), turn_request())
    cut = mock_transport([data], error=httpx.RemoteProtocolError("peer closed connection"))
    assert await streamed(adapter_on(prefix, bare, cut), turn_request()) == whole


def adapter_on(prefix: str, model: str, transport: httpx.AsyncBaseTransport) -> Provider:
    module, _, attr = ENDPOINTS[prefix].adapter.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    base = "http://replay.invalid" + ("" if prefix == "anthropic" else "/v1")
    provider: Provider = factory(
        model, settings(base_url=base), client=httpx.AsyncClient(transport=transport)
    )
    return provider

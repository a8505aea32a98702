"""A shared client's request sent past ``AsyncClient.send``'s layers (``providers.clients.send``,
ADR 0034): on a real loopback server it must put the same bytes on the wire as httpx's own
``send``, and answer with the same response (request, status, head, body, ``elapsed``,
``next_request``) and the same errors; a client or request that one of those layers would act
on (authentication, event hooks, cookies, redirects followed, a closed client) goes through
httpx's ``send``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from support.replay import SSE_HEADERS, ReplayServer, Reply, blackhole_port

from thoughtgate.providers import clients
from thoughtgate.providers.clients import ProviderClients, send
from thoughtgate.providers.http import _parsed_url, _post_request

HEADERS = httpx.Headers({"Authorization": "Bearer k", "anthropic-version": "2023-06-01"})
TIMEOUT = httpx.Timeout(5.0, connect=1.0)
BODIES: list[dict[str, Any]] = [
    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "stream": True, "messages": [{"role": "user", "content": 'é\u2028"x"\n'}]},
    {"model": "m", "max_tokens": 5, "tools": [{"name": "t", "input_schema": {}}]},
]


@contextlib.asynccontextmanager
async def shared(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A shared client of its own ``ProviderClients``, closed with it."""
    pool = ProviderClients()
    async with pool.lease():
        yield pool.client(base_url)


def spy_on_send(client: httpx.AsyncClient) -> list[httpx.Request]:
    """Record the requests that go through ``client.send`` (httpx's path)."""
    sent: list[httpx.Request] = []
    real = client.send

    async def spy(request: httpx.Request, **kw: Any) -> httpx.Response:
        sent.append(request)
        return await real(request, **kw)

    client.send = spy  # type: ignore[method-assign]
    return sent


def request_for(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> httpx.Request:
    return _post_request(client, _parsed_url(url), body, HEADERS, TIMEOUT, ("direct", url))


async def exchange(client: httpx.AsyncClient, request: httpx.Request, *, direct: bool) -> Any:
    response = await (send(client, request) if direct else client.send(request, stream=True))
    body = await response.aread()
    await response.aclose()
    assert response.request is request
    assert response.elapsed.total_seconds() >= 0  # set when the body closed, as httpx sets it
    return (
        response.status_code,
        response.http_version,
        response.reason_phrase,
        response.headers.raw,
        body,
        response.default_encoding,
        response.next_request and (response.next_request.method, response.next_request.url),
    )


async def test_the_installed_httpx_takes_the_direct_path() -> None:
    """The direct path needs httpx's private ``BoundAsyncStream`` and ``ClientState``; an httpx
    without them sends every request through ``client.send`` (slower, not wrong), and this
    fails so the change is seen."""
    assert clients._BoundStream is not None and clients._OPENED is not None
    async with ReplayServer([Reply([b"data: {}\n\n"])]) as server, shared(server.url) as client:
        through_httpx = spy_on_send(client)
        url = f"{server.url}/v1/messages"
        for body in BODIES:
            response = await send(client, request_for(client, url, body))
            await response.aread()
            await response.aclose()
        assert through_httpx == []
        assert server.bodies == BODIES
        assert server.connections == 1  # the shared client's keep-alive connection, reused


@pytest.mark.parametrize(
    "reply",
    [
        Reply([b"data: {}\n\n", b"data: [DONE]\n\n"]),
        Reply([b'{"error": {"type": "overloaded_error"}}'], status=529),
        Reply([b""], status=302, headers={"location": "/v1/elsewhere", "content-length": "0"}),
        Reply([b"x"], headers={**SSE_HEADERS, "x-many": "a", "X-Many": "b"}),
    ],
    ids=["stream", "error-status", "redirect-not-followed", "repeated-headers"],
)
async def test_a_direct_request_is_the_one_httpx_sends_byte_for_byte(reply: Reply) -> None:
    async with ReplayServer([reply]) as server, shared(server.url) as client:
        url = f"{server.url}/v1/messages"
        for body in BODIES:
            theirs = await exchange(client, request_for(client, url, body), direct=False)
            ours = await exchange(client, request_for(client, url, body), direct=True)
            assert ours == theirs
        assert len(server.raw) == 2 * len(BODIES)
        for httpx_bytes, direct_bytes in zip(server.raw[::2], server.raw[1::2], strict=True):
            assert direct_bytes == httpx_bytes


async def test_a_failed_connection_is_the_error_httpx_raises_with_its_request() -> None:
    with blackhole_port() as port:
        url = f"http://127.0.0.1:{port}/v1/messages"
        async with shared(url) as client:
            errors = []
            for direct in (False, True):
                request = client.build_request("POST", url, json={}, timeout=httpx.Timeout(0.2))
                with pytest.raises(httpx.ConnectTimeout) as caught:
                    await (send(client, request) if direct else client.send(request, stream=True))
                assert caught.value.request is request
                errors.append((type(caught.value), str(caught.value)))
            assert errors[0] == errors[1]


def basic_auth(client: httpx.AsyncClient) -> None:
    client.auth = httpx.BasicAuth("user", "secret")


def hooks(client: httpx.AsyncClient) -> None:
    async def stamp(request: httpx.Request) -> None:
        request.headers["x-hooked"] = "1"

    client.event_hooks = {"request": [stamp], "response": []}


def cookies(client: httpx.AsyncClient) -> None:
    client.cookies.set("session", "abc", domain="127.0.0.1")


def follow(client: httpx.AsyncClient) -> None:
    client.follow_redirects = True


@pytest.mark.parametrize(
    ("change", "seen"),
    [
        (basic_auth, b"authorization: Basic dXNlcjpzZWNyZXQ="),
        (hooks, b"x-hooked: 1"),
        (cookies, b"Cookie: session=abc"),
        (follow, b"POST /v1/messages"),
    ],
    ids=["auth", "event-hooks", "cookies", "redirects-followed"],
)
async def test_a_client_whose_layers_act_goes_through_httpx(
    change: Callable[[httpx.AsyncClient], None], seen: bytes
) -> None:
    async with ReplayServer([Reply([b"data: {}\n\n"])]) as server, shared(server.url) as client:
        change(client)
        through_httpx = spy_on_send(client)
        url = f"{server.url}/v1/messages"
        request = client.build_request("POST", url, json={}, headers=HEADERS, timeout=TIMEOUT)
        response = await send(client, request)
        await response.aclose()
        assert through_httpx == [request]
        assert seen.lower() in server.raw[-1].lower()


async def test_a_user_and_password_in_the_url_go_through_httpx() -> None:
    """httpx turns them into Basic authentication in ``send``."""
    async with ReplayServer([Reply([b"data: {}\n\n"])]) as server, shared(server.url) as client:
        through_httpx = spy_on_send(client)
        url = server.url.replace("http://", "http://user:secret@") + "/v1/messages"
        request = client.build_request("POST", url, json={}, timeout=TIMEOUT)
        response = await send(client, request)
        await response.aclose()
        assert through_httpx == [request]
        assert b"authorization: basic dxnlcjpzzwnyzxq=" in server.raw[-1].lower()


async def test_cookies_an_answer_sets_reach_the_jar_and_later_requests() -> None:
    set_cookie = {**SSE_HEADERS, "set-cookie": "session=abc; Path=/"}
    replies = [Reply([b"data: {}\n\n"], headers=set_cookie), Reply([b"data: {}\n\n"])]
    async with ReplayServer(replies) as server, shared(server.url) as client:
        url = f"{server.url}/v1/messages"
        for _ in range(2):
            response = await send(client, request_for(client, url, {}))
            await response.aclose()
        assert client.cookies.get("session") == "abc"
        assert b"cookie: session=abc" in server.raw[-1].lower()


async def test_a_closed_client_refuses_as_httpx_refuses() -> None:
    async with ReplayServer([Reply([b"data: {}\n\n"])]) as server, shared(server.url) as client:
        request = request_for(client, f"{server.url}/v1/messages", {})
        await client.aclose()
        with pytest.raises(RuntimeError, match="client has been closed"):
            await send(client, request)


async def test_a_client_not_made_by_the_shared_pool_goes_through_httpx() -> None:
    async with ReplayServer([Reply([b"data: {}\n\n"])]) as server, httpx.AsyncClient() as client:
        through_httpx = spy_on_send(client)
        request = client.build_request("POST", f"{server.url}/v1/messages", json={})
        response = await send(client, request)
        await response.aclose()
        assert through_httpx == [request]

"""What a provider request through the shared clients does on the wire that a user relies on.

The shared clients are given a transport of their own (``ShardedTransport``), and httpx reads no
proxy from the environment for a client given a transport; provider requests must still honour
``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY`` as httpx's default client does
(ADR 0105). And what ``AsyncClient.send`` does for them stays (ADR 0100 measured going past it,
not kept): the cookies a provider sets go back with the next turn, a user and password in the
base URL become basic authentication, the ``httpx`` log line, a refused or hanging connect is the
error it was.

The provider and the proxy here are loopback servers that record each request's head.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from support.replay import ReplayServer, Reply, blackhole_port, chunked, transcript
from support.servers import serving
from support.sse import frames
from support.tls import self_signed

from thoughtgate.errors import ProviderConnectionError, ProviderTimeoutError, ThoughtgateError
from thoughtgate.providers import clients as clients_module
from thoughtgate.providers.base import ProviderSettings
from thoughtgate.providers.clients import ProviderClients, environment_proxies
from thoughtgate.providers.http import HTTPTransport

pytestmark = pytest.mark.inprocess

BODY = b"data: one\n\n"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@dataclass
class Recorder:
    """Answers every request with a one-event SSE stream (``first_headers`` on the first answer)
    and keeps each request's head, lower-cased; a ``CONNECT`` is kept and refused (403)."""

    first_headers: dict[str, str] = field(default_factory=dict)
    heads: list[str] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def request_lines(self) -> list[str]:
        return [head.partition("\r\n")[0] for head in self.heads]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                if head.startswith("connect "):
                    self.heads.append(head)
                    writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    break
                length = head.partition("content-length:")[2].partition("\r\n")[0]
                await reader.readexactly(int(length or 0))
                extra = self.first_headers if not self.heads else {}
                self.heads.append(head)
                lines = ["HTTP/1.1 200 OK", "content-type: text/event-stream"]
                lines += [f"{k}: {v}" for k, v in extra.items()]
                lines += ["transfer-encoding: chunked", "", ""]
                chunk = f"{len(BODY):x}\r\n".encode() + BODY + b"\r\n0\r\n\r\n"
                writer.write("\r\n".join(lines).encode() + chunk)
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def recording(**first_headers: str) -> AsyncIterator[Recorder]:
    recorder = Recorder(dict(first_headers))
    async with serving(recorder.serve) as server:
        recorder.port = server.sockets[0].getsockname()[1]
        yield recorder


def transport(base_url: str, clients: ProviderClients, **settings: Any) -> HTTPTransport:
    return HTTPTransport(
        "test", base_url, {"x-api-key": "k"}, ProviderSettings(**settings), clients=clients
    )


async def turn(http: HTTPTransport) -> list[str]:
    async with http.open("/v1/messages", {"q": 1}, stream=True) as response:
        return [m.data for m in [m async for m in http.events(response)]]


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No proxy variable set, in either case, until the test sets one (lower case, which the
    standard library prefers when both are set)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("REQUEST_METHOD", raising=False)  # CGI: the stdlib then skips HTTP_PROXY
    yield monkeypatch


# --- proxies from the environment --------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "outranked"),
    [("HTTP_PROXY", None), ("http_proxy", None), ("ALL_PROXY", None), ("HTTP_PROXY", "ALL_PROXY")],
)
async def test_the_environment_s_proxy_carries_a_turn_to_an_http_provider(
    proxy_env: pytest.MonkeyPatch, variable: str, outranked: str | None
) -> None:
    """The proxy gets the request in absolute form; ``ALL_PROXY`` serves when no proxy for the
    scheme is set, and yields to one that is."""
    clients = ProviderClients()
    async with recording() as provider, recording() as proxy, recording() as other:
        proxy_env.setenv(variable, proxy.url)
        if outranked is not None:
            proxy_env.setenv(outranked, other.url)
        async with clients.lease():
            assert await turn(transport(provider.url, clients)) == ["one"]
    assert proxy.request_lines == [f"post {provider.url}/v1/messages http/1.1"]
    assert provider.heads == other.heads == []


async def test_no_proxy_naming_the_host_sends_the_turn_straight_to_it(
    proxy_env: pytest.MonkeyPatch,
) -> None:
    clients = ProviderClients()
    async with recording() as provider, recording() as proxy, clients.lease():
        proxy_env.setenv("HTTP_PROXY", proxy.url)
        proxy_env.setenv("NO_PROXY", "example.com, 127.0.0.1")
        for _ in range(2):
            assert await turn(transport(provider.url, clients)) == ["one"]
        assert clients.pools(provider.url) == 1  # the direct requests keep the sharded pools
    assert provider.request_lines == ["post /v1/messages http/1.1"] * 2
    assert proxy.heads == []


async def test_https_proxy_is_asked_to_connect_to_an_https_provider(
    proxy_env: pytest.MonkeyPatch,
) -> None:
    """An ``https`` base URL goes through ``HTTPS_PROXY`` (a ``CONNECT`` tunnel), not through
    ``HTTP_PROXY``; this proxy refuses the tunnel, so the turn fails."""
    clients = ProviderClients()
    async with recording() as http_proxy, recording() as proxy, clients.lease():
        proxy_env.setenv("HTTP_PROXY", http_proxy.url)
        proxy_env.setenv("HTTPS_PROXY", proxy.url)
        with pytest.raises(ThoughtgateError):
            await turn(transport("https://provider.invalid:8443", clients, max_retries=0))
    assert proxy.request_lines == ["connect provider.invalid:8443 http/1.1"]
    assert http_proxy.heads == []


async def test_a_proxy_set_after_a_client_was_made_reaches_a_new_client_only(
    proxy_env: pytest.MonkeyPatch,
) -> None:
    """As httpx's default client: the environment is read when a client is made."""
    clients = ProviderClients()
    async with recording() as provider, recording() as proxy, clients.lease():
        assert await turn(transport(provider.url, clients)) == ["one"]
        proxy_env.setenv("HTTP_PROXY", proxy.url)
        assert await turn(transport(provider.url, clients)) == ["one"]
        fresh = ProviderClients()
        async with fresh.lease():
            assert await turn(transport(provider.url, fresh)) == ["one"]
    assert len(provider.heads) == 2
    assert len(proxy.heads) == 1


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"HTTP_PROXY": "http://proxy:3128"},
        {"HTTPS_PROXY": "proxy:3128", "ALL_PROXY": "http://other:1080"},
        {"ALL_PROXY": "http://p:1", "NO_PROXY": ".example.com,10.0.0.1,::1,localhost,corp"},
        {"HTTP_PROXY": "http://p:1", "NO_PROXY": "http://internal:8080, *"},
    ],
)
def test_the_proxy_patterns_are_httpx_s_own(
    proxy_env: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    """Pins the private httpx helper the shared clients read the environment with: the URL
    patterns and proxies are exactly those httpx's default client mounts (its proxy map). This
    fails if httpx renames the helper or its client stops using it as is."""
    for name, value in env.items():
        proxy_env.setenv(name, value)
    default = httpx.AsyncClient()._get_proxy_map(None, allow_env_proxies=True)
    ours = environment_proxies()
    assert list(ours) == list(default)
    assert [None if p is None else p.url for p in ours.values()] == [
        None if p is None else p.url for p in default.values()
    ]


# --- through a proxy to a TLS provider ---------------------------------------------------------


@pytest.fixture
def trusted_tls(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[ssl.SSLContext]:
    """A server context for ``127.0.0.1`` whose certificate the shared clients trust the way a
    user makes them trust a private CA: ``SSL_CERT_FILE``, read when the process's one TLS
    context is built (cleared here before and after, so no other test sees this CA)."""
    server, cert_file = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    clients_module._tls_context.cache_clear()
    yield server
    clients_module._tls_context.cache_clear()


async def relay(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then close ``dst``."""
    with contextlib.suppress(ConnectionError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    with contextlib.suppress(OSError):
        dst.close()


@dataclass
class Tunnel:
    """A ``CONNECT`` proxy: keeps each request line, answers 200 and relays bytes both ways."""

    request_lines: list[str] = field(default_factory=list)
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        line = head.partition("\r\n")[0]
        self.request_lines.append(line)
        host, _, port = line.split(" ")[1].rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()

        try:
            await asyncio.gather(relay(reader, up_writer), relay(up_reader, writer))
        finally:
            up_writer.transport.abort()


@contextlib.asynccontextmanager
async def tunnelling(tls: ssl.SSLContext | None = None) -> AsyncIterator[Tunnel]:
    tunnel = Tunnel()
    async with serving(tunnel.serve, tls=tls) as server:
        tunnel.port = server.sockets[0].getsockname()[1]
        yield tunnel


@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
@pytest.mark.parametrize("proxy_scheme", ["http", "https"])
def test_a_turn_streams_from_a_tls_provider_through_a_connect_tunnel(
    proxy_env: pytest.MonkeyPatch, trusted_tls: ssl.SSLContext, proxy_scheme: str, runner: str
) -> None:
    """The corporate case: ``HTTPS_PROXY`` in front of an ``https`` provider. The client asks the
    proxy to ``CONNECT``, starts TLS with the provider inside the tunnel (verified against the
    trusted roots), and the turn's events arrive as the provider sent them, over two turns (the
    tunnelled connection is kept and reused). With an ``https://`` proxy the tunnel itself is TLS
    (TLS inside TLS). On asyncio's loop and on uvloop (the daemon's)."""
    body = transcript("thinking_text.sse")
    expected = [frame.data for frame in frames(body)]

    async def two_turns() -> tuple[Tunnel, int, int]:
        clients = ProviderClients()
        async with (
            ReplayServer([Reply(chunked(body, "random"))], tls=trusted_tls) as provider,
            tunnelling(trusted_tls if proxy_scheme == "https" else None) as tunnel,
        ):
            proxy_env.setenv("HTTPS_PROXY", f"{proxy_scheme}://127.0.0.1:{tunnel.port}")
            async with clients.lease():
                for _ in range(2):
                    got = await turn(transport(provider.url, clients, max_retries=0))
                    assert got == expected
        return tunnel, provider.port, provider.connections

    if runner == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        tunnel, port, connections = uvloop.run(two_turns())
    else:
        tunnel, port, connections = asyncio.run(two_turns())
    assert tunnel.request_lines == [f"CONNECT 127.0.0.1:{port} HTTP/1.1"]
    assert connections == 1


async def test_a_tunnel_to_a_provider_it_cannot_verify_fails_to_connect(
    proxy_env: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Verification is not loosened for a tunnel: a certificate outside the trusted roots is a
    connection error, as it is without a proxy."""
    server, _ = self_signed(tmp_path)  # not trusted: no SSL_CERT_FILE
    clients = ProviderClients()
    async with (
        ReplayServer([Reply([b"data: {}\n\n"])], tls=server) as provider,
        tunnelling() as tunnel,
    ):
        proxy_env.setenv("HTTPS_PROXY", f"http://127.0.0.1:{tunnel.port}")
        async with clients.lease():
            with pytest.raises(ProviderConnectionError, match="could not connect"):
                await turn(transport(provider.url, clients, max_retries=0))
    assert tunnel.request_lines == [f"CONNECT 127.0.0.1:{provider.port} HTTP/1.1"]


async def test_an_https_proxy_it_cannot_verify_is_refused(
    proxy_env: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The ``https://`` proxy's own certificate is verified (its context is built once per
    process, ADRs 0107, 0111): one outside the trusted roots is a connection error, before any
    ``CONNECT`` is sent, on every turn."""
    server, _ = self_signed(tmp_path)  # not trusted: no SSL_CERT_FILE
    clients = ProviderClients()
    async with tunnelling(server) as tunnel:
        proxy_env.setenv("HTTPS_PROXY", f"https://127.0.0.1:{tunnel.port}")
        async with clients.lease():
            for _ in range(2):
                with pytest.raises(ProviderConnectionError, match="could not connect"):
                    await turn(transport("https://provider.invalid", clients, max_retries=0))
    assert tunnel.request_lines == []


def test_a_daemon_builds_the_https_proxys_tls_context_before_it_serves(
    proxy_env: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``build_tls_context`` (a daemon's start, before it serves) builds the context an
    ``https://`` proxy is verified with; the clients made later, at each endpoint's first
    request on the event loop every run shares, build none (each built its own: 25-40 ms of
    CPU there)."""
    built: list[ssl.SSLContext] = []
    default = clients_module.httpcore.default_ssl_context

    def counted() -> ssl.SSLContext:
        built.append(default())
        return built[-1]

    proxy_env.setattr(clients_module.httpcore, "default_ssl_context", counted)
    proxy_env.setenv("HTTPS_PROXY", "https://127.0.0.1:9")
    proxy_env.setenv("SSL_CERT_DIR", str(tmp_path))  # this test's own: nothing built before
    clients_module.build_tls_context()
    assert len(built) == 1

    async def made() -> None:
        clients = ProviderClients()
        async with clients.lease():
            clients.client("https://one.invalid")
            clients.client("https://two.invalid")
            assert clients.created == 2

    asyncio.run(made())
    assert len(built) == 1


@dataclass
class Socks5:
    """A SOCKS5 proxy (no authentication, ``CONNECT`` only): keeps each target as ``host:port``
    and relays bytes both ways."""

    targets: list[str] = field(default_factory=list)
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _version, methods = await reader.readexactly(2)
        await reader.readexactly(methods)
        writer.write(b"\x05\x00")  # no authentication
        _version, _command, _reserved, kind = await reader.readexactly(4)
        if kind == 1:
            host = ".".join(str(b) for b in await reader.readexactly(4))
        else:  # a domain name
            host = (await reader.readexactly((await reader.readexactly(1))[0])).decode()
        port = int.from_bytes(await reader.readexactly(2), "big")
        self.targets.append(f"{host}:{port}")
        up_reader, up_writer = await asyncio.open_connection(host, port)
        writer.write(b"\x05\x00\x00\x01" + bytes(4) + bytes(2))
        await writer.drain()
        try:
            await asyncio.gather(relay(reader, up_writer), relay(up_reader, writer))
        finally:
            up_writer.transport.abort()


@pytest.mark.skipif(
    not clients_module._socks_installed(), reason="the socks extra is not installed"
)
@pytest.mark.parametrize("secure", [False, True], ids=["http", "https"])
async def test_a_turn_streams_through_a_socks5_proxy_with_the_extra(
    proxy_env: pytest.MonkeyPatch, trusted_tls: ssl.SSLContext, secure: bool
) -> None:
    body = transcript("thinking_text.sse")
    socks = Socks5()
    clients = ProviderClients()
    async with (
        ReplayServer(
            [Reply(chunked(body, "random"))], tls=trusted_tls if secure else None
        ) as provider,
        serving(socks.serve) as server,
    ):
        socks.port = server.sockets[0].getsockname()[1]
        proxy_env.setenv("ALL_PROXY", f"socks5://127.0.0.1:{socks.port}")
        async with clients.lease():
            got = await turn(transport(provider.url, clients, max_retries=0))
    assert got == [frame.data for frame in frames(body)]
    assert socks.targets == [f"127.0.0.1:{provider.port}"]


@pytest.fixture
def without_socksio(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if ``socksio`` were not installed (it is not, unless the ``socks`` extra is)."""
    monkeypatch.setattr(clients_module, "_socks_installed", lambda: False)


@pytest.mark.usefixtures("without_socksio")
async def test_a_socks_proxy_without_its_extra_is_an_error_naming_the_fix(
    proxy_env: pytest.MonkeyPatch,
) -> None:
    """``ALL_PROXY=socks5://...`` needs ``socksio``; without it the turn fails at once, not
    retried, with words that say what to install (not httpx's ``ImportError``)."""
    clients = ProviderClients()
    proxy_env.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    async with clients.lease():
        with pytest.raises(ProviderConnectionError) as caught:
            await turn(transport("https://provider.invalid", clients, max_retries=3))
    error = caught.value
    assert not error.retryable
    assert error.provider == "test"
    assert "install thoughtgate[socks]" in error.described()
    assert "socks5://127.0.0.1:1080" in error.described()


@pytest.mark.usefixtures("without_socksio")
async def test_a_socks_proxy_the_request_does_not_use_needs_no_extra(
    proxy_env: pytest.MonkeyPatch,
) -> None:
    """Only a request that goes through the SOCKS proxy needs it: a host in ``NO_PROXY`` is
    reached directly."""
    clients = ProviderClients()
    async with recording() as provider, clients.lease():
        proxy_env.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
        proxy_env.setenv("NO_PROXY", "127.0.0.1")
        assert await turn(transport(provider.url, clients)) == ["one"]
    assert provider.request_lines == ["post /v1/messages http/1.1"]


async def _refused_turn(
    proxy_env: pytest.MonkeyPatch, variable: str, url: str
) -> ProviderConnectionError:
    """The error of a turn to an ``https://`` provider with ``variable`` set to ``url``, on a
    client of its own, retries allowed (an unusable proxy is retried never)."""
    clients = ProviderClients()
    proxy_env.setenv(variable, url)
    async with clients.lease():
        with pytest.raises(ProviderConnectionError) as caught:
            await turn(transport("https://provider.invalid", clients, max_retries=3))
    return caught.value


@pytest.mark.parametrize(
    ("variable", "url", "shown"),
    [
        ("ALL_PROXY", "socks4://someone:s3cret@127.0.0.1:1080", "socks4://127.0.0.1:1080"),
        ("HTTPS_PROXY", "ftp://proxy.invalid", "ftp://proxy.invalid"),
    ],
)
async def test_a_proxy_scheme_httpx_does_not_know_is_an_error_naming_the_variable(
    proxy_env: pytest.MonkeyPatch, variable: str, url: str, shown: str
) -> None:
    """httpx refuses a proxy URL whose scheme it does not know with a ``ValueError`` when the
    client is built; the turn that would use it fails at once, not retried, with words naming the
    variable and the schemes that work, and the URL without its user and password."""
    error = await _refused_turn(proxy_env, variable, url)
    message = error.described()
    assert not error.retryable
    assert error.provider == "test"
    assert variable in message
    assert shown in message
    assert "http, https, socks5, socks5h" in message
    assert "someone" not in message
    assert "s3cret" not in message


@pytest.mark.parametrize(
    ("variable", "url"),
    [("HTTPS_PROXY", "http://someone:s3cret@proxy.invalid:port"), ("ALL_PROXY", "http://[::1")],
    ids=["port", "ipv6"],
)
async def test_a_proxy_url_httpx_cannot_parse_is_an_error_naming_the_variable(
    proxy_env: pytest.MonkeyPatch, variable: str, url: str
) -> None:
    """httpx refuses a proxy URL it cannot parse (a port that is not a number, an unclosed IPv6
    address) with ``httpx.InvalidURL`` when the client is built; the turn that would use it
    fails at once, not retried, with words naming the variable, and without the URL (its user
    and password cannot be told from the rest of a URL that does not parse). httpx's reason is
    kept in the developer-only detail."""
    error = await _refused_turn(proxy_env, variable, url)
    message = error.described()
    assert not error.retryable
    assert variable in message
    assert "not a URL" in message
    assert "someone" not in message
    assert "s3cret" not in message
    assert error.detail is not None and "Invalid" in error.detail
    assert "s3cret" not in error.detail


async def test_a_no_proxy_entry_httpx_cannot_parse_is_an_error_naming_the_variable(
    proxy_env: pytest.MonkeyPatch,
) -> None:
    """httpx refuses a client whose ``NO_PROXY`` holds an entry it cannot parse (``host:abc``);
    which hosts go direct is then unknown, so the turn fails at once, not retried, naming the
    variable (no request is sent through the proxy either)."""
    proxy_env.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    error = await _refused_turn(proxy_env, "NO_PROXY", "provider.invalid:abc")
    assert not error.retryable
    assert "NO_PROXY" in error.described()


@pytest.mark.parametrize(
    ("variable", "url", "no_proxy"),
    [("ALL_PROXY", "socks4://127.0.0.1:1080", "127.0.0.1"), ("HTTPS_PROXY", "ftp://x", None)],
    ids=["no_proxy", "another_scheme"],
)
async def test_a_proxy_scheme_httpx_does_not_know_stops_no_request_it_does_not_carry(
    proxy_env: pytest.MonkeyPatch, variable: str, url: str, no_proxy: str | None
) -> None:
    """Only a request that would go through the unusable proxy fails: a host in ``NO_PROXY``,
    or an ``http://`` provider when only ``HTTPS_PROXY`` is unusable, is reached directly."""
    clients = ProviderClients()
    async with recording() as provider, clients.lease():
        proxy_env.setenv(variable, url)
        if no_proxy is not None:
            proxy_env.setenv("NO_PROXY", no_proxy)
        assert await turn(transport(provider.url, clients)) == ["one"]
    assert provider.request_lines == ["post /v1/messages http/1.1"]


# --- what AsyncClient.send does for the shared clients -----------------------------------------


async def test_a_cookie_the_provider_sets_goes_back_with_the_next_turns() -> None:
    clients = ProviderClients()
    async with recording(**{"set-cookie": "lb=a1; Path=/"}) as provider, clients.lease():
        for _ in range(3):  # each run builds its transport; the client's jar is shared
            assert await turn(transport(provider.url, clients)) == ["one"]
    first, *later = provider.heads
    assert "cookie:" not in first
    assert all("\r\ncookie: lb=a1\r\n" in head for head in later)


async def test_a_user_and_password_in_the_base_url_become_basic_authentication() -> None:
    clients = ProviderClients()
    async with recording() as provider, clients.lease():
        url = f"http://user:secret@127.0.0.1:{provider.port}"
        for _ in range(2):  # the first request built by httpx, the next from its template
            assert await turn(transport(url, clients)) == ["one"]
    expected = f"\r\nauthorization: {httpx.BasicAuth('user', 'secret')._auth_header}\r\n"
    assert [expected.lower() in head for head in provider.heads] == [True, True]


async def test_each_request_is_logged_by_httpx(caplog: pytest.LogCaptureFixture) -> None:
    clients = ProviderClients()
    with caplog.at_level(logging.INFO, logger="httpx"):
        async with recording() as provider, clients.lease():
            await turn(transport(provider.url, clients))
    lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert lines == [f'HTTP Request: POST {provider.url}/v1/messages "HTTP/1.1 200 OK"']


async def test_a_refused_connection_is_a_retried_connection_error_naming_its_request() -> None:
    async with serving(lambda r, w: asyncio.sleep(0)) as listener:
        port = listener.sockets[0].getsockname()[1]
    clients = ProviderClients()
    http = transport(f"http://127.0.0.1:{port}", clients, max_retries=2)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    http.sleep = sleep
    async with clients.lease():
        with pytest.raises(ProviderConnectionError, match="could not connect") as caught:
            await turn(http)
    assert caught.value.retryable and len(slept) == 2
    cause = caught.value.__cause__
    assert isinstance(cause, httpx.ConnectError)
    assert cause.request.url == f"http://127.0.0.1:{port}/v1/messages"


async def test_a_connect_that_hangs_is_a_timeout() -> None:
    clients = ProviderClients()
    with blackhole_port() as port:
        http = transport(f"http://127.0.0.1:{port}", clients, max_retries=0, connect_timeout_s=0.2)
        async with clients.lease():
            with pytest.raises(ProviderTimeoutError) as caught:
                await turn(http)
    assert isinstance(caught.value.__cause__, httpx.ConnectTimeout)

"""One HTTP client per provider endpoint and process, shared by every adapter and every run.

Why: an ``httpx.AsyncClient`` owns a connection pool and a TLS context. Building one costs about
50 ms of CPU (``load_verify_locations``) and starts with no connection, so a client per adapter
meant ~100 ms per daemon run (an adapter is built to check the model when the run is requested,
and again to execute it) and a new TCP (and TLS) connection per turn. Here:

* A client is made lazily, on the first request to its endpoint (scheme, host and port of the base
  URL); building an adapter, or checking a model and its key, opens nothing.
* A client carries nothing of a run: timeouts, headers and keys go on each request
  (:class:`~thoughtgate.providers.http.HTTPTransport`), so one client serves every run, model and
  key that talks to that endpoint, and its keep-alive connections are reused across turns and runs.
* All clients share one TLS context, built once per process.
* A client spreads its connections over small connection pools of ``SHARD_SIZE`` (see
  :class:`ShardedTransport`): httpcore's pool walks all its connections on every request and every
  response close, so one pool of a hundred streams cost more CPU than the streams' parsing.
* A client honours the environment's proxies (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``,
  ``NO_PROXY``) as httpx's default client does, read when it is made: httpx reads none for a
  client given a transport, so they are mounted here, each proxy with sharded pools of its own
  (:func:`environment_proxies`, ADR 0105).
* A client belongs to the event loop that made it (its connections do). A process runs one loop
  (the daemon's, the CLI command's, the MCP server's), so this is one client per endpoint per
  process; another loop (a second ``asyncio.run``) gets its own.
* Clients are closed when the last *lease* on their loop ends. Long-lived owners hold one for their
  lifetime (the daemon's lifespan, a CLI command, the MCP server, ``async with Runtime(...)``);
  each request and each run execution holds one while it lasts, so a client is never closed under
  a request, and clients used without a long-lived owner never outlive the work that used them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.util
import os
import ssl
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpcore
import httpx

from thoughtgate.errors import ProviderConnectionError
from thoughtgate.providers.h11_body import BODY_READS, body_reads
from thoughtgate.providers.netio import AsyncioBackend

__all__ = [
    "SHARD_SIZE",
    "ProviderClients",
    "ShardedTransport",
    "build_tls_context",
    "endpoint_of",
    "environment_proxies",
    "shared_clients",
]

SHARD_SIZE = 4
"""Requests in flight per connection pool before the next pool takes new ones (see
:class:`ShardedTransport`); a pool keeps as many idle keep-alive connections. Four, not sixteen:
httpcore's walk of a pool's connections on every request and response close is a method call or
five per connection, and at 100 concurrent streams pools of four took a fifth less CPU per
delta than pools of sixteen (ADR 0027); two were no cheaper than four."""
KEEPALIVE_EXPIRY_S = 5.0


@functools.lru_cache(maxsize=256)
def endpoint_of(base_url: str) -> str:
    """``scheme://host:port`` of a base URL: what one client (and its connection pool) serves.

    Cached: every request asks it (:meth:`ProviderClients.client`), and parsing the URL again
    each time cost about 1.5 % of an adapter run's CPU."""
    url = httpx.URL(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.scheme}://{url.host}:{port}"


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The process's one TLS context (httpx's defaults: certifi, or ``SSL_CERT_FILE``/``_DIR``)."""
    return httpx.create_ssl_context()


def build_tls_context() -> None:
    """Build the process's TLS context now (about 50 ms of CPU, ``load_verify_locations``), and
    the one for an ``https://`` proxy the environment names (25-40 ms): a daemon does it before
    it serves, not on the event loop its first provider request shares with every run under
    way."""
    _tls_context()
    if any(_https_proxy(url) for url in _environment_proxy_urls().values()):
        _proxy_context()


def _https_proxy(url: str | None) -> bool:
    """Whether ``url`` is an ``https://`` proxy httpx can read."""
    if url is None:
        return False
    try:
        return httpx.URL(url).scheme == "https"
    except httpx.InvalidURL:
        return False


def environment_proxies() -> dict[str, httpx.Proxy | None]:
    """The proxies httpx's default client takes from the environment, by httpx URL pattern; a
    pattern mapped to ``None`` (from ``NO_PROXY``) goes direct.

    Why: httpx reads ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY`` only for a
    client built without a ``transport``, and the shared clients are built with their own
    (:class:`ShardedTransport`). The patterns come from httpx's own helper, the one its default
    client reads the environment with (private: ``tests/providers/test_provider_requests.py``
    fails if httpx renames it or its client stops using it as is), so the variables, their case,
    the ``NO_PROXY`` rules and which pattern wins stay exactly httpx's."""
    found = _environment_proxy_urls()
    return {key: None if url is None else httpx.Proxy(url) for key, url in found.items()}


def _environment_proxy_urls() -> dict[str, str | None]:
    """The proxy URLs by pattern, as httpx's helper reads them (see :func:`environment_proxies`),
    not yet checked: httpx refuses a scheme it does not know only when it makes the proxy."""
    helper: Any = importlib.import_module("httpx._utils").get_environment_proxies
    found: dict[str, str | None] = helper()
    return found


_PROXY_SCHEMES = ("http", "https", "socks5", "socks5h")
"""The proxy URL schemes httpx carries a request through (``httpx.Proxy`` refuses others)."""
_SOCKS_SCHEMES = ("socks5", "socks5h")
_PROXY_VARIABLES = {"http://": "HTTP_PROXY", "https://": "HTTPS_PROXY", "all://": "ALL_PROXY"}


def _socks_installed() -> bool:
    """Whether httpx can build a SOCKS proxy transport (it needs ``socksio``)."""
    return importlib.util.find_spec("socksio") is not None


class _UnusableProxy(httpx.AsyncBaseTransport):
    """Mounted for a proxy that httpx cannot use: a request that would go through it fails at
    once, not retried, with ``message`` (which says why and what to do).

    Why: httpx fails such a proxy with a library error (an ``ImportError`` for SOCKS without
    ``socksio``, a ``ValueError`` for a scheme it does not know, ``httpx.InvalidURL`` for a URL
    it cannot parse) when its transport or the client is built, which escaped as a crash of the
    run. Mounted per pattern, so a request that the proxy does not carry (``NO_PROXY``, or a
    scheme with a proxy of its own) goes as before: failing the client would stop a local model
    behind ``NO_PROXY`` because of a proxy it never uses (ADRs 0106, 0107, 0111)."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        self.message = message
        self.detail = detail

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise ProviderConnectionError(self.message, retryable=False, detail=self.detail)


def _unusable_proxy(pattern: str, url: str) -> _UnusableProxy | None:
    """An :class:`_UnusableProxy` for ``url`` if httpx cannot use it here (it cannot parse it,
    or its scheme), else ``None``. The URL is shown as ``httpx.Proxy`` keeps it: without a user
    or password."""
    variable = _PROXY_VARIABLES.get(pattern, "the environment")
    try:
        shown = httpx.URL(url).copy_with(username=None, password=None)
    except httpx.InvalidURL as exc:
        # Not shown: a user and password cannot be told from the rest of a URL that does not
        # parse. httpx's reason (``Invalid port: 'abc'``) names a part of the URL, never its
        # user or password; it goes to the developer-only detail.
        return _UnusableProxy(
            f"the proxy in {variable} is not a URL httpx can read: check its host and port",
            detail=f"InvalidURL: {exc}",
        )
    if shown.scheme not in _PROXY_SCHEMES:
        return _UnusableProxy(
            f"the proxy {shown} (from {variable}) has a scheme httpx cannot use: "
            f"use one of {', '.join(_PROXY_SCHEMES)}"
        )
    if shown.scheme in _SOCKS_SCHEMES and not _socks_installed():
        return _UnusableProxy(
            f"the SOCKS proxy {shown} (from {variable}) needs the socksio package: "
            "install thoughtgate[socks]"
        )
    return None


def _unreadable_no_proxy(exc: httpx.InvalidURL) -> _UnusableProxy:
    """What every request of a client fails with when httpx cannot read a ``NO_PROXY`` entry
    (``host:abc``, ``[::1``) as a URL pattern: it refuses the client, and which hosts go direct
    is unknown, so none is sent (fail closed) rather than a crash of the run."""
    return _UnusableProxy(
        "NO_PROXY holds an entry httpx cannot read (check its hosts and ports): "
        "no provider request is sent until it is fixed",
        detail=f"InvalidURL: {exc}",
    )


@functools.lru_cache(maxsize=8)
def _proxy_tls_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """The TLS context ``https://`` proxies are verified with, built once per process (for each
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, which OpenSSL reads when it is built).

    Why: given no context, httpcore builds its default (``httpcore.default_ssl_context()``) for
    every new connection to an ``https://`` proxy, about 25-40 ms of CPU each (loading the
    roots); that same context, built once, keeps the trust exactly: the system's roots (or the
    two variables) and certifi's, with verification and host name checks on. Not the process's
    one context (``_tls_context``): httpx's defaults there trust certifi alone, or the variables
    alone, so a proxy trusted through the system's roots would be refused (ADR 0107). Once per
    process, not per client, and built by :func:`build_tls_context` before a daemon serves: a
    client is made at its endpoint's first request, on the event loop every run shares, and each
    endpoint's client paid the build there (ADR 0111)."""
    return httpcore.default_ssl_context()


def _proxy_context() -> ssl.SSLContext:
    return _proxy_tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


class _LeanCookies(httpx.Cookies):
    """A client's cookie jar that skips a response without cookies at once.

    Why: httpx's client hands every response to its jar, which first builds ``urllib`` views of
    the request and the response (parsing the URL again) only to find no ``Set-Cookie`` header;
    that was about 3 % of an adapter run's CPU. A response that sets cookies (``Set-Cookie``,
    ``Set-Cookie2``, the only headers the jar reads) goes to the jar exactly as before."""

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


def _lean_cookies(client: httpx.AsyncClient) -> None:
    """Give ``client`` a :class:`_LeanCookies` jar (private attribute: left as is if httpx has
    moved it; the jar is empty when the client is new)."""
    if type(getattr(client, "_cookies", None)) is httpx.Cookies:
        client._cookies = _LeanCookies()


def _fast_lock_class() -> Any:
    """httpcore's connection lock, on an anyio lock that does not yield to the event loop when
    it is free; ``None`` when httpcore or anyio lack what this needs (the locks are then left
    as they are: slower, not wrong)."""
    try:
        base: Any = importlib.import_module("httpcore._synchronization").AsyncLock
        anyio.Lock(fast_acquire=True)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - other versions
        return None

    class FastLock(base):  # type: ignore[misc]
        def setup(self) -> None:
            super().setup()
            if getattr(self, "_backend", None) == "asyncio":
                self._anyio_lock = anyio.Lock(fast_acquire=True)

    return FastLock


_FastLock: Any = _fast_lock_class()


def _lean_locks(stream: Any) -> None:
    """Give the connection that answered a :data:`_FastLock` for each of its two locks (once).

    Why: httpcore takes a connection's request lock and its state lock on every request and the
    state lock again when the response closes; anyio's lock yields to the event loop each time
    even when free (a pass of the loop and a resume of the whole awaiting stack, three times a
    request), and that showed as one of the busiest lines of an adapter's run. Free, a fast
    lock is taken at once; taken, it waits as before; a cancelled task still stops at it. At
    this point neither lock is held (the response head has been read) and, the connection
    being HTTP/1.1, no other request waits on it. Any other shape of stream is left alone.
    """
    if _FastLock is None:
        return
    try:
        outer = stream._httpcore_stream._pool_request.connection  # httpcore.AsyncHTTPConnection
        inner = outer._connection  # httpcore.AsyncHTTP11Connection
        if not isinstance(inner, httpcore.AsyncHTTP11Connection):
            return
        if type(outer._request_lock) is not _FastLock:
            outer._request_lock = _FastLock()
        if type(inner._state_lock) is not _FastLock:
            inner._state_lock = _FastLock()
    except AttributeError:  # another httpx or httpcore: nothing changed
        return


class _LeanPool(httpcore.AsyncConnectionPool):
    """httpcore's pool, without a cancel shield around closing no connection.

    Why: the pool closes the connections it dropped after every request and every response
    close, inside an anyio cancel shield (a cancel scope entered and left, the async library
    looked up), and almost always there are none to close. With some, it is httpcore's own
    code, shield and all."""

    async def _close_connections(self, closing: list[Any]) -> None:
        if closing:
            await super()._close_connections(closing)


class _Shard:
    __slots__ = ("active", "transport")

    def __init__(self, transport: httpx.AsyncHTTPTransport) -> None:
        self.transport = transport
        self.active = 0


class _ReleasingStream(httpx.AsyncByteStream):
    """A response body that gives its shard's slot back when the response is closed."""

    def __init__(self, inner: httpx.AsyncByteStream, shard: _Shard) -> None:
        self._inner = inner
        self._shard: _Shard | None = shard

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._inner.__aiter__()  # no generator layer of our own on the per-read path

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._shard is not None:
                self._shard.active -= 1
                self._shard = None


class ShardedTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, several times over: a new request goes to the first pool with fewer
    than ``shard_size`` requests in flight, and a new pool is made when all are that busy.

    Why: httpcore 1.0's pool re-examines every connection it holds on each request and each
    response close (idle ones with a socket poll), and part of it compares every idle connection
    with all others, so its cost per request grows with the connections held. A provider endpoint
    holds one connection per concurrent stream: at 100 streams that walk was a fifth of the
    daemon's CPU. Pools of a few connections keep it small; the first pools stay the busiest, so
    sequential runs keep reusing the same warm connections. Requests are never queued here: a pool
    has no connection limit, and a stream holds its connection as long as it needs. With a
    ``proxy``, every pool connects through it (httpx's proxy transport; ADR 0105).
    """

    def __init__(
        self,
        *,
        verify: ssl.SSLContext,
        shard_size: int = SHARD_SIZE,
        proxy: httpx.Proxy | None = None,
    ) -> None:
        self._verify = verify
        self._size = shard_size
        self._proxy = proxy
        self._shards: list[_Shard] = []

    @property
    def pools(self) -> int:
        return len(self._shards)

    def _shard(self) -> _Shard:
        for shard in self._shards:
            if shard.active < self._size:
                return shard
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=self._size,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        transport = httpx.AsyncHTTPTransport(verify=self._verify, limits=limits, proxy=self._proxy)
        # sockets on the running loop directly, not through sniffio and anyio (see netio)
        pool = transport._pool
        assert isinstance(pool, httpcore.AsyncConnectionPool)
        pool._network_backend = AsyncioBackend()
        if type(pool) is httpcore.AsyncConnectionPool:  # the same pool, one method leaner
            pool.__class__ = _LeanPool
        shard = _Shard(transport)
        self._shards.append(shard)
        return shard

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        shard = self._shard()
        shard.active += 1
        try:
            response = await shard.transport.handle_async_request(request)
        except BaseException:
            shard.active -= 1
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        _lean_locks(response.stream)
        extensions = response.extensions
        reads = body_reads(response.stream, request)
        if reads is not None:  # the body may be read per network read (h11_body, ADR 0024)
            extensions = {**extensions, BODY_READS: reads}
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_ReleasingStream(response.stream, shard),
            extensions=extensions,
        )

    async def aclose(self) -> None:
        shards, self._shards = self._shards, []
        for shard in shards:
            await shard.transport.aclose()


@dataclass(slots=True)
class _LoopClients:
    clients: dict[str, httpx.AsyncClient] = field(default_factory=dict)
    transports: dict[str, ShardedTransport] = field(default_factory=dict)
    leases: int = 0


class ProviderClients:
    """The clients of one process, by event loop and endpoint; see the module docstring."""

    def __init__(self, *, shard_size: int = SHARD_SIZE) -> None:
        self.shard_size = shard_size
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClients] = (
            weakref.WeakKeyDictionary()
        )
        self.created = 0
        """Clients made so far (all loops): tests and benchmarks read it."""

    def _here(self) -> _LoopClients:
        loop = asyncio.get_running_loop()
        here = self._loops.get(loop)
        if here is None:
            here = self._loops[loop] = _LoopClients()
        return here

    def client(self, base_url: str) -> httpx.AsyncClient:
        """The shared client for ``base_url``'s endpoint on the running loop, made on first use."""
        here = self._here()
        key = endpoint_of(base_url)
        client = here.clients.get(key)
        if client is None or client.is_closed:
            # No timeout, headers or base URL here: those are the run's, sent per request.
            transport = ShardedTransport(verify=_tls_context(), shard_size=self.shard_size)
            try:
                client = httpx.AsyncClient(
                    verify=_tls_context(), transport=transport, mounts=self._proxy_mounts()
                )
            except httpx.InvalidURL as exc:  # a NO_PROXY entry httpx cannot read as a pattern
                client = httpx.AsyncClient(
                    verify=_tls_context(), transport=_unreadable_no_proxy(exc)
                )
            _lean_cookies(client)
            here.clients[key] = client
            here.transports[key] = transport
            self.created += 1
        return client

    def _proxy_mounts(self) -> dict[str, httpx.AsyncBaseTransport | None] | None:
        """The environment's proxies as httpx mounts (``None``: none set). A proxied pattern gets
        sharded pools of its own through the proxy; a ``NO_PROXY`` pattern maps to ``None``,
        which httpx sends through the client's own transport. httpx orders the patterns, most
        specific first, as for its default client. Read when a client is made, as httpx reads
        them; the transports make no connection until a request needs one."""
        proxies = _environment_proxy_urls()
        if not proxies:
            return None
        return {pattern: self._proxy_mount(pattern, url) for pattern, url in proxies.items()}

    def _proxy_mount(self, pattern: str, url: str | None) -> httpx.AsyncBaseTransport | None:
        if url is None:
            return None
        unusable = _unusable_proxy(pattern, url)
        if unusable is not None:
            return unusable
        tls = _proxy_context() if _https_proxy(url) else None
        proxy = httpx.Proxy(url, ssl_context=tls)
        return ShardedTransport(verify=_tls_context(), shard_size=self.shard_size, proxy=proxy)

    def pools(self, base_url: str) -> int:
        """Connection pools of ``base_url``'s client on the running loop (0 without a client)."""
        transport = self._here().transports.get(endpoint_of(base_url))
        return 0 if transport is None else transport.pools

    def endpoints(self) -> list[str]:
        """Endpoints with an open client on the running loop."""
        return sorted(k for k, c in self._here().clients.items() if not c.is_closed)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[None]:
        """Keep this loop's clients open while the block runs; the last lease out closes them."""
        here = self._here()
        here.leases += 1
        try:
            yield
        finally:
            here.leases -= 1
            if here.leases == 0:
                await self._close(here)

    @staticmethod
    async def _close(here: _LoopClients) -> None:
        clients = list(here.clients.values())
        here.clients.clear()  # a request from now on gets a new client, never a closing one
        here.transports.clear()
        for client in clients:
            with contextlib.suppress(Exception):  # closing must not mask what ended the owner
                await client.aclose()


_SHARED = ProviderClients()


def shared_clients() -> ProviderClients:
    """The process's clients, used by every adapter that is not handed a client of its own."""
    return _SHARED

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
import ssl
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

__all__ = ["CONNECTION_LIMITS", "ProviderClients", "endpoint_of", "shared_clients"]

CONNECTION_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
"""As the official SDKs set them: every concurrent stream holds a connection for minutes, so the
pool must not queue runs behind each other (httpx's default caps an endpoint at 100)."""


def endpoint_of(base_url: str) -> str:
    """``scheme://host:port`` of a base URL: what one client (and its connection pool) serves."""
    url = httpx.URL(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.scheme}://{url.host}:{port}"


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The process's one TLS context (httpx's defaults: certifi, or ``SSL_CERT_FILE``/``_DIR``)."""
    return httpx.create_ssl_context()


@dataclass(slots=True)
class _LoopClients:
    clients: dict[str, httpx.AsyncClient] = field(default_factory=dict)
    leases: int = 0


class ProviderClients:
    """The clients of one process, by event loop and endpoint; see the module docstring."""

    def __init__(self, *, limits: httpx.Limits = CONNECTION_LIMITS) -> None:
        self.limits = limits
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
            client = httpx.AsyncClient(verify=_tls_context(), limits=self.limits)
            here.clients[key] = client
            self.created += 1
        return client

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

    async def aclose(self) -> None:
        """Close the running loop's clients now (the next request makes a new one)."""
        await self._close(self._here())

    @staticmethod
    async def _close(here: _LoopClients) -> None:
        clients = list(here.clients.values())
        here.clients.clear()  # a request from now on gets a new client, never a closing one
        for client in clients:
            with contextlib.suppress(Exception):  # closing must not mask what ended the owner
                await client.aclose()


_SHARED = ProviderClients()


def shared_clients() -> ProviderClients:
    """The process's clients, used by every adapter that is not handed a client of its own."""
    return _SHARED

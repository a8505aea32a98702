"""Loopback asyncio servers for tests that end their connections when they close.

``asyncio.Server.close()`` stops accepting, but (before Python 3.13) neither closes the
connections already accepted nor waits for their handlers. A handler still waiting on an idle
keep-alive connection or a stalled reply is then destroyed pending when the test's loop ends, its
socket unclosed: an unraisable ``ResourceWarning``, which fails the suite (CI did, once).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["Handler", "serving"]

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(
    handle: Handler, *, tls: ssl.SSLContext | None = None
) -> AsyncIterator[asyncio.Server]:
    """``asyncio.start_server(handle)`` on 127.0.0.1 and a free port; on exit every connection's
    handler is cancelled and awaited, and its socket closed, before the server's own close."""
    handlers: set[asyncio.Task[None]] = set()

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)  # type: ignore[arg-type]
        try:
            await handle(reader, writer)
        finally:
            writer.transport.abort()
            handlers.discard(task)  # type: ignore[arg-type]

    server = await asyncio.start_server(tracked, "127.0.0.1", 0, ssl=tls)
    try:
        yield server
    finally:
        server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 10)  # a bound only a hang reaches

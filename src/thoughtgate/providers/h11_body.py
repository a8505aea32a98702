"""A streamed HTTP/1.1 response body read straight from its connection's h11 parser, one batch
of bytes per network read.

Why: providers send each SSE event as its own HTTP chunk. Read through httpx, every chunk is one
h11 ``Data`` event carried up four async generators (httpcore's connection, its body stream and
pool stream, httpx's response stream and ``aiter_raw``), each with its own trace and exception
mapping; and when several chunks wait in the socket buffer (a busy daemon, or a fast provider),
they still go up one by one, each to the SSE decoder and the adapter on a wake-up of its own.
Here the body is read by the same h11 parser and the same network stream httpcore would use, but
every ``Data`` event the parser can give from what one read brought is joined into one piece:
one trip up per network read, the same bytes in the same order (ADR 0024).

Nothing of HTTP is parsed here: h11 reads the framing (chunked, ``Content-Length`` or until
close), trailers and the end of the message exactly as through httpx, and raises on malformed
framing or a body cut short. Its errors and the network stream's become the httpx exceptions
httpx itself would raise (``httpx.RemoteProtocolError``, ``ReadTimeout``, ``ReadError``), so
:mod:`thoughtgate.providers.http` maps them as before. At the end of the message h11 is done
with the response, so closing it returns the connection to its pool for keep-alive as usual;
a body not read to its end closes the connection, as httpcore does.

The reader is reached through private attributes of httpx's and httpcore's body streams (the
versions this project installs, checked by ``tests/providers/test_h11_body.py``); a response of
another shape (another transport, an HTTP/2 connection, a test's canned answer) has no reader and
is read through httpx.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import h11
import httpcore
import httpx
from httpcore._async.connection_pool import PoolByteStream
from httpcore._async.http11 import HTTP11ConnectionByteStream
from httpx._transports.default import AsyncResponseStream

__all__ = ["BODY_READS", "BodyReads", "body_reads"]

BODY_READS = "thoughtgate.body_reads"
"""The key of a response's ``extensions`` holding its :data:`BodyReads`, when it has one."""

BodyReads = Callable[[], AsyncIterator[bytes]]
"""Starts reading a response body: the bytes of each network read, joined (never ``b""``)."""

_READ_BYTES = 64 * 1024
"""Bytes asked of the network per read, as httpcore asks."""

_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.NetworkError, httpx.NetworkError),
)
"""httpcore's exception -> httpx's, as ``httpx._transports.default`` maps them (first match)."""


def body_reads(stream: Any, request: httpx.Request) -> BodyReads | None:
    """The reader of a response body that httpx's default transport streams from an HTTP/1.1
    connection, or ``None`` for any other body."""
    if type(stream) is not AsyncResponseStream:
        return None
    pool_stream = stream._httpcore_stream
    if type(pool_stream) is not PoolByteStream:
        return None
    connection_stream = pool_stream._stream
    if type(connection_stream) is not HTTP11ConnectionByteStream:
        return None
    connection = connection_stream._connection
    if not isinstance(connection, httpcore.AsyncHTTP11Connection):
        return None
    timeout = request.extensions.get("timeout", {}).get("read")
    return functools.partial(_reads, connection, timeout)


def _transport_error(exc: Exception) -> httpx.TransportError:
    for source, target in _ERRORS:
        if isinstance(exc, source):
            return target(str(exc))
    return httpx.TransportError(str(exc))


async def _reads(
    connection: httpcore.AsyncHTTP11Connection, timeout: float | None
) -> AsyncIterator[bytes]:
    state: h11.Connection = connection._h11_state
    network = connection._network_stream
    next_event = state.next_event
    pieces: list[bytes] = []
    while True:
        try:
            event = next_event()
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc)) from exc
        if type(event) is h11.Data:
            pieces.append(event.data)
            continue
        if pieces:
            yield b"".join(pieces)  # h11 hands out bytearrays: this makes the bytes anyway
            pieces = []
        if event is not h11.NEED_DATA:
            return  # EndOfMessage (trailers read and checked by h11), or PAUSED after it
        try:
            data = await network.read(_READ_BYTES, timeout=timeout)
        except (httpcore.TimeoutException, httpcore.NetworkError) as exc:
            raise _transport_error(exc) from exc
        state.receive_data(data)

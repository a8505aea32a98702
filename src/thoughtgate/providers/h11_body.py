"""A streamed HTTP/1.1 response body read past httpx, one piece of bytes per network read.

Why: providers send each SSE event as its own HTTP chunk. Read through httpx, every chunk is one
h11 ``Data`` event (a regular-expression match of its size line, an event object, a state-machine
step) carried up four async generators (httpcore's connection, its body and pool streams, httpx's
response stream and ``aiter_raw``), each with its own trace and exception mapping; and chunks that
wait in the socket buffer together (a busy daemon, a fast provider) still go up one at a time, each
to the SSE decoder and the adapter on its own. That was most of the CPU an adapter spent per
delta (ADR 0024 has the figures).

Here, once httpx and h11 have read the response head: a chunked body's chunks are read straight
from the connection's network stream, with h11's own grammar for the size line, and everything
one read brought goes up as one piece; the last chunk (``0``), the trailers and the end of the
message are handed back to h11, which reads and checks them as if it had read the chunks itself,
so the connection is then reusable as usual. Any other body (``Content-Length``, until close, or
a chunk already part-read) is read by h11, its ``Data`` events of one read joined. The framing is
as strict as h11's: a malformed size line or chunk end, an over-long line, a connection that ends
before the last chunk are errors, after the bytes that came before them; the errors are the httpx
exceptions httpx itself raises (``RemoteProtocolError``, ``ReadTimeout``, ``ReadError``), so
:mod:`thoughtgate.providers.http` maps them as before. A body not read to its end closes the
connection, as httpcore does.

The reader is reached through private attributes of httpx, httpcore and h11 (the versions this
project installs, checked by ``tests/providers/test_h11_body.py``, which also compares it byte for
byte and verdict for verdict with httpx's reader); a response of another shape (another transport,
HTTP/2, a test's canned answer) has no reader and is read through httpx, and an h11 without the
pieces used here reads every body itself.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import h11
import h11._readers
import httpcore
import httpx


def _private(module: str, name: str) -> Any:
    """A private class looked up softly: a release that moves it leaves every body to httpx
    (slower, not wrong) instead of failing the import of every provider."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:  # pragma: no cover - depends on the installed httpx/httpcore
        return None


PoolByteStream: Any = _private("httpcore._async.connection_pool", "PoolByteStream")
HTTP11ConnectionByteStream: Any = _private("httpcore._async.http11", "HTTP11ConnectionByteStream")
AsyncResponseStream: Any = _private("httpx._transports.default", "AsyncResponseStream")

__all__ = ["BODY_READS", "BodyReads", "body_reads"]

BODY_READS = "thoughtgate.body_reads"
"""The key of a response's ``extensions`` holding its :data:`BodyReads`, when it has one."""

BodyReads = Callable[[], AsyncIterator[bytes]]
"""Starts reading a response body: the bytes of each network read, joined (never ``b""``)."""

_READ_BYTES = 64 * 1024
"""Bytes asked of the network per read, as httpcore asks."""

_MAX_LINE = 16 * 1024
"""The longest unfinished chunk line held before the body is refused (h11's own limit)."""

_CHUNKED_READER: Any = getattr(h11._readers, "ChunkedReader", None)
_CHUNK_LINE: re.Pattern[bytes] | None = getattr(h11._readers, "chunk_header_re", None)
CHUNK_FRAMING_HERE = _CHUNKED_READER is not None and _CHUNK_LINE is not None
"""Whether the installed h11 lets chunk framing be read here (else h11 reads all of it)."""

_HEX = re.compile(rb"[0-9A-Fa-f]{1,20}")
"""A chunk line that is a size and nothing else (h11's ``chunk-size``)."""

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


def _reads(
    connection: httpcore.AsyncHTTP11Connection, timeout: float | None
) -> AsyncIterator[bytes]:
    state: h11.Connection = connection._h11_state
    network = connection._network_stream
    buffered = _chunked_start(state)
    if buffered is not None:
        return _chunked(state, buffered, network, timeout)
    return _h11_reads(state, network, timeout)


def _chunked_start(state: h11.Connection) -> bytearray | None:
    """The bytes h11 holds past the response head, taken from it, when the body is chunked and
    none of it was read yet; ``None`` otherwise (h11 then reads the whole body)."""
    if not CHUNK_FRAMING_HERE:
        return None
    try:
        reader: Any = state._reader
        if (
            type(reader) is not _CHUNKED_READER
            or reader._bytes_in_chunk
            or reader._bytes_to_discard
            or reader._reading_trailer
        ):
            return None
        received = state._receive_buffer
        return bytearray(received.maybe_extract_at_most(len(received)) or b"")
    except AttributeError:  # another h11
        return None


async def _read(network: httpcore.AsyncNetworkStream, timeout: float | None) -> bytes:
    try:
        return await network.read(_READ_BYTES, timeout=timeout)
    except (httpcore.TimeoutException, httpcore.NetworkError) as exc:
        raise _transport_error(exc) from exc


async def _h11_reads(
    state: h11.Connection, network: httpcore.AsyncNetworkStream, timeout: float | None
) -> AsyncIterator[bytes]:
    """The body as h11 reads it, the ``Data`` events of each network read joined."""
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
        state.receive_data(await _read(network, timeout))


async def _chunked(
    state: h11.Connection,
    buf: bytearray,
    network: httpcore.AsyncNetworkStream,
    timeout: float | None,
) -> AsyncIterator[bytes]:
    """The data of a chunked body up to its last chunk; then h11 has the rest (the ``0`` line,
    trailers and end), as if it had read the chunks itself.

    Each chunk line is checked with h11's own grammar (``chunk_header_re``), the CRLF after each
    chunk's data must be exactly that, a line that does not end is refused past h11's limit, and a
    connection that ends before the last chunk is an error: the framing is as strict as h11's.
    """
    pos = 0
    remaining = 0  # bytes of the current chunk's data still to come
    crlf = False  # the CRLF that ends a chunk's data is still to come
    pieces: list[bytearray] = []
    while True:
        error, last = _frames(buf, pos, remaining, crlf, pieces)
        pos, remaining, crlf = last
        if pieces:  # what arrived before a framing error is delivered before the error
            yield b"".join(pieces)
            pieces = []
        if error is not None:
            raise error
        if remaining < 0:  # the last chunk: h11 reads it, the trailers and the end
            state.receive_data(bytes(buf[pos:]))
            async for piece in _h11_reads(state, network, timeout):
                yield piece  # none: h11 has nothing left to give but the end
            return
        del buf[:pos]
        pos = 0
        try:  # _read, inline: a coroutine less per network read
            data = await network.read(_READ_BYTES, timeout=timeout)
        except (httpcore.TimeoutException, httpcore.NetworkError) as exc:
            raise _transport_error(exc) from exc
        if not data:
            raise _malformed(
                "peer closed connection without sending complete message body "
                "(incomplete chunked read)"
            )
        buf += data


def _frames(
    buf: bytearray, pos: int, remaining: int, crlf: bool, pieces: list[bytearray]
) -> tuple[httpx.RemoteProtocolError | None, tuple[int, int, bool]]:
    """Reads the chunks ``buf`` holds from ``pos`` into ``pieces``; returns a framing error (or
    ``None``) and where it stopped: ``(pos, remaining, crlf)``, ``remaining`` -1 at the last
    chunk's line (``pos`` is where it starts)."""
    size = len(buf)
    while True:
        if remaining:
            end = min(size, pos + remaining)
            if end > pos:
                pieces.append(buf[pos:end])
                remaining -= end - pos
                pos = end
            if remaining:
                return None, (pos, remaining, crlf)
            crlf = True
        if crlf:
            if not buf.startswith(b"\r\n", pos):
                footer = bytes(buf[pos : pos + 2])
                if footer in (b"", b"\r"):
                    return None, (pos, 0, crlf)
                return _malformed(f"malformed chunk footer: {footer!r}"), (pos, 0, crlf)
            pos += 2
            crlf = False
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            if size - pos > _MAX_LINE:
                return _malformed("chunk line too long"), (pos, 0, crlf)
            return None, (pos, 0, crlf)
        if _HEX.fullmatch(buf, pos, eol):  # the usual line: the size alone
            length = int(buf[pos:eol], 16)
        else:  # extensions, trailing blanks, or not a chunk line: h11's grammar decides
            line = bytes(buf[pos : eol + 2])
            assert _CHUNK_LINE is not None  # CHUNK_FRAMING_HERE
            match = _CHUNK_LINE.fullmatch(line)
            if match is None:
                return _malformed(f"illegal chunk header: {line!r}"), (pos, 0, crlf)
            length = int(match["chunk_size"], 16)
        if length == 0:
            return None, (pos, -1, False)
        start = eol + 2
        end = start + length
        if buf.startswith(b"\r\n", end):  # the whole chunk is here: the usual case
            pieces.append(buf[start:end])
            pos = end + 2
            continue
        pos = start
        remaining = length


def _malformed(message: str) -> httpx.RemoteProtocolError:
    return httpx.RemoteProtocolError(message)

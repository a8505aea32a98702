"""Anthropic test helpers: transcripts, a loopback replay server, and a read-to-the-end check.

A transcript is served byte for byte, in whatever chunking the test asks for, either by a real
HTTP/1.1 server on 127.0.0.1 (chunked transfer encoding, one HTTP chunk per planned piece) or by an
``httpx.MockTransport`` with a byte stream. :class:`CountingTransport` wraps either one and records
how many body bytes the consumer actually pulled, so a test can fail when part of a transcript was
left unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings

FIXTURES = Path(__file__).parent / "fixtures" / "anthropic"
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "request-id": "req_replay_1"}


def transcript(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def split_at(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


def split_events(data: bytes) -> list[bytes]:
    """One SSE event per piece (the separator stays with the event before it)."""
    sep = b"\r\n\r\n" if b"\r\n\r\n" in data else b"\n\n"
    pieces = data.split(sep)
    out = [p + sep for p in pieces[:-1]]
    if pieces[-1]:
        out.append(pieces[-1])
    return out


# --------------------------------------------------------------------------- read accounting


class _CountingStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, tally: ReadTally) -> None:
        self._inner = inner
        self._tally = tally

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._tally.bytes_read += len(chunk)
            yield chunk
        self._tally.reached_eof = True

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class ReadTally:
    bytes_read: int = 0
    reached_eof: bool = False

    def assert_fully_read(self, expected: bytes) -> None:
        assert self.bytes_read == len(expected), (
            f"consumer read {self.bytes_read} of {len(expected)} transcript bytes"
        )
        assert self.reached_eof, "consumer stopped before the end of the response body"


class CountingTransport(httpx.AsyncBaseTransport):
    """Wraps a transport; ``tallies`` holds one :class:`ReadTally` per response."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.tallies: list[ReadTally] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        tally = ReadTally()
        self.tallies.append(tally)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _CountingStream(response.stream, tally)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


# --------------------------------------------------------------------------- in-memory replay


class _PiecesStream(httpx.AsyncByteStream):
    def __init__(self, pieces: Sequence[bytes], error: Exception | None) -> None:
        self._pieces = pieces
        self._error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece
        if self._error is not None:
            raise self._error


def mock_transport(
    pieces: Sequence[bytes],
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
    error: Exception | None = None,
    requests: list[Any] | None = None,
) -> CountingTransport:
    """A MockTransport answering every request with ``pieces`` (then ``error``, if given)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if requests is not None:
            requests.append(json.loads(request.content))
        return httpx.Response(
            status, headers=headers or SSE_HEADERS, stream=_PiecesStream(pieces, error)
        )

    return CountingTransport(httpx.MockTransport(handler))


def provider_with(
    transport: httpx.AsyncBaseTransport,
    model: str = "claude-sonnet-4-5",
    *,
    base_url: str = "http://replay.invalid",
    timeout: float = 5.0,
    max_retries: int = 0,
) -> AnthropicProvider:
    settings = ProviderSettings(
        base_url=base_url,
        api_key="test-key",
        timeout_s=timeout,
        connect_timeout_s=timeout,
        max_retries=max_retries,
    )
    client = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(timeout))
    return AnthropicProvider(model, settings, client=client)


# --------------------------------------------------------------------------- loopback server


@dataclass
class Reply:
    """One scripted HTTP answer: status, headers and the body pieces (one HTTP chunk each)."""

    pieces: Sequence[bytes]
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: dict(SSE_HEADERS))
    stall: bool = False  # send headers and pieces, then never finish


@dataclass
class ReplayServer:
    """A real HTTP/1.1 server on 127.0.0.1 that answers request ``n`` with ``replies[n]``.

    The last reply repeats. ``bodies`` records each request's JSON body.
    """

    replies: Sequence[Reply]
    bodies: list[Any] = field(default_factory=list)
    port: int = 0
    _server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ReplayServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                self.bodies.append(json.loads(body) if body else None)
                reply = self.replies[min(len(self.bodies) - 1, len(self.replies) - 1)]
                await self._answer(writer, reply)
                if reply.stall:
                    await asyncio.sleep(3600)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, reply: Reply) -> None:
        lines = [f"HTTP/1.1 {reply.status} X"]
        lines += [f"{k}: {v}" for k, v in reply.headers.items()]
        lines.append("transfer-encoding: chunked")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        for piece in reply.pieces:
            if piece:
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
                await asyncio.sleep(0)
        if not reply.stall:
            writer.write(b"0\r\n\r\n")
            await writer.drain()


def loopback_provider(
    server: ReplayServer, model: str = "claude-sonnet-4-5", **kw: Any
) -> tuple[AnthropicProvider, CountingTransport]:
    transport = CountingTransport(httpx.AsyncHTTPTransport())
    return provider_with(transport, model, base_url=server.url, **kw), transport


@contextlib.contextmanager
def blackhole_port() -> Iterator[int]:
    """A port whose listen backlog is full: connecting to it hangs until the connect timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()

"""The tests' one replay kit: wire transcripts served to the real adapters, every byte accounted.

A transcript (``tests/fixtures/<format>/...``, written in the providers' real byte shapes) is
served to an adapter through the real httpx client, in whatever chunking a test asks for:

* in memory: :class:`Replay` answers each request with the next body (the last one repeats) from
  an ``httpx.MockTransport``; ``chunking`` is ``whole``, ``bytes`` or ``random``, or the test
  hands in its own pieces (:func:`mock_transport`);
* on loopback: :class:`ReplayServer` is a real HTTP/1.1 server on 127.0.0.1 answering with
  scripted :class:`Reply` objects, one HTTP chunk per piece (or stalling after them).

Each served body is read-accounted (:class:`ReadTally`): ``assert_fully_read`` fails a test whose
adapter left part of a transcript unread, or stopped before the end of the body. ``cut_after``
and ``error`` turn a body into a connection that drops mid-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from support.servers import serving
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, ToolSpec, TurnRequest
from thoughtgate.types import Message, ToolResultPart, Turn

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "request-id": "req_replay_1"}
CHUNKINGS = ("whole", "bytes", "random")


# --------------------------------------------------------------------------- transcripts


def fixture(relative: str) -> bytes:
    """``tests/fixtures/<relative>``, as bytes."""
    return (FIXTURES / relative).read_bytes()


def transcript(name: str) -> bytes:
    """An Anthropic transcript (``tests/fixtures/anthropic/<name>``)."""
    return fixture(f"anthropic/{name}")


def chunk_sizes(kind: str, total: int, seed: int = 7) -> list[int]:
    if kind == "whole":
        return [max(1, total)]
    if kind == "bytes":
        return [1] * total
    rng = random.Random(seed)
    sizes: list[int] = []
    while sum(sizes) < total:
        sizes.append(rng.randint(1, 97))
    return sizes


def chunked(data: bytes, kind: str, seed: int = 7) -> list[bytes]:
    """``data`` cut as chunking ``kind`` cuts it."""
    out: list[bytes] = []
    pos = 0
    for size in chunk_sizes(kind, len(data), seed):
        out.append(data[pos : pos + size])
        pos += size
    return out or [b""]


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


@dataclass
class ReadTally:
    """How much of one response body its consumer pulled."""

    size: int | None = None
    """The body's length, when it is known up front."""
    bytes_read: int = 0
    reached_eof: bool = False

    def assert_fully_read(self, expected: bytes | None = None, *, to_eof: bool = True) -> None:
        """Every byte was pulled; with ``to_eof`` the consumer also read on to the end of the
        body (an adapter that stops at ``[DONE]`` or ``response.completed`` fails this)."""
        size = len(expected) if expected is not None else self.size
        if size is not None:  # a live server's body is as long as its end says
            assert self.bytes_read == size, (
                f"transcript left unread: {self.bytes_read}/{size} bytes"
            )
        assert self.reached_eof or not to_eof, "the consumer stopped before the end of the body"


class _TalliedStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, tally: ReadTally) -> None:
        self._inner = inner
        self._tally = tally

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._tally.bytes_read += len(chunk)
            yield chunk
        self._tally.reached_eof = True

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


class CountingTransport(httpx.AsyncBaseTransport):
    """Wraps a transport (a mock or a real one); ``tallies`` holds one per response body and
    ``requests`` the JSON body of each request."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.tallies: list[ReadTally] = []
        self.requests: list[Any] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        content = await request.aread()
        self.requests.append(json.loads(content) if content else None)
        response = await self.inner.handle_async_request(request)
        tally = ReadTally(size=getattr(response.stream, "size", None))
        self.tallies.append(tally)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _TalliedStream(response.stream, tally)
        return response

    def assert_fully_read(self, *, to_eof: bool = True) -> None:
        assert self.tallies, "no request was made"
        for tally in self.tallies:
            tally.assert_fully_read(to_eof=to_eof)

    async def aclose(self) -> None:
        await self.inner.aclose()


# --------------------------------------------------------------------------- in-memory replay


class Pieces(httpx.AsyncByteStream):
    """A body served piece by piece; a connection that drops after ``cut_after`` bytes
    (``RemoteProtocolError``), or that raises ``error`` after the last piece."""

    def __init__(
        self,
        pieces: Sequence[bytes],
        *,
        cut_after: int | None = None,
        error: Exception | None = None,
    ) -> None:
        self.pieces = pieces
        self.size = sum(len(p) for p in pieces) if cut_after is None else cut_after
        self.cut_after = cut_after
        self.error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        sent = 0
        for piece in self.pieces:
            if self.cut_after is not None and sent + len(piece) > self.cut_after:
                head = piece[: self.cut_after - sent]
                if head:
                    yield head
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
            sent += len(piece)
            yield piece
        if self.error is not None:
            raise self.error

    async def aclose(self) -> None:
        return None


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
            status, headers=headers or SSE_HEADERS, stream=Pieces(pieces, error=error)
        )

    return CountingTransport(httpx.MockTransport(handler))


class Replay:
    """Answers request ``n`` with ``data[n]`` (the last one repeats), in ``chunking``.

    ``data`` is one body or a list of them; status, content type and headers are the same for
    each. ``requests`` holds the JSON body of every request, in order.
    """

    def __init__(
        self,
        data: bytes | Sequence[bytes],
        *,
        chunking: str = "whole",
        status: int = 200,
        content_type: str = "text/event-stream; charset=utf-8",
        headers: dict[str, str] | None = None,
        cut_after: int | None = None,
        seed: int = 7,
    ) -> None:
        self.data = [data] if isinstance(data, bytes) else list(data)
        self.chunking = chunking
        self.status = status
        self.content_type = content_type
        self.headers = {"x-request-id": "req_replay_0001", **(headers or {})}
        self.cut_after = cut_after
        self.seed = seed
        self.requests: list[Any] = []
        self.transport = CountingTransport(httpx.MockTransport(self.handler))

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content or b"null"))
        data = self.data[min(len(self.requests), len(self.data)) - 1]
        body = Pieces(chunked(data, self.chunking, self.seed), cut_after=self.cut_after)
        headers = {"content-type": self.content_type, **self.headers}
        return httpx.Response(self.status, headers=headers, stream=body)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport)

    def assert_fully_read(self, *, to_eof: bool = True) -> None:
        self.transport.assert_fully_read(to_eof=to_eof)


# --------------------------------------------------------------------------- adapters on replays


def settings(
    *, base_url: str = "http://replay.invalid/v1", max_retries: int = 0, **extra: Any
) -> ProviderSettings:
    return ProviderSettings(
        base_url=base_url, api_key="sk-test", max_retries=max_retries, extra=extra
    )


def make(cls: Callable[..., Any], model: str, replay: Replay, **extra: Any) -> Any:
    """An adapter wired to a replay transport."""
    return cls(model, settings(**extra), client=replay.client())


def provider_with(
    transport: httpx.AsyncBaseTransport,
    model: str = "claude-sonnet-4-5",
    *,
    base_url: str = "http://replay.invalid",
    timeout: float = 5.0,
    max_retries: int = 0,
    server: str | None = None,
) -> AnthropicProvider:
    """An Anthropic adapter on ``transport`` (``server``: the server it plays, named as behind a
    gateway; by default the host says none)."""
    settings = ProviderSettings(
        base_url=base_url,
        api_key="test-key",
        timeout_s=timeout,
        connect_timeout_s=timeout,
        max_retries=max_retries,
        extra={"thoughtgate": {"server": server}} if server else {},
    )
    client = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(timeout))
    return AnthropicProvider(model, settings, client=client)


TOOLS = (
    ToolSpec("get_country", "The user's country", {"type": "object", "properties": {}}),
    ToolSpec(
        "largest_city",
        "Largest city of a country",
        {"type": "object", "properties": {"country": {"type": "string"}}},
    ),
)


def turn_request(
    mode: str = "surface",
    messages: list[Message] | None = None,
    *,
    tools: bool = False,
    **reasoning: Any,
) -> TurnRequest:
    """A request for a disclosure mode (``hidden`` / ``surface`` / ``telemetry_only``)."""
    return TurnRequest(
        messages or [Message.user("Why is the sky blue?")],
        tools=TOOLS if tools else (),
        reasoning=ReasoningRequest.for_mode(mode, **reasoning),
    )


async def streamed(provider: Any, request: TurnRequest) -> Turn:
    return await stream_llm_turn(provider, request)


async def run_tool_loop(provider: Any, *, mode: str = "surface", turns: int = 4) -> list[Turn]:
    """Drive the emulator's ``tool-loop`` scenario the way the agent loop does."""
    history: list[Message] = [Message.user("What is the largest city in my country?")]
    done: list[Turn] = []
    for _ in range(turns):
        turn = await stream_llm_turn(provider, turn_request(mode, history, tools=True))
        done.append(turn)
        if not turn.tool_calls:
            break
        results = tuple(ToolResultPart(c.call_id, "Mexico", name=c.name) for c in turn.tool_calls)
        history += [turn.as_message(), Message("tool", results)]
    return done


# --------------------------------------------------------------------------- loopback server


@dataclass
class Reply:
    """One scripted HTTP answer: status, headers and the body pieces (one HTTP chunk each)."""

    pieces: Sequence[bytes]
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: dict(SSE_HEADERS))
    stall: bool = False  # send headers and pieces, then never finish
    hang_up: bool = False  # close the connection after answering, without saying so first
    pause_s: float = 0.0  # between pieces (each its own network read)


@dataclass
class ReplayServer:
    """A real HTTP/1.1 server on 127.0.0.1 that answers request ``n`` with ``replies[n]``.

    The last reply repeats. ``bodies`` records each request's JSON body.
    """

    replies: Sequence[Reply]
    bodies: list[Any] = field(default_factory=list)
    port: int = 0
    connections: int = 0
    """Connections accepted so far (keep-alive reuse shows as fewer connections than requests)."""
    tls: ssl.SSLContext | None = None
    """Serve HTTPS with this context (its certificate names ``127.0.0.1``)."""
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)
    """Set each time the server closes a connection."""
    _stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    @property
    def url(self) -> str:
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ReplayServer:
        server = await self._stack.enter_async_context(
            serving(self._serve_connection, tls=self.tls)
        )
        self.port = server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
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
                if reply.hang_up or reply.headers.get("connection") == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.hung_up.set()

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
                await asyncio.sleep(reply.pause_s)
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

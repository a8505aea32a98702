"""Provider bodies read past httpx, one piece per network read (``providers.h11_body``).

The reader must give exactly the bytes httpx gives, however the network splits them, and fail
where httpx fails: malformed chunk framing, a body cut at any byte, a stall (read timeout). It
reads chunk framing itself and leaves the rest to h11, so it is compared with httpx's own reader
(h11 throughout) byte for byte and verdict for verdict; and the private path it takes through
httpx, httpcore and h11 must still be there in the installed versions (else every provider body
would silently go the slower way).
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import AsyncIterator

import httpx
import pytest
from httpcore._backends.mock import AsyncMockBackend
from hypothesis import given, settings
from hypothesis import strategies as st
from support.replay import ReplayServer, Reply

from thoughtgate.errors import ProviderStreamError, ProviderTimeoutError
from thoughtgate.providers import h11_body
from thoughtgate.providers.base import ProviderSettings
from thoughtgate.providers.clients import ProviderClients
from thoughtgate.providers.h11_body import BODY_READS, body_reads
from thoughtgate.providers.http import HTTPTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunked(pieces: list[bytes], trailers: bytes = b"") -> bytes:
    framed = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces if p)
    return framed + b"0\r\n" + trailers + b"\r\n"


def split(wire: bytes, cuts: list[int]) -> list[bytes]:
    """``wire`` in the pieces that ``cuts`` (positions) make: one network read each."""
    bounds = [0, *sorted(set(cuts)), len(wire)]
    return [wire[a:b] for a, b in itertools.pairwise(bounds) if b > a]


TLS = ssl.create_default_context()


class Mocked:
    """httpx's own transport over httpcore's mock network: each piece is one network read."""

    def __init__(self, reads: list[bytes]) -> None:
        self.transport = httpx.AsyncHTTPTransport(verify=TLS)
        self.pool = self.transport._pool
        self.pool._network_backend = AsyncMockBackend(reads)  # type: ignore[attr-defined]

    async def response(self) -> tuple[httpx.Response, httpx.Request]:
        request = httpx.Request("POST", "http://provider.test/v1/messages", content=b"{}")
        request.extensions["timeout"] = {"read": 5.0}
        return await self.transport.handle_async_request(request), request

    async def ours(self) -> list[bytes]:
        response, request = await self.response()
        reads = body_reads(response.stream, request)
        assert reads is not None
        try:
            return [piece async for piece in reads()]
        finally:
            await response.aclose()

    async def httpx_raw(self) -> bytes:
        response, _ = await self.response()
        try:
            return b"".join([piece async for piece in response.aiter_raw()])
        finally:
            await response.aclose()

    async def outcome(self, *, ours: bool) -> tuple[bytes, bool]:
        """The bytes delivered, and whether the body ended in an error."""
        response, request = await self.response()
        reads = body_reads(response.stream, request)
        assert reads is not None
        got: list[bytes] = []
        try:
            async for piece in reads() if ours else response.aiter_raw():
                got.append(piece)
        except httpx.RemoteProtocolError:
            return b"".join(got), True
        finally:
            await response.aclose()
        return b"".join(got), False


pieces_st = st.lists(st.binary(min_size=1, max_size=40), min_size=0, max_size=8)
trailers_st = st.sampled_from([b"", b"x-trailer: done\r\n", b"a: 1\r\nb: 2\r\n"])


@settings(max_examples=150, deadline=None)
@given(pieces=pieces_st, trailers=trailers_st, data=st.data())
async def test_the_body_is_the_bytes_httpx_gives_however_the_network_splits_them(
    pieces: list[bytes], trailers: bytes, data: st.DataObject
) -> None:
    wire = HEAD + chunked(pieces, trailers)
    cuts = data.draw(st.lists(st.integers(1, len(wire) - 1), max_size=12))
    reads = split(wire, cuts)
    ours = await Mocked(reads).ours()
    assert b"".join(ours) == b"".join(pieces) == await Mocked(reads).httpx_raw()
    assert all(ours)  # never an empty piece
    assert len(ours) <= len(reads)  # at most one piece per network read


SSE_BODY = [
    b'event: content_block_delta\ndata: {"delta":{"thinking":"Tides"}}\n\n',
    b"event: ping\ndata: {}\n\n",
    b"\r\n0\r\n\r\n",  # chunk framing inside the data is data
]


@pytest.mark.parametrize("trailers", [b"", b"x-trailer: done\r\n"])
async def test_a_body_split_at_every_position_arrives_whole(trailers: bytes) -> None:
    wire = HEAD + chunked(SSE_BODY, trailers)
    for cut in range(1, len(wire)):
        assert b"".join(await Mocked([wire[:cut], wire[cut:]]).ours()) == b"".join(SSE_BODY)
    one_byte_reads = [wire[i : i + 1] for i in range(len(wire))]
    assert b"".join(await Mocked(one_byte_reads).ours()) == b"".join(SSE_BODY)


frame_st = st.one_of(
    st.binary(min_size=1, max_size=30).map(lambda p: chunked([p])[: -len(b"0\r\n\r\n")]),
    st.binary(min_size=1, max_size=12).map(
        lambda p: f"{len(p):X};ext=1 \r\n".encode() + p + b"\r\n"
    ),
    st.sampled_from(
        [
            b"0\r\n\r\n",
            b"000\r\nx-t: 1\r\n\r\n",
            b"0;e\r\n\r\n",
            b"\r\n",
            b"\r",
            b"zz\r\n",
            b"1\r\n",
        ]
    ),
    st.binary(max_size=8),  # anything at all
)


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(frame_st, max_size=8), data=st.data())
async def test_any_body_reads_as_h11_reads_it(frames: list[bytes], data: st.DataObject) -> None:
    """Differential: valid, malformed, cut or trailing bytes, split anywhere, give the same
    bytes and the same verdict (a whole body or a protocol error) as httpx's own reader."""
    wire = HEAD + b"".join(frames)
    cuts = data.draw(st.lists(st.integers(1, len(wire) - 1), max_size=6))
    reads = split(wire, cuts)
    assert await Mocked(reads).outcome(ours=True) == await Mocked(reads).outcome(ours=False)


async def test_every_chunk_one_read_brought_is_one_piece() -> None:
    events = [f"event: e\ndata: {i}\n\n".encode() for i in range(20)]
    wire = HEAD + chunked(events)
    assert await Mocked([wire]).ours() == [b"".join(events)]


async def test_a_whole_body_leaves_the_connection_ready_for_the_next_request() -> None:
    mocked = Mocked([HEAD + chunked([b"data: 1\n\n"])])
    assert await mocked.ours() == [b"data: 1\n\n"]
    (connection,) = mocked.pool.connections
    assert connection.is_idle()


@pytest.mark.parametrize("trailers", [b"", b"x-trailer: done\r\n"])
async def test_a_body_cut_at_any_byte_is_an_error_not_a_short_body(trailers: bytes) -> None:
    wire = HEAD + chunked([b"event: a\ndata: {}\n\n", b"event: b\ndata: {}\n\n"], trailers)
    for end in range(len(HEAD), len(wire)):
        mocked = Mocked([wire[:end]])
        with pytest.raises(httpx.RemoteProtocolError):
            await mocked.ours()
        with pytest.raises(httpx.RemoteProtocolError):  # as httpx's own reader
            await Mocked([wire[:end]]).httpx_raw()
        assert not mocked.pool.connections  # a broken connection is never reused


@pytest.mark.parametrize(
    "bad",
    [
        b"zz\r\ndata\r\n0\r\n\r\n",  # chunk size not hex
        b"4\r\ndata!!\r\n0\r\n\r\n",  # more bytes than the size says
        b"4\r\ndataXY0\r\n\r\n",  # no CRLF after the chunk's data
        b"0\r\nnot a header line\r\n\r\n",  # malformed trailer
    ],
)
async def test_malformed_chunk_framing_is_an_error(bad: bytes) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        await Mocked([HEAD + bad]).ours()


async def test_a_body_without_chunks_is_read_by_its_length_or_until_close() -> None:
    sized = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\ndata: 1\n\n\n"
    assert b"".join(await Mocked(split(sized, [40, 45])).ours()) == b"data: 1\n\n\n"
    closed = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\ndata: 1\n\n"
    assert b"".join(await Mocked(split(closed, [41])).ours()) == b"data: 1\n\n"


def shared_transport(server: ReplayServer, read: float = 5.0) -> HTTPTransport:
    settings = ProviderSettings(timeout_s=read, max_retries=0)
    return HTTPTransport("test", server.url, {}, settings, clients=ProviderClients())


async def batches(transport: HTTPTransport) -> AsyncIterator[list[str]]:
    async with transport._clients.lease(), transport.open("/", {}, stream=True) as response:
        assert BODY_READS in response.extensions  # the installed httpx/httpcore take this path
        async for batch in transport.event_batches(response):
            yield [message.data for message in batch]


async def test_the_shared_clients_read_provider_bodies_this_way_and_keep_the_connection() -> None:
    pieces = [f"data: {i}\n\n".encode() for i in range(30)]
    async with ReplayServer([Reply(pieces)]) as server:
        transport = shared_transport(server)
        async with transport._clients.lease():
            for _ in range(3):
                got = [data async for batch in batches(transport) for data in batch]
                assert got == [str(i) for i in range(30)]
        assert (len(server.bodies), server.connections) == (3, 1)


async def test_a_stall_mid_body_is_a_timeout_after_what_arrived() -> None:
    reply = Reply([b"data: first\n\n"], stall=True)
    got: list[str] = []
    async with ReplayServer([reply]) as server:
        with pytest.raises(ProviderTimeoutError):
            async for batch in batches(shared_transport(server, read=0.3)):
                got += batch
    assert got == ["first"]


async def test_a_connection_cut_mid_body_is_a_stream_error_after_what_arrived() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the JSON body, {}
        writer.write(HEAD + b"d\r\ndata: first\n\n\r\n" + b"e\r\ndata: sec")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(cut, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = ProviderSettings(max_retries=0)
    transport = HTTPTransport(
        "test", f"http://127.0.0.1:{port}", {}, settings, clients=ProviderClients()
    )
    got: list[str] = []
    try:
        with pytest.raises(ProviderStreamError, match="the stream was cut"):
            async for batch in batches(transport):
                got += batch
    finally:
        server.close()
        await server.wait_closed()
    assert got == ["first"]


async def test_the_installed_h11_leaves_chunk_framing_to_the_reader() -> None:
    """Else every chunked body would go the slower way, h11 event by event, without a sound."""
    assert h11_body.CHUNK_FRAMING_HERE
    mocked = Mocked([HEAD + b"5\r\nhello\r\n"])
    response, _ = await mocked.response()
    (connection,) = mocked.pool.connections
    state = connection._connection._h11_state  # type: ignore[attr-defined]
    assert h11_body._chunked_start(state) == b"5\r\nhello\r\n"  # what came with the head
    await response.aclose()


async def test_a_body_of_another_shape_has_no_reader() -> None:
    assert body_reads(httpx.ByteStream(b"x"), httpx.Request("GET", "http://x.test")) is None

"""The provider clients' network backend (``providers.netio``), through the shared transport.

Every adapter that is not handed a client of its own reads its provider through it, so it is
proven here on real loopback sockets: plain and TLS, keep-alive reuse, a peer that closes an idle
connection, a stall mid-body (read timeout), a refused connection, and a body larger than the
read buffer (flow control).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpcore
import httpx
import pytest
from support.replay import ReplayServer, Reply, blackhole_port
from support.tls import self_signed

from thoughtgate.providers.clients import (
    ProviderClients,
    ShardedTransport,
    _FastLock,
    _LeanCookies,
    _LeanPool,
)
from thoughtgate.providers.netio import AsyncioBackend

TEXT = {"content-type": "text/plain"}


HANG = 60.0
"""A wait no healthy exchange comes near, however loaded the machine: the bound of a test that is
not about timeouts. On a loaded machine seven TLS handshakes, both ends in one loop, took up to
1.1 s (uvloop does the TCP connect at once, so all of it falls in the handshake): a 1 s connect
timeout failed the interleaving test, whose subject is bytes, not time."""


def client(
    verify: ssl.SSLContext | None = None, *, read: float = HANG, connect: float = HANG
) -> httpx.AsyncClient:
    """The shared transport's client; its timeouts are a hang's (:data:`HANG`) unless a test of
    timeouts sets its own."""
    transport = ShardedTransport(verify=verify or ssl.create_default_context())
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(read, connect=connect))


async def test_the_shared_transport_reads_through_the_asyncio_backend() -> None:
    transport = ShardedTransport(verify=ssl.create_default_context())
    pool = transport._shard().transport._pool
    assert isinstance(pool._network_backend, AsyncioBackend)  # type: ignore[attr-defined]
    await transport.aclose()


async def test_pieces_arrive_in_order_and_a_connection_is_reused() -> None:
    pieces = [f"piece {i}\n".encode() for i in range(50)]
    async with ReplayServer([Reply(pieces, headers=TEXT)]) as server, client() as http:
        for _ in range(3):
            async with http.stream("GET", server.url) as response:
                got = [chunk async for chunk in response.aiter_raw()]
            assert b"".join(got) == b"".join(pieces)
        assert (len(server.bodies), server.connections) == (3, 1)


async def test_a_connection_takes_its_locks_without_a_pass_of_the_event_loop() -> None:
    """The shared transport gives each connection that answered locks that a free acquire does
    not yield on (``clients._lean_locks``); this pins the private path it takes through the
    installed httpx and httpcore, and the connection keeps serving requests with them."""
    assert _FastLock is not None
    async with ReplayServer([Reply([b"ok"], headers=TEXT)]) as server, client() as http:
        for _ in range(3):
            assert (await http.get(server.url)).content == b"ok"
        transport = http._transport
        assert isinstance(transport, ShardedTransport)
        (connection,) = transport._shard().transport._pool.connections  # type: ignore[attr-defined]
        assert type(connection._request_lock) is _FastLock
        assert type(connection._connection._state_lock) is _FastLock
        assert server.connections == 1


async def test_a_connection_the_peer_closed_while_idle_is_not_reused() -> None:
    """The server hangs up after each answer without saying so: the pool must see the idle
    connection is closed (``is_readable``) and open a new one rather than write into it."""
    async with (
        ReplayServer([Reply([b"ok"], headers=TEXT, hang_up=True)]) as server,
        client() as http,
    ):
        for _ in range(3):
            server.hung_up.clear()
            response = await http.get(server.url)
            assert response.content == b"ok"
            await server.hung_up.wait()
        assert server.connections == 3


async def test_the_connections_a_pool_drops_are_closed_by_the_lean_pool() -> None:
    """The shared transport's pools skip the cancel shield when they drop no connection
    (``clients._LeanPool``, ADR 0032); this pins that the installed httpcore takes that path, and
    that connections the pool does drop (the peer hung up on them while idle) are still closed."""
    async with (
        ReplayServer([Reply([b"ok"], headers=TEXT, hang_up=True)]) as server,
        client() as http,
    ):
        transport = http._transport
        assert isinstance(transport, ShardedTransport)
        pool = transport._shard().transport._pool  # type: ignore[attr-defined]
        assert type(pool) is _LeanPool
        streams = []
        for _ in range(3):
            server.hung_up.clear()
            async with http.stream("GET", server.url) as response:
                assert await response.aread() == b"ok"
                streams.append(response.extensions["network_stream"])
            await server.hung_up.wait()
        assert server.connections == 3
        await http.get(server.url)  # drops the third, idle and hung up on
        assert all(s._transport.is_closing() for s in streams)


async def test_a_stall_mid_body_is_a_read_timeout() -> None:
    reply = Reply([b"first"], headers=TEXT, stall=True)
    async with (
        ReplayServer([reply]) as server,
        client(read=0.3) as http,
        http.stream("GET", server.url) as response,
    ):
        stream = response.aiter_raw()
        assert await stream.__anext__() == b"first"
        with pytest.raises(httpx.ReadTimeout):
            await stream.__anext__()


async def test_connect_failures_are_mapped() -> None:
    async with client(connect=1.0) as http:
        with blackhole_port() as port, pytest.raises(httpx.ConnectTimeout):
            await http.get(f"http://127.0.0.1:{port}")
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{_closed_port()}")


async def test_a_body_larger_than_the_read_buffer_arrives_whole() -> None:
    big = [bytes([65 + i % 26]) * 65536 for i in range(12)]  # 768 KiB, beyond the 256 KiB buffer
    async with (
        ReplayServer([Reply(big, headers=TEXT)]) as server,
        client() as http,
        http.stream("GET", server.url) as response,
    ):
        got = b"".join([chunk async for chunk in response.aiter_raw()])
    assert got == b"".join(big)


@pytest.fixture(scope="module")
def tls(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ssl.SSLContext, ssl.SSLContext]]:
    """A server context with a self-signed certificate for 127.0.0.1, and a client trusting it."""
    server, cert_file = self_signed(tmp_path_factory.mktemp("tls"))
    trusting = ssl.create_default_context(cafile=str(cert_file))
    yield server, trusting


async def test_tls_streams_and_is_verified(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_ctx, trusting = tls
    pieces = [f"secret {i}\n".encode() for i in range(20)]
    async with ReplayServer([Reply(pieces, headers=TEXT)], tls=server_ctx) as server:
        async with client(trusting) as http:
            for _ in range(2):
                async with http.stream("GET", server.url) as response:
                    got = b"".join([chunk async for chunk in response.aiter_raw()])
                assert got == b"".join(pieces)
        async with client() as untrusting:  # the system's roots do not know this certificate
            with pytest.raises(httpx.ConnectError):
                await untrusting.get(server.url)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Timer:
    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.when, self.callback, self.args, self.cancelled = when, callback, args, False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A stream's event loop as its read timeouts see it (``loop.time``, ``loop.call_at``), with
    a clock that only :meth:`advance` moves: a timer fires when the test moves the clock past it,
    never because the machine was slow. Everything else is the running loop's."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.now = 1000.0
        self._timers: list[_Timer] = []

    def time(self) -> float:
        return self.now

    def create_future(self) -> asyncio.Future[Any]:
        return self._loop.create_future()

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> _Timer:
        timer = _Timer(when, callback, args)
        self._timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock on and run every timer now due, earliest first (a timer may set
        another)."""
        self.now += seconds
        while due := [t for t in self._timers if t.when <= self.now]:
            timer = min(due, key=lambda t: t.when)
            self._timers.remove(timer)
            if not timer.cancelled:
                timer.callback(*timer.args)


async def test_a_read_timeout_counts_from_each_read_not_from_the_first() -> None:
    """The stream keeps one read timer across reads: pieces that each come within the timeout
    never time out, however long the whole body takes; a read without a timeout is not failed by
    a timer an earlier read armed; a stall after them is a ``ReadTimeout``.

    Time is the test's (:class:`ManualClock`): the server sends each piece when told, after the
    test has moved the stream's clock; a loaded machine can only make the test slower."""
    pieces: asyncio.Queue[bytes] = asyncio.Queue()
    served = asyncio.Event()

    async def on_cue(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while piece := await pieces.get():
            writer.write(piece)
            await writer.drain()
        await reader.read()  # a stall, until the client hangs up
        writer.close()
        await writer.wait_closed()
        served.set()

    server = await asyncio.start_server(on_cue, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=HANG)
    clock = stream._loop = ManualClock(asyncio.get_running_loop())  # type: ignore[attr-defined]

    async def read_after(waited: float, timeout: float | None) -> asyncio.Task[bytes]:
        """A read started, then ``waited`` seconds of the stream's clock with nothing to read;
        the read, still waiting, is returned."""
        read = asyncio.create_task(stream.read(1024, timeout=timeout))
        for _ in range(1000):  # until the read waits, its deadline set
            if stream._protocol.waiter is not None:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0)
        else:
            raise AssertionError("the read never waited")
        clock.advance(waited)
        await asyncio.sleep(0)  # a read timed out by that is done now
        assert not read.done(), read
        return read

    try:
        for _ in range(6):  # 0.5 s before each piece: 3 s in all, past the 0.6 s of each read
            read = await read_after(0.5, timeout=0.6)
            await pieces.put(b"x")
            assert await asyncio.wait_for(read, HANG) == b"x"
        read = await read_after(10.0, timeout=None)  # the timer armed above fires meanwhile
        await pieces.put(b"late")
        assert await asyncio.wait_for(read, HANG) == b"late"
        read = await read_after(0.5, timeout=0.6)
        clock.advance(0.2)  # past its deadline, and nothing came
        await asyncio.sleep(0)
        assert read.done()
        with pytest.raises(httpcore.ReadTimeout):
            await read
    finally:
        await pieces.put(b"")
        await stream.aclose()
        await asyncio.wait_for(served.wait(), HANG)
        server.close()
        await server.wait_closed()


async def test_the_shared_clients_keep_the_cookies_a_provider_sets() -> None:
    """The shared clients' jar skips a response without cookies (``clients._LeanCookies``);
    one that sets a cookie is stored as httpx stores it, and a later response without any
    leaves it there."""
    clients = ProviderClients()
    replies = [
        Reply([b"ok"], headers={**TEXT, "set-cookie": "lb=a1; Path=/"}),
        Reply([b"ok"], headers=TEXT),
    ]
    async with ReplayServer(replies) as server, clients.lease():
        http = clients.client(server.url)
        assert type(http._cookies) is _LeanCookies  # type: ignore[attr-defined]
        assert (await http.get(server.url)).content == b"ok"
        assert http.cookies.get("lb") == "a1"
        assert (await http.get(server.url)).content == b"ok"
        assert http.cookies.get("lb") == "a1"


class _Writes:
    """A transport that records each write it passes on (to see what went out in one call)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextlib.asynccontextmanager
async def _recorded(*, answer: bool) -> AsyncIterator[tuple[Any, _Writes, list[bytes]]]:
    """A stream to a server that notes each piece it reads (``got``) and, with ``answer``,
    answers the first one; the stream's writes are recorded (``writes``). On the way out the
    stream closes and the server sees the client hang up."""
    got: list[bytes] = []
    done = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 20):
            got.append(data)
            if answer and len(got) == 1:
                writer.write(b"answer")
                await writer.drain()
        writer.close()
        await writer.wait_closed()
        done.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=1.0)
    writes = stream._transport = _Writes(stream._transport)  # type: ignore[attr-defined]
    try:
        yield stream, writes, got
    finally:
        await stream.aclose()
        await asyncio.wait_for(done.wait(), 5)
        server.close()
        await server.wait_closed()


async def test_a_requests_head_and_body_go_out_in_one_write() -> None:
    """httpcore writes a request's head and then its body; the stream holds both until it reads
    the answer and sends them in one write (one system call, one segment, ADR 0032)."""
    async with _recorded(answer=True) as (stream, writes, got):
        await stream.write(b"POST / HTTP/1.1\r\ncontent-length: 4\r\n\r\n", timeout=1.0)
        await stream.write(b"body", timeout=1.0)
        assert writes.writes == []  # held until the answer is read
        assert await stream.read(1024, timeout=1.0) == b"answer"
        assert writes.writes == [b"POST / HTTP/1.1\r\ncontent-length: 4\r\n\r\nbody"]
        assert got == [b"POST / HTTP/1.1\r\ncontent-length: 4\r\n\r\nbody"]


async def test_a_large_body_is_sent_as_it_is_written_and_a_held_one_before_a_close() -> None:
    """Past 64 KiB held, a write is sent at once (with the transport's flow control), so a large
    body is never held whole; what is still held when the stream closes is sent first."""
    big = b"x" * (65 * 1024)
    async with _recorded(answer=False) as (stream, writes, got):
        await stream.write(b"head", timeout=1.0)
        await stream.write(big, timeout=1.0)
        assert writes.writes == [b"head" + big]
        await stream.write(b"tail", timeout=1.0)
    assert writes.writes == [b"head" + big, b"tail"]
    assert b"".join(got) == b"head" + big + b"tail"


async def test_a_request_held_on_a_connection_the_peer_closed_reads_the_end() -> None:
    """A connection that closes while a request is held sends nothing and raises nothing then:
    the read that follows meets the end of the stream, as httpcore reads the answer after a
    write that failed; a write on a connection already closed fails at once, as before."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=1.0)
    try:
        await stream.write(b"request", timeout=1.0)
        await asyncio.sleep(0.1)  # the close arrives while the request is held
        assert await stream.read(1024, timeout=1.0) == b""
        with pytest.raises(httpcore.WriteError):
            await stream.write(b"more", timeout=1.0)
    finally:
        await stream.aclose()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
@pytest.mark.parametrize("secure", [False, True], ids=["plain", "tls"])
def test_streams_read_at_once_each_get_their_own_bytes(
    runner: str, secure: bool, tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    """Every connection of a loop reads its socket into the loop's one receive buffer: streams
    whose pieces interleave, plain and TLS, on asyncio's loop and on uvloop (the daemon's), each
    get exactly their own bytes, a body past the flow-control limit included."""
    server_ctx, trusting = tls if secure else (None, None)
    replies = [
        Reply([f"stream {n} piece {i};".encode() * (1 + i % 5) for i in range(40)], headers=TEXT)
        for n in range(6)
    ]
    replies.append(Reply([bytes([97 + i]) * 100_000 for i in range(4)], headers=TEXT))

    async def read_all() -> list[bytes]:
        async with ReplayServer(replies, tls=server_ctx) as server, client(trusting) as http:

            async def one() -> bytes:
                async with http.stream("GET", server.url) as response:
                    return b"".join([chunk async for chunk in response.aiter_raw()])

            return await asyncio.gather(*(one() for _ in replies))

    if runner == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        got = uvloop.run(read_all())
    else:
        got = asyncio.run(read_all())
    assert sorted(got) == sorted(b"".join(reply.pieces) for reply in replies)

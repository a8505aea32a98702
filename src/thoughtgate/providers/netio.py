"""The network backend of the provider clients: sockets on the running asyncio loop, directly.

Why: a provider streams a turn as many small writes, each read on its own wake-up (a delta every
few milliseconds), so the fixed cost of one read is paid per delta. httpcore's default backend
reaches asyncio through sniffio and anyio, and enters an anyio cancel scope (``fail_after``) on
every read to apply the read timeout. Here a read that finds bytes buffered returns them at once,
and a read that waits costs one future and one timer: the same timeouts, a fraction of the work.

Semantics kept from httpcore's backends: ``read`` returns at most ``max_bytes`` (``b""`` at end of
stream), raises ``ReadTimeout`` when no byte arrives within ``timeout`` and ``ReadError`` when the
connection fails; the bytes of ``write`` are sent with the transport's flow control (waiting for
its buffer to drain below its high-water mark: ``WriteTimeout`` / ``WriteError``), held until the
connection next reads (or closes, or holds 64 KiB) so that a request's head and body leave in one
system call; connecting maps to ``ConnectTimeout`` / ``ConnectError``; ``is_readable`` (asked of
an idle keep-alive connection before reuse) is true once the peer closed or sent something
unasked, which is exactly when the connection must not be reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
import weakref
from collections.abc import Iterable
from typing import Any, cast

import httpcore

__all__ = ["AsyncioBackend"]

_MAX_BUFFER = 256 * 1024
"""Bytes held unread before the socket stops being read (flow control)."""
_MAX_UNSENT = 64 * 1024
"""Bytes written and held (see ``_Stream.write``) before they are sent without waiting for the
next read: a large request body is sent as it is written, with the transport's flow control."""


_RECEIVE_BYTES = 256 * 1024
"""The most one socket read takes (asyncio's own ``max_size`` for a stream transport)."""
_RECEIVE_BUFFERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, memoryview] = (
    weakref.WeakKeyDictionary()
)
"""Per event loop: the one buffer every connection's socket reads go into (see ``_Protocol``)."""


def _receive_buffer(loop: asyncio.AbstractEventLoop) -> memoryview:
    buffer = _RECEIVE_BUFFERS.get(loop)
    if buffer is None:
        buffer = _RECEIVE_BUFFERS[loop] = memoryview(bytearray(_RECEIVE_BYTES))
    return buffer


class _Protocol(asyncio.BufferedProtocol):
    """Buffers what arrives and wakes the one reader waiting for it.

    A buffered protocol: the loop reads the socket into a buffer it is handed (``get_buffer``),
    and what a read brought is copied out at once (``buffer_updated``). Why: for a plain
    protocol, asyncio's loop receives every socket read into a new 256 KiB ``bytes`` and shrinks
    it to what arrived; where the C allocator serves that size by mapping memory (a process that
    has not raised glibc's mmap threshold), each read of a delta costs an ``mmap``, an ``mremap``,
    a ``munmap`` and page faults: a fifth of a delta's CPU on the asyncio loop (ADR 0081). uvloop
    reads into a buffer of its own either way. The buffer is shared by the connections of one
    loop: the loop fills it and calls ``buffer_updated`` in one step with nothing run in between
    (asyncio's and uvloop's sockets and TLS alike), and the bytes are copied out there.
    """

    def __init__(self) -> None:
        self._received = _receive_buffer(asyncio.get_running_loop())
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.paused = False
        self.reading_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's, so no isinstance here
        self.transport = cast(asyncio.Transport, transport)

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._received

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._received[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        self.buffer += data
        if len(self.buffer) > _MAX_BUFFER and self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None:
            self.error = exc
        self._wake()
        drained = self.drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        drained = self.drained
        if drained is not None and not drained.done():
            drained.set_result(None)


def _socket_readable(sock: Any) -> bool:
    """Whether a socket has something to read (or was closed) right now, without waiting."""
    if sock.fileno() < 0:
        return True
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


def _expire(future: asyncio.Future[None], error: type[Exception]) -> None:
    if not future.done():
        future.set_exception(error("timed out"))


async def _wait(
    future: asyncio.Future[None], timeout: float | None, error: type[Exception]
) -> None:
    """Wait for ``future``; after ``timeout`` seconds it fails with ``error`` (one timer, no
    cancel scope)."""
    if timeout is None:
        await future
        return
    timer = asyncio.get_running_loop().call_later(timeout, _expire, future, error)
    try:
        await future
    finally:
        timer.cancel()


class _Stream(httpcore.AsyncNetworkStream):
    """One connection. A read that waits arms no timer of its own: the stream keeps one timer,
    due at the earliest deadline it was armed for, and when it fires it fails the waiting read if
    that read's deadline has passed, or sets itself again for it. A provider's stream waits once
    per delta, and a timer made and cancelled per wait was a heap push, a handle and a
    cancellation each time."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()
        self._deadline: float | None = None  # of the read waiting now (None: it waits forever)
        self._timer: asyncio.TimerHandle | None = None
        self._unsent: list[bytes] = []  # written, held until the next read or close
        self._unsent_bytes = 0
        self._write_timeout: float | None = None  # of the last write held

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._unsent:
            await self._send_unsent()
        protocol = self._protocol
        if not protocol.buffer and not protocol.eof:
            loop = self._loop
            waiter = protocol.waiter = loop.create_future()
            if timeout is None:
                self._deadline = None
            else:
                self._deadline = deadline = loop.time() + timeout
                if self._timer is None:
                    self._timer = loop.call_at(deadline, self._read_timer)
            try:
                await waiter
            finally:
                protocol.waiter = None
                self._deadline = None  # a timer that fires now finds no read of this stream
        buffer = protocol.buffer
        if buffer:
            if len(buffer) <= max_bytes:
                data = bytes(buffer)
                buffer.clear()
            else:
                data = bytes(buffer[:max_bytes])
                del buffer[:max_bytes]
            if protocol.reading_paused and len(buffer) <= _MAX_BUFFER // 2:
                protocol.reading_paused = False
                if protocol.transport is not None:
                    protocol.transport.resume_reading()
            return data
        if protocol.error is not None:
            raise httpcore.ReadError(str(protocol.error)) from protocol.error
        return b""

    def _read_timer(self) -> None:
        """The stream's read timer fired: time out the waiting read if its deadline has passed,
        else wait for that deadline (a read that waits forever needs no timer)."""
        self._timer = None
        waiter, deadline = self._protocol.waiter, self._deadline
        if waiter is None or waiter.done() or deadline is None:
            return
        if self._loop.time() >= deadline:
            waiter.set_exception(httpcore.ReadTimeout("timed out"))
        else:
            self._timer = self._loop.call_at(deadline, self._read_timer)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Hold ``buffer`` until the connection next reads (or closes), then send everything
        held in one write: a request's head and body go out in one system call and one segment,
        not two (httpcore writes them apart and then reads the answer). A connection already
        closed fails at once, as before; one that fails while the request is held is found by
        the read that follows, as httpcore finds it after a write it let pass (it reads the
        answer after a ``WriteError`` anyway)."""
        if not buffer:
            return
        protocol = self._protocol
        if protocol.eof or self._transport.is_closing():
            raise httpcore.WriteError(str(protocol.error or "the connection is closed"))
        self._unsent.append(buffer)
        self._unsent_bytes += len(buffer)
        self._write_timeout = timeout
        if self._unsent_bytes > _MAX_UNSENT:  # a large body goes out as it comes, paced
            await self._send_unsent()

    async def _send_unsent(self) -> None:
        """Send what :meth:`write` held, waiting for the transport's buffer to drain below its
        high-water mark (``WriteTimeout`` after the last write's timeout). A connection that
        closed meanwhile sends nothing: the read that follows meets its end or its error."""
        unsent, self._unsent, self._unsent_bytes = self._unsent, [], 0
        protocol = self._protocol
        if protocol.eof or self._transport.is_closing():
            return
        self._transport.write(unsent[0] if len(unsent) == 1 else b"".join(unsent))
        if not protocol.paused:
            return
        protocol.drained = asyncio.get_running_loop().create_future()
        try:
            await _wait(protocol.drained, self._write_timeout, httpcore.WriteTimeout)
        finally:
            protocol.drained = None

    async def aclose(self) -> None:
        transport = self._transport
        if transport.is_closing():
            return
        if self._unsent:  # sent before the close, as an unbuffered write would have been
            unsent, self._unsent, self._unsent_bytes = self._unsent, [], 0
            transport.write(b"".join(unsent))
        transport.close()
        # let the loop run the close (uvloop refuses to close with a handle still open), then
        # drop whatever is left unsent, as anyio does
        await asyncio.sleep(0)
        transport.abort()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if self._unsent:
            await self._send_unsent()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError as exc:
            self._transport.close()
            raise httpcore.ConnectTimeout("TLS handshake timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(str(exc)) from exc
        assert transport is not None
        self._protocol.transport = transport  # flow control now goes through the TLS layer
        return _Stream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # An idle connection is readable once the peer closed it or sent something unasked;
            # the socket is asked too, for a close the loop has not delivered yet.
            if self._protocol.eof or self._protocol.buffer:
                return True
            sock = self._transport.get_extra_info("socket")
            return sock is None or _socket_readable(sock)
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend on the running asyncio loop (see the module docstring)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address else None
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    _Protocol, host, port, local_addr=local
                )
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():
            with contextlib.suppress(OSError):
                sock.setsockopt(*option)
        return _Stream(transport, protocol)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_unix_connection(_Protocol, path)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"connecting to {path} timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return _Stream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

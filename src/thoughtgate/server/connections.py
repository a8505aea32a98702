"""Connection limits for ``thoughtgate serve``: no client can hold the daemon's sockets hostage.

uvicorn alone never closes a connection that sends nothing (its keep-alive timer starts only after
a first response) and accepts until the process runs out of file descriptors; from then on every
``accept`` fails and the daemon is unreachable, also for honest clients. So each connection made by
``thoughtgate serve`` is wrapped (:func:`guarded_protocol`, around uvicorn's own HTTP protocol):

* ``header_timeout_s``: a request head must be complete this long after the connection opened (or
  after the previous response); a silent or trickling ("slowloris") connection is closed.
* ``max_header_bytes``: a request head longer than this is answered ``431`` and the connection
  closed; uvicorn's httptools protocol (the daemon's) has no limit of its own, and held 1.9 GB of
  one connection's header lines within the head's deadline (ADR 0147).
* ``body_timeout_s``: a request whose body is still arriving when the head's deadline passes
  gets this long more for the rest of it, then ``408`` and the connection is closed; a body that
  trickles in holds no connection (nor the bytes read of it) for ever (ADR 0147).
* ``idle_timeout_s``: an idle keep-alive connection closes after this long (uvicorn's
  ``timeout_keep_alive``).
* ``max_connections``: at most this many open connections, kept below the open-file limit
  (:func:`connection_budget`). A new connection beyond it closes the oldest connection that is not
  in the middle of a request (one that never sent a request, or an idle keep-alive one) so the
  newcomer is served; when every connection is busy (live streams, say) the newcomer is answered
  ``503`` and closed. A flood of unused connections therefore never locks honest clients out.

This is the connection-level equivalent of uvicorn's ``limit_concurrency``, which would answer
``503`` to everyone as soon as idle connections fill the limit.

A request uvicorn cannot parse is answered ``400`` here too, as JSON with the headers of every
answer of the daemon's (uvicorn's own answer has none of them, ADR 0164).

With ``server.cors_origins`` listed, the ``400``, ``408`` and ``431`` written here name the
listed origin the request's head sent, as far as it was parsed, as the app's answers do, so a
browser's script reads their status (ADR 0170). The ``503`` of a connection refused at its
accept cannot: no request of it was read, so no origin is known, and naming a listed one
regardless would tell it to anyone; a browser's script sees a network error there.

On uvicorn's httptools protocol (the daemon's), the head of a response that gives its length is
also held until its body is written, so that the two leave in one write (:class:`_HeldHead`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from thoughtgate.server.cors import allow_lines

__all__ = ["ConnectionLimits", "connection_budget", "guarded_protocol"]

log = logging.getLogger("thoughtgate.server")

_MIN_SPARE_FILES = 16
_SPARE_FILES = 128
"""Descriptors kept for everything but client connections: the store, provider calls, logs."""

_BODY = json.dumps(
    {
        "error": {
            "code": "unavailable",
            "message": "too many connections (server.max_connections); try again shortly",
        }
    }
).encode()
_NOT_KEPT = b"cache-control: no-store\r\nx-content-type-options: nosniff\r\n"
"""As every answer of the app's (``server.responses.NOT_KEPT``, ADR 0159)."""
_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    + _NOT_KEPT
    + b"connection: close\r\nretry-after: 1\r\ncontent-length: "
    + str(len(_BODY)).encode()
    + b"\r\n\r\n"
    + _BODY
)


def _error_answer(status: str, code: str, message: str, cors: bytes = b"") -> bytes:
    """A JSON error answer the connection writes itself, closing the connection after it.
    ``cors``: its CORS header lines (``server.cors.allow_lines``), for a listed origin."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return (
        b"HTTP/1.1 %b\r\ncontent-type: application/json\r\n%b%bconnection: close\r\n"
        b"content-length: %d\r\n\r\n%b" % (status.encode(), _NOT_KEPT, cors, len(body), body)
    )


def _too_slow(body_timeout_s: float) -> tuple[str, str, str]:
    """The ``408`` a request gets whose body did not arrive in time (written by the connection,
    not the app: the app is still waiting for that body)."""
    return (
        "408 Request Timeout",
        "request_timeout",
        "the request body did not arrive in time (server.body_timeout_s: "
        f"{body_timeout_s:g} s after server.header_timeout_s)",
    )


def _head_sent(conn: Any) -> Sequence[tuple[bytes, bytes]]:
    """The request head's headers as far as they were read: the current request's, or those
    uvicorn's httptools protocol parsed of a head still arriving (h11 parses none before the
    head is whole)."""
    cycle = conn.cycle
    if cycle is not None and not cycle.response_complete:
        return list(cycle.scope.get("headers") or ())
    return list(getattr(conn, "headers", None) or ())


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    body_timeout_s: float = 30.0
    max_header_bytes: int = 64 * 1024
    cors_origins: frozenset[str] = frozenset()
    """``server.cors_origins``: the connection's own answers name a listed origin the request
    sent, as the app's do (ADR 0170)."""


def connection_budget(configured: int) -> tuple[int, int | None]:
    """``(max_connections, open_file_limit)``: ``configured``, lowered to fit the process's
    open-file limit with room to spare. Raises the soft limit towards the hard one first when it
    is too low (as servers commonly do), so a default ``ulimit -n 1024`` does not cap a daemon
    that the system would let hold more."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to read or raise
        return configured, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = configured + _SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError):  # keep the limit we have
                pass
    if soft == resource.RLIM_INFINITY:
        return configured, None
    spare = max(_MIN_SPARE_FILES, min(_SPARE_FILES, soft // 4))
    return max(1, min(configured, soft - spare)), int(soft)


class _HeldHead:
    """The transport one response of uvicorn's httptools protocol writes to, until its head has
    gone out: the head of a response with a ``Content-Length`` (every JSON answer: a run's
    creation, a ticket) is held and written with the body's first write, in one write; a
    streamed response's (chunked: the live channel) is held until the end of the loop's step,
    and written with the first chunk sent in that step, or alone (ADR 0091).

    Why: uvicorn writes a response's head as soon as the app starts the response, and its body
    at the next message, two writes for one answer; each write is a system call that wakes the
    client, and on a busy machine a woken client may take the CPU from the daemon (ADR 0032).
    The body follows the head within the same ASGI send sequence, so holding the head delays
    nothing a client could use. A live stream whose first page is read already sends it in the
    step that starts the response; one with nothing to send yet still sends its head, in the
    loop's next turn, as it waits. A ``HEAD`` request's head, or any write before the head
    (``100 Continue``), goes out at once. After its first write the response writes to the
    connection's transport directly (``cycle.transport`` is put back), so the live stream's
    direct writes (``server.sse``) see the transport itself. A close before the body sends the
    held head first, as it was written before.
    """

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        cycle = self._cycle
        head = self._head
        if head is not None:  # the body: with the head, in one write
            self._head = None
            cycle.transport = self._transport
            self._transport.write(head + data)
            return
        if (
            cycle.response_started
            and not cycle.response_complete
            and cycle.transport is self
            and cycle.scope["method"] != "HEAD"
        ):
            self._head = bytes(data)
            if cycle.chunked_encoding is not False:  # streamed: out by the step's end
                asyncio.get_running_loop().call_soon(self._send_head)
            return
        cycle.transport = self._transport
        self._transport.write(data)

    def _send_head(self) -> None:
        """A streamed response's head that no chunk followed in its step: alone, now."""
        head = self._head
        if head is not None:
            self._head = None
            self._cycle.transport = self._transport
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head)
        self._cycle.transport = self._transport
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(base: type[asyncio.Protocol], limits: ConnectionLimits) -> type[Any]:
    """uvicorn's HTTP protocol class ``base`` with the header timeout and the connection limit.

    Relies on what uvicorn's h11 and httptools protocols share: ``connections`` (the server's
    open connections), ``cycle`` (the current request, ``response_complete`` once answered),
    ``transport``, ``loop``, ``on_response_complete`` and ``send_400_response``; and, for
    :class:`_HeldHead`, on the httptools protocol's ``on_headers_complete`` and its cycle's
    ``transport``, ``response_started``, ``chunked_encoding``, ``response_complete`` and
    ``scope``.
    """

    too_slow = _too_slow(limits.body_timeout_s)
    too_long = (
        "431 Request Header Fields Too Large",
        "header_too_large",
        f"the request head is longer than {limits.max_header_bytes} bytes "
        "(server.max_header_bytes)",
    )
    origins = limits.cors_origins

    class Guarded(base):  # type: ignore[valid-type, misc]
        _tg_waiting_since: float = 0.0
        _tg_waiting_for: object = None
        _tg_body_of: object = None
        _tg_head_bytes: int = 0
        _tg_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if _over_limit(self.connections, limits.max_connections) and not _make_room(self):
                log.warning(
                    "refused a connection: server.max_connections (%d) are open and all busy",
                    limits.max_connections,
                )
                transport.write(_TOO_MANY)
                transport.close()
                return
            self._tg_wait_for_request()

        def data_received(self, data: bytes) -> None:
            """Count the bytes of a head still arriving: those that come while no body is (a
            head's, even a pipelined one's), until a head is complete."""
            before = self.cycle
            counted = before is None or not before.more_body
            super().data_received(data)
            if self.cycle is not before:
                self._tg_head_bytes = 0
            elif counted:
                self._tg_head_bytes += len(data)
                if self._tg_head_bytes > limits.max_header_bytes:
                    self._tg_head_too_long(before)

        def _tg_head_too_long(self, cycle: Any) -> None:
            self._tg_head_bytes = 0
            if self.transport.is_closing():
                return
            log.info("closed a connection whose request head passed server.max_header_bytes")
            if cycle is None or cycle.response_complete:  # nothing else is being answered
                self.transport.write(
                    _error_answer(*too_long, allow_lines(origins, self.headers_sent()))
                )
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to bytes that are no HTTP request (its parser's error), in the
            daemon's words and with the headers of every answer (ADR 0164): uvicorn's own is
            ``text/plain`` with none of them. The words are uvicorn's, fixed ASCII ("Invalid
            HTTP request received."), never the bytes received."""
            if self.transport.is_closing():
                return
            cors = allow_lines(origins, self.headers_sent())
            self.transport.write(_error_answer("400 Bad Request", "bad_request", msg, cors))
            self.transport.close()

        def headers_sent(self) -> Sequence[tuple[bytes, bytes]]:
            return _head_sent(self) if origins else ()

        def on_headers_complete(self) -> None:  # uvicorn's httptools protocol only
            before = self.cycle
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not before and hasattr(cycle, "chunked_encoding"):
                cycle.transport = _HeldHead(cycle.transport, cycle)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._tg_wait_for_request()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._tg_timer is not None:
                self._tg_timer.cancel()
                self._tg_timer = None
            super().connection_lost(exc)

        def _tg_wait_for_request(self) -> None:
            if self._tg_timer is not None:
                self._tg_timer.cancel()
            self._tg_waiting_since = time.monotonic()
            self._tg_waiting_for = self.cycle  # a new request head replaces the cycle
            self._tg_timer = self.loop.call_later(limits.header_timeout_s, self._tg_no_request)

        def _tg_no_request(self) -> None:
            """The head's deadline (then, for a body still arriving, the body's) has passed."""
            self._tg_timer = None
            if self.transport.is_closing():
                return
            if _waiting(self):
                self.transport.close()
                return
            cycle = self.cycle
            if not _reading_body(cycle):
                return  # the request is in: its answer is the app's business
            if cycle is not self._tg_body_of:  # the body's own deadline starts now
                self._tg_body_of = cycle
                self._tg_timer = self.loop.call_later(limits.body_timeout_s, self._tg_no_request)
                return
            log.info("closed a connection whose request body did not arrive in time")
            self.transport.write(
                _error_answer(*too_slow, allow_lines(origins, self.headers_sent()))
            )
            self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def _waiting(conn: Any) -> bool:
    """No request head has arrived since the connection began waiting for one."""
    cycle = conn.cycle
    return bool(cycle is conn._tg_waiting_for and (cycle is None or cycle.response_complete))


def _reading_body(cycle: Any) -> bool:
    """A request whose body has not all arrived and that nothing was answered to yet (an app
    that answers without reading the body, a ``401``, is not kept waiting on it)."""
    return bool(
        cycle is not None
        and getattr(cycle, "more_body", False)
        and not getattr(cycle, "response_started", True)
    )


def _over_limit(connections: set[Any], limit: int) -> bool:
    """More than ``limit`` open, not counting those already closing (they leave the set on the
    next turn of the loop)."""
    if len(connections) <= limit:
        return False
    return sum(not c.transport.is_closing() for c in connections) > limit


def _make_room(newcomer: Any) -> bool:
    """Close the connection that has waited longest for a request; ``False`` if none waits."""
    oldest: Any = None
    for conn in newcomer.connections:
        if conn is newcomer or conn.transport.is_closing() or not _waiting(conn):
            continue
        if oldest is None or conn._tg_waiting_since < oldest._tg_waiting_since:
            oldest = conn
    if oldest is None:
        return False
    oldest.transport.close()
    return True

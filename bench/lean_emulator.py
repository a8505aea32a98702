"""The bench emulator's lean HTTP/1.1 server (ADR 0133): the ASGI emulator's answers, replayed.

The bench's emulator stands in for a remote provider, whose CPU is not the daemon's machine's;
on the bench's two shared cores every microsecond the emulator spends is taken from the daemon
(or LiteLLM's proxy) being measured. uvicorn, Starlette and the format modules rebuilt each
answer per request (JSON encoding of every event, request parsing, routing, a coroutine and an
ASGI message per write); the answers are the same for the same request, so this server renders
each distinct request once, through :mod:`thoughtgate.testing.emulator`'s own ASGI application
in process, and from then on writes the recorded bytes on the request's :class:`Pace`.

What decides an answer is keyed exactly (:func:`_key`): method, target, body bytes and the
headers the emulator reads (``x-emulator-scenario``, ``x-emulator-flavor``, whether a key and an
``anthropic-version`` are sent). A miss renders the request three times; bytes that differ
between the renders are ids the emulator makes fresh per request (Anthropic's ``msg_01Emu…``
and ``request-id``, the OpenAI formats' ``x-request-id``): each is a run of lowercase hex, and
each answer gets fresh hex of the same length there. An answer whose renders differ otherwise
(in length) is not replayed but rendered for each request. Everything else is byte for byte the
ASGI emulator under uvicorn: status line, ``date`` and ``server`` headers, the application's
headers, chunked framing with one chunk per ASGI body message, errors (404, 405, 400 in the
format's shape) included.

Pacing, stamp and trace are :func:`bench.emulator_process._paced`'s (on :mod:`bench.emulator_pace`): the body messages before the
first one holding ``STAMP`` go out with the headers at once; from that one on, they go out in
the writes :func:`~bench.emulator_pace.paced_writes` makes of them (a delta each, its framing
with it, ADR 0150), each write on its slot of the request's :class:`Pace` (made when the request
has arrived whole), the first with ``STAMP`` replaced by the send time; ``BENCH_TRACE`` records
the same fields.

Served: HTTP/1.1 (and 1.0) with ``Content-Length`` bodies, keep-alive, ``Connection: close``,
requests arriving while an answer streams (handled after it). Not served, with a 400 and the
connection closed (never a hang): a malformed request line or header, a ``Transfer-Encoding``
request body, a head over 64 KiB; a ``x-emulator-scenario`` naming a built-in scenario (the bench
scenario only; their ``Sleep`` and ``Cut`` steps are not replayed) gets a 400 in the format's
error shape. An application error is uvicorn's 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import os
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from bench.emulator_pace import (
    GAP_S,
    PROVIDER_TTFB_S,
    STAMP,
    TERMINAL,
    Pace,
    paced_writes,
    stamp,
    trace_write,
)

__all__ = ["Answer", "LeanServer", "lean_server", "render", "serve_forever"]

_PLACEHOLDER = STAMP.encode()
_HEX = frozenset(b"0123456789abcdef")
_MAX_HEAD = 64 * 1024
_RENDERS = 3
_CACHE = 256
_MANY = 64
"""Distinct requests rendered after which the server says so on stderr: a bench sends a few
kinds (four formats, streamed or not); more means a client's bodies vary per request (an id,
a time), every one is a miss, and the emulator's CPU a request is the ASGI emulator's three
times over -- charged to that client's phase on the shared cores, which would skew a
comparison (a baseline's figure made worse by the emulator, not by itself)."""


def _status_line(status: int) -> bytes:
    # uvicorn's STATUS_LINE: the reason phrase from http.HTTPStatus
    try:
        phrase = HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


# ----------------------------------------------------------------------------- rendering


@dataclass(slots=True)
class _Rendered:
    """One answer of the ASGI application: status, headers, and each body message."""

    status: int
    headers: list[tuple[bytes, bytes]]
    bodies: list[tuple[bytes, bool]]  # (body, more_body)


async def _asgi_once(
    app: Any,
    method: str,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> _Rendered:
    """Drive ``app`` with one request in process, as uvicorn would, and collect its answer."""
    parsed = urllib.parse.urlsplit(target)
    path = parsed.path.decode("latin-1")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 0),
        "client": ("127.0.0.1", 0),
        "scheme": "http",
        "root_path": "",
        "method": method,
        "path": urllib.parse.unquote(path) if "%" in path else path,
        "raw_path": parsed.path,
        "query_string": parsed.query,
        "headers": headers,
        "state": {},
    }
    given = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # no disconnect: the response's listener is cancelled when it ends
        raise AssertionError("unreachable")

    out = _Rendered(0, [], [])

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out.status = int(message["status"])
            out.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            out.bodies.append((bytes(message.get("body", b"")), message.get("more_body", False)))

    try:
        await app(scope, receive, send)
    except Exception:  # uvicorn's answer to an application error before its response
        if out.status:
            raise
        return _Rendered(
            500,
            [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"21"),
                (b"connection", b"close"),
            ],
            [(b"Internal Server Error", False)],
        )
    return out


def _hex_spans(renders: list[bytes]) -> list[tuple[int, int]] | None:
    """The runs of lowercase hex that differ between ``renders`` of one part (``None`` when
    they differ in length or anywhere outside such a run)."""
    first = renders[0]
    if any(len(r) != len(first) for r in renders):
        return None
    spans: list[tuple[int, int]] = []
    for i in range(len(first)):
        if all(r[i] == first[i] for r in renders) or (spans and i < spans[-1][1]):
            continue
        if any(r[i] not in _HEX for r in renders):
            return None
        start, end = i, i + 1
        while start > 0 and all(r[start - 1] in _HEX for r in renders):
            start -= 1
        while end < len(first) and all(r[end] in _HEX for r in renders):
            end += 1
        spans.append((start, end))
    return spans


class _Part:
    """Bytes with runs of hex filled afresh on each :meth:`fill`."""

    __slots__ = ("pieces", "plain")

    def __init__(self, data: bytes, spans: list[tuple[int, int]]) -> None:
        self.plain = data if not spans else None
        pieces: list[bytes | int] = []
        at = 0
        for start, end in spans:
            pieces += [data[at:start], end - start]
            at = end
        pieces.append(data[at:])
        self.pieces = pieces

    def fill(self) -> bytes:
        if self.plain is not None:
            return self.plain
        return b"".join(
            p if isinstance(p, bytes) else os.urandom((p + 1) // 2).hex()[:p].encode()
            for p in self.pieces
        )


def _framed(body: bytes, more: bool, chunked: bool) -> bytes:
    """A body message as uvicorn writes it."""
    if not chunked:
        return body
    framed = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
    return framed if more else framed + b"0\r\n\r\n"


class Answer:
    """One request's answer, ready to write: its status line, its headers after the default
    ones, the body messages before the first paced one (``pre``), and the paced writes
    (``paced``, each with whether it holds the terminal event). ``replayable``: the renders it
    was made from differed only in fresh ids, so it answers every request like its own."""

    __slots__ = ("chunked", "close", "headers", "paced", "pre", "replayable", "status_line")

    def __init__(self, renders: list[_Rendered]) -> None:
        first = renders[0]
        self.status_line = _status_line(first.status)
        self.chunked = chunked = first.status not in (204, 304) and all(
            k.lower() != b"content-length" for k, _ in first.headers
        )
        self.close = any(
            k.lower() == b"connection" and b"close" in v.lower() for k, v in first.headers
        )
        alike = len({(r.status, len(r.headers), len(r.bodies)) for r in renders}) == 1
        self.replayable = alike
        if not alike:
            renders = renders[:1]
        versions = [
            [_header_bytes(r.headers)] + [_framed(*b, chunked) for b in r.bodies] for r in renders
        ]
        parts: list[_Part] = []
        for index, data in enumerate(versions[0]):
            spans = _hex_spans([v[index] for v in versions])
            if spans is None:
                self.replayable, spans = False, []
            parts.append(_Part(data, spans))
        self.headers = parts[0]
        bodies = [body for body, _ in first.bodies]
        start, writes = paced_writes(bodies)
        self.pre = parts[1 : 1 + start]
        self.paced: list[tuple[_Part, bool]] = [
            (
                _Joined([parts[1 + i] for i in write]) if len(write) > 1 else parts[1 + write[0]],
                any(t in bodies[i] for i in write for t in TERMINAL),
            )
            for write in writes
        ]

    def head(self, date: bytes, closing: bool, head_only: bool = False) -> bytes:
        """The status line and headers as uvicorn writes them: ``date`` and ``server`` first,
        ``connection: close`` when the client asked for it and the application did not say
        it, ``transfer-encoding: chunked`` when the application sent no length (and the
        request was not a ``HEAD``)."""
        close = b"connection: close\r\n" if closing and not self.close else b""
        chunked = b"transfer-encoding: chunked\r\n" if self.chunked and not head_only else b""
        return self.status_line + date + self.headers.fill() + close + chunked + b"\r\n"


def _header_bytes(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(b"%s: %s\r\n" % (k.lower(), v) for k, v in headers)


class _Joined(_Part):
    """Body messages written as one (:func:`~bench.emulator_pace.paced_writes`)."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[_Part]) -> None:
        self.parts, self.plain = parts, None

    def fill(self) -> bytes:
        return b"".join(part.fill() for part in self.parts)


async def render(
    app: Any, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> Answer:
    """The answer to one request, from ``app`` rendered :data:`_RENDERS` times."""
    return Answer([await _asgi_once(app, method, target, headers, body) for _ in range(_RENDERS)])


# ----------------------------------------------------------------------------- serving


def _key(method: bytes, target: bytes, headers: dict[bytes, bytes], body: bytes) -> tuple[Any, ...]:
    """What the ASGI emulator's answer depends on (:mod:`thoughtgate.testing.emulator` reads
    these headers and no others)."""
    return (
        method,
        target,
        headers.get(b"x-emulator-scenario"),
        headers.get(b"x-emulator-flavor"),
        bool(headers.get(b"x-api-key") or headers.get(b"authorization")),
        bool(headers.get(b"anthropic-version")),
        body,
    )


class _State:
    """The server's shared state: the emulator, its answers by request, the date header."""

    def __init__(self, emulator: Any) -> None:
        from thoughtgate.testing.emulator.scenarios import builtin_scenarios

        self.emulator = emulator
        self.app = emulator.app  # built once (the property builds a new application)
        self.refused = frozenset(builtin_scenarios()) - set(emulator.scenarios)
        self.answers: dict[tuple[Any, ...], asyncio.Future[Answer]] = {}
        self.rendered = 0
        self._second = -1
        self._date = b""

    def date(self) -> bytes:
        """uvicorn's default headers, the date's text made once a second as uvicorn does."""
        now = int(time.time())
        if now != self._second:
            self._second = now
            when = email.utils.formatdate(now, usegmt=True).encode()
            self._date = b"date: %s\r\nserver: uvicorn\r\n" % when
        return self._date

    async def answer(
        self,
        method: bytes,
        target: bytes,
        headers: dict[bytes, bytes],
        pairs: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> Answer:
        """The answer to a request that was not found ready: rendered (the first of its kind),
        or awaited (one rendering for the requests that arrive while it renders)."""
        key = _key(method, target, headers, body)
        pending = self.answers.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        if len(self.answers) >= _CACHE:
            self.answers.clear()
        self.answers[key] = future
        try:
            answer = await render(self.app, method.decode("latin-1"), target, pairs, body)
        except BaseException as exc:
            self.answers.pop(key, None)
            future.set_exception(exc)
            future.exception()  # retrieved here: the waiters get it from their own await
            raise
        finally:
            self.emulator.requests.clear()  # the log the ASGI emulator keeps: not kept here
        if not answer.replayable:
            self.answers.pop(key, None)
        self.rendered += 1
        if self.rendered == _MANY:
            print(
                f"bench emulator: {_MANY} distinct requests rendered; a client's requests vary "
                "(each is rendered, not replayed): its figures include the emulator's extra CPU",
                file=sys.stderr,
                flush=True,
            )
        future.set_result(answer)
        return answer

    def ready(
        self, method: bytes, target: bytes, headers: dict[bytes, bytes], body: bytes
    ) -> Answer | None:
        found = self.answers.get(_key(method, target, headers, body))
        return (
            found.result() if found is not None and found.done() and not found.exception() else None
        )


def _plain(status: int, message: bytes) -> bytes:
    """uvicorn's own answer to a request it cannot serve (and the connection closed)."""
    return (
        b"%scontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (_status_line(status), len(message), message)
    )


@dataclass(slots=True)
class _Reply:
    """One answer being written: its schedule, its trace record, the next paced message."""

    answer: Answer
    pace: Pace
    traced: dict[str, Any] | None
    closing: bool
    index: int = 0


class _Connection(asyncio.Protocol):
    """One client connection: parse a request, answer it (paced), then the next."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.continued = False
        self.head_only = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's is no subclass)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    def _refuse(self, message: bytes, status: int = 400) -> None:
        """A request this server cannot read (400) or answer (500); the connection closed."""
        self.busy = True
        if self.transport is not None:
            self.transport.write(_plain(status, message))
            self.transport.close()

    def _next_request(self) -> None:
        buffer = self.buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > _MAX_HEAD:
                self._refuse(b"Request head too large")
            return
        lines = bytes(buffer[:end]).split(b"\r\n")
        request_line = lines[0].split(b" ")
        if len(request_line) != 3 or request_line[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            self._refuse(b"Invalid HTTP request received.")
            return
        method, target, version = request_line
        headers: dict[bytes, bytes] = {}
        pairs: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                self._refuse(b"Invalid HTTP request received.")
                return
            name, value = name.lower(), value.strip(b" \t")
            headers[name] = value
            pairs.append((name, value))
        if b"transfer-encoding" in headers:
            self._refuse(b"Request bodies with Transfer-Encoding are not served")
            return
        length = headers.get(b"content-length", b"0")
        if not length.isdigit():
            self._refuse(b"Invalid Content-Length")
            return
        size = end + 4 + int(length)
        if len(buffer) < size:  # the body is still coming
            if headers.get(b"expect", b"").lower() == b"100-continue" and not self.continued:
                self.continued = True
                if self.transport is not None:
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        self.continued = False
        body = bytes(buffer[end + 4 : size])
        del buffer[:size]
        connection = headers.get(b"connection", b"").lower()
        closing = version == b"HTTP/1.0" or b"close" in connection  # as uvicorn decides
        self.head_only = method == b"HEAD"
        self.busy = True
        # made as the ASGI wrapper makes them: when the application gets the request
        traced: dict[str, Any] | None = {"e_start": time.monotonic()} if _TRACE else None
        pace = Pace(PROVIDER_TTFB_S, GAP_S)
        state = self.state
        if headers.get(b"x-emulator-scenario", b"").decode("latin-1") in state.refused:
            self._answer(_refused(target, state.refused), pace, traced, closing)
            return
        answer = state.ready(method, target, headers, body)
        if answer is not None:
            self._answer(answer, pace, traced, closing)
            return
        task = asyncio.ensure_future(state.answer(method, target, headers, pairs, body))
        task.add_done_callback(lambda done: self._rendered(done, pace, traced, closing))

    def _rendered(
        self, task: asyncio.Future[Answer], pace: Pace, traced: dict[str, Any] | None, closing: bool
    ) -> None:
        if task.cancelled() or task.exception() is not None:
            self._refuse(b"Internal Server Error", 500)
            return
        self._answer(task.result(), pace, traced, closing)

    def _answer(
        self, answer: Answer, pace: Pace, traced: dict[str, Any] | None, closing: bool
    ) -> None:
        if self.transport is None:
            return
        closing = closing or answer.close
        head = answer.head(self.state.date(), closing, self.head_only)
        if self.head_only:  # uvicorn writes no body for HEAD
            self.transport.write(head)
            self._done(closing)
            return
        self.transport.write(head + b"".join(p.fill() for p in answer.pre))
        self._pace(_Reply(answer, pace, traced, closing))

    def _pace(self, reply: _Reply) -> None:
        """Write the reply's next paced message and those after it, each on its slot (at once
        when the slot has passed: a late write goes out as soon as it can, the next keeps its
        own)."""
        paced = reply.answer.paced
        while reply.index < len(paced):
            due = reply.pace.due
            delay = reply.pace.wait_s()
            if delay > 0:
                self.timer = asyncio.get_running_loop().call_later(delay, self._on_slot, reply, due)
                return
            self._write(reply, due)
        self._done(reply.closing)

    def _on_slot(self, reply: _Reply, due: float) -> None:
        self.timer = None
        if self.transport is None:
            return
        self._write(reply, due)
        self._pace(reply)

    def _write(self, reply: _Reply, due: float) -> None:
        """The reply's next paced message; the first with its stamp (every copy of the
        placeholder in it: OpenRouter mirrors reasoning in two fields). The trace's fields are
        ``_paced``'s."""
        assert self.transport is not None
        index, traced = reply.index, reply.traced
        reply.index += 1
        part, terminal = reply.answer.paced[index]
        data = part.fill()
        if index == 0:
            sent = stamp()
            data = data.replace(_PLACEHOLDER, sent.encode())
            if traced is not None:
                traced.update(key=sent[1:], e_due_first=due)
        if traced is not None:
            now = time.monotonic()
            traced["e_last_write"] = now
            if terminal:
                traced.setdefault("e_terminal", now)
            else:
                traced["e_last_nonterminal"] = now
        self.transport.write(data)
        if traced is not None:
            traced.setdefault("e_first_written", time.monotonic())
            if reply.index == len(reply.answer.paced):
                traced["e_end"] = time.monotonic()
                trace_write(traced, _TRACE)

    def _done(self, closing: bool) -> None:
        self.busy = False
        if self.transport is None:
            return
        if closing:
            self.transport.close()
        elif self.buffer:
            self._next_request()


def _refused(target: bytes, refused: frozenset[str]) -> Answer:
    """A 400 in the format's error shape for a built-in scenario asked for by name."""
    message = (
        "the bench emulator serves the bench scenario only; the built-in scenarios ("
        + ", ".join(sorted(refused))
        + ") are thoughtgate.testing.emulator's"
    )
    error = {"type": "invalid_request_error", "message": message}
    if urllib.parse.urlsplit(target).path.endswith(b"/messages"):
        body: dict[str, Any] = {"type": "error", "error": error}
    else:
        body = {"error": {**error, "param": None, "code": None}}
    raw = json.dumps(body).encode()
    headers = [(b"content-length", str(len(raw)).encode()), (b"content-type", b"application/json")]
    return Answer([_Rendered(400, headers, [(raw, False)])])


_TRACE = os.environ.get("BENCH_TRACE")


# ----------------------------------------------------------------------------- entry points


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed (the daemon's loop), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def _start(emulator: Any, host: str, port: int) -> asyncio.Server:
    state = _State(emulator)
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _Connection(state), host, port)


def serve_forever(emulator: Any, host: str, on_port: Any) -> None:
    """Serve ``emulator`` on ``host`` (a free port, passed to ``on_port``) until killed."""

    async def main() -> None:
        server = await _start(emulator, host, 0)
        on_port(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    with asyncio.Runner(loop_factory=_new_loop) as runner:
        runner.run(main())


class LeanServer:
    """The lean server in a thread of this process (tests): ``url`` once started."""

    def __init__(self, emulator: Any, host: str = "127.0.0.1") -> None:
        self.emulator, self.host = emulator, host
        self.loop = _new_loop()
        self.server: asyncio.Server | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://{self.host}:{self.server.sockets[0].getsockname()[1]}"

    def start(self) -> LeanServer:
        self.thread.start()
        started = asyncio.run_coroutine_threadsafe(_start(self.emulator, self.host, 0), self.loop)
        self.server = started.result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self.server is not None:
                self.server.close()
                self.server.close_clients()  # type: ignore[attr-defined]

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@contextlib.contextmanager
def lean_server(emulator: Any, host: str = "127.0.0.1") -> Iterator[LeanServer]:
    server = LeanServer(emulator, host).start()
    try:
        yield server
    finally:
        server.stop()

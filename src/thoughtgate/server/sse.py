"""The live channel: one encoder for an event, the per-connection frame stream, and its transport.

Frames: ``id: <seq>`` and ``data: <the event envelope as JSON>`` (the same shape as
``GET /v1/runs/{id}/events``); no ``event:`` name, so a browser's ``onmessage`` gets them all.

Each connection is one task. ``live_frames`` takes the events after the reader's cursor that are
ready now from a :class:`~thoughtgate.server.fanout.LiveReader` (stored events first, then the
run's shared feed: one store read per event however many readers follow the run, each frame
filtered and encoded once per role), passes them through the one output filter and yields them
as one chunk; :class:`LiveResponse` writes each chunk with one socket write. So a slow reader
never slows the run (the run writes to the store, and the feed hands events to readers without
waiting) nor other readers, and holds at most the feed's backlog in memory (past it, it reads
the store later). A reader that takes no chunk for ``lag_timeout_s`` while ``queue_size`` or more
events wait for it is sent an ``event: lagging`` frame whose data names the last ``id`` it was
sent, and closed; it resumes from there with ``Last-Event-ID`` and loses nothing, because nothing
is ever dropped from the log.

A stream that follows a run is also let go while the store refuses writes (ADR 0151): nothing more
of any run can be recorded then, so once it has sent what is stored it ends with an ``event:
failed`` frame naming the last ``id`` it was sent (as a read that fails does), and the client
resumes from there once the store takes writes again.
``LiveStreams`` asks the store (``write_refusal``: no query) once a tick for every stream.

A stream is also ended when its reader's access goes: ``watch_access`` registers a callback (the
daemon's ``AccessWatch``) that, once the ticket's key is revoked or loses the role, makes the
stream send nothing more but an ``event: access_revoked`` frame whose data says why. A finished
run (``follow=False``) is replayed up to its last stored event and the response ends there,
terminal event or not. The chunk a stream ends with goes out with the response's end, in one
write (ADR 0085): the feed writes the run's terminal event and ends the response in the commit's
own step (``DirectWrites.end``), or the stream's task sends a :class:`LastChunk` as the last
body; so a client reads its run's end in one wake, and sooner.

Why not sse-starlette's ``EventSourceResponse`` (ADR 0014): it runs four tasks per connection
and an anyio cancel scope per write, which made the stream route the daemon's largest cost after
SQLite (docs/benchmarks.md). :class:`LiveResponse` keeps what it gave us: keep-alive comments
(``ping_s``), the end of the stream when the client disconnects, a write blocked for
``send_timeout_s`` closing the connection, and every stream ending when the server shuts down
(``LiveStreams.stop_all``), with one ticker per app instead of timers per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from thoughtgate.access.filter import event_filter, reads_apart
from thoughtgate.access.roles import Role
from thoughtgate.events.schema import Event, is_run_terminal
from thoughtgate.server.access_watch import OnAccessLost
from thoughtgate.server.fanout import FirstPage, LiveReader, RunFeeds
from thoughtgate.store import codec
from thoughtgate.store.base import EventStore

__all__ = [
    "PING",
    "SERVER_SEND",
    "DirectWrites",
    "LastChunk",
    "LiveResponse",
    "LiveStreams",
    "encode_event",
    "event_frame",
    "frame_bytes",
    "live_frames",
]

log = logging.getLogger("thoughtgate.server")

_LAGGING: Final = "lagging"
_FAILED: Final = "failed"
_REVOKED: Final = "access_revoked"
PING: Final = b": ping\r\n\r\n"
"""A keep-alive comment line (readers ignore it)."""


class LastChunk(bytes):
    """A stream's last chunk (it ends with the run's terminal event, or a finished run's last
    stored one): :class:`LiveResponse` sends it with the response's end, in one write."""

    __slots__ = ()


def encode_event(event: Event) -> dict[str, Any]:
    """An (already filtered) event as SSE fields: ``id`` is its sequence number."""
    return {"id": str(event.seq), "data": _envelope_json(event)}


def _envelope_json(event: Event) -> str:
    payload = event.payload if type(event.payload) is dict else dict(event.payload)
    return codec.dumps(
        {
            "seq": event.seq,
            "run_id": event.run_id,
            "task_id": event.task_id,
            "type": event.type,
            "ts": event.ts,
            "v": event.v,
            "payload": payload,
        },
        what="event",
    )


def event_frame(event: Event) -> bytes:
    """One SSE frame for an (already filtered) event: ``frame_bytes(encode_event(event))``.

    JSON text never holds a raw line break (it escapes them), so the data is one line.
    """
    return b"id: %d\r\ndata: %s\r\n\r\n" % (event.seq, _envelope_json(event).encode("utf-8"))


def frame_bytes(fields: dict[str, Any]) -> bytes:
    """A frame from SSE fields (``id``, ``event``, ``data``, in that order); data with line
    breaks becomes several ``data:`` lines."""
    lines = [f"{name}: {fields[name]}\r\n" for name in ("id", "event") if name in fields]
    if "data" in fields:
        lines += [f"data: {line}\r\n" for line in str(fields["data"]).splitlines() or [""]]
    return ("".join(lines) + "\r\n").encode("utf-8")


def _note(kind: str, **data: Any) -> bytes:
    return frame_bytes({"event": kind, "data": json.dumps({"reason": kind, **data})})


async def live_frames(
    store: EventStore,
    run_id: str,
    *,
    role: Role,
    mode: str,
    after: int,
    queue_size: int = 256,
    lag_timeout_s: float = 10.0,
    feeds: RunFeeds | None = None,
    follow: bool = True,
    watch_access: Callable[[OnAccessLost], Callable[[], None]] | None = None,
    ping_s: float | None = None,
    streams: LiveStreams | None = None,
    direct: DirectWrites | None = None,
    first_page: FirstPage | None = None,
) -> AsyncIterator[bytes]:
    """Chunks of frames for one connection: replay after ``after``, then live, until the terminal
    event (``follow=False``: only what is stored now), or until ``watch_access`` reports lost
    access. With ``ping_s``, a keep-alive comment after that long without a frame (timed by
    ``streams``' ticker when given, else by a timer per wait). With ``direct`` (filled by the
    :class:`LiveResponse` that sends these chunks), live events published while this stream
    waits are written by the feed at once, through the same filter, instead of yielded.
    ``first_page``: ``feeds.first_page(run_id, after)`` read already."""
    feeds = feeds if feeds is not None else RunFeeds(store)
    # What the filter will withhold whole from this reader is not read at all (ADR 0160).
    apart = reads_apart(role, mode=mode)
    reader = feeds.reader(run_id, after=after, follow=follow, first_page=first_page, apart=apart)
    loop = asyncio.get_running_loop()
    # This reader's filter resolved once; the callbacks below are its methods (ADR 0171).
    st = _FrameStream(feeds, reader, role, mode, event_filter(role, mode=mode), follow, ping_s)
    st.last_sent = after
    st.quiet_since = loop.time()
    if follow and streams is not None and streams.refusing() is not None:
        st.refused = True  # what is stored, then the resume frame
    if direct is not None:
        st.direct = direct
        reader.sink = st.sink
    unwatch = watch_access(st.access_lost) if watch_access is not None else None
    untick = streams.add(st.tick, reader.wake, st.store_refused) if streams is not None else None
    wait = None if untick is not None else ping_s
    try:
        while True:
            if st.refused and reader.following:
                yield _note(_FAILED, resume_after=st.last_sent)
                return
            try:
                batch = await reader.next(wait)
            except asyncio.CancelledError:
                raise
            except Exception:  # reported to the reader, who may resume
                log.exception("live stream of run %s failed", run_id)
                yield _note(_FAILED, resume_after=st.last_sent)
                return
            if st.lost is not None:
                break
            if batch is None:
                return
            # Neither the batch nor its frames are held while the chunk is sent, nor while the
            # stream waits for the next batch (ADR 0171): a replaying reader's page is up to 500
            # events, each a few objects, and a thousand readers waiting on their sockets
            # together held them all at once.
            out = st.frames(batch)
            del batch
            if out is None:  # nothing this reader may see: a keep-alive once it has been quiet
                if ping_s is not None and loop.time() - st.quiet_since >= ping_s:
                    st.quiet_since = loop.time()
                    yield PING
                continue
            if reader.done:  # the response ends with it, in the same write
                yield LastChunk(out)
                return
            started = loop.time()
            yield out
            del out
            st.quiet_since = loop.time()
            if st.lost is not None:
                break
            if loop.time() - started >= lag_timeout_s and reader.behind >= queue_size:
                yield _note(_LAGGING, resume_after=st.last_sent)
                return
        yield _note(_REVOKED, message=st.lost)
    finally:
        reader.sink = None
        if unwatch is not None:
            unwatch()
        if untick is not None:
            untick()
        reader.close()


class _FrameStream:
    """One ``live_frames`` stream's state and the callbacks others call into it: the access
    watch (``access_lost``), the ticker (``tick``, ``store_refused``) and the feed (``sink``).

    A class with slots, not closures over the generator's locals (ADR 0171): a thousand
    connected readers each held four closures, their cells and closure tuples (~23 objects
    that every pass of the cyclic collector walks); this is one object and a bound method per
    callback."""

    __slots__ = (
        "direct",
        "feeds",
        "follow",
        "last_sent",
        "loop",
        "lost",
        "mode",
        "ping_s",
        "quiet_since",
        "reader",
        "refused",
        "role",
        "show",
    )

    def __init__(
        self,
        feeds: RunFeeds,
        reader: LiveReader,
        role: Role,
        mode: str,
        show: Callable[[Event], Event | None],
        follow: bool,
        ping_s: float | None,
    ) -> None:
        self.feeds = feeds
        self.reader = reader
        self.role = role
        self.mode = mode
        self.show = show
        self.follow = follow
        self.ping_s = ping_s
        self.loop = asyncio.get_running_loop()
        self.direct: DirectWrites | None = None
        self.last_sent = 0
        """The ``seq`` of the last event sent to the reader (by the stream or its ``sink``)."""
        self.quiet_since = 0.0
        """Loop time of the last chunk sent (keep-alives count from it)."""
        self.lost: str | None = None
        """Why the reader's access went (``access_lost``): the stream stops at once."""
        self.refused = False
        """The store refused writes while following (ADR 0151)."""

    def frames(self, batch: Sequence[Event]) -> bytes | None:
        """The chunk of ``batch``'s frames this reader is sent (``None``: none), its filter's
        and the feed's cache's; ``last_sent`` moves to the last of them."""
        chunk = []
        feeds, role, mode, show = self.feeds, self.role, self.mode, self.show
        shared = self.reader.shared
        for event in batch:
            data = feeds.frame(event, role, mode, event_frame, cache=shared, show=show)
            if data is not None:
                chunk.append(data)
                self.last_sent = event.seq
        return b"".join(chunk) if chunk else None

    def access_lost(self, message: str) -> None:
        """Stop at once: nothing read after this moment reaches the reader."""
        if self.lost is None:
            self.lost = message
            self.reader.wake()

    def tick(self, now: float) -> None:
        if self.ping_s is not None and now - self.quiet_since >= self.ping_s:
            self.reader.wake()

    def store_refused(self) -> None:
        """The store refuses writes: nothing more of the run can be recorded while it does, so
        a follower is let go with the resume frame rather than held (ADR 0151)."""
        if self.follow and not self.refused:
            self.refused = True
            self.reader.wake()

    def sink(self, events: Sequence[Event]) -> bool:
        """The feed's events while this stream waits: filtered, encoded, written in one write;
        with the run's terminal event, the response's end goes in that write too."""
        direct = self.direct
        if direct is None or self.lost is not None:
            return False
        ends = any(is_run_terminal(e.type) for e in events)
        write = direct.end if ends else direct.write
        if write is None:
            return False  # next() yields them (a terminal event in a LastChunk)
        # the same batch for every reader of the feed: encoded once per role and mode
        shown = self.feeds.chunk(
            events, self.role, self.mode, event_frame, cache=self.reader.shared, show=self.show
        )
        if shown is not None:
            if not write(shown[0]):
                return False
            self.last_sent = shown[1]
            self.quiet_since = self.loop.time()
        elif ends:  # nothing of them for this reader: the stream ends the response itself
            return False
        return True


_Stream = tuple[Callable[[float], None], Callable[[], None], Callable[[], None] | None]
"""An open stream's ``tick``, ``stop`` and ``refused`` (``LiveStreams.add``)."""


class _Forget:
    """What ``LiveStreams.add`` returns: called, it takes its stream off the ticker. Its own key
    there, and one object with a slot rather than a closure over a token (ADR 0171)."""

    __slots__ = ("streams",)

    def __init__(self, streams: dict[object, _Stream]) -> None:
        self.streams = streams

    def __call__(self) -> None:
        self.streams.pop(self, None)


class LiveStreams:
    """The open live streams of one app: ticked by one task for all of them, and ended all at
    once when the server shuts down.

    Keep-alives and send timeouts need a clock per stream; one ticker that looks at every open
    stream each ``tick_s`` costs far less than a timer per write or per wait (a thousand readers
    of one run would arm a thousand timers per event). The same ticker asks whether the store
    refuses writes, once for all of them (``refusal``).
    """

    def __init__(
        self, tick_s: float = 1.0, *, refusal: Callable[[], str | None] | None = None
    ) -> None:
        self.tick_s = tick_s
        self.refusal = refusal
        """The store's ``write_refusal`` (ADR 0151): asked once a tick while streams are open,
        and by each stream as it starts; while it answers, following streams are let go."""
        self._streams: dict[object, _Stream] = {}
        self._ticker: asyncio.Task[None] | None = None
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop the streams run on (known once one was added)."""

    def add(
        self,
        tick: Callable[[float], None],
        stop: Callable[[], None],
        refused: Callable[[], None] | None = None,
    ) -> Callable[[], None]:
        """Call ``tick(loop time)`` every ``tick_s``, ``refused()`` at each tick while the store
        refuses writes, and ``stop()`` on shutdown, until the returned function is called."""
        forget = _Forget(self._streams)
        self._streams[forget] = (tick, stop, refused)
        if self._ticker is None or self._ticker.done():
            self.loop = asyncio.get_running_loop()
            self._ticker = self.loop.create_task(self._tick_forever())
        if self.stopping:
            stop()
        return forget

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while self._streams:
            await asyncio.sleep(self.tick_s)
            now = loop.time()
            refusing = self.refusing() is not None
            for tick, _, refused in list(self._streams.values()):
                tick(now)
                if refusing and refused is not None:
                    refused()

    def refusing(self) -> str | None:
        """Why the store refuses writes now (``refusal``'s word), or ``None``."""
        return self.refusal() if self.refusal is not None else None

    def stop_all(self) -> None:
        """End every open stream now, and every stream opened from now on."""
        self.stopping = True
        for _, stop, _ in list(self._streams.values()):
            stop()
        if self._ticker is not None:
            self._ticker.cancel()

    def __len__(self) -> int:
        return len(self._streams)


SERVER_SEND: Final = "thoughtgate.server_send"
"""Scope key of the ASGI server's own ``send``, set by the app before any middleware wraps it
(``server.app``): what lets a live stream find the connection's socket."""
_DIRECT_MAX_BUFFERED = 64 * 1024
"""Bytes waiting in a connection's write buffer past which writes go back to the awaited path
(where a client that stopped reading meets the send timeout and the lag check)."""


class DirectWrites:
    """How a live stream's feed writes a chunk to its connection without awaiting.

    ``write`` and ``end`` are set by :class:`LiveResponse` once the response has started, when
    the server is uvicorn's httptools protocol (the daemon's): ``write`` writes the chunk to the
    socket's transport as one HTTP chunk and returns ``True``, or returns ``False`` (nothing
    written) when the client is gone, the response is ending, or the socket is not keeping up;
    ``end`` likewise writes a stream's last chunk and ends the response with it, in one write,
    and sets ``ended``. Other servers (and tests' in-memory transports) leave them ``None``:
    every chunk is then awaited.
    """

    __slots__ = ("end", "ended", "write")

    def __init__(self) -> None:
        self.write: Callable[[bytes], bool] | None = None
        self.end: Callable[[bytes], bool] | None = None
        self.ended = False
        """The response was ended by ``end``: its task sends nothing more."""

    def stop(self) -> None:
        """No direct write from now on (the response is ending)."""
        self.write = None
        self.end = None


def _socket_writers(server_send: Any, direct: DirectWrites) -> None:
    """Set ``direct``'s writers for uvicorn's httptools connection behind ``server_send``, if it
    is one. Only after the response has started, with chunked encoding (no length given)."""
    cycle = getattr(server_send, "__self__", None)
    if cycle is None or type(cycle).__module__ != "uvicorn.protocols.http.httptools_impl":
        return
    transport = getattr(cycle, "transport", None)
    flow = getattr(cycle, "flow", None)
    if transport is None or flow is None or getattr(cycle, "chunked_encoding", None) is not True:
        return

    writes = _SocketWrites(server_send, cycle, flow, direct)
    direct.write = writes.write
    direct.end = writes.end


class _SocketWrites:
    """``DirectWrites``' writers for one uvicorn httptools connection (``_socket_writers``):
    one object with slots, not three closures and their cells (ADR 0171)."""

    __slots__ = ("cycle", "direct", "flow", "server_send")

    def __init__(self, server_send: Any, cycle: Any, flow: Any, direct: DirectWrites) -> None:
        self.server_send = server_send
        self.cycle = cycle
        self.flow = flow
        self.direct = direct

    # ``cycle.transport`` at each write: the response's head may still be held (with the first
    # chunk of the step that started the response, ``connections._HeldHead``), then the socket's.
    def writable(self) -> bool:
        cycle = self.cycle
        return not (
            cycle.disconnected
            or cycle.response_complete
            or self.flow.write_paused
            or cycle.transport.get_write_buffer_size() > _DIRECT_MAX_BUFFERED
        )

    def write(self, chunk: bytes) -> bool:
        if not self.writable():
            return False
        self.cycle.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        return True

    def end(self, chunk: bytes) -> bool:
        if not self.writable():
            return False
        # uvicorn's own send: with the socket not paused (checked above) it awaits nothing,
        # so one step runs it whole -- the chunk and the body's end in one write, the response
        # complete, the connection ready for its next request -- in the feed's step, not after
        # a turn of the event loop to wake the stream's task.
        step = self.server_send({"type": "http.response.body", "body": chunk, "more_body": False})
        direct = self.direct
        try:
            step.send(None)
        except StopIteration:
            direct.stop()
            direct.ended = True
            return True
        except Exception:  # not the feed's to raise: the stream's own send meets it
            log.exception("ending a live stream's response from its feed failed")
            direct.stop()
            return False
        # It awaited: its only await (a paused socket's drain) comes before it writes anything.
        step.close()
        return False


def _abort(scope: Scope) -> None:
    """Drop the connection of ``scope`` at once, with whatever it holds unsent (uvicorn's
    connection, found through its ``send``; any other server closes it itself)."""
    cycle = getattr(scope.get(SERVER_SEND), "__self__", None)
    transport = getattr(cycle, "transport", None)
    abort = getattr(transport, "abort", None)
    if abort is not None:
        abort()


class LiveResponse(Response):
    """An ASGI response for a stream of SSE chunks: one socket write per chunk.

    Ends when the chunks end, when the client disconnects, when a write stays blocked for
    ``send_timeout_s`` (a client that stopped reading), or when ``streams.stop_all()`` runs.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        send_timeout_s: float,
        headers: dict[str, str],
        streams: LiveStreams | None = None,
        direct: DirectWrites | None = None,
    ) -> None:
        # Not Response.__init__: there is no body to render.
        self.chunks = chunks
        self.direct = direct
        self.send_timeout_s = send_timeout_s
        self.background = None
        self.streams = streams
        self.status_code = 200
        raw = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-store",
            "x-content-type-options": "nosniff",
        }
        raw.update({k.lower(): v for k, v in headers.items()})
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in raw.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        ends = _Ending(task, self.direct, self.send_timeout_s)
        forget = self.streams.add(ends.tick, ends.stopping) if self.streams is not None else None
        watcher = loop.create_task(ends.watch(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if self.direct is not None and ends.why is None:
                _socket_writers(scope.get(SERVER_SEND), self.direct)
            more = True
            async for chunk in self.chunks:
                more = type(chunk) is not LastChunk
                ends.sending_since = loop.time()
                await send({"type": "http.response.body", "body": chunk, "more_body": more})
                ends.sending_since = None
                if not more:
                    break
            if more and not (self.direct is not None and self.direct.ended):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if ends.why is None or task.uncancel() > 0:
                raise  # not ours: the server is cancelling this request
            if ends.why == "server stopping":  # end the response properly
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            # disconnected: nobody to tell; send timed out: a write would block again, so the
            # connection is dropped with what waits to be sent (a close would wait for the
            # client to read it first, for ever: ADR 0147)
            if ends.why == "send timed out":
                _abort(scope)
        finally:
            ends.active = False
            if self.direct is not None:
                self.direct.stop()
            if forget is not None:
                forget()
            watcher.cancel()
            close = getattr(self.chunks, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()


class _Ending:
    """What ends one :class:`LiveResponse`: the client going away (``watch``), a write blocked
    for ``send_timeout_s`` (``tick``), the server stopping (``stopping``). Each cancels the
    response's task once, with ``why`` set, while it is ``active``.

    One object with slots, not closures over ``__call__``'s locals (ADR 0171): a thousand
    connected readers each held four closures, their cells and closure tuples."""

    __slots__ = ("active", "direct", "send_timeout_s", "sending_since", "task", "why")

    def __init__(
        self, task: asyncio.Task[Any], direct: DirectWrites | None, send_timeout_s: float
    ) -> None:
        self.task = task
        self.direct = direct
        self.send_timeout_s = send_timeout_s
        self.active = True
        self.why: str | None = None
        self.sending_since: float | None = None
        """Loop time the awaited write in progress began (``None``: none is)."""

    def end(self, why: str) -> None:
        # (After the feed ended the response, its completion reads as a disconnect: this
        # task ends on its own, its reader done.)
        direct = self.direct
        if self.active and self.why is None and not (direct is not None and direct.ended):
            self.why = why
            if direct is not None:
                direct.stop()
            self.task.cancel()

    def tick(self, now: float) -> None:
        if self.sending_since is not None and now - self.sending_since >= self.send_timeout_s:
            self.end("send timed out")  # the client stopped reading

    def stopping(self) -> None:
        self.end("server stopping")

    async def watch(self, receive: Receive) -> None:
        """The client going away ends the stream."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.end("disconnected")

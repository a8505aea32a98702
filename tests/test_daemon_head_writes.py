"""A response that gives its length leaves the daemon in one write, head and body together
(``server.connections._HeldHead``, ADR 0032); a streamed one sends its head with the first chunk
sent in the step that starts it, or alone when it has none yet (ADR 0091); ``HEAD`` answers and a
close before the body still send their head, and the live stream writes to the transport itself,
its run's terminal event in the write that ends the response (ADR 0085)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from thoughtgate.access.roles import Role
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.providers.sse import SSEDecoder
from thoughtgate.server.connections import ConnectionLimits, guarded_protocol
from thoughtgate.server.fanout import RunFeeds
from thoughtgate.server.sse import SERVER_SEND, DirectWrites, LiveResponse, live_frames
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord

WRITES: list[bytes] = []
CYCLE_TRANSPORTS: list[str] = []
CONNECTIONS: list[object] = []
FEEDS: list[RunFeeds] = []
RELEASE: list[asyncio.Event] = []


class _Writes:
    """The connection's transport, noting each write it passes on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


Guarded = guarded_protocol(HttpToolsProtocol, ConnectionLimits(100, 30.0))


class Recording(Guarded):  # type: ignore[misc, valid-type]
    def connection_made(self, transport: Any) -> None:
        CONNECTIONS.append(transport)
        super().connection_made(_Writes(transport))


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path in ("/live", "/live-read"):  # a run's live stream, as the daemon's ``_App`` serves it
        scope[SERVER_SEND] = send
        feeds, direct = FEEDS[0], DirectWrites()
        # ``/live-read``: its first page read before the response starts, as ``GET
        # /v1/runs/{id}/stream`` reads it while the ticket's key is checked (ADR 0028)
        first = await feeds.first_page("run_1", 0) if path == "/live-read" else None
        frames = live_frames(
            feeds.store,
            "run_1",
            role=Role.VIEWER,
            mode="surface",
            after=0,
            feeds=feeds,
            direct=direct,
            first_page=first,
        )
        response = LiveResponse(frames, send_timeout_s=5.0, headers={}, direct=direct)
        await response(scope, receive, send)
        return
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        cycle = send.__self__
        for piece in (b"one", b"two"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            CYCLE_TRANSPORTS.append(type(cycle.transport).__name__)
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/waiting":  # a stream with nothing to send yet
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await RELEASE[0].wait()
        await send({"type": "http.response.body", "body": b"late", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b'{"ok":true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"11")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if path == "/fail":
        raise RuntimeError("after the head")
    await send({"type": "http.response.body", "body": body})


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[str]:
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, http=Recording, lifespan="off", log_level="critical"
    )
    server = Server(config)
    task = asyncio.create_task(server.serve())
    await asyncio.wait_for(server.ready.wait(), 10)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture(autouse=True)
def fresh() -> None:
    WRITES.clear()
    CYCLE_TRANSPORTS.clear()
    CONNECTIONS.clear()
    FEEDS.clear()
    RELEASE.clear()


async def test_a_json_answer_is_one_write() -> None:
    async with serving() as url, httpx.AsyncClient() as client:
        for _ in range(2):  # a new request on the same connection holds its head again
            response = await client.get(url + "/json")
            assert response.json() == {"ok": True}
    assert len(WRITES) == 2
    for write in WRITES:
        head, _, body = write.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 11" in head
        assert body == b'{"ok":true}'


async def test_a_streamed_answer_sends_its_head_with_the_first_chunk_of_its_step() -> None:
    """A live stream whose first page is read already: one write for its head and that page
    (ADR 0091); the chunks after it, and a ``HEAD`` answer, go out as they are sent."""
    async with serving() as url, httpx.AsyncClient() as client:
        async with client.stream("GET", url + "/stream") as response:
            assert b"".join([piece async for piece in response.aiter_bytes()]) == b"onetwo"
        head = await client.head(url + "/json")
        assert head.status_code == 200 and head.headers["content-length"] == "11"
    head, _, first = WRITES[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding: chunked" in head
    assert first == b"3\r\none\r\n"
    assert WRITES[1:3] == [b"3\r\ntwo\r\n", b"0\r\n\r\n"]
    assert WRITES[3].startswith(b"HTTP/1.1 200 OK") and WRITES[3].endswith(b"\r\n\r\n")
    # once the head is out the stream writes to the transport itself (the live stream's direct
    # writes too)
    assert CYCLE_TRANSPORTS == ["_Writes", "_Writes"]


async def test_a_stream_with_nothing_to_send_yet_sends_its_head_alone() -> None:
    """Its client sees the response begin (an ``EventSource``'s ``open``) while it waits."""
    RELEASE.append(asyncio.Event())
    async with (
        serving() as url,
        httpx.AsyncClient() as client,
        client.stream("GET", url + "/waiting") as response,
    ):
        assert response.status_code == 200  # the head arrived, the body not begun
        assert len(WRITES) == 1 and WRITES[0].endswith(b"\r\n\r\n")
        RELEASE[0].set()
        assert b"".join([piece async for piece in response.aiter_bytes()]) == b"late"
    assert WRITES[1:] == [b"4\r\nlate\r\n", b"0\r\n\r\n"]


async def test_a_close_before_the_body_sends_the_held_head() -> None:
    async with serving() as url, httpx.AsyncClient() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(url + "/fail")
    assert len(WRITES) == 1 and WRITES[0].startswith(b"HTTP/1.1 200 OK")
    assert WRITES[0].endswith(b"\r\n\r\n")


async def test_a_live_stream_ends_in_the_write_of_its_terminal_event() -> None:
    store = MemoryStore()
    await store.create_run(RunRecord("run_1", "p"))
    FEEDS.append(RunFeeds(store))
    async with serving() as url, httpx.AsyncClient() as client:
        async with client.stream("GET", url + "/live") as response:
            body = response.aiter_bytes()
            delta = NewEvent(EventType.MESSAGE_DELTA, {"text": "a", "turn": 1})
            await store.append("run_1", [delta])
            # Once its first chunk is out the stream waits on the run's feed: it sent it and went
            # back to its reader in one step (or the feed wrote it, the stream waiting already).
            first = await anext(body)
            await store.append("run_1", [delta, NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
            # in the append's own step, the feed wrote the run's end and the response's
            last = WRITES[-1]
            assert last.endswith(b"\r\n0\r\n\r\n") and b"run.settlement.completed" in last
            received = first + b"".join([piece async for piece in body])
        again = await client.get(url + "/json")  # the connection serves its next request
        assert again.json() == {"ok": True}
    messages = SSEDecoder().feed(received)
    assert [m.id for m in messages] == ["1", "2", "3"]
    assert b"0\r\n\r\n" not in WRITES[:-2]  # no other end, before or after
    assert WRITES[-2] == last and len(CONNECTIONS) == 1


async def test_a_live_streams_head_and_first_page_leave_in_one_write() -> None:
    """A stream of a run with events stored, its first page read while the request was
    served: one write for the response's head and that page (ADR 0091), then the feed's."""
    store = MemoryStore()
    await store.create_run(RunRecord("run_1", "p"))
    delta = NewEvent(EventType.MESSAGE_DELTA, {"text": "a", "turn": 1})
    await store.append("run_1", [delta, delta])
    FEEDS.append(RunFeeds(store))
    async with (
        serving() as url,
        httpx.AsyncClient() as client,
        client.stream("GET", url + "/live-read") as response,
    ):
        body = response.aiter_bytes()
        first = await anext(body)
        head, _, page = WRITES[0].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding: chunked" in head
        assert page.count(b"message.delta") == 2, page
        assert len(WRITES) == 1
        await store.append("run_1", [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED)])
        received = first + b"".join([piece async for piece in body])
    messages = SSEDecoder().feed(received)
    assert [m.id for m in messages] == ["1", "2", "3"]
    assert len(WRITES) == 2 and WRITES[1].endswith(b"\r\n0\r\n\r\n")

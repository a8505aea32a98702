"""A response that gives its length leaves the daemon in one write, head and body together
(``server.connections._HeldHead``, ADR 0032); streamed responses, ``HEAD`` answers and a close
before the body still send their head, and the live stream writes to the transport itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from thoughtgate.server.connections import ConnectionLimits, guarded_protocol

WRITES: list[bytes] = []
CYCLE_TRANSPORTS: list[str] = []


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
        super().connection_made(_Writes(transport))


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        cycle = send.__self__
        CYCLE_TRANSPORTS.append(type(cycle.transport).__name__)
        for piece in (b"one", b"two"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
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


async def test_streamed_and_head_answers_send_their_head_at_once() -> None:
    async with serving() as url, httpx.AsyncClient() as client:
        async with client.stream("GET", url + "/stream") as response:
            assert b"".join([piece async for piece in response.aiter_bytes()]) == b"onetwo"
        head = await client.head(url + "/json")
        assert head.status_code == 200 and head.headers["content-length"] == "11"
    assert WRITES[0].startswith(b"HTTP/1.1 200 OK") and WRITES[0].endswith(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in WRITES[0]
    assert WRITES[1:4] == [b"3\r\none\r\n", b"3\r\ntwo\r\n", b"0\r\n\r\n"]
    assert WRITES[4].startswith(b"HTTP/1.1 200 OK") and WRITES[4].endswith(b"\r\n\r\n")
    assert CYCLE_TRANSPORTS == ["_Writes"]  # the live stream writes to the transport itself


async def test_a_close_before_the_body_sends_the_held_head() -> None:
    async with serving() as url, httpx.AsyncClient() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(url + "/fail")
    assert len(WRITES) == 1 and WRITES[0].startswith(b"HTTP/1.1 200 OK")
    assert WRITES[0].endswith(b"\r\n\r\n")

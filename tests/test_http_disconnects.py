"""What a client that goes away mid-request leaves behind (ADR 0082), on a real loopback daemon.

uvicorn does not cancel a request's handler when its client disconnects: the handler runs to its
end and its answer is dropped. So the line is drawn where the request body is complete:

* a client gone before its body arrived whole (a ``Content-Length`` larger than what it sent,
  a chunked body cut) started nothing: no run is stored;
* a client gone after its body arrived -- before or after the answer, on ``POST /v1/runs`` or on
  the stream of ``POST /v1/runs/follow`` -- started its run, which executes to its end like any
  other and is found in the run list; a disconnect never cancels a run (a run is stopped only by
  its own end, a daemon's shutdown, or a lost lease).

A handler cancelled for another reason (uvicorn cancels the requests still under way when the
daemon's graceful shutdown times out) ends the run it was starting at once: see
``test_cancelled_daemon_starts``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemon import ThreadServer, auth, seed_keys, server_tools

from thoughtgate.config import Config
from thoughtgate.server.app import create_app
from thoughtgate.store.base import EventStore
from thoughtgate.store.urls import open_store

pytestmark = [pytest.mark.inprocess, pytest.mark.timeout(60)]


class _Served:
    def __init__(self, server: ThreadServer, store: EventStore, key: str) -> None:
        self.server = server
        self.store = store
        self.key = key
        host, port = server.base_url.removeprefix("http://").split(":")
        self.address = (host, int(port))

    def send_and_leave(self, head: str, body: bytes) -> None:
        """Send a request's head and ``body`` (all or part of what the head announces), then
        close the connection without reading anything."""
        with socket.create_connection(self.address, timeout=5) as conn:
            conn.sendall(head.encode("ascii") + body)
            conn.shutdown(socket.SHUT_WR)

    def post_head(self, path: str, length: int | None) -> str:
        framing = (
            f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
        )
        ((name, value),) = auth(self.key).items()
        return (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{name}: {value}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n\r\n"
        )

    def idle(self) -> None:
        """Wait until the server holds no connection and runs no request handler: whatever the
        requests sent so far did is done."""
        state = self.server.server.server_state
        deadline = time.monotonic() + 20
        while state.connections or state.tasks:
            assert time.monotonic() < deadline, "the server never settled"
            time.sleep(0.01)

    def runs(self) -> list[Any]:
        return asyncio.run(self._runs())

    async def _runs(self) -> list[Any]:
        return list(await self.store.list_runs())


@pytest.fixture
def served(tmp_path: Path) -> Iterator[_Served]:
    store = asyncio.run(open_store(f"sqlite:///{tmp_path / 'daemon.db'}"))
    keys = seed_keys(store)
    app = create_app(store, Config.from_mapping({}), tools=server_tools())
    try:
        with ThreadServer(app) as server:
            yield _Served(server, store, keys["member"])
    finally:
        asyncio.run(store.close())


def _body(prompt: str) -> bytes:
    return json.dumps({"prompt": prompt, "model": "fake:echo"}).encode()


def _ended(served: _Served, count: int) -> list[Any]:
    deadline = time.monotonic() + 20
    while True:
        runs = served.runs()
        if len(runs) == count and all(r.status not in ("pending", "running") for r in runs):
            return runs
        assert time.monotonic() < deadline, f"runs still open: {runs}"
        time.sleep(0.02)


def test_a_client_gone_before_its_body_arrived_started_nothing(served: _Served) -> None:
    body = _body("never")
    served.send_and_leave(served.post_head("/v1/runs", len(body) + 20), body)
    served.send_and_leave(served.post_head("/v1/runs/follow", len(body)), body[:10])
    served.send_and_leave(served.post_head("/v1/runs", None), f"{len(body):x}\r\n".encode())
    served.idle()
    assert served.runs() == []


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/follow"])
def test_a_client_gone_after_its_body_arrived_started_its_run_which_ends(
    served: _Served, path: str
) -> None:
    body = _body("kept")
    served.send_and_leave(served.post_head(path, len(body)), body)
    (run,) = _ended(served, 1)
    assert run.status == "completed", "executed to its end, not cancelled by the disconnect"
    assert run.prompt == "kept"
    served.idle()

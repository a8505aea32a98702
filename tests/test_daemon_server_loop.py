"""The daemon server's main loop wakes once a second, not ten times (ADR 0057), and keeps what
uvicorn's loop gives: a ``Date`` header kept current, and a stop request that ends it."""

from __future__ import annotations

import asyncio
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pytest
import uvicorn

from thoughtgate.config import Config
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.server.manager import RunManager
from thoughtgate.server.serve import TICK_S, DaemonServer
from thoughtgate.store.memory import MemoryStore

pytestmark = pytest.mark.timeout(30)


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@pytest.mark.inprocess
async def test_the_date_header_stays_current_and_a_stop_request_ends_the_server() -> None:
    ready = asyncio.Event()
    config = uvicorn.Config(_app, host="127.0.0.1", port=0, lifespan="off", log_level="critical")
    server = DaemonServer(
        config, RunManager(Runtime(MemoryStore(), Config())), on_ready=lambda *_: ready.set()
    )
    task = asyncio.create_task(server.serve())
    await asyncio.wait_for(ready.wait(), 10)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient() as client:
            first = parsedate_to_datetime(
                (await client.get(f"http://127.0.0.1:{port}/")).headers["date"]
            )
            await asyncio.sleep(2.5 * TICK_S)
            later = parsedate_to_datetime(
                (await client.get(f"http://127.0.0.1:{port}/")).headers["date"]
            )
        assert (later - first).total_seconds() >= 1, "the header moved on with the clock"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
    assert task.done() and task.exception() is None

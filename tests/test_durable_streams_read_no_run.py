"""A durable daemon's run started here at once is answered as a plain daemon's is (ADR 0086): a
ticket and a live stream of it, while it executes and just after, need no read of the run from
the store -- the daemon knows it exists, that it has not ended, and its mode -- and the stream
still brings the whole run once, in order, to its terminal event, filtered for the ticket's
role."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemon import (
    Daemon,
    ThreadServer,
    seed_keys,
    server_tools,
    sse_events,
    stream_all,
)

from thoughtgate.config import Config
from thoughtgate.events.schema import is_run_terminal
from thoughtgate.orchestration.durability import make_durable
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.server.app import create_app
from thoughtgate.store.urls import open_store
from thoughtgate.testing.fake import FAKE_SCRIPTS, reasoning, text

pytestmark = [pytest.mark.timeout(60), pytest.mark.inprocess]

GATE = threading.Event()
"""Set by the test: the gated run's model turn ends."""


def _gated(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    async def gen() -> AsyncIterator[Any]:
        yield reasoning("thinking while the client asks for a ticket")
        await asyncio.to_thread(GATE.wait, 30)  # the test's thread sets it
        yield text("done")

    return gen()


@pytest.fixture
def durable_daemon(tmp_path: Path) -> Iterator[Daemon]:
    FAKE_SCRIPTS["durable-gated"] = _gated
    store = asyncio.run(open_store(f"sqlite:///{tmp_path / 'daemon.db'}"))
    keys = seed_keys(store)
    config = Config.from_mapping(
        {"server": {"secret": "durable-streams-secret", "ticket_ttl_s": 30, "keepalive_s": 0.5}}
    )
    runtime = Runtime(store, config, tools=server_tools())
    assert make_durable(runtime) is not None, "a SQLite store runs durably by default"
    app = create_app(runtime, shutdown_grace_s=0.1)
    try:
        with ThreadServer(app) as server:
            try:
                yield Daemon(server.base_url, keys, store, app)
            finally:
                GATE.set()  # a failed test's run ends too, before the server stops
    finally:
        del FAKE_SCRIPTS["durable-gated"]
        GATE.clear()
        asyncio.run(store.close())


class _RunReads:
    """Counts the daemon store's reads of one run (patched in place)."""

    def __init__(self, daemon: Daemon, run_id: str) -> None:
        self.store: Any = daemon.store
        self.run_id = run_id
        self.count = 0
        self._get_run = self.store.get_run

    async def get_run(self, run_id: str, **kw: Any) -> Any:
        if run_id == self.run_id:
            self.count += 1
        return await self._get_run(run_id, **kw)

    def __enter__(self) -> _RunReads:
        self.store.get_run = self.get_run
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.get_run = self._get_run


def test_a_durable_run_executing_here_is_streamed_without_reading_the_run(
    durable_daemon: Daemon,
) -> None:
    daemon = durable_daemon
    body = {"prompt": "hi", "model": "fake:durable-gated", "chain_of_thought": "surface"}
    run_id = daemon.start_run(body)
    with _RunReads(daemon, run_id) as reads:
        ticket = daemon.ticket(run_id, "developer")
        with (
            daemon.client() as c,
            c.stream("GET", f"/v1/runs/{run_id}/stream", params={"ticket": ticket}) as r,
        ):
            assert r.status_code == 200
            GATE.set()  # the stream is open: the run may end now
            live = r.read().decode("utf-8")
        during = reads.count
        # Just after it ended here: known as executed here, so read no more than before.
        response, as_viewer = stream_all(daemon, run_id, "viewer")
        after = reads.count
    assert during == 0, "neither the ticket nor the stream of a run executing here read it"
    assert after == 0, "nor those of a run that just ended here"
    events = sse_events(live)
    stored = daemon.get(f"/v1/runs/{run_id}/events", "owner").json()["events"]
    assert [e["seq"] for e in events] == [e["seq"] for e in stored]  # all, once, in order
    assert is_run_terminal(events[-1]["type"])
    assert daemon.wait_done(run_id)["status"] == "completed"
    assert any(e["type"] == "reasoning.delta" for e in events)
    assert response.status_code == 200
    assert "reasoning.delta" not in as_viewer  # the run's own mode, for a viewer
    assert is_run_terminal(sse_events(as_viewer)[-1]["type"])

"""A live stream opened right after its run ended in this daemon (the usual case at 100
concurrent runs: the run is over before the client's third request arrives): it gets the whole
run once and in order, filtered for the ticket's role, from the one early read of its first
page, without the store being asked about the run for the ticket or the stream (ADR 0028,
amended). And a refused stream leaves no early read behind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.daemon import Daemon, auth, sse_events, stream_all, ticketing_daemon

from thoughtgate.events.schema import is_run_terminal

SECRET = "stream-after-end-secret"


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with ticketing_daemon(SECRET, keepalive_s=0.5) as d:
        yield d


class _Count:
    """Counts the store's run reads and event reads (the daemon's store, patched in place)."""

    def __init__(self, daemon: Daemon) -> None:
        self.store: Any = daemon.store
        self.runs = 0
        self.pages = 0
        self._get_run, self._read = self.store.get_run, self.store.read

    async def get_run(self, run_id: str, **kw: Any) -> Any:
        self.runs += 1
        return await self._get_run(run_id, **kw)

    async def read(self, run_id: str, **kw: Any) -> Any:
        self.pages += 1
        return await self._read(run_id, **kw)

    def __enter__(self) -> _Count:
        self.store.get_run, self.store.read = self.get_run, self.read
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.get_run, self.store.read = self._get_run, self._read


def test_a_stream_after_the_run_ended_here_gets_all_of_it_once_without_reading_the_run(
    daemon: Daemon,
) -> None:
    run_id = daemon.start_run(
        {"prompt": "hello", "model": "fake:echo", "chain_of_thought": "surface"}
    )
    daemon.wait_done(run_id)
    stored = daemon.get(f"/v1/runs/{run_id}/events", "owner").json()["events"]
    with _Count(daemon) as count:
        response, as_developer = stream_all(daemon, run_id, "developer")
    assert response.status_code == 200
    events = sse_events(as_developer)
    assert [e["seq"] for e in events] == [e["seq"] for e in stored]  # all, once, in order
    assert is_run_terminal(events[-1]["type"])
    assert any(e["type"] == "reasoning.delta" for e in events)
    assert count.runs == 0, "neither the ticket nor the stream read the run"
    assert count.pages == 1, "the early first page is the only read of its events"
    _, as_viewer = stream_all(daemon, run_id, "viewer")  # the run's own mode, remembered
    assert "reasoning.delta" not in as_viewer
    assert is_run_terminal(sse_events(as_viewer)[-1]["type"])


def test_a_refused_stream_leaves_no_early_read_listening(daemon: Daemon) -> None:
    """Its first page's read starts once the ticket's signature holds, alongside the key check;
    when the key is refused, nothing is sent and that read is let go."""
    with daemon.client("owner") as owner:
        made = owner.post("/v1/keys", json={"name": "leaked", "role": "developer"}).json()
    run_id = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
    daemon.wait_done(run_id)
    with daemon.client() as c:
        got = c.post("/v1/tickets", json={"run_id": run_id}, headers=auth(made["key"]))
        ticket = got.json()["ticket"]
    with daemon.client("owner") as owner:
        assert owner.delete(f"/v1/keys/{made['key_id']}").status_code == 200
    with daemon.client() as c:
        refused = c.get(f"/v1/runs/{run_id}/stream", params={"ticket": ticket})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "ticket_key_revoked"
    assert run_id not in daemon.store.wakeups._listeners  # the early read was let go

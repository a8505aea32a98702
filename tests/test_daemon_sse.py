"""The live channel: tickets, replay and live follow, resume with Last-Event-ID after random
disconnects (no gaps, no duplicates), keep-alive comments, and slow readers."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.daemon import (
    HAVE_SQLITE,
    Daemon,
    read_sse,
    running_daemon,
    sse_events,
    stream_all,
    ticketing_daemon,
)

from thoughtgate.access.roles import Role
from thoughtgate.access.tickets import TicketSigner
from thoughtgate.config import Config
from thoughtgate.events.schema import is_run_terminal
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.sse import SSEDecoder
from thoughtgate.server.sse import live_frames
from thoughtgate.store.memory import MemoryStore

SECRET = "test-ticket-secret"


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with ticketing_daemon(SECRET, keepalive_s=0.2) as d:
        yield d


def _sse_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert set(response.json()["error"]) == {"code", "message"}


def test_ticket_is_required_signed_current_and_for_this_run(daemon: Daemon) -> None:
    run_id = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
    other = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
    daemon.wait_done(run_id)
    url = f"/v1/runs/{run_id}/stream"
    good = daemon.ticket(run_id, "viewer")
    past = TicketSigner(SECRET, ttl_s=30, clock=lambda: time.time() - 60)
    expired, _ = past.issue(run_id, Role.OWNER, key_id="key_any")
    forged, _ = TicketSigner("guessed", ttl_s=30).issue(run_id, Role.OWNER, key_id="key_any")
    with daemon.client() as c:
        _sse_error(c.get(url), 401)
        _sse_error(c.get(url, params={"ticket": "garbage"}), 401)
        _sse_error(c.get(url, params={"ticket": expired}), 401)
        _sse_error(c.get(url, params={"ticket": forged}), 401)
        _sse_error(c.get(url, params={"ticket": good[:-3] + "abc"}), 401)
        _sse_error(c.get(f"/v1/runs/{other}/stream", params={"ticket": good}), 403)
        # a key is not a ticket
        _sse_error(c.get(url, headers={"Authorization": f"Bearer {daemon.keys['owner']}"}), 401)
        assert c.get(url, params={"ticket": good, "last_event_id": "x"}).status_code == 422
        with daemon.client("viewer") as v:
            assert v.post("/v1/tickets", json={"run_id": "run_nope"}).status_code == 404
            assert v.post("/v1/tickets", json={"run": run_id}).status_code == 422


def test_a_ticket_carries_the_role_of_the_key_that_asked(daemon: Daemon) -> None:
    run_id = daemon.start_run(
        {"prompt": "hello", "model": "fake:echo", "chain_of_thought": "surface"}
    )
    daemon.wait_done(run_id)
    _, as_viewer = stream_all(daemon, run_id, "viewer")
    _, as_developer = stream_all(daemon, run_id, "developer")
    assert "reasoning.delta" not in as_viewer and "reasoning.delta" in as_developer


def test_finished_run_replays_and_closes_then_204_after_the_end(daemon: Daemon) -> None:
    run_id = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
    daemon.wait_done(run_id)
    # The read ends only when the daemon closes the stream: one left open after the run's end
    # would be kept alive by its 0.2 s keep-alives until the test's timeout fails it.
    response, body = stream_all(daemon, run_id, "owner")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    ids = [int(line[4:]) for line in body.splitlines() if line.startswith("id: ")]
    assert ids == [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    assert is_run_terminal(frames[-1]["type"])
    ticket = daemon.ticket(run_id, "owner")
    with daemon.client() as c:
        end = c.get(
            f"/v1/runs/{run_id}/stream",
            params={"ticket": ticket},
            headers={"Last-Event-ID": str(ids[-1])},
        )
        assert end.status_code == 204
        tail = c.get(
            f"/v1/runs/{run_id}/stream", params={"ticket": ticket, "last_event_id": ids[-3]}
        )
        assert [int(x[4:]) for x in tail.text.splitlines() if x.startswith("id: ")] == ids[-2:]


def test_keepalive_comments_while_a_run_is_quiet(daemon: Daemon) -> None:
    run_id = daemon.start_run({"prompt": "slow", "model": "fake:slow"})
    ticket = daemon.ticket(run_id, "viewer")
    decoder = SSEDecoder()
    with (
        httpx.Client(base_url=daemon.base_url, timeout=5) as c,
        c.stream("GET", f"/v1/runs/{run_id}/stream", params={"ticket": ticket}) as r,
    ):
        # Three comments every 0.2 s take 0.6 s; the window is ten times that, for a loaded
        # machine, and still far below the default 15 s interval this daemon must not be using.
        deadline = time.monotonic() + 6
        for chunk in r.iter_raw():
            list(decoder.feed(chunk))
            if time.monotonic() > deadline or decoder.comments >= 3:
                break
    assert decoder.comments >= 3  # keepalive_s = 0.2


async def _resume_until_end(
    base_url: str, run_id: str, ticket: str, rng: random.Random, *, header: bool
) -> tuple[list[int], int]:
    """Read a random number of frames, drop the connection, resume; until the terminal event."""
    seen: list[int] = []
    connections = 0
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        while True:
            connections += 1
            last = seen[-1] if seen else 0
            params = {"ticket": ticket}
            headers = {}
            if header:
                headers["Last-Event-ID"] = str(last)
            else:
                params["last_event_id"] = str(last)
            budget = rng.randint(1, 40)
            decoder = SSEDecoder()
            async with client.stream(
                "GET", f"/v1/runs/{run_id}/stream", params=params, headers=headers
            ) as response:
                if response.status_code == 204:
                    return seen, connections
                assert response.status_code == 200
                done = False
                async for chunk in response.aiter_raw():
                    for message in decoder.feed(chunk):
                        if message.event not in ("", "message"):
                            continue
                        event = json.loads(message.data)
                        assert message.id == str(event["seq"])
                        seen.append(event["seq"])
                        budget -= 1
                        done = is_run_terminal(event["type"])
                        if done or budget <= 0:
                            break  # the rest of this chunk is dropped unread, as in a crash
                    if done or budget <= 0:
                        break
            if done:
                return seen, connections


@pytest.fixture(scope="module")
def sqlite_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    if not HAVE_SQLITE:
        pytest.skip("needs the SQLite store (thoughtgate.store.sqlite, branch store)")
    config = Config.from_mapping({"server": {"keepalive_s": 0.2, "secret": SECRET}})
    with running_daemon(
        config=config, shutdown_grace_s=0.1, sqlite_dir=tmp_path_factory.mktemp("sqlite")
    ) as d:
        yield d


@pytest.fixture
def resume_daemon(request: pytest.FixtureRequest) -> Daemon:
    name = "daemon" if request.param == "memory" else "sqlite_daemon"
    found: Daemon = request.getfixturevalue(name)
    return found


@pytest.mark.parametrize(
    ("resume_daemon", "role"),
    [("memory", "owner"), ("memory", "viewer"), ("sqlite", "owner")],
    indirect=["resume_daemon"],
)
async def test_resume_after_random_disconnects_has_no_gaps_or_duplicates(
    resume_daemon: Daemon, role: str
) -> None:
    daemon = resume_daemon
    rng = random.Random(f"resume-{role}")
    runs = [
        daemon.start_run(
            {"prompt": f"chatty {n}", "model": "fake:chatty", "chain_of_thought": "surface"}
        )
        for n in (150, 300, 300)
    ]
    tickets = [daemon.ticket(r, role) for r in runs]
    results = await asyncio.gather(
        *(
            _resume_until_end(daemon.base_url, r, t, random.Random(rng.random()), header=i % 2 == 0)
            for i, (r, t) in enumerate(zip(runs, tickets, strict=True))
        )
    )
    with daemon.client(role) as c:
        for run_id, (seen, connections) in zip(runs, results, strict=True):
            expected = [
                e["seq"]
                for e in c.get(f"/v1/runs/{run_id}/events", params={"limit": 5000}).json()["events"]
            ]
            assert seen == expected, run_id  # same order, nothing missing, nothing twice
            assert connections > 3
            if role == "owner":
                assert seen == list(range(1, len(seen) + 1))


async def test_live_reader_follows_until_the_terminal_event(daemon: Daemon) -> None:
    run_id = daemon.start_run(
        {"prompt": "chatty 400", "model": "fake:chatty", "chain_of_thought": "surface"}
    )
    ticket = daemon.ticket(run_id, "developer")
    async with (
        httpx.AsyncClient(base_url=daemon.base_url, timeout=10) as client,
        client.stream("GET", f"/v1/runs/{run_id}/stream", params={"ticket": ticket}) as response,
    ):
        decoder = SSEDecoder()
        events = []
        async for chunk in response.aiter_raw():
            events += [json.loads(m.data) for m in decoder.feed(chunk) if m.data]
    assert is_run_terminal(events[-1]["type"])  # the server ended the response
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert sum(e["type"] == "reasoning.delta" for e in events) > 0


# --------------------------------------------------------------------------- slow readers


def _chatty_runtime(store: MemoryStore) -> Runtime:
    return Runtime(store, Config())


async def test_a_slow_reader_never_slows_the_run_or_other_readers_and_can_resume() -> None:
    store = MemoryStore()
    runtime = _chatty_runtime(store)
    run = await runtime.create_run(
        RunRequest("chatty 600", model="fake:chatty", chain_of_thought="surface")
    )

    async def collect(frames: Any, delay: float, out: list[bytes] | None = None) -> list[bytes]:
        out = [] if out is None else out
        async for chunk in frames:
            out.append(chunk)
            if delay:
                await asyncio.sleep(delay)
        return out

    def stream(after: int = 0, lag: float = 0.05) -> Any:
        return live_frames(
            store,
            run.run_id,
            role=Role.OWNER,
            mode="surface",
            after=after,
            queue_size=8,
            lag_timeout_s=lag,
        )

    fast = asyncio.create_task(collect(stream(lag=5), 0))
    slow_so_far: list[bytes] = []
    # 0.1 s per write > lag timeout 0.05
    slow = asyncio.create_task(collect(stream(), 0.1, slow_so_far))
    await runtime.execute(run.run_id)
    slow_at_run_end = list(slow_so_far)
    fast_frames = await asyncio.wait_for(fast, 5)
    slow_frames = await asyncio.wait_for(slow, 10)
    total = len(await store.read(run.run_id))

    def decode(chunks: list[bytes]) -> tuple[list[int], list[Any]]:
        decoder = SSEDecoder()
        messages = [m for c in chunks for m in decoder.feed(c)]
        # (an SSE id persists across messages, so the unnamed-id lagging note repeats the last)
        ids = [int(m.id) for m in messages if m.id is not None and m.event != "lagging"]
        notes = [json.loads(m.data) for m in messages if m.event == "lagging"]
        return ids, notes

    fast_ids, fast_notes = decode(fast_frames)
    assert fast_ids == list(range(1, total + 1)) and not fast_notes
    slow_ids, notes = decode(slow_frames)
    assert notes and notes[0]["resume_after"] == slow_ids[-1] < total
    assert slow_ids == list(range(1, len(slow_ids) + 1))
    # The run did not wait for the slow reader: had each write waited for room in its queue (8
    # entries), the run could only have ended once the reader had taken all but the last few;
    # it ended with the reader (at 0.1 s a frame) not halfway.
    assert len(decode(slow_at_run_end)[0]) < total // 2
    rest, _ = decode(await collect(stream(after=notes[0]["resume_after"], lag=5), 0))
    assert slow_ids + rest == list(range(1, total + 1))


def test_read_sse_helper_counts_comments() -> None:
    class Fake:
        def iter_bytes(self) -> Iterator[bytes]:
            yield b": ping\n\nid: 1\ndata: {}\n\n"

    messages, comments = read_sse(Fake())  # type: ignore[arg-type]
    assert comments == 1 and messages[0].id == "1"


def _stalled_reader(daemon: Daemon, run_id: str, ticket: str) -> Any:
    """A connection that asks for the stream and then never reads a byte."""
    import socket

    host, port = daemon.base_url.removeprefix("http://").split(":")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    stalled.connect((host, int(port)))
    stalled.sendall(
        f"GET /v1/runs/{run_id}/stream?ticket={ticket} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    )
    return stalled


def test_a_reader_that_stops_reading_does_not_hold_up_the_run_or_others(daemon: Daemon) -> None:
    import socket

    run_id = daemon.start_run(
        {"prompt": "chatty 1500", "model": "fake:chatty", "chain_of_thought": "surface"}
    )
    stalled = _stalled_reader(daemon, run_id, daemon.ticket(run_id, "owner"))
    stalled.settimeout(30)
    try:
        # its stream is open and being sent to (peeked at, not read)...
        assert stalled.recv(16, socket.MSG_PEEK).startswith(b"HTTP/1.1 200")
        # ...and it never reads a byte: meanwhile the run ends and another reader gets it all
        # (a run held up by it would not end: wait_done gives up on it)
        done = daemon.wait_done(run_id, timeout=60)
        assert done["status"] == "completed"
        _, body = stream_all(daemon, run_id, "owner")
        ids = [int(line[4:]) for line in body.splitlines() if line.startswith("id: ")]
        assert ids == list(range(1, ids[-1] + 1)) and ids[-1] > 3000
        assert is_run_terminal(sse_events(body)[-1]["type"])
        # all of that while what was sent to the stalled reader still waits unread, from its
        # first byte
        assert stalled.recv(16, socket.MSG_PEEK | socket.MSG_DONTWAIT).startswith(b"HTTP/1.1 200")
    finally:
        stalled.close()


def _wait_until(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


def test_a_reader_that_stops_reading_is_closed_after_the_send_timeout() -> None:
    config = Config.from_mapping({"server": {"keepalive_s": 0.2, "secret": SECRET}})
    with running_daemon(config=config, shutdown_grace_s=0.1, sse_send_timeout_s=0.5) as daemon:
        streams = daemon.app.state.thoughtgate.streams
        connections = daemon.server.server_state.connections
        run_id = daemon.start_run(  # ~10 MB of frames: more than every buffer on the way holds
            {"prompt": "chatty 20000", "model": "fake:chatty", "chain_of_thought": "surface"}
        )
        stalled = _stalled_reader(daemon, run_id, daemon.ticket(run_id, "owner"))
        try:
            assert _wait_until(lambda: len(streams) > 0, 30)
            assert daemon.wait_done(run_id, timeout=60)["status"] == "completed"
            # its stream stays stuck writing until a write has been blocked for the send
            # timeout; then the server lets it go (the client never read a byte nor left)
            assert _wait_until(lambda: len(streams) == 0, 30)
            # and its connection: a close would wait for the client to read what is buffered
            # for it (megabytes, in the process and the kernel), for ever (ADR 0147)
            assert _wait_until(lambda: not connections, 30), f"{len(connections)} still open"
        finally:
            stalled.close()


def test_every_open_stream_ends_when_the_server_stops() -> None:
    config = Config.from_mapping({"server": {"keepalive_s": 0.2, "secret": SECRET}})
    with running_daemon(config=config, shutdown_grace_s=0.1) as daemon:
        state = daemon.app.state.thoughtgate
        run_id = daemon.start_run({"prompt": "slow", "model": "fake:slow"})
        ticket = daemon.ticket(run_id, "viewer")
        with (
            httpx.Client(base_url=daemon.base_url, timeout=5) as c,
            c.stream("GET", f"/v1/runs/{run_id}/stream", params={"ticket": ticket}) as r,
        ):
            assert _wait_until(lambda: len(state.streams) > 0, 30)
            # what the daemon's server does on SIGTERM once its runs are drained
            assert state.streams.loop is not None
            state.streams.loop.call_soon_threadsafe(state.streams.stop_all)
            list(r.iter_raw())  # the response ends (the client's read timeout is 5 s)...
        # ...before the run does (fake:slow is quiet for 30 s): the stop ended it
        assert daemon.get(f"/v1/runs/{run_id}", "owner").json()["status"] == "running"


# --------------------------------------------------------------------------- one request per run


def _start_and_follow(daemon: Daemon, role: str, body: dict[str, Any]) -> tuple[int, Any, str]:
    with (
        daemon.client(role) as c,
        c.stream("POST", "/v1/runs/follow", json=body) as r,
    ):
        return r.status_code, r.headers, r.read().decode("utf-8")


def test_one_request_starts_the_run_and_streams_it_to_the_callers_role(daemon: Daemon) -> None:
    body = {"prompt": "chatty 20", "model": "fake:chatty", "chain_of_thought": "surface"}
    status, headers, text = _start_and_follow(daemon, "developer", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse_events(text)
    run_id = events[0]["run_id"]
    assert headers["location"] == f"/v1/runs/{run_id}"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # all of it, in order
    assert events[0]["type"] == "run.started" and is_run_terminal(events[-1]["type"])
    assert any(e["type"] == "reasoning.delta" for e in events)  # a developer, on surface
    # what the ticket route gives the same role, byte for byte
    _, replayed = stream_all(daemon, run_id, "developer")
    assert sse_events(replayed) == events

    _, _, member_text = _start_and_follow(daemon, "member", body)
    member_events = sse_events(member_text)
    assert is_run_terminal(member_events[-1]["type"])
    assert not any(e["type"] == "reasoning.delta" for e in member_events)  # the one filter
    assert '"r0 "' in text and '"r0 "' not in member_text  # the model's thought itself


def test_one_request_needs_a_role_that_may_start_runs_and_a_valid_body(daemon: Daemon) -> None:
    body = {"prompt": "hello", "model": "fake:echo"}
    assert _start_and_follow(daemon, "viewer", body)[0] == 403
    with daemon.client() as c:
        assert c.post("/v1/runs/follow", json=body).status_code == 401
    assert _start_and_follow(daemon, "member", {**body, "base_url": "http://x"})[0] == 422

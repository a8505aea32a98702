"""Inputs at and past their limits: resuming at or past the end of a finished run answers 204 at
once (no stream held open, no store polling), a finished run's stream ends after its last event,
integers outside their range are 422 (never 500), and over-deep JSON is 400."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.daemon import HAVE_SQLITE, Daemon, running_daemon, sse_events

from thoughtgate.config import Config
from thoughtgate.events.schema import NewEvent
from thoughtgate.server.state import ServerState
from thoughtgate.store.records import RunRecord

BIG = 2**63


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    if not HAVE_SQLITE:
        pytest.skip("needs the SQLite store")
    config = Config.from_mapping({"server": {"keepalive_s": 0.5}})
    with running_daemon(
        config=config, shutdown_grace_s=0.1, sqlite_dir=tmp_path_factory.mktemp("bounds")
    ) as d:
        yield d


def state(daemon: Daemon) -> ServerState:
    found = daemon.app.state.thoughtgate
    assert isinstance(found, ServerState)
    return found


def status_of(client: httpx.Client, url: str, **kw: Any) -> int:
    """The status, without reading the body: a wrongly held-open stream fails fast, not never."""
    with client.stream("GET", url, **kw) as response:
        return response.status_code


def body_within(client: httpx.Client, url: str, seconds: float, **kw: Any) -> str:
    """The whole body, or a failure once ``seconds`` pass (keep-alive comments reset httpx's
    read timeout, so it alone would wait forever)."""
    deadline = time.monotonic() + seconds
    chunks: list[bytes] = []
    with client.stream("GET", url, **kw) as response:
        for chunk in response.iter_raw():
            chunks.append(chunk)
            assert time.monotonic() < deadline, "the stream was held open"
    return b"".join(chunks).decode()


def finished_run(daemon: Daemon) -> tuple[str, int]:
    run_id = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
    daemon.wait_done(run_id)
    with daemon.client("owner") as c:
        last = c.get(f"/v1/runs/{run_id}/events", params={"limit": 5000}).json()["next_after"]
    return run_id, int(last)


# --------------------------------------------------------------------------- 204 at the end


def test_resuming_at_or_past_the_end_of_a_finished_run_answers_204_at_once(
    daemon: Daemon,
) -> None:
    """The attack: ``Last-Event-ID`` past the end held the stream open forever, polling the
    store 4 times a second; a few hundred of them from one viewer key held a third of a core."""
    run_id, last = finished_run(daemon)
    ticket = daemon.ticket(run_id, "viewer")
    url = f"/v1/runs/{run_id}/stream"
    # "at once" against "forever": bounds a loaded machine cannot reach by being slow
    with httpx.Client(base_url=daemon.base_url, timeout=10) as c:
        for after in (last, last + 1, last + 1000, BIG - 1):
            for how in ("header", "query"):
                started = time.monotonic()
                if how == "header":
                    kw: dict[str, Any] = {"headers": {"Last-Event-ID": str(after)}}
                    kw["params"] = {"ticket": ticket}
                else:
                    kw = {"params": {"ticket": ticket, "last_event_id": str(after)}}
                assert status_of(c, url, **kw) == 204, (after, how)
                assert time.monotonic() - started < 5.0
    assert state(daemon).feeds is not None and state(daemon).feeds.active == 0


async def test_many_resumes_past_the_end_hold_nothing_open(daemon: Daemon) -> None:
    run_id, last = finished_run(daemon)
    ticket = daemon.ticket(run_id, "viewer")

    async def resume(c: httpx.AsyncClient, after: int) -> int:
        async with c.stream(
            "GET",
            f"/v1/runs/{run_id}/stream",
            params={"ticket": ticket},
            headers={"Last-Event-ID": str(after)},
        ) as response:
            return response.status_code

    # A stream held open shows as a 200 or a read timeout (30 s without a byte: 50 requests at
    # once to a daemon sharing this process took over 5 s to answer on a loaded machine);
    # waiting for one of the 50 pooled connections is unbounded, as it only measures how loaded
    # the machine is: 300 requests through 50 connections queue six deep.
    timeout = httpx.Timeout(30, pool=None)
    async with httpx.AsyncClient(
        base_url=daemon.base_url, timeout=timeout, limits=httpx.Limits(max_connections=50)
    ) as c:
        resumes = asyncio.gather(*(resume(c, last + 1 + i) for i in range(300)))
        answers = await asyncio.wait_for(resumes, 120)
    assert set(answers) == {204}
    assert state(daemon).feeds is not None and state(daemon).feeds.active == 0


def test_a_finished_run_without_a_terminal_event_streams_to_its_last_event_and_ends(
    daemon: Daemon,
) -> None:
    """A run whose record says it ended but whose log lacks the terminal event (written by an
    older version, or repaired by hand) must not hold its readers forever."""

    async def make() -> str:
        run = RunRecord("run_" + "e" * 32, "p", status="running")
        await daemon.store.create_run(run)
        await daemon.store.append(run.run_id, [NewEvent("run.started"), NewEvent("task.started")])
        await daemon.store.update_run(run.run_id, status="failed")  # its log left as it was
        return run.run_id

    run_id = asyncio.run(make())
    ticket = daemon.ticket(run_id, "owner")
    url = f"/v1/runs/{run_id}/stream"
    with httpx.Client(base_url=daemon.base_url, timeout=10) as c:
        body = body_within(c, url, 10, params={"ticket": ticket})
        assert [e["seq"] for e in sse_events(body)] == [1, 2]
        end = status_of(c, url, params={"ticket": ticket}, headers={"Last-Event-ID": "2"})
    assert end == 204


def test_resuming_past_the_last_event_of_a_running_run_is_422(daemon: Daemon) -> None:
    run_id = daemon.start_run({"prompt": "slow", "model": "fake:slow"})
    ticket = daemon.ticket(run_id, "viewer")
    with (
        httpx.Client(base_url=daemon.base_url, timeout=3) as c,
        c.stream(
            "GET",
            f"/v1/runs/{run_id}/stream",
            params={"ticket": ticket},
            headers={"Last-Event-ID": "100000"},
        ) as r,
    ):
        assert r.status_code == 422
        assert "past the last event" in json.loads(r.read())["error"]["message"]


# --------------------------------------------------------------------------- integers


@pytest.mark.parametrize(
    ("path", "param", "value"),
    [
        ("/v1/runs/{run}/events", "after", str(BIG)),
        ("/v1/runs/{run}/events", "after", "-1"),
        ("/v1/runs/{run}/events", "after", "9" * 40),
        ("/v1/runs/{run}/events", "after", "１２"),  # full-width digits: int() takes them
        ("/v1/runs/{run}/events", "limit", str(BIG)),
        ("/v1/runs/{run}/events", "limit", "0"),
        ("/v1/runs", "offset", str(BIG)),
        ("/v1/runs", "offset", "-5"),
        ("/v1/runs", "limit", str(-BIG)),
        ("/v1/runs", "since", str(BIG)),
        ("/v1/runs", "until", "-1"),
        ("/v1/runs/{run}/stream", "last_event_id", str(BIG)),
        ("/v1/runs/{run}/stream", "last_event_id", "-1"),
        ("/v1/runs/{run}/stream", "Last-Event-ID", str(BIG)),
        ("/v1/runs/{run}/stream", "Last-Event-ID", "1e3"),
    ],
)
def test_integers_out_of_range_are_422_naming_the_parameter(
    daemon: Daemon, path: str, param: str, value: str
) -> None:
    run_id, _ = finished_run(daemon)
    params: dict[str, str] = {}
    headers: dict[str, str] = {}
    if path.endswith("/stream"):
        params["ticket"] = daemon.ticket(run_id, "viewer")
    if param == "Last-Event-ID":
        headers[param] = value
    else:
        params[param] = value
    with daemon.client("viewer") as c:
        r = c.get(path.format(run=run_id), params=params, headers=headers)
    assert r.status_code == 422, (param, value, r.status_code, r.text)
    message = r.json()["error"]["message"]
    assert param in message and ("integer" in message or "between" in message), message


def test_the_largest_allowed_integer_is_fine(daemon: Daemon) -> None:
    run_id, _ = finished_run(daemon)
    with daemon.client("viewer") as c:
        r = c.get(f"/v1/runs/{run_id}/events", params={"after": str(BIG - 1)})
        assert r.status_code == 200 and r.json()["events"] == []
        assert c.get("/v1/runs", params={"offset": str(BIG - 1)}).json()["runs"] == []
        far = {"since": str(BIG - 1), "until": str(BIG - 1)}
        assert c.get("/v1/runs", params=far).json()["runs"] == []


# --------------------------------------------------------------------------- deep JSON


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
@pytest.mark.parametrize(
    ("path", "role", "wrap"),
    [
        ("/v1/runs", "member", '{{"prompt": "x", "tasks": {}}}'),
        ("/v1/runs", "member", "{}"),
        ("/v1/tickets", "viewer", '{{"run_id": {}}}'),
        ("/v1/keys", "admin", '{{"name": "n", "role": {}}}'),
    ],
)
def test_over_deep_json_is_400(daemon: Daemon, path: str, role: str, wrap: str, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    with daemon.client(role) as c:
        r = c.post(path, content=wrap.format(nested), headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_json" and "nested deeper than 64" in error["message"]


def test_json_at_the_depth_limit_is_judged_by_its_shape(daemon: Daemon) -> None:
    nested = "[" * 63 + "]" * 63  # with the object around them: 64 levels, the limit
    with daemon.client("member") as c:
        r = c.post("/v1/runs", content=f'{{"prompt": "x", "tasks": {nested}}}')
    assert r.status_code == 422, r.text  # not a 400: only the shape is wrong


def test_the_daemon_is_still_healthy(daemon: Daemon) -> None:
    with daemon.client() as c:
        assert c.get("/healthz").status_code == 200

"""Live streams per key: one key holds at most ``quotas.max_live_streams_per_key`` (ADR 0155).

Every live stream holds a connection, and ``server.max_connections`` is shared by all keys: past
its limit a key's next stream is ``429`` with ``Retry-After``, as its runs past their quota are,
while other keys still open theirs; a refused ``/v1/runs/follow`` starts no run. A slot is
given back when its stream ends, however it ends, so a key never loses one for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, ClassVar

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.daemon import Daemon, running_daemon

from thoughtgate.config import Config, QuotasConfig
from thoughtgate.errors import QuotaExceededError
from thoughtgate.server.routes import all_endpoints
from thoughtgate.server.stream_slots import StreamSlots, admitted

pytestmark = pytest.mark.inprocess

SECRET = "test-ticket-secret"


def _wait_until(check: Callable[[], bool], timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _key_id(daemon: Daemon, role: str) -> str:
    return str(daemon.get("/v1/me", role).json()["key_id"])


def _refused(response: httpx.Response) -> None:
    assert response.status_code == 429, response.read()
    error = response.json()["error"]
    assert error["code"] == "too_many_requests"
    assert "max_live_streams_per_key" in error["message"]
    assert int(response.headers["Retry-After"]) >= 1


def test_every_streaming_route_is_admitted_per_key() -> None:
    """The limit is taken where every ``text/event-stream`` route is called: these four."""
    live = {e.path for e in all_endpoints() if e.media_type == "text/event-stream"}
    assert live == {"/v1/runs/{run_id}/stream", "/v1/runs/follow", "/v1/runs/stream", "/v1/agui"}


def test_the_default_is_above_a_keys_open_runs() -> None:
    """A key may follow every run it may have open, and more."""
    quotas = QuotasConfig()
    assert quotas.max_live_streams_per_key > quotas.max_open_runs_per_key


def test_a_key_past_its_live_streams_is_429_until_one_ends() -> None:
    config = Config.from_mapping(
        {
            "server": {"keepalive_s": 0.2, "secret": SECRET},
            "quotas": {"max_live_streams_per_key": 2},
        }
    )
    with (
        running_daemon(config=config, shutdown_grace_s=0.1) as daemon,
        contextlib.ExitStack() as held,
        httpx.Client(base_url=daemon.base_url, timeout=10) as c,
        daemon.client("member") as member,
    ):
        slots = daemon.app.state.thoughtgate.stream_slots
        viewer = _key_id(daemon, "viewer")
        run_id = daemon.start_run({"prompt": "slow", "model": "fake:slow"})
        url = f"/v1/runs/{run_id}/stream"

        def open_stream(role: str = "viewer") -> httpx.Response:
            ticket = daemon.ticket(run_id, role)
            return held.enter_context(c.stream("GET", url, params={"ticket": ticket}))

        first, second = open_stream(), open_stream()
        assert (first.status_code, second.status_code) == (200, 200)
        assert slots.held(viewer) == 2
        third = c.get(url, params={"ticket": daemon.ticket(run_id, "viewer")})
        _refused(third)
        runs_ticket = c.post(
            "/v1/tickets",
            json={"scope": "runs"},
            headers={"Authorization": f"Bearer {daemon.keys['viewer']}"},
        ).json()["ticket"]
        _refused(c.get("/v1/runs/stream", params={"ticket": runs_ticket}))
        assert open_stream("developer").status_code == 200, "another key is not starved"

        # one request per run: a refused follow starts no run
        follows = [
            held.enter_context(
                member.stream("POST", "/v1/runs/follow", json={"prompt": "slow", "model": m})
            )
            for m in ("fake:slow", "fake:slow")
        ]
        assert [r.status_code for r in follows] == [200, 200]
        listed = len(member.get("/v1/runs").json()["runs"])
        _refused(member.post("/v1/runs/follow", json={"prompt": "slow", "model": "fake:slow"}))
        assert len(member.get("/v1/runs").json()["runs"]) == listed, "no run was started"

        first.close()  # the client goes away: its slot comes back
        assert _wait_until(lambda: slots.held(viewer) == 1)
        assert open_stream().status_code == 200
        held.close()
        keys = [viewer, _key_id(daemon, "developer"), _key_id(daemon, "member")]
        assert _wait_until(lambda: not any(slots.held(key) for key in keys))


# --------------------------------------------------------------------------- never leaked


class _Scripted:
    """A stream response that ends as the test says: its run ends, the client goes away, it
    fails, or its task is cancelled (the daemon shutting down)."""

    status_code = 200
    raw_headers: ClassVar[list[tuple[bytes, bytes]]] = []
    background = None

    def __init__(self) -> None:
        self.ending: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        how = await self.ending
        if how == "fails":
            raise RuntimeError("the stream failed")
        if how == "client_left":
            assert (await receive())["type"] == "http.disconnect"


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("open"), st.sampled_from("ab")),
        st.tuples(st.just("open_fails"), st.sampled_from("ab")),
        st.tuples(
            st.just("end"),
            st.integers(0, 7),
            st.sampled_from(["run_ended", "client_left", "fails", "cancelled"]),
        ),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, limit=st.integers(1, 3))
def test_a_slot_is_held_exactly_while_its_stream_lasts(ops: list[Any], limit: int) -> None:
    """Whatever streams open, are refused, fail before they answer, or end (each way a stream
    ends), every key holds exactly as many slots as it has streams still open, and is refused
    exactly when that is its limit."""

    async def play() -> None:
        slots = StreamSlots()
        open_streams: list[tuple[str, _Scripted, asyncio.Task[None]]] = []

        async def disconnect() -> dict[str, str]:
            return {"type": "http.disconnect"}

        async def ignore(message: Any) -> None:
            return None

        for op in ops:
            if op[0] in ("open", "open_fails"):
                key = op[1]
                full = sum(1 for k, _, _ in open_streams if k == key) >= limit
                scripted = _Scripted()

                async def respond(op: str = op[0], scripted: _Scripted = scripted) -> Any:
                    if op == "open_fails":
                        raise LookupError("the route failed before it answered")
                    return scripted

                try:
                    response = await admitted(slots, key, limit, respond)
                except QuotaExceededError:
                    assert full
                except LookupError:
                    assert not full and op[0] == "open_fails"
                else:
                    assert not full and op[0] == "open"
                    task = asyncio.create_task(response({}, disconnect, ignore))
                    await asyncio.sleep(0)
                    open_streams.append((key, scripted, task))
            elif open_streams:
                _, scripted, task = open_streams.pop(op[1] % len(open_streams))
                if op[2] == "cancelled":
                    task.cancel()
                else:
                    scripted.ending.set_result(op[2])
                with contextlib.suppress(RuntimeError, asyncio.CancelledError):
                    await task
            for key in "ab":
                assert slots.held(key) == sum(1 for k, _, _ in open_streams if k == key)
        for _, _, task in open_streams:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert slots.held("a") == slots.held("b") == 0

    asyncio.run(play())

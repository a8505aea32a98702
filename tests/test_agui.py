"""``POST /v1/agui``: the real AG-UI client (npm ``@ag-ui/client``, under node) against a daemon,
as developer and as viewer, and the endpoint's own rules (roles, input, endings, approvals)."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, agui_input, markers, running_daemon
from support.durable import until
from support.node import node_json

from thoughtgate.errors import StoreError
from thoughtgate.events.schema import Event
from thoughtgate.providers.base import Provider, TurnRequest
from thoughtgate.server.state import ServerState
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, FakeProvider, text

TOOLS = ["lookup"]


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


def _agui(
    daemon: Daemon, role: str, body: dict[str, Any]
) -> tuple[httpx.Response, list[dict[str, Any]], str]:
    """One AG-UI request: the response, its decoded events and its raw body. (The body is
    written as ASCII JSON: a lone surrogate as a ``\\u`` escape, which UTF-8 cannot carry.)"""
    sent = json.dumps(body).encode("ascii")
    headers = {"content-type": "application/json"}
    with daemon.client(role) as c, c.stream("POST", "/v1/agui", content=sent, headers=headers) as r:
        raw = r.read().decode("utf-8")
    events = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:")]
    return r, events, raw


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def _client(daemon: Daemon, role: str, prompt: str = "", **thoughtgate: Any) -> dict[str, Any]:
    spec = {"prompt": prompt, "forwardedProps": {"thoughtgate": thoughtgate}}
    out: dict[str, Any] = node_json(
        "agui_client.mjs", f"{daemon.base_url}/v1/agui", daemon.keys[role], json.dumps(spec)
    )
    return out


# --------------------------------------------------------------------------- the real client


def test_the_ag_ui_client_runs_as_developer_and_follows_as_viewer_without_reasoning(
    daemon: Daemon,
) -> None:
    token = uuid.uuid4().hex[:10]
    mark = markers(token)
    dev = _client(
        daemon, "developer", f"canary {token}",
        model="fake:canary", chain_of_thought="surface", tools=TOOLS,
    )  # fmt: skip
    assert dev["error"] is None and dev["runError"] is None, dev
    kinds = _types(dev["events"])
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
    assert {"REASONING_START", "REASONING_MESSAGE_CONTENT", "REASONING_END"} <= set(kinds)
    assert "REASONING_ENCRYPTED_VALUE" not in kinds
    assert {"TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"} <= set(kinds)
    roles = [m["role"] for m in dev["messages"]]
    assert "reasoning" in roles and "tool" in roles and roles.count("assistant") == 2
    answer = [m for m in dev["messages"] if m["role"] == "assistant" and m.get("content")]
    assert [m["content"] for m in answer] == ["The answer is 42."]
    dumped = json.dumps(dev)
    assert mark["reasoning"] in dumped and mark["tool"] in dumped
    assert mark["carrier"] not in dumped, "carriers never leave, not even for developers"

    run_id = dev["events"][0]["metadata"]["thoughtgate"]["run_id"]
    viewer = _client(daemon, "viewer", run=run_id)
    assert viewer["error"] is None and viewer["runError"] is None, viewer
    kinds = _types(viewer["events"])
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
    assert not any(k.startswith("REASONING") for k in kinds)
    assert not any(k.startswith("TOOL_CALL") for k in kinds), "a viewer reads no tool data"
    assert [m["content"] for m in viewer["messages"] if m["role"] == "assistant"] == [
        "The answer is 42."
    ]
    cards = [m for m in viewer["messages"] if m.get("activityType") == "thoughtgate.tool"]
    assert [c["content"] for c in cards] == [
        {"call_id": "call_lookup", "tool": "lookup", "label": "lookup", "status": "completed"}
    ]
    dumped = json.dumps(viewer)
    for secret in mark.values():
        assert secret not in dumped
    # ... and not a byte of it on the wire either
    _, _, raw = _agui(daemon, "viewer", agui_input(run=run_id))
    assert "REASONING" not in raw and mark["reasoning"] not in raw


@pytest.mark.parametrize("mode", ["hidden", "telemetry_only"])
def test_no_reasoning_events_outside_surface_runs_even_for_owners(
    daemon: Daemon, mode: str
) -> None:
    token = uuid.uuid4().hex[:10]
    out = _client(
        daemon, "owner", f"canary {token}",
        model="fake:canary", chain_of_thought=mode, tools=TOOLS,
    )  # fmt: skip
    assert out["runError"] is None
    assert not any(k.startswith("REASONING") for k in _types(out["events"]))
    assert markers(token)["reasoning"] not in json.dumps(out)


# --------------------------------------------------------------------------- roles and input


def test_starting_a_run_needs_member_following_one_needs_viewer(daemon: Daemon) -> None:
    r, _, raw = _agui(daemon, "viewer", agui_input("x", model="fake:echo"))
    assert r.status_code == 403 and "forbidden" in raw
    r, events, _ = _agui(daemon, "member", agui_input("x", model="fake:echo"))
    assert r.status_code == 200 and _types(events)[-1] == "RUN_FINISHED"
    run_id = r.headers["x-thoughtgate-run-id"]
    assert events[0]["metadata"]["thoughtgate"]["run_id"] == run_id
    assert (events[0]["threadId"], events[0]["runId"]) == ("t-1", "r-1")
    r, events, _ = _agui(daemon, "viewer", agui_input("ignored", run=run_id))
    assert r.status_code == 200 and _types(events)[-1] == "RUN_FINISHED"
    with daemon.client() as c:
        assert c.post("/v1/agui", json=agui_input("x", model="fake:echo")).status_code == 401


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"tools": [{"name": "f", "description": "d", "parameters": {}}]}, 422, "frontend tools"),
        ({"resume": [{"interruptId": "i", "status": "resolved"}]}, 422, "resume is not supported"),
        (
            {"messages": [{"id": "a", "role": "assistant", "content": "hi"}]},
            422,
            "must end with a user message",
        ),
        (
            {
                "messages": [
                    {
                        "id": "u",
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "url", "value": "https://x"}}
                        ],
                    }
                ]
            },
            422,
            "only text content",
        ),
        ({"forwardedProps": {"thoughtgate": {"base_url": "http://evil"}}}, 422, "base_url"),
        ({"forwardedProps": {"thoughtgate": {"run": "run_nope"}}}, 404, "run_nope"),
        ({"threadId": None}, 422, "threadId"),
    ],
)
def test_bad_input_is_a_clear_error_before_anything_streams(
    daemon: Daemon, change: dict[str, Any], status: int, message: str
) -> None:
    body = {**agui_input("x", model="fake:echo"), **change}
    with daemon.client("member") as c:
        r = c.post("/v1/agui", json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert message in r.json()["error"]["message"]
    assert "pydantic.dev" not in r.text


CUT = "half an emoji: \ud83d"
"""A model's text cut inside a surrogate pair, as Python's ``json`` reads a provider's
``"\\ud83d"``; a payload keeps it exactly (ADR 0114)."""


def _cut_emoji(request: TurnRequest, turn: int) -> Iterator[Any]:
    yield text(CUT)


def test_a_lone_surrogate_in_the_answer_or_the_input_streams_as_an_escape(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UTF-8 cannot carry a lone surrogate (in the model's answer, or in the ``threadId`` a
    client sent, which ``RUN_STARTED`` echoes): the frame writes it as a ``\\u`` escape, which
    the client's JSON reader turns back into the same text, instead of the stream breaking off
    after its headers with a traceback in the daemon's log."""
    monkeypatch.setitem(FAKE_SCRIPTS, "cut-emoji", _cut_emoji)
    body = {**agui_input("hi", model="fake:cut-emoji"), "threadId": "t-\udfff"}
    r, events, raw = _agui(daemon, "member", body)
    assert r.status_code == 200 and _types(events)[-1] == "RUN_FINISHED", raw
    assert events[0]["threadId"] == "t-\udfff"
    said = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "".join(said) == CUT
    follow = agui_input("ignored", run=r.headers["x-thoughtgate-run-id"])
    r, events, raw = _agui(daemon, "viewer", follow)
    assert r.status_code == 200 and _types(events)[-1] == "RUN_FINISHED", raw
    assert "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT") == CUT


def test_reasoning_a_client_sends_back_never_reaches_the_model() -> None:
    seen: list[TurnRequest] = []

    def script(request: TurnRequest, turn: int) -> Iterator[Any]:
        seen.append(request)
        yield text("ok")

    def factory(model: str) -> Provider:
        return FakeProvider(script)

    with running_daemon(provider_factory=factory) as d:
        body = agui_input("second question", model="fake:x")
        body["messages"] = [
            {"id": "u0", "role": "user", "content": "first question"},
            {"id": "r0", "role": "reasoning", "content": "SECRET-REASONING-4411"},
            {"id": "a0", "role": "assistant", "content": "first answer"},
            {"id": "s0", "role": "system", "content": "Be brief."},
            {"id": "u1", "role": "user", "content": "second question"},
        ]
        body["context"] = [{"description": "user timezone", "value": "Europe/Paris"}]
        _, events, _ = _agui(d, "member", body)
    assert _types(events)[-1] == "RUN_FINISHED"
    (request,) = seen
    sent = json.dumps([[getattr(p, "text", "") for p in m.parts] for m in request.messages])
    assert "SECRET-REASONING" not in sent
    assert [m.role for m in request.messages] == ["user", "assistant", "user"]
    assert request.system == "Be brief.\n\nuser timezone: Europe/Paris"


# --------------------------------------------------------------------------- how runs end


@pytest.mark.parametrize(("model", "code"), [("fake:outage", "failed"), ("fake:cut", "partial")])
def test_a_run_that_did_not_complete_ends_with_run_error(
    daemon: Daemon, model: str, code: str
) -> None:
    out = _client(daemon, "member", "x", model=model)
    assert out["error"] is None
    kinds = _types(out["events"])
    assert kinds[-1] == "RUN_ERROR" and "RUN_FINISHED" not in kinds
    assert out["runError"]["code"] == code
    assert out["runError"]["message"].startswith(f"the run is {code}")


def test_approvals_are_custom_events_answered_through_the_api(daemon: Daemon) -> None:
    body = agui_input("go", model="fake:approval", tools=["dangerous"])
    events: list[dict[str, Any]] = []

    def answer(run_id: str, call_id: str) -> None:
        with daemon.client("member") as c:
            r = c.post(f"/v1/runs/{run_id}/approvals/{call_id}", json={"decision": "approve"})
            assert r.status_code == 200, r.text

    with daemon.client("developer") as c, c.stream("POST", "/v1/agui", json=body) as r:
        run_id = r.headers["x-thoughtgate-run-id"]
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            events.append(event)
            if event["type"] == "CUSTOM" and event["name"] == "thoughtgate.approval_required":
                value = event["value"]
                assert value["answer"]["path"] == f"/v1/runs/{run_id}/approvals/call_danger"
                assert value["input"] == {"target": "prod"}  # member+ reads the arguments
                threading.Thread(target=answer, args=(run_id, value["call_id"])).start()
    names = [e["name"] for e in events if e["type"] == "CUSTOM"]
    assert names[:2] == ["thoughtgate.approval_required", "thoughtgate.approval_response"]
    assert _types(events)[-1] == "RUN_FINISHED"
    results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert [e["content"] for e in results] == ["changed prod"]


class _Held:
    """``fake:held``: says one word, then waits until the test lets it go. It runs on the
    daemon's event loop, which it keeps for the test (``loop``)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.go = threading.Event()

    def __call__(self, request: TurnRequest, turn: int) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            self.loop = asyncio.get_running_loop()
            yield text("one ")
            while not self.go.is_set():  # noqa: ASYNC110 (another thread sets it)
                await asyncio.sleep(0.02)
            yield text("two")

        return gen()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Held]:
    script = _Held()
    monkeypatch.setitem(FAKE_SCRIPTS, "held", script)
    yield script
    script.go.set()


SECRET_PATH = "/srv/secret-store-dir/daemon.db"


class _UnreadableStore(MemoryStore):
    """A memory store whose event reads fail once ``failing`` is set, with a message naming
    its file, as a SQLite or PostgreSQL error names its database."""

    failing = False

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        if self.failing:
            raise StoreError(f"{SECRET_PATH}: disk I/O error")
        return await super().read(run_id, after=after, limit=limit, apart=apart)


@pytest.mark.parametrize("finished", [True, False], ids=["replayed", "followed"])
def test_a_store_read_that_fails_ends_the_stream_with_run_error_never_run_finished(
    held: _Held, finished: bool
) -> None:
    """Before, the stream's reader died with the read and the response stayed open, sending
    keep-alives, for ever: an AG-UI client waited on a run it could never see end."""
    store = _UnreadableStore()
    with running_daemon(store=store) as d:
        if finished:
            r, _, _ = _agui(d, "member", agui_input("x", model="fake:echo"))
            run_id = r.headers["x-thoughtgate-run-id"]
        else:
            run_id = d.start_run({"prompt": "x", "model": "fake:held"})
        store.failing = True
        r, events, raw = _agui(d, "viewer", agui_input("ignored", run=run_id))
    assert r.status_code == 200
    assert _types(events) == ["RUN_STARTED", "RUN_ERROR"], raw
    assert events[-1]["code"] == "store_unavailable"
    assert events[-1]["message"] == (
        "the run's events cannot be read now: the event store is unavailable; "
        "follow the run again later"
    )
    assert events[-1]["metadata"] == {"thoughtgate": {"run_id": run_id}}
    assert "secret-store-dir" not in raw and "disk I/O" not in raw


def test_a_client_that_disconnects_stops_its_streams_reader(held: _Held) -> None:
    with running_daemon() as d:
        state = d.app.state.thoughtgate
        assert isinstance(state, ServerState)
        body = agui_input("x", model="fake:held")
        with d.client("member") as c, c.stream("POST", "/v1/agui", json=body) as r:
            run_id = r.headers["x-thoughtgate-run-id"]
            lines = r.iter_lines()  # held: a line iterator dropped closes the connection
            for line in lines:
                if "TEXT_MESSAGE_CONTENT" in line:
                    break
            loop = held.loop
            assert loop is not None

            async def readers() -> int:
                return sum(t.get_name() == f"agui pump {run_id}" for t in asyncio.all_tasks())

            assert asyncio.run_coroutine_threadsafe(readers(), loop).result(10) == 1
            assert len(state.streams) == 1  # asked whether the store refuses writes
        # the client went away while its run goes on

        async def gone() -> bool:
            left = asyncio.run_coroutine_threadsafe(readers(), loop).result(10)
            return left == 0 and len(state.streams) == 0

        asyncio.run(until(gone))
        assert d.get(f"/v1/runs/{run_id}", "owner").json()["status"] == "running"


def _stopping_end(events: list[dict[str, Any]], raw: str, run_id: str) -> None:
    assert "RUN_FINISHED" not in _types(events), raw
    assert _types(events)[-1] == "RUN_ERROR", raw
    assert events[-1]["code"] == "server_stopping"
    assert events[-1]["message"] == (
        "the daemon is shutting down: this stream ends, not the run; follow the run again later"
    )
    assert events[-1]["metadata"] == {"thoughtgate": {"run_id": run_id}}


def test_the_daemons_shutdown_ends_ag_ui_streams_saying_so_never_run_finished(
    held: _Held,
) -> None:
    """What the daemon's server does on SIGTERM once the runs it executes are drained
    (``LiveStreams.stop_all``) ends every AG-UI stream, as it ends the daemon's own: before,
    a stream following a run that goes on (executed elsewhere, or left running here) stayed
    open until sse-starlette saw the server's exit flag, or until the run ended. The client is
    told the stream ends, not the run, and which run to follow again."""
    with running_daemon() as d:
        state = d.app.state.thoughtgate
        assert isinstance(state, ServerState)
        run_id = d.start_run({"prompt": "x", "model": "fake:held"})
        body = agui_input("ignored", run=run_id)
        # a read timeout, not a timed assert: without the change the stream waits on the
        # held run, and the test fails there instead of hanging
        with (
            d.client("viewer") as c,
            c.stream("POST", "/v1/agui", json=body, timeout=httpx.Timeout(10, read=10)) as r,
        ):
            lines = r.iter_lines()
            seen = []
            for line in lines:
                seen.append(line)
                if "TEXT_MESSAGE_CONTENT" in line:
                    break
            assert len(state.streams) == 1
            assert state.streams.loop is not None
            state.streams.loop.call_soon_threadsafe(state.streams.stop_all)
            seen.extend(lines)  # the response ends, its chunked body complete
        events = [json.loads(line[5:]) for line in seen if line.startswith("data:")]
        _stopping_end(events, "\n".join(seen), run_id)
        # one that opens while the daemon stops ends at once, after what opens it
        _, events, raw = _agui(d, "viewer", body)
        assert _types(events) == ["RUN_STARTED", "RUN_ERROR"], raw
        _stopping_end(events, raw, run_id)
        assert d.get(f"/v1/runs/{run_id}", "owner").json()["status"] == "running"

"""The run list over HTTP: filtered keyset pages, search, the key filter's rules, and the live
list stream (one SSE subscription, through the one output filter, resumable) -- against a real
daemon on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, billed_canaries, markers, running_daemon

from thoughtgate.providers.sse import SSEDecoder, SSEMessage


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


def _me(daemon: Daemon, role: str) -> dict[str, Any]:
    return dict(daemon.get("/v1/me", role).json())


def _list(daemon: Daemon, role: str, **params: Any) -> httpx.Response:
    return daemon.get("/v1/runs", role, params=params)


def _ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [r["run_id"] for r in response.json()["runs"]]


def _list_ticket(daemon: Daemon, role: str) -> str:
    with daemon.client(role) as c:
        r = c.post("/v1/tickets", json={"scope": "runs"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["scope"], body["run_id"]) == ("runs", None)
    assert body["stream_url"].startswith("/v1/runs/stream?ticket=")
    return str(body["ticket"])


class ListStream:
    """A live run-list stream read in a thread: messages arrive in ``inbox``."""

    def __init__(self, daemon: Daemon, role: str, *, after: int, header: bool = False) -> None:
        self.inbox: queue.Queue[SSEMessage] = queue.Queue()
        self.client = httpx.Client(base_url=daemon.base_url, timeout=httpx.Timeout(30, read=60))
        params: dict[str, Any] = {"ticket": _list_ticket(daemon, role)}
        headers = {"Last-Event-ID": str(after)} if header else {}
        if not header:
            params["last_event_id"] = after
        self.response = self.client.send(
            self.client.build_request("GET", "/v1/runs/stream", params=params, headers=headers),
            stream=True,
        )
        assert self.response.status_code == 200, self.response.read()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        decoder = SSEDecoder()
        try:
            for chunk in self.response.iter_bytes():
                for message in decoder.feed(chunk):
                    self.inbox.put(message)
        except httpx.HTTPError:
            pass

    def until(
        self, done: Callable[[list[SSEMessage]], bool], within: float = 15
    ) -> list[SSEMessage]:
        got: list[SSEMessage] = []
        deadline = time.monotonic() + within
        while not done(got):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"stream did not say it in time: {got}")
            try:
                got.append(self.inbox.get(timeout=left))
            except queue.Empty:
                continue
        return got

    def close(self) -> None:
        """Hang up at once. Closing the response from this thread does not wake the reader
        blocked in ``recv``: the socket stays open, the daemon never sees the client go, and the
        test server's shutdown waits for the stream to end at its next keep-alive (15 s). So
        shut the socket down first."""
        stream = self.response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=10)
        self.response.close()
        self.client.close()


@pytest.fixture
def streams() -> Iterator[list[ListStream]]:
    opened: list[ListStream] = []
    yield opened
    for s in opened:
        s.close()


def _views(messages: list[SSEMessage]) -> list[dict[str, Any]]:
    return [json.loads(m.data) for m in messages if m.event in ("", "message") and m.data]


def _status_of(run_id: str, status: str) -> Callable[[list[SSEMessage]], bool]:
    return lambda got: any(v["run_id"] == run_id and v["status"] == status for v in _views(got))


# --------------------------------------------------------------------------- pages


def test_pages_filters_and_search_over_http(daemon: Daemon) -> None:
    mark = f"needle-{time.monotonic_ns()}"
    started = [
        daemon.start_run({"prompt": f"{mark} alpha", "model": "fake:echo"}),
        daemon.start_run({"prompt": f"{mark} beta", "model": "fake:echo"}),
        daemon.start_run(
            {"prompt": f"{mark} GAMMA", "model": "fake:echo", "chain_of_thought": "surface"}
        ),
    ]
    for run_id in started:
        daemon.wait_done(run_id)
    newest_first = started[::-1]
    assert _ids(_list(daemon, "viewer", q=mark)) == newest_first
    assert _ids(_list(daemon, "viewer", q=f"{mark} gamma")) == [started[2]]
    assert _ids(_list(daemon, "viewer", q=mark, mode="surface")) == [started[2]]
    assert _ids(_list(daemon, "viewer", q=mark, status="failed,error")) == []
    assert _ids(_list(daemon, "viewer", q=mark, model="fake:echo", status="completed")) == (
        newest_first
    )
    # keyset pages: next -> before, to the end
    seen, before = [], None
    while True:
        params = {"q": mark, "limit": 1, **({"before": before} if before else {})}
        body = _list(daemon, "viewer", **params).json()
        seen += [r["run_id"] for r in body["runs"]]
        before = body["next"]
        if before is None:
            break
    assert seen == newest_first
    now = int(time.time())
    assert _ids(_list(daemon, "viewer", q=mark, since=now + 60)) == []
    assert _ids(_list(daemon, "viewer", q=mark, since=now - 600, until=now + 60)) == newest_first


@pytest.mark.parametrize("role", ["viewer", "member", "developer", "owner"])
def test_search_matches_the_prompt_only_never_what_a_role_may_not_read(
    daemon: Daemon, role: str
) -> None:
    """A search that matched a run's reasoning, a continuity carrier or a tool's arguments would
    tell a viewer what they say one guess at a time, though the run never shows it to them:
    only the prompt, which every reader sees, is searched, for every role."""
    token = f"search{role}"
    run_id = daemon.start_run(
        {
            "prompt": f"canary {token}",
            "model": "fake:canary",
            "chain_of_thought": "surface",
            "tools": ["lookup"],
        }
    )
    assert daemon.wait_done(run_id)["status"] == "completed"
    assert _ids(_list(daemon, role, q=token)) == [run_id]
    for secret in markers(token).values():  # reasoning, a carrier's text, a tool argument
        assert _ids(_list(daemon, role, q=secret)) == [], secret


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"before": "not-a-cursor"}, "cursor"),
        ({"status": "done"}, "status 'done' is not one of"),
        ({"mode": "loud"}, "mode 'loud' is not one of"),
        ({"q": "x" * 201}, "q is limited to 200 characters"),
        ({"offset": 5, "q": "x"}, "offset cannot be combined"),
        ({"since": "yesterday"}, "since must be an integer"),
        ({"sort": "asc"}, "unknown query parameter 'sort'"),
    ],
)
def test_a_malformed_list_request_says_what_is_wrong(
    daemon: Daemon, params: dict[str, Any], message: str
) -> None:
    r = _list(daemon, "viewer", **params)
    assert r.status_code == 422, r.text
    assert message in r.json()["error"]["message"]


def test_who_started_a_run_is_recorded_and_shown_to_admins_only(daemon: Daemon) -> None:
    member_key = _me(daemon, "member")["key_id"]
    dev_key = _me(daemon, "developer")["key_id"]
    mine = daemon.start_run({"prompt": "started by the member", "model": "fake:echo"}, "member")
    theirs = daemon.start_run({"prompt": "started by the dev", "model": "fake:echo"}, "developer")
    for run_id in (mine, theirs):
        daemon.wait_done(run_id)
    # everyone may list their own runs ...
    assert mine in _ids(_list(daemon, "member", key="me"))
    assert theirs not in _ids(_list(daemon, "member", key="me"))
    assert _ids(_list(daemon, "member", key=member_key)) == _ids(_list(daemon, "member", key="me"))
    assert _ids(_list(daemon, "viewer", key="me")) == []  # a viewer starts no runs
    # ... only admins anyone's
    denied = _list(daemon, "developer", key=member_key)
    assert denied.status_code == 403 and member_key not in denied.text
    assert theirs not in _ids(_list(daemon, "admin", key=member_key))
    assert mine in _ids(_list(daemon, "admin", key=member_key))
    assert theirs in _ids(_list(daemon, "owner", key=dev_key))
    for role in ("viewer", "member", "developer"):
        for view in _list(daemon, role, limit=500).json()["runs"]:
            assert "started_by" not in view
        assert "started_by" not in daemon.get(f"/v1/runs/{mine}", role).json()
    shown = {v["run_id"]: v["started_by"] for v in _list(daemon, "admin", limit=500).json()["runs"]}
    assert (shown[mine], shown[theirs]) == (member_key, dev_key)


def test_tools_are_listed_for_those_who_start_runs(daemon: Daemon) -> None:
    tools = daemon.get("/v1/tools", "member").json()["tools"]
    by_name = {t["name"]: t for t in tools}
    assert by_name["dangerous"]["requires_approval"] is True
    assert by_name["lookup"]["requires_approval"] is False and by_name["lookup"]["label"]
    assert daemon.get("/v1/tools", "viewer").status_code == 403


# --------------------------------------------------------------------------- the live list


def test_the_list_stream_sends_new_runs_and_their_changes_as_they_happen(
    daemon: Daemon, streams: list[ListStream]
) -> None:
    start = _list(daemon, "viewer", limit=1).json()["changes"]
    stream = ListStream(daemon, "viewer", after=start)
    streams.append(stream)
    run_id = daemon.start_run(
        {"prompt": "needs a person", "model": "fake:approval", "tools": ["dangerous"]}
    )
    stream.until(_status_of(run_id, "running"))  # it waits for the approval: still open
    with daemon.client("member") as c:
        r = c.post(f"/v1/runs/{run_id}/approvals/call_danger", json={"decision": "approve"})
        assert r.status_code == 200, r.text
    got = stream.until(_status_of(run_id, "completed"))
    assert [v["status"] for v in _views(got) if v["run_id"] == run_id][-1] == "completed"
    ids = [int(m.id) for m in got if m.id]
    assert ids == sorted(ids) and ids[0] > start


def test_the_list_stream_passes_every_run_through_the_filter(
    daemon: Daemon, streams: list[ListStream]
) -> None:
    token = "liststream"
    start = _list(daemon, "viewer", limit=1).json()["changes"]
    viewer = ListStream(daemon, "viewer", after=start)
    developer = ListStream(daemon, "developer", after=start)
    streams += [viewer, developer]
    run_id = daemon.start_run(
        {"prompt": f"canary {token}", "model": "fake:canary", "chain_of_thought": "surface"}
    )
    seen = viewer.until(_status_of(run_id, "completed"))
    dev_seen = developer.until(_status_of(run_id, "completed"))
    for secret in markers(token).values():
        assert not any(secret in m.data for m in seen)
    views = [v for v in _views(seen) if v["run_id"] == run_id]
    assert all("reasoning" not in t for v in views for t in v["tasks"])
    final = [v for v in _views(dev_seen) if v["run_id"] == run_id][-1]
    assert any(markers(token)["reasoning"] in (t.get("reasoning") or "") for t in final["tasks"])


def test_the_list_and_its_stream_give_billed_counts_to_developers_only(
    daemon: Daemon, streams: list[ListStream]
) -> None:
    """A row's usage sums the turns' billed counts, which include the reasoning's tokens: a
    viewer's and a member's rows -- pages and live frames -- carry none (``usage`` is ``{}``), a
    developer's every one (ADR 0163)."""
    start = _list(daemon, "viewer", limit=1).json()["changes"]
    readers = {
        role: ListStream(daemon, role, after=start) for role in ("viewer", "member", "developer")
    }
    streams += readers.values()
    run_id = daemon.start_run(
        {"prompt": "tokens", "model": "fake:tokencanary", "tools": ["lookup"]}
    )
    for role, stream in readers.items():
        got = stream.until(_status_of(run_id, "completed"))
        rows = [v for v in _views(got) if v["run_id"] == run_id]
        page = [r for r in _list(daemon, role, limit=50).json()["runs"] if r["run_id"] == run_id]
        for row in [*rows, *page]:
            usages = [row["usage"], *(t["usage"] for t in row["tasks"])]
            if role == "developer":
                assert row["status"] != "completed" or row["usage"]["output_tokens"] == 16300007
            else:
                assert all(u == {} for u in usages), (role, row)
                assert not {c for c in billed_canaries() if c in json.dumps(row)}, (role, row)


def test_the_list_stream_resumes_after_the_last_change_it_sent(
    daemon: Daemon, streams: list[ListStream]
) -> None:
    start = _list(daemon, "viewer", limit=1).json()["changes"]
    first = daemon.start_run({"prompt": "resume one", "model": "fake:echo"})
    daemon.wait_done(first)
    middle = _list(daemon, "viewer", limit=1).json()["changes"]
    second = daemon.start_run({"prompt": "resume two", "model": "fake:echo"})
    daemon.wait_done(second)
    for header in (False, True):
        stream = ListStream(daemon, "viewer", after=middle, header=header)
        streams.append(stream)
        got = stream.until(_status_of(second, "completed"))
        assert {v["run_id"] for v in _views(got)} == {second}
        assert all(int(m.id) > middle for m in got if m.id)
    replay = ListStream(daemon, "viewer", after=start)
    streams.append(replay)
    got = replay.until(_status_of(second, "completed"))
    assert [v["run_id"] for v in _views(got)] == [first, second]  # each once, latest state
    assert [v["status"] for v in _views(got)] == ["completed", "completed"]


def test_list_and_run_tickets_open_only_their_own_stream(daemon: Daemon) -> None:
    run_id = daemon.start_run({"prompt": "tickets", "model": "fake:echo"})
    daemon.wait_done(run_id)
    list_ticket = _list_ticket(daemon, "viewer")
    run_ticket = daemon.ticket(run_id, "viewer")
    with daemon.client() as c:
        r = c.get(f"/v1/runs/{run_id}/stream", params={"ticket": list_ticket})
        assert r.status_code == 403 and "run list" in r.json()["error"]["message"]
        r = c.get("/v1/runs/stream", params={"ticket": run_ticket})
        assert r.status_code == 403 and "not the run list" in r.json()["error"]["message"]
        r = c.get("/v1/runs/stream")
        assert r.status_code == 401
        latest = _list(daemon, "viewer", limit=1).json()["changes"]
        r = c.get("/v1/runs/stream", params={"ticket": list_ticket, "last_event_id": latest + 5})
        assert r.status_code == 422 and "past the run list's last change" in r.text
    with daemon.client("viewer") as c:
        for body in ({}, {"scope": "runs", "run_id": run_id}, {"scope": "list"}):
            assert c.post("/v1/tickets", json=body).status_code == 422


def test_a_revoked_key_ends_its_list_stream(daemon: Daemon, streams: list[ListStream]) -> None:
    from thoughtgate.access.keys import create_key

    async def make() -> Any:
        return await create_key(daemon.store, name="list-revoked", role="viewer")

    created = asyncio.run(make())  # the daemon runs in its own thread and loop
    daemon.keys["list-revoked"] = created.key
    start = _list(daemon, "viewer", limit=1).json()["changes"]
    stream = ListStream(daemon, "list-revoked", after=start)
    streams.append(stream)
    revoked = dataclasses.replace(created.record, revoked_at=time.time())
    asyncio.run(daemon.store.save_api_key(revoked))
    got = stream.until(lambda got: any(m.event == "access_revoked" for m in got), within=10)
    assert "revoked" in json.loads(got[-1].data)["message"]


def test_a_run_another_process_records_reaches_the_list_stream(tmp_path: Any) -> None:
    """A ``thoughtgate run`` in a terminal writes the daemon's SQLite file too: its run reaches
    the daemon's live list within the list's poll interval, without any in-process wake-up."""
    from support.store_conformance import make_run

    from thoughtgate.store.sqlite import SQLiteStore

    with running_daemon(sqlite_dir=tmp_path) as daemon:
        start = _list(daemon, "viewer", limit=1).json()["changes"]
        stream = ListStream(daemon, "viewer", after=start)
        try:
            run = make_run(created_at=time.time())

            async def elsewhere() -> None:
                other = await SQLiteStore.open(tmp_path / "daemon.db")
                try:
                    await other.create_run(run)
                finally:
                    await other.close()

            asyncio.run(elsewhere())
            got = stream.until(_status_of(run.run_id, "pending"), within=10)
            assert [v["run_id"] for v in _views(got)] == [run.run_id]
        finally:
            stream.close()

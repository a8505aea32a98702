"""The live channel follows its key: a ticket names the key that asked for it and opens nothing
once that key is revoked or below the ticket's role; an open stream ends within 5 s of either;
and a ticket error says what is wrong in the reader's words."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, auth, ticketing_daemon

from thoughtgate.access.roles import Role
from thoughtgate.access.tickets import TicketSigner
from thoughtgate.providers.sse import SSEDecoder, SSEMessage

SECRET = "live-access-secret"
PROMISE_S = 5.0


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with ticketing_daemon(SECRET, keepalive_s=0.5) as d:
        yield d


def fresh_key(daemon: Daemon, name: str, role: str) -> dict[str, Any]:
    with daemon.client("owner") as owner:
        made = owner.post("/v1/keys", json={"name": name, "role": role})
        assert made.status_code == 201, made.text
        found: dict[str, Any] = made.json()
        return found


def ticket_for(daemon: Daemon, run_id: str, key: str) -> str:
    with daemon.client() as c:
        got = c.post("/v1/tickets", json={"run_id": run_id}, headers=auth(key))
        assert got.status_code == 200, got.text
        return str(got.json()["ticket"])


def kinds(messages: Sequence[SSEMessage]) -> list[str]:
    """What a stream sent, in a line a failure can print: each event's type, or its SSE name."""
    return [
        m.event if m.event not in ("", "message") else json.loads(m.data)["type"] for m in messages
    ]


async def within(
    seconds: float, awaitable: Awaitable[Any], step: str, sent: Callable[[], list[str]]
) -> None:
    """``awaitable`` done, or a failure saying which step did not happen and what the stream had
    sent by then (a bare ``TimeoutError`` from deep in asyncio says neither). The bound catches a
    hang, not slowness: each step takes about a second on a loaded machine."""
    try:
        await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        pytest.fail(f"{step}: not within {seconds} s; the stream had sent {sent()}")


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()["error"]
    return response.status_code, body["code"], body["message"]


def test_ticket_errors_say_what_is_wrong(daemon: Daemon) -> None:
    run_id = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
    other = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
    good = daemon.ticket(run_id, "owner")
    key_id = json.loads(base64.urlsafe_b64decode(good.split(".")[1] + "=="))["kid"]
    expired, _ = TicketSigner(SECRET, ttl_s=30, clock=lambda: time.time() - 60).issue(
        run_id, Role.OWNER, key_id=key_id
    )
    forged, _ = TicketSigner("guessed", ttl_s=30).issue(run_id, Role.OWNER, key_id=key_id)
    url = f"/v1/runs/{run_id}/stream"
    with daemon.client() as c:
        wrong = error_of(c.get(f"/v1/runs/{other}/stream", params={"ticket": good}))
        assert wrong == (
            403,
            "ticket_wrong_run",
            "this ticket is for another run; get one for this run from POST /v1/tickets",
        )
        status, code, message = error_of(c.get(url, params={"ticket": expired}))
        assert (status, code) == (401, "ticket_expired") and "expired" in message
        status, code, message = error_of(c.get(url, params={"ticket": forged}))
        assert (status, code) == (401, "ticket_invalid") and "not valid" in message
        status, code, message = error_of(c.get(url))
        assert (status, code) == (401, "ticket_missing") and "POST /v1/tickets" in message
        for text in (wrong[2], message):
            assert "role" not in text  # a ticket problem is not reported as a role problem


@pytest.mark.parametrize("scope", ["run", "runs"])
def test_a_ticket_of_any_bytes_is_refused_as_not_valid(daemon: Daemon, scope: str) -> None:
    """A URL's ticket is whatever its query held: characters no ticket has (``é``, a byte that
    is not UTF-8, a lone surrogate's escape) are a ticket error, as a forged ticket is, not a
    500 with a traceback in the daemon's log."""
    run_id = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
    good = daemon.ticket(run_id, "owner")
    head, body, mac = good.split(".")
    path = f"/v1/runs/{run_id}/stream" if scope == "run" else "/v1/runs/stream"
    odd = ("%C3%A9", "%FF", "%ED%A0%80", "%00")
    tickets = [f"{head}.{body}.{mac[:-1]}{o}" for o in odd]
    tickets += [f"{head}.{body[:-1]}{o}.{mac}" for o in odd]
    tickets += [f"{head}{o}.{body}.{mac}" for o in odd]
    with daemon.client() as c:
        for ticket in tickets:
            refused = c.get(f"{path}?ticket={ticket}")
            status, code, message = error_of(refused)
            assert (status, code) == (401, "ticket_invalid"), (ticket, refused.text)
            assert "POST /v1/tickets" in message


def test_a_ticket_opens_nothing_once_its_key_is_revoked(daemon: Daemon) -> None:
    """The attack: a key leaks, is revoked, but its tickets still open streams."""
    made = fresh_key(daemon, "leaked", "developer")
    run_id = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
    ticket = ticket_for(daemon, run_id, made["key"])
    with daemon.client() as c:
        assert c.get(f"/v1/runs/{run_id}/stream", params={"ticket": ticket}).status_code == 200
    with daemon.client("owner") as owner:
        assert owner.delete(f"/v1/keys/{made['key_id']}").status_code == 200
    with daemon.client() as c:
        refused = c.get(f"/v1/runs/{run_id}/stream", params={"ticket": ticket})
    assert error_of(refused) == (
        401,
        "ticket_key_revoked",
        "the key that asked for this ticket has been revoked",
    )


class LiveStream:
    """An SSE stream read in the background, so a test can act while it runs."""

    def __init__(self, base_url: str, run_id: str, ticket: str) -> None:
        self.messages: list[tuple[float, SSEMessage]] = []
        self.ended_at: float | None = None
        self.status = 0
        self.first = asyncio.Event()
        self.task = asyncio.create_task(self._read(base_url, run_id, ticket))

    async def _read(self, base_url: str, run_id: str, ticket: str) -> None:
        decoder = SSEDecoder()
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=30) as client,
            client.stream(
                "GET", f"/v1/runs/{run_id}/stream", params={"ticket": ticket}
            ) as response,
        ):
            self.status = response.status_code
            async for chunk in response.aiter_raw():
                for message in decoder.feed(chunk):
                    self.messages.append((time.monotonic(), message))
                    self.first.set()
        self.ended_at = time.monotonic()
        self.first.set()

    def sent(self) -> list[str]:
        return kinds([m for _, m in self.messages])

    def events(self) -> list[tuple[float, dict[str, Any]]]:
        return [(at, json.loads(m.data)) for at, m in self.messages if m.event in ("", "message")]


async def _follow_then_lose_access(daemon: Daemon, take_away: Any) -> None:
    made = fresh_key(daemon, f"dev-{time.monotonic_ns()}", "developer")
    run_id = daemon.start_run(
        {"prompt": "slow", "model": "fake:slow", "chain_of_thought": "surface"}
    )
    stream = LiveStream(daemon.base_url, run_id, ticket_for(daemon, run_id, made["key"]))
    await within(10, stream.first.wait(), "the stream's first event", stream.sent)
    assert stream.status == 200 and stream.ended_at is None
    assert any(e["type"] == "reasoning.delta" for _, e in stream.events())
    await asyncio.to_thread(take_away, made)
    lost_at = time.monotonic()
    await within(15, stream.task, "the stream's end after its key lost access", stream.sent)
    assert stream.ended_at is not None
    assert stream.ended_at - lost_at < PROMISE_S, stream.ended_at - lost_at
    last = stream.messages[-1][1]
    assert last.event == "access_revoked", last
    assert "the key that asked for this ticket" in json.loads(last.data)["message"]
    assert all(at < lost_at + PROMISE_S for at, _ in stream.events())
    with daemon.client("owner") as owner:  # the run itself goes on, unaffected
        assert owner.get(f"/v1/runs/{run_id}").json()["status"] == "running"


async def test_an_open_stream_ends_within_5s_of_its_key_being_revoked(daemon: Daemon) -> None:
    def revoke(made: dict[str, Any]) -> None:
        with daemon.client("owner") as owner:
            assert owner.delete(f"/v1/keys/{made['key_id']}").status_code == 200

    await _follow_then_lose_access(daemon, revoke)


async def test_an_open_stream_ends_within_5s_of_its_key_losing_the_role(daemon: Daemon) -> None:
    def demote(made: dict[str, Any]) -> None:
        async def go() -> None:
            [record] = [k for k in await daemon.store.list_api_keys() if k.key_id == made["key_id"]]
            await daemon.store.save_api_key(dataclasses.replace(record, role="viewer"))

        asyncio.run(go())  # the memory store keeps no loop of its own

    await _follow_then_lose_access(daemon, demote)


async def test_a_one_request_stream_ends_within_5s_of_its_key_being_revoked(
    daemon: Daemon,
) -> None:
    made = fresh_key(daemon, f"member-{time.monotonic_ns()}", "member")
    messages: list[SSEMessage] = []
    first = asyncio.Event()

    async def follow() -> None:
        decoder = SSEDecoder()
        body = {"prompt": "slow", "model": "fake:slow", "chain_of_thought": "surface"}
        async with (
            httpx.AsyncClient(base_url=daemon.base_url, timeout=30) as client,
            client.stream("POST", "/v1/runs/follow", json=body, headers=auth(made["key"])) as r,
        ):
            assert r.status_code == 200
            async for chunk in r.aiter_raw():
                messages.extend(decoder.feed(chunk))
                first.set()

    task = asyncio.create_task(follow())
    await within(10, first.wait(), "the stream's first event", lambda: kinds(messages))
    run_id = json.loads(messages[0].data)["run_id"]
    with daemon.client("owner") as owner:
        assert owner.delete(f"/v1/keys/{made['key_id']}").status_code == 200
    revoked_at = time.monotonic()
    await within(15, task, "the stream's end after its key was revoked", lambda: kinds(messages))
    assert time.monotonic() - revoked_at < PROMISE_S
    assert messages[-1].event == "access_revoked"
    assert "revoked" in json.loads(messages[-1].data)["message"]
    with daemon.client("owner") as owner:  # the run itself goes on, unaffected
        assert owner.get(f"/v1/runs/{run_id}").json()["status"] == "running"


async def test_an_ag_ui_stream_ends_with_run_error_within_5s_of_its_key_being_revoked(
    daemon: Daemon,
) -> None:
    """``POST /v1/agui`` follows a run on its own response, with no ticket: it too re-checks its
    key and ends with AG-UI's ``RUN_ERROR`` (``code: access_revoked``) once the key is revoked,
    while the run goes on."""
    made = fresh_key(daemon, f"agui-{time.monotonic_ns()}", "member")
    messages: list[SSEMessage] = []
    run_ids: list[str] = []
    first = asyncio.Event()
    body = {
        "threadId": "t-1",
        "runId": "r-1",
        "state": {},
        "messages": [{"id": "u1", "role": "user", "content": "slow"}],
        "tools": [],
        "context": [],
        "forwardedProps": {"thoughtgate": {"model": "fake:slow", "chain_of_thought": "surface"}},
    }

    async def follow() -> None:
        decoder = SSEDecoder()
        async with (
            httpx.AsyncClient(base_url=daemon.base_url, timeout=30) as client,
            client.stream("POST", "/v1/agui", json=body, headers=auth(made["key"])) as r,
        ):
            assert r.status_code == 200
            run_ids.append(r.headers["x-thoughtgate-run-id"])
            async for chunk in r.aiter_raw():
                messages.extend(m for m in decoder.feed(chunk) if m.data)
                if messages:
                    first.set()

    task = asyncio.create_task(follow())
    await within(10, first.wait(), "the stream's first event", lambda: kinds(messages))
    assert kinds(messages)[0] == "RUN_STARTED"
    with daemon.client("owner") as owner:
        assert owner.delete(f"/v1/keys/{made['key_id']}").status_code == 200
    revoked_at = time.monotonic()
    await within(15, task, "the stream's end after its key was revoked", lambda: kinds(messages))
    assert time.monotonic() - revoked_at < PROMISE_S
    last = json.loads(messages[-1].data)
    assert (last["type"], last["code"]) == ("RUN_ERROR", "access_revoked"), kinds(messages)
    assert "revoked" in last["message"]
    with daemon.client("owner") as owner:  # the run itself goes on, unaffected
        assert owner.get(f"/v1/runs/{run_ids[0]}").json()["status"] == "running"

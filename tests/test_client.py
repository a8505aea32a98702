"""thoughtgate.client against a real daemon on loopback: follow live == reload, resume after cut
connections and expired tickets (no gaps, no duplicates), lagging readers, the client rules for
``cot.*`` payloads, what each role receives, typed errors, and the blocking wrapper."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, free_port
from support.servers import serving
from support.web import (
    SEEDED_EVENTS,
    SEEDED_SECRET,
    STEP_TITLES,
    STORY_ANSWER,
    raw_marker,
    seed_run,
    story_run,
    web_daemon,
)

from thoughtgate.client import (
    AnswerError,
    DaemonError,
    RequestRejectedError,
    SyncThoughtgateClient,
    ThoughtgateClient,
)
from thoughtgate.errors import (
    AccessDeniedError,
    AuthenticationError,
    RunNotFoundError,
    UsageError,
)
from thoughtgate.events.schema import Event, is_run_terminal
from thoughtgate.events.thread import StepItem, ToolCard


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with web_daemon(shutdown_grace_s=0.1) as d:
        yield d


def _client(daemon: Daemon, role: str, **options: Any) -> ThoughtgateClient:
    return ThoughtgateClient(daemon.base_url, daemon.keys[role], **options)


def _story(daemon: Daemon, token: str, delay: float = 0.0) -> str:
    return daemon.start_run(story_run(token, delay))


def _dump(events: list[Event]) -> str:
    return json.dumps([e.to_dict() for e in events])


# --------------------------------------------------------------------------- follow and thread


@pytest.mark.parametrize("role", ["viewer", "developer"])
async def test_follow_live_equals_reload_and_only_developers_get_reasoning(
    daemon: Daemon, role: str
) -> None:
    token = f"live{role}"
    run_id = _story(daemon, token, delay=0.05)
    async with _client(daemon, role) as tg:
        seen: list[Event] = []
        views = []
        status_at_first_event = None
        async for view in tg.watch(run_id):
            views.append(view)
            if status_at_first_event is None:
                status_at_first_event = (await tg.get_run(run_id)).status
        seen = await tg.events(run_id)
        reloaded = await tg.thread(run_id, live=False)
        replayed = await tg.thread(run_id, live=True)  # a finished run replays and ends
    assert status_at_first_event in ("pending", "running")  # it was watched live
    live = views[-1]
    assert live == reloaded == replayed
    assert len(views) == len(seen) and live.last_seq == seen[-1].seq
    assert is_run_terminal(seen[-1].type)
    assert [s.summary for s in live.steps] == STEP_TITLES
    cards = live.cards
    assert [(c.tool_key, c.status) for c in cards] == [
        ("check_weather", "completed"),
        ("find_trains", "completed"),
    ]
    assert live.message.text == STORY_ANSWER and live.status == "completed"
    assert live.receipt is not None and live.receipt.raw_reasoning_exists
    # think -> tool -> think -> tool -> think: steps interleave with the cards
    kinds = [type(i).__name__ for i in live.items if isinstance(i, StepItem | ToolCard)]
    assert kinds == ["StepItem", "ToolCard", "StepItem", "ToolCard", "StepItem"]
    marker = raw_marker(token)
    if role == "viewer":
        assert not any(e.type == "reasoning.delta" for e in seen)
        assert marker not in _dump(seen) and marker not in json.dumps(live.to_dict())
        assert live.raw_reasoning is None
        assert all(c.input is None and c.output is None for c in cards)
    else:
        assert live.raw_reasoning is not None and marker in live.raw_reasoning
        assert cards[0].input == {"city": "Porto"}


async def test_follow_stops_with_an_authentication_error_when_its_key_is_revoked(
    daemon: Daemon,
) -> None:
    with daemon.client("owner") as owner:
        created = owner.post("/v1/keys", json={"name": "client-dev", "role": "developer"}).json()

    def revoke() -> int:
        with daemon.client("owner") as owner:
            return owner.delete(f"/v1/keys/{created['key_id']}").status_code

    run_id = _story(daemon, "revoked", delay=0.5)
    seen: list[Event] = []
    async with ThoughtgateClient(daemon.base_url, created["key"]) as tg:
        with pytest.raises(AuthenticationError, match="the daemon refused this key"):
            async for event in tg.follow(run_id):
                seen.append(event)
                if len(seen) == 1:
                    assert await asyncio.to_thread(revoke) == 200
    assert seen and not is_run_terminal(seen[-1].type)  # it stopped mid-run, not at the end


# --------------------------------------------------------------------------- resume


class CuttingProxy:
    """A loopback TCP proxy that cuts every live-channel connection after a random number of
    response bytes (a real dropped connection, mid-frame or between frames)."""

    def __init__(self, target: str, rng: random.Random, low: int, high: int) -> None:
        self.host, port = target.removeprefix("http://").split(":")
        self.port = int(port)
        self.rng, self.low, self.high = rng, low, high
        self.cuts = 0
        self.url = ""

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[CuttingProxy]:
        async with serving(self._handle) as server:
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            yield self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        budget: list[int | None] = [None]

        async def upstream() -> None:
            while data := await reader.read(65536):
                if b"/stream?" in data:
                    budget[0] = self.rng.randint(self.low, self.high)
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            sent = 0
            while data := await up_reader.read(4096):
                limit = budget[0]
                if limit is not None and sent + len(data) > limit:
                    writer.write(data[: max(0, limit - sent)])
                    await writer.drain()
                    self.cuts += 1
                    return
                writer.write(data)
                sent += len(data)
                await writer.drain()

        up = asyncio.create_task(upstream())
        try:
            await downstream()
        except ConnectionError:
            pass
        finally:
            up.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await up
            writer.transport.abort()
            up_writer.transport.abort()


@pytest.fixture(scope="module")
def short_tickets() -> Iterator[Daemon]:
    with web_daemon(config={"server": {"ticket_ttl_s": 1}}, shutdown_grace_s=0.1) as d:
        yield d


@pytest.mark.parametrize("clock_skew", [0.0, -3600.0], ids=["expiry-seen", "expiry-by-401"])
async def test_resume_after_cut_connections_and_expired_tickets(
    short_tickets: Daemon, clock_skew: float
) -> None:
    """Tickets live 1 s, the run ~2.5 s, connections are cut every few hundred bytes. With a
    true clock the client renews tickets it sees expiring; with a slow one it trusts old tickets
    and renews on the daemon's 401. Either way: every event once, in order."""
    daemon = short_tickets
    run_id = _story(daemon, "resume", delay=0.25)
    proxy = CuttingProxy(daemon.base_url, random.Random(7), 300, 1500)
    async with (
        proxy.running(),
        ThoughtgateClient(
            proxy.url,
            daemon.keys["viewer"],
            reconnect_delay=0.01,
            ticket_margin_s=0.2,
            clock=lambda: time.time() + clock_skew,
        ) as tg,
    ):
        followed = [e async for e in tg.follow(run_id)]
        connections, tickets = tg.connections, tg.tickets_issued
    async with _client(daemon, "viewer") as direct:
        expected = await direct.events(run_id)
    assert [e.seq for e in followed] == [e.seq for e in expected]  # no gap, nothing twice
    assert followed == expected
    assert proxy.cuts >= 3 and connections > proxy.cuts
    assert tickets > 1  # the run outlived its first ticket (with the slow clock: 401s)


async def test_resume_protocol_on_a_scripted_channel() -> None:
    """Lagging and failed frames, overlap after a resume, an expired ticket and the 204 end."""
    frames = [
        b'id: 1\ndata: {"seq":1,"run_id":"r","type":"run.started","payload":{}}\n\n'
        b'id: 2\ndata: {"seq":2,"run_id":"r","type":"message.delta","payload":{"text":"a"}}\n\n'
        b'event: lagging\ndata: {"reason":"lagging","resume_after":2}\n\n',
        # the resume overlaps (seq 2 again), then the stream fails server-side
        b'id: 2\ndata: {"seq":2,"run_id":"r","type":"message.delta","payload":{"text":"a"}}\n\n'
        b'id: 3\ndata: {"seq":3,"run_id":"r","type":"message.delta","payload":{"text":"b"}}\n\n'
        b'event: failed\ndata: {"reason":"failed","resume_after":3}\n\n',
        None,  # 401: the daemon says the ticket expired
        b'id: 4\ndata: {"seq":4,"run_id":"r","type":"run.settlement.completed","payload":{}}\n\n',
    ]
    seen_after: list[str] = []
    tickets = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal tickets
        if request.url.path == "/v1/tickets":
            tickets += 1
            ticket = {"ticket": f"t{tickets}", "expires_at": time.time() + 60, "role": "viewer"}
            return httpx.Response(200, json={**ticket, "run_id": "r", "stream_url": ""})
        seen_after.append(request.headers.get("last-event-id", "0"))
        body = frames.pop(0) if frames else None
        if body is None:
            if not frames:
                return httpx.Response(204)
            return httpx.Response(401, json={"error": {"code": "unauthorized", "message": "x"}})
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    transport = httpx.MockTransport(handler)
    async with ThoughtgateClient("http://tg", "k", transport=transport, reconnect_delay=0) as tg:
        events = [e async for e in tg.follow("r")]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert seen_after == ["0", "2", "3", "3"]
    assert tickets == 2  # one fresh ticket after the 401


async def test_a_channel_that_never_progresses_gives_up_with_a_clear_error() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        if request.url.path == "/v1/tickets":
            return httpx.Response(
                200, json={"ticket": "t", "expires_at": time.time() + 60, "role": "viewer"}
            )
        calls += 1
        return httpx.Response(
            200, content=b": ping\n\n", headers={"content-type": "text/event-stream"}
        )

    async with ThoughtgateClient(
        "http://tg",
        "k",
        transport=httpx.MockTransport(handler),
        reconnect_delay=0,
        max_reconnects=3,
    ) as tg:
        with pytest.raises(DaemonError, match="nothing new after 3 reconnects"):
            _ = [e async for e in tg.follow("r")]
    assert calls == 4


# --------------------------------------------------------------------------- client rules


@pytest.fixture(scope="module")
def seeded() -> Iterator[Daemon]:
    with web_daemon(seeds=[seed_run("run_seeded", SEEDED_EVENTS)]) as d:
        yield d


@pytest.mark.parametrize("role", ["viewer", "member", "developer", "owner"])
async def test_unmarked_or_malformed_cot_payloads_are_discarded_and_block_nothing(
    seeded: Daemon, role: str
) -> None:
    async with _client(seeded, role) as tg:
        live = await tg.thread("run_seeded", live=True)
        reloaded = await tg.thread("run_seeded", live=False)
        events = await tg.events("run_seeded")
    assert live == reloaded
    assert [s.summary for s in live.steps] == ["Reading the request"]
    assert live.discarded == 6  # s2..s6 and the unmarked receipt
    (card,) = live.cards
    assert card.status == "completed" and card.label == "Look it up"
    assert [s.summary for s in card.reasoning] == ["Looking it up"]
    assert live.message.text == "Done." and live.status == "completed"
    # no reasoning is ever recovered from tool data or provider fields
    assert live.raw_reasoning is None
    shown = [i for i in live.items if not isinstance(i, ToolCard)]
    assert SEEDED_SECRET not in json.dumps([i.to_dict() for i in shown])
    assert SEEDED_SECRET not in json.dumps([s.to_payload() for s in card.reasoning])
    if role in ("developer", "owner"):  # the filter lets them read payload.reasoning ...
        assert SEEDED_SECRET in _dump(events)
    if role == "viewer":  # ... and never a viewer, nor tool data
        assert SEEDED_SECRET not in _dump(events)


# --------------------------------------------------------------------------- the run list


async def test_list_runs_filters_and_pages_as_the_daemon_selects(daemon: Daemon) -> None:
    mark = f"listed-{time.monotonic_ns()}"
    started = [
        daemon.start_run({"prompt": f"{mark} one", "model": "fake:echo"}),
        daemon.start_run({"prompt": f"{mark} TWO", "model": "fake:echo"}),
        daemon.start_run(
            {"prompt": f"{mark} three", "model": "fake:echo", "chain_of_thought": "surface"}
        ),
    ]
    for run_id in started:
        daemon.wait_done(run_id)
    newest_first = started[::-1]
    async with _client(daemon, "viewer") as tg:
        assert [r.run_id for r in await tg.list_runs(search=mark)] == newest_first
        assert [r.run_id for r in await tg.list_runs(search=f"{mark} two")] == [started[1]]
        assert [r.run_id for r in await tg.list_runs(search=mark, mode="surface")] == [started[2]]
        assert await tg.list_runs(search=mark, status=["failed", "error"]) == []
        both = await tg.list_runs(search=mark, status="completed", model="fake:echo", limit=2)
        assert [r.run_id for r in both] == newest_first[:2]
        assert await tg.list_runs(search=mark, since=time.time() + 60) == []
        assert await tg.list_runs(search=mark, key="me") == [], "the viewer started none"
        paged, before = [], None
        while True:
            page = await tg.runs_page(limit=1, before=before, search=mark)
            paged += [r.run_id for r in page.runs]
            if page.next is None:
                break
            before = page.next
        assert paged == newest_first and page.changes > 0
    async with _client(daemon, "member") as member:
        mine = await member.list_runs(key="me", search=mark, limit=500)
        assert [r.run_id for r in mine] == newest_first, "daemon.start_run starts as member"


async def test_list_runs_reads_past_the_daemons_page_size_with_the_cursor() -> None:
    """More than 500 runs come in keyset pages, each after the last one's cursor, filters kept."""
    from thoughtgate.access.filter import filter_run
    from thoughtgate.access.roles import Role
    from thoughtgate.store.records import RunRecord

    views = [
        filter_run(RunRecord(f"run_{i:04}", "p", status="completed"), Role.VIEWER).to_json()
        for i in range(1100, 0, -1)
    ]
    asked: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        asked.append(params)
        start = int(params.get("before", "0"))
        end = start + int(params["limit"])
        more = end < len(views)
        return httpx.Response(
            200, json={"runs": views[start:end], "next": str(end) if more else None, "changes": 7}
        )

    transport = httpx.MockTransport(handler)
    async with ThoughtgateClient("http://tg", "k", transport=transport) as tg:
        runs = await tg.list_runs(limit=1050, status=("completed", "partial"))
        assert [r.run_id for r in runs] == [v["run_id"] for v in views[:1050]]
        assert [(a["limit"], a.get("before")) for a in asked] == [
            ("500", None),
            ("500", "500"),
            ("50", "1000"),
        ]
        assert {a["status"] for a in asked} == {"completed,partial"}
        asked.clear()
        assert len(await tg.list_runs(limit=5000)) == 1100, "until the last page"
        assert [a.get("before") for a in asked] == [None, "500", "1000"]


async def test_resume_run_says_why_a_run_does_not_resume(daemon: Daemon) -> None:
    run_id = _story(daemon, "resume")
    daemon.wait_done(run_id)
    async with _client(daemon, "member") as member:
        with pytest.raises(RequestRejectedError) as refused:
            await member.resume_run(run_id)
    assert refused.value.status == 409 and "durable" in refused.value.message
    async with _client(daemon, "viewer") as viewer:
        with pytest.raises(AccessDeniedError):
            await viewer.resume_run(run_id)


# --------------------------------------------------------------------------- errors


async def test_errors_are_typed(daemon: Daemon) -> None:
    run_id = _story(daemon, "errors")
    async with ThoughtgateClient(daemon.base_url, "tg_not_a_key") as bad:
        with pytest.raises(AuthenticationError):
            await bad.me()
        with pytest.raises(AuthenticationError):
            _ = [e async for e in bad.follow(run_id)]
    async with _client(daemon, "viewer") as viewer:
        with pytest.raises(AccessDeniedError):
            await viewer.start_run("hello", "fake:echo")
        with pytest.raises(RunNotFoundError) as missing:
            await viewer.get_run("run_nope")
        assert missing.value.run_id == "run_nope"
        with pytest.raises(RunNotFoundError):
            await viewer.events("run_nope")
        with pytest.raises(RunNotFoundError):
            _ = [e async for e in viewer.follow("run_nope")]
        assert (await viewer.me())["role"] == "viewer"
    async with _client(daemon, "member") as member:
        with pytest.raises(RequestRejectedError) as unknown:
            await member.start_run("hello", "nope:model")
        assert unknown.value.status == 400
        said = json.loads(unknown.value.body or "")["error"]  # the daemon's words, unchanged
        assert str(unknown.value) == f"[400 {said['code']}] {said['message']}"
        with pytest.raises(RequestRejectedError) as nothing:
            await member.answer_approval(run_id, "call_nope", "approve")
        assert nothing.value.status in (404, 409)
    async with ThoughtgateClient(f"http://127.0.0.1:{free_port()}", "k") as nowhere:
        with pytest.raises(DaemonError, match="cannot reach"):
            await nowhere.list_runs()


_HOSTILE = "bad \x1b]0;PWNED\x07gate\x1b[2J\r\x9b31m\x1b]8;;http://e\x1b\\ "
"""A retitle, a clear screen, a carriage return, C1's CSI and an OSC 8 link."""


def _controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal would obey (tab and line break are text)."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) < 0xA0]


@pytest.mark.parametrize(
    ("status", "body", "raised"),
    [
        (502, _HOSTILE + "A" * 3_000_000, DaemonError),  # a proxy's page, megabytes of it
        (404, json.dumps({"error": {"code": "x\x1b[8m", "message": _HOSTILE * 30_000}}),
         RequestRejectedError),  # daemon-shaped JSON, a code that is no identifier
        (500, json.dumps({"error": {"code": "boom", "message": _HOSTILE}}), DaemonError),
        (403, json.dumps({"error": {"code": "forbidden", "message": _HOSTILE * 30_000}}),
         AccessDeniedError),
        (401, json.dumps({"error": {"code": "ticket_bad", "message": _HOSTILE * 30_000}}),
         AuthenticationError),
        (401, json.dumps({"error": {"code": "unauthorized", "message": _HOSTILE}}),
         AuthenticationError),
        (404, json.dumps({"error": {"code": "not_found", "message": "run 'run_x' not found"}}),
         RunNotFoundError),
    ],
    ids=["5xx-page", "4xx-json", "5xx-json", "403-json", "401-ticket-json", "401-key-json",
         "404-run-json"],
)  # fmt: skip
async def test_a_hostile_servers_words_are_bounded_and_inert_in_the_errors_text(
    status: int, body: str, raised: type[Exception]
) -> None:
    """A client pointed at a wrong or hostile address gets whatever that server sends; the
    errors' text went to library users' logs and terminals as it came (escape sequences,
    megabytes): only the CLI cleaned it (ADR 0135, amendment 4). Now ``str(exc)`` shows each
    control character, is bounded and says how long the words were; the body stays on
    ``body``, as it came, whatever the status made of it: a 401, a 403 and a 404 naming the
    run were the core's classes, without it (amendment 6)."""
    from thoughtgate.client.errors import MESSAGE_LIMIT

    wire = body.encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        kind = "application/json" if body.startswith("{") else "text/html"
        head = f"HTTP/1.1 {status} Nope\r\ncontent-type: {kind}\r\n"
        writer.write(f"{head}content-length: {len(wire)}\r\nconnection: close\r\n\r\n".encode())
        writer.write(wire)
        await writer.drain()

    async with serving(answer) as server:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with ThoughtgateClient(url, "k") as tg:
            with pytest.raises(raised) as caught:
                await (tg.get_run("run_x") if status == 404 else tg.list_runs())
    text = str(caught.value)
    assert not _controls(text), repr(text[:300])
    assert len(text) < MESSAGE_LIMIT * 4 + 100, len(text)  # (an escape shows as 4 characters)
    if '"unauthorized"' not in body and status != 404:  # (said in the client's words)
        assert "bad \\x1b]0;PWNED\\x07gate\\x1b[2J\\x9b31m\\x1b]8;;http://e" in text, text
    if len(body) > MESSAGE_LIMIT and raised is not DaemonError:
        words = len(json.loads(body)["error"]["message"])
        assert text.endswith(f"… ({words} characters in all)"), text[-100:]
    assert isinstance(caught.value, AnswerError)
    assert caught.value.body == body
    assert caught.value.status == status
    assert caught.value.code in ("error", "boom", "", "forbidden", "ticket_bad", "unauthorized",
                                 "not_found")  # fmt: skip
    if status == 502:
        assert text.endswith(f"… ({len(body)} characters in all)"), text[-100:]


@pytest.mark.unit
@pytest.mark.parametrize(
    "url", ["localhost:8765", "127.0.0.1:8765", "tg.example", "ftp://tg", "http://"]
)
def test_an_address_without_http_is_refused_naming_the_form_expected(url: str) -> None:
    """``localhost:8765`` was taken for a URL whose scheme is ``localhost``: every call then
    failed with "unsupported protocol 'localhost://'". Refused when the client is made, saying
    what to give instead."""
    expected = f"{url!r} is not a daemon's address: use http://HOST:PORT"
    with pytest.raises(UsageError, match=re.escape(expected)):
        ThoughtgateClient(url, "k")
    with pytest.raises(UsageError, match=re.escape(expected)):
        SyncThoughtgateClient(url, "k")


# --------------------------------------------------------------------------- blocking wrapper


def test_the_blocking_client_follows_and_builds_the_same_thread(daemon: Daemon) -> None:
    with SyncThoughtgateClient(daemon.base_url, daemon.keys["member"]) as tg:
        body = story_run("sync", 0.01)
        run_id = tg.start_run(
            body["prompt"], body["model"], "surface", body["tools"], system=body["system"]
        )
        followed = list(tg.follow(run_id))
        views = list(tg.watch(run_id))
        reloaded = tg.thread(run_id, live=False)
        assert followed == tg.events(run_id)
        assert tg.get_run(run_id).status == "completed"
        assert any(r.run_id == run_id for r in tg.list_runs())
        newest = tg.list_runs(limit=1, status="completed", mode="surface")
        assert [r.run_id for r in newest] == [run_id]
        assert tg.runs_page(limit=1, mode=["surface"]).runs[0].run_id == run_id
    assert views[-1] == reloaded and reloaded.message.text == STORY_ANSWER


def test_an_event_in_a_newer_vocabulary_is_refused_with_what_to_do() -> None:
    from thoughtgate.client import event_from_dict
    from thoughtgate.events.schema import EVENT_VERSION

    wire = {"seq": 3, "run_id": "r", "type": "message.delta", "ts": 1.0, "payload": {"text": "a"}}
    assert event_from_dict({**wire, "v": EVENT_VERSION}).v == EVENT_VERSION
    with pytest.raises(DaemonError, match="upgrade thoughtgate"):
        event_from_dict({**wire, "v": EVENT_VERSION + 1})

"""A daemon whose store refuses writes says so (ADR 0151): ``GET /readyz`` answers 503 with a
short reason word, the live readers of its open runs get the channel's resume frame and their
connections end, and a run whose execution here stopped because nothing of it could be recorded
no longer reads ``running``.

Before, a daemon whose store directory was removed (ADR 0149) or whose writes failed refused
every write, but ``/healthz`` (liveness: it reads nothing) answered ok, the run it was executing
read ``running`` and a live reader stayed attached until the daemon stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from psycopg import errors as pg_errors_mod
from psycopg import sql
from support.daemon import Daemon, running_daemon
from support.durable import until
from support.pg import PG_URL, pg_admin, pg_schema, schema_name
from support.store_conformance import make_run
from support.ticker import ticker_prompt

from thoughtgate.config import Config
from thoughtgate.errors import StoreError, StoreReadOnlyError
from thoughtgate.providers.sse import SSEDecoder, SSEMessage
from thoughtgate.server.app import create_app
from thoughtgate.server.readiness import Readiness
from thoughtgate.store.base import EventStore
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.pg_errors import writes_refused
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name

WAIT_S = 30.0
"""Only a hang reaches it (a live reader left attached)."""


@contextlib.contextmanager
def _held_run(tmp_path: Path, *, hold: Path | None = None) -> Iterator[tuple[Daemon, Path, str]]:
    """A daemon on a SQLite store in its own directory, and a run it executes whose model waits
    while a file in that directory exists, then streams: once the directory is removed, the
    model goes on and its first write is the first the removed store refuses. ``hold``: the
    file the model waits on instead (outside the directory: it waits on after the removal)."""
    directory = tmp_path / "store"
    with running_daemon(sqlite_dir=directory) as daemon:
        hold = hold or directory / "hold"
        hold.touch()
        prompt = ticker_prompt(5, 0, hold)
        run_id = daemon.start_run(
            {"prompt": prompt, "model": "fake:ticker", "chain_of_thought": "surface"}
        )

        async def running() -> bool:
            return daemon.get(f"/v1/runs/{run_id}", "owner").json()["status"] == "running"

        asyncio.run(until(running))
        yield daemon, directory, run_id


def _read_to_end(response: httpx.Response) -> list[SSEMessage]:
    """Every message of an SSE response that must end by itself: keep-alive comments would
    reset a read timeout, so the whole read has a deadline."""
    deadline = time.monotonic() + WAIT_S
    decoder = SSEDecoder()
    out: list[SSEMessage] = []
    for chunk in response.iter_bytes():
        out.extend(decoder.feed(chunk))
        assert time.monotonic() < deadline, f"still attached after {out}"
    return [*out, *decoder.flush()]


@pytest.mark.inprocess
def test_readiness_answers_ok_on_a_healthy_store_and_503_once_its_directory_is_removed(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "store"
    with running_daemon(sqlite_dir=directory) as daemon:
        ready = daemon.get("/readyz")  # no key, like /healthz
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        shutil.rmtree(directory)
        unready = daemon.get("/readyz")
        assert unready.status_code == 503
        assert unready.json() == {"status": "unready", "reason": "store_removed"}
        # liveness is another question: the process is up and answers
        assert daemon.get("/healthz").status_code == 200


@pytest.mark.inprocess
def test_readiness_says_nothing_of_runs_or_paths_with_or_without_a_key(tmp_path: Path) -> None:
    with _held_run(tmp_path) as (daemon, directory, run_id):
        bodies = {daemon.get("/readyz", role).text for role in (None, "owner")}
        shutil.rmtree(directory)
        bodies |= {daemon.get("/readyz", role).text for role in (None, "owner")}
        assert {json.dumps(json.loads(b), sort_keys=True) for b in bodies} == {
            '{"status": "ready"}',
            '{"reason": "store_removed", "status": "unready"}',
        }
        for body in bodies:
            assert run_id not in body and str(tmp_path) not in body and "db" not in body


def _live(
    daemon: Daemon,
    run_id: str,
    *,
    after: int | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> list[SSEMessage]:
    """The owner's live stream of ``run_id`` (resumed after ``after``), read to its end, with
    ``meanwhile`` done once it is open."""
    params: dict[str, str | int] = {"ticket": daemon.ticket(run_id, "owner")}
    if after is not None:
        params["last_event_id"] = after
    timeout = httpx.Timeout(10, read=WAIT_S)
    with (
        daemon.client() as c,
        c.stream("GET", f"/v1/runs/{run_id}/stream", params=params, timeout=timeout) as r,
    ):
        assert r.status_code == 200
        if meanwhile is not None:
            meanwhile()
        return _read_to_end(r)


@pytest.mark.inprocess
def test_a_live_reader_of_a_run_whose_store_is_removed_gets_the_resume_frame_and_is_let_go(
    tmp_path: Path,
) -> None:
    with _held_run(tmp_path) as (daemon, directory, run_id):
        # the model goes on; its first write is refused. Before, the reader stayed attached
        # until the daemon stopped
        messages = _live(daemon, run_id, meanwhile=lambda: shutil.rmtree(directory))
        last = messages[-1]
        assert last.event == "failed"
        sent = [int(m.id) for m in messages if m.id]
        assert json.loads(last.data) == {"reason": "failed", "resume_after": max(sent)}

        # once its execution here stopped (at its first refused write), its end unrecorded, the
        # run does not read running
        async def stopped() -> bool:
            return daemon.get(f"/v1/runs/{run_id}", "owner").status_code != 200

        asyncio.run(until(stopped, WAIT_S))
        view = daemon.get(f"/v1/runs/{run_id}", "owner")
        assert view.status_code == 503, view.text
        assert view.json()["error"]["code"] == "store_refuses_writes"
        assert "running" not in view.text
        # a reader that resumes is let go the same way, after what is stored: no hang
        resumed = _live(daemon, run_id, after=max(sent))
        assert [m.event for m in resumed] == ["failed"]
        assert json.loads(resumed[0].data)["resume_after"] == max(sent)


@pytest.mark.inprocess
def test_a_run_still_waiting_on_its_model_reads_running_and_its_reader_is_let_go_too(
    tmp_path: Path,
) -> None:
    """ADR 0162 on ADR 0151's third open item: a run whose model is still silent when the store
    starts refusing writes has not stopped (its next write decides), so its view and the list
    say ``running``, unmarked, which is true; but its live reader is let go like any other
    (the refusal is the store's, not the run's), and is let go again on resuming meanwhile."""
    hold = tmp_path / "hold"  # outside the store's directory: the model keeps waiting
    with _held_run(tmp_path, hold=hold) as (daemon, directory, run_id):
        messages = _live(daemon, run_id, meanwhile=lambda: shutil.rmtree(directory))
        assert messages[-1].event == "failed"
        sent = [int(m.id) for m in messages if m.id]
        assert json.loads(messages[-1].data) == {"reason": "failed", "resume_after": max(sent)}
        assert hold.exists(), "let go while its model still waits: no write was refused yet"
        view = daemon.get(f"/v1/runs/{run_id}", "owner")
        assert view.status_code == 200 and view.json()["status"] == "running"
        listed = daemon.get("/v1/runs", "owner").json()["runs"]
        assert [(v["run_id"], v["status"], v.get("record_out_of_date")) for v in listed] == [
            (run_id, "running", None)
        ]
        assert [m.event for m in _live(daemon, run_id, after=max(sent))] == ["failed"]
        # once the model goes on, its first write is refused: the run stops, as ADR 0151 says
        hold.unlink()

        async def stopped() -> bool:
            return daemon.get(f"/v1/runs/{run_id}", "owner").status_code == 503

        asyncio.run(until(stopped, WAIT_S))


@pytest.mark.inprocess
def test_the_run_list_marks_a_run_stopped_by_a_refused_write_as_out_of_date(
    tmp_path: Path,
) -> None:
    """The run list says of such a run what its own view says (503): its record is out of date.
    Its ``status`` stays the recorded one (a client reading it is not given a new status), with
    ``record_out_of_date`` naming the store's refusal; its live stream, opened before, is sent
    the run again so marked."""
    with _held_run(tmp_path) as (daemon, directory, run_id):
        with daemon.client("owner") as c:
            ticket = c.post("/v1/tickets", json={"scope": "runs"}).json()["ticket"]
            page = c.get("/v1/runs").json()
        assert [r.get("record_out_of_date") for r in page["runs"]] == [None]
        timeout = httpx.Timeout(10, read=WAIT_S)
        with (
            daemon.client() as c,
            c.stream(
                "GET",
                "/v1/runs/stream",
                params={"ticket": ticket, "last_event_id": page["changes"]},
                timeout=timeout,
            ) as r,
        ):
            assert r.status_code == 200
            shutil.rmtree(directory)  # the model goes on; its first write is refused
            decoder = SSEDecoder()
            marked: list[dict[str, object]] = []
            deadline = time.monotonic() + WAIT_S
            for chunk in r.iter_bytes():
                views = [json.loads(m.data) for m in decoder.feed(chunk) if m.event != "failed"]
                marked += [v for v in views if v.get("record_out_of_date")]
                if marked:
                    break
                assert time.monotonic() < deadline, "the stream never said so"
        assert marked[0]["run_id"] == run_id and marked[0]["status"] == "running"
        assert marked[0]["record_out_of_date"] == "store_removed"
        listed = daemon.get("/v1/runs", "viewer").json()["runs"]
        assert [(v["run_id"], v["status"], v.get("record_out_of_date")) for v in listed] == [
            (run_id, "running", "store_removed")
        ]
        assert daemon.get(f"/v1/runs/{run_id}", "owner").status_code == 503  # as its view


@pytest.mark.inprocess
def test_an_approval_answered_while_the_store_refuses_writes_is_refused_and_stays_pending(
    tmp_path: Path,
) -> None:
    """ADR 0165: an approval answered while the store refuses writes was taken (200) and given
    to the waiting execution, whose next write -- recording the answer -- was refused: the run
    stopped, the answer lost, after its answerer was told it was taken. Now it is a 503 with the
    run view's code, the run keeps waiting, and the same answer is taken once the store is back
    (here: its directory moved away, then back: the same file, so it takes writes again)."""
    directory = tmp_path / "store"
    away = tmp_path / "away"
    config = Config.from_mapping({"orchestration": {"approval_timeout_s": 120}})
    with running_daemon(sqlite_dir=directory, config=config) as daemon:
        run_id = daemon.awaiting_approval(WAIT_S)
        url = f"/v1/runs/{run_id}/approvals/call_danger"
        directory.rename(away)
        try:
            with daemon.client("member") as c:
                refused = c.post(url, json={"decision": "approve"})
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "store_refuses_writes"
            assert "store_removed" in error["message"] and "still pending" in error["message"]
            assert str(tmp_path) not in refused.text
        finally:
            away.rename(directory)

        async def ready() -> bool:
            return daemon.get("/readyz").status_code == 200

        asyncio.run(until(ready, WAIT_S))
        with daemon.client("member") as c:
            taken = c.post(url, json={"decision": "approve"})
        assert taken.status_code == 200, taken.text
        assert daemon.wait_done(run_id, timeout=WAIT_S)["status"] == "completed"
        events = daemon.get(f"/v1/runs/{run_id}/events", "owner").json()["events"]
        answers = [e for e in events if e["type"] == "tool.approval_response"]
        assert [a["payload"]["decision"] for a in answers] == ["approve"]


@pytest.mark.inprocess
def test_while_the_store_refuses_writes_an_approval_is_checked_in_order_key_run_readiness(
    tmp_path: Path,
) -> None:
    """ADR 0170: the approval route asked the store's readiness before it looked the run up, so
    while the store refused writes an unknown run was a 503 "the approval is still pending"
    rather than a 404, and an ended run a 503 rather than a 409. The order is the key (401), its
    role (403), the run (404, 409: reads work while writes are refused), then readiness (503)."""
    directory = tmp_path / "store"
    away = tmp_path / "away"
    config = Config.from_mapping({"orchestration": {"approval_timeout_s": 120}})
    with running_daemon(sqlite_dir=directory, config=config) as daemon:
        ended = daemon.start_run({"prompt": "hi", "model": "fake:echo"})
        assert daemon.wait_done(ended, timeout=WAIT_S)["status"] == "completed"
        waiting = daemon.awaiting_approval(WAIT_S)
        answer = {"decision": "approve"}

        def post(run_id: str, role: str) -> httpx.Response:
            key = daemon.keys.get(role, "tg_not_a_key")
            with httpx.Client(base_url=daemon.base_url, timeout=10) as c:
                return c.post(
                    f"/v1/runs/{run_id}/approvals/call_danger",
                    json=answer,
                    headers={"Authorization": f"Bearer {key}"},
                )

        directory.rename(away)
        try:
            unknown = post("run_0123456789abcdef0123456789abcdef", "member")
            assert unknown.status_code == 404, unknown.text
            assert unknown.json()["error"]["code"] == "not_found"
            over = post(ended, "member")
            assert over.status_code == 409, over.text
            assert "already ended (completed)" in over.json()["error"]["message"]
            stranger = post(waiting, "nobody")
            assert stranger.status_code == 401, stranger.text
            assert post(waiting, "viewer").status_code == 403
            refused = post(waiting, "member")
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "store_refuses_writes"
            for answered in (unknown, over, stranger):
                assert "still pending" not in answered.text
        finally:
            away.rename(directory)


def _agui_events(messages: list[SSEMessage]) -> list[dict[str, Any]]:
    return [json.loads(m.data) for m in messages if m.data]


@pytest.mark.inprocess
def test_an_agui_follower_of_a_run_whose_store_is_removed_gets_run_error_and_is_let_go(
    tmp_path: Path,
) -> None:
    """AG-UI has no resume frame: the follower is told, with ``RUN_ERROR`` code
    ``store_refuses_writes``, that the run cannot be followed now and may be later; never that
    it finished."""
    with _held_run(tmp_path) as (daemon, directory, run_id):
        body = {
            "threadId": "t",
            "runId": "r",
            "messages": [],
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {"thoughtgate": {"run": run_id}},
        }
        timeout = httpx.Timeout(10, read=WAIT_S)
        with (
            daemon.client("viewer") as c,
            c.stream("POST", "/v1/agui", json=body, timeout=timeout) as r,
        ):
            assert r.status_code == 200
            shutil.rmtree(directory)  # the model goes on; its first write is refused
            events = _agui_events(_read_to_end(r))  # before, attached until the daemon stopped
        types = [e["type"] for e in events]
        assert types[0] == "RUN_STARTED" and types[-1] == "RUN_ERROR", types
        assert "RUN_FINISHED" not in types
        end = events[-1]
        assert end["code"] == "store_refuses_writes"
        assert end["message"] == (
            "the run's events cannot be followed now: the event store refuses writes; "
            "follow the run again later"
        )
        assert end["metadata"] == {"thoughtgate": {"run_id": run_id}}
        assert str(tmp_path) not in json.dumps(events)
        # one that follows meanwhile gets what is stored, then the same end: no hang
        with (
            daemon.client("viewer") as c,
            c.stream("POST", "/v1/agui", json=body, timeout=timeout) as r,
        ):
            again = _agui_events(_read_to_end(r))
        assert [e["type"] for e in again] == types
        assert again[-1] == end


@contextlib.asynccontextmanager
async def _readyz(store: EventStore) -> AsyncIterator[httpx.AsyncClient]:
    """The daemon's routes over ``store`` in this loop (``/readyz`` needs no lifespan)."""
    app = create_app(store, Config())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


@pytest.mark.inprocess
async def test_readiness_fails_while_writes_fail_and_recovers_once_one_is_taken(
    tmp_path: Path,
) -> None:
    """Another connection holds the write lock past the store's busy timeout: every write is
    refused (as on a full disk); once one is taken again, the daemon is ready."""
    path = tmp_path / "s.db"
    store = await SQLiteStore.open(path, busy_timeout=0.05)
    try:
        async with _readyz(store) as client:
            assert (await client.get("/readyz")).status_code == 200
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN EXCLUSIVE")
            try:
                with pytest.raises(StoreError, match="locked"):
                    await store.create_run(make_run())
                unready = await client.get("/readyz")
                assert unready.status_code == 503
                assert unready.json() == {"status": "unready", "reason": "store_refuses_writes"}
            finally:
                other.execute("ROLLBACK")
                other.close()
            await store.create_run(make_run())
            assert (await client.get("/readyz")).json() == {"status": "ready"}
    finally:
        await store.close()


class _Proxy:
    """A TCP proxy to the test PostgreSQL server: stopping it cuts every connection through it
    and refuses new ones, as an unreachable server does, to this test's store alone."""

    def __init__(self) -> None:
        target = urlsplit(PG_URL)
        self.target = (target.hostname or "127.0.0.1", target.port or 5432)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    def url(self) -> str:
        parts = urlsplit(PG_URL)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in self._writers:
                writer.close()
            self._writers.clear()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@pytest.mark.postgres
async def test_readiness_fails_while_postgresql_is_unreachable_and_recovers(
    pg_schema: str,
) -> None:
    proxy = _Proxy()
    await proxy.start()
    store = await PostgresStore.open(proxy.url(), schema=pg_schema)
    try:
        async with _readyz(store) as client:
            assert (await client.get("/readyz")).json() == {"status": "ready"}
            await proxy.stop()

            async def unreachable() -> bool:
                answer = await client.get("/readyz")
                return answer.status_code == 503 and answer.json() == {
                    "status": "unready",
                    "reason": "store_unreachable",
                }

            await until(unreachable, WAIT_S)
            await proxy.start()  # the same port: the server is back

            async def ready() -> bool:
                return (await client.get("/readyz")).status_code == 200

            await until(ready, WAIT_S)
            await store.create_run(make_run())  # and it takes writes
    finally:
        await proxy.stop()
        await store.close()


class _CountingStore(MemoryStore):
    """A store whose database check takes a while and is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.checks = 0
        self.answer: str | None = "store_unreachable"

    async def check_writes(self, wait_s: float) -> str | None:
        self.checks += 1
        await asyncio.sleep(0.01)
        return self.answer


@pytest.mark.unit
async def test_readiness_asks_the_database_once_however_many_probes_ask_at_once() -> None:
    """A load balancer and an orchestrator probing every second, or a flood of anonymous
    requests, cost the store one check a second, not one each."""
    store = _CountingStore()
    readiness = Readiness(store, every_s=3600)
    answers = await asyncio.gather(*(readiness.refusal() for _ in range(50)))
    assert answers == ["store_unreachable"] * 50
    store.answer = None
    assert await readiness.refusal() == "store_unreachable"  # reused until every_s passed
    assert store.checks == 1
    fresh = Readiness(store, every_s=0)
    assert await fresh.refusal() is None
    assert await fresh.refusal() is None
    assert store.checks == 3


@contextlib.asynccontextmanager
async def _own_database(admin: Any) -> AsyncIterator[tuple[str, str]]:
    """A database of this test's own and its URL: its settings are changed, no other's."""
    database = schema_name()
    await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        yield database, urlunsplit(urlsplit(PG_URL)._replace(path=f"/{database}"))
    finally:
        await admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )


async def _read_only(admin: Any, database: str, on: bool) -> None:
    """New sessions of ``database`` refuse writes (or take them again); its sessions are ended,
    so the store's pool reconnects into the new setting."""
    name = sql.Identifier(database)
    setting = (
        "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    )
    await admin.execute(sql.SQL("ALTER DATABASE {} " + setting).format(name))
    await admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = %s AND pid <> pg_backend_pid()",
        (database,),
    )


@pytest.mark.postgres
async def test_a_postgresql_store_whose_writes_are_refused_says_so_without_asking(
    pg_admin: Any,
) -> None:
    """PostgreSQL that still takes connections and reads but refuses writes (here read-only; a
    full disk alike): the store's own cheap signal, which the live streams' ticker and
    ``/readyz`` take first, says so from its last refused write, until a write is taken. A write
    refused for its own reason (a run that exists already) counts for nothing."""
    async with _own_database(pg_admin) as (database, url):
        store = await PostgresStore.open(url, schema="s", pool_wait_s=2)
        try:
            run = make_run()
            await store.create_run(run)
            with pytest.raises(StoreError):
                await store.create_run(run)  # a constraint: the database takes writes
            assert store.write_refusal() is None
            await _read_only(pg_admin, database, on=True)
            with contextlib.suppress(StoreError):  # a pooled session ended: the next is new
                await store.create_run(make_run())
            with pytest.raises(StoreReadOnlyError):
                await store.create_run(make_run())
            assert store.write_refusal() == "store_read_only"
            await store.get_run(run.run_id)  # reads still work, and do not clear it
            assert store.write_refusal() == "store_read_only"
            await _read_only(pg_admin, database, on=False)
            with contextlib.suppress(StoreError):
                await store.create_run(make_run())
            await store.create_run(make_run())
            assert store.write_refusal() is None
        finally:
            await store.close()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("error", "word"),
    [
        (pg_errors_mod.DiskFull("could not extend file"), "store_refuses_writes"),
        (pg_errors_mod.OutOfMemory("out of memory"), "store_refuses_writes"),
        (pg_errors_mod.ReadOnlySqlTransaction("read-only"), "store_read_only"),
        (pg_errors_mod.TooManyConnections("too many clients"), "store_refuses_writes"),
        # not answering at all: the database check's own connection sees that come and go
        (pg_errors_mod.AdminShutdown("terminating connection"), None),
        (psycopg.OperationalError("connection failed"), None),
        (pg_errors_mod.UniqueViolation("duplicate key"), None),
        (pg_errors_mod.SyntaxError("syntax error"), None),
        (pg_errors_mod.QueryCanceled("canceling statement"), None),
        (pg_errors_mod.SerializationFailure("could not serialize"), None),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, Exception) else str(x),
)
def test_which_postgresql_errors_say_the_database_refuses_writes(
    error: psycopg.Error, word: str | None
) -> None:
    assert writes_refused(error) == word

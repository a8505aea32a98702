"""Helpers for the fault-injection and replica tests: a paced fake script, a raw SSE client,
``thoughtgate serve`` replicas sharing one PostgreSQL schema, and a store that fails on purpose.

The paced fake script, ``fake:ticker``, is in :mod:`support.ticker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

import httpx
import psycopg
import pytest
from psycopg import sql

from support.daemon import PG_START_S, SERVER_TOOLS, ServeProcess, auth, cli
from support.pg import PG_URL, schema_name
from support.ticker import ticker_prompt
from thoughtgate.errors import StoreError, StoreUnavailableError
from thoughtgate.events.schema import Event, NewEvent, is_run_terminal
from thoughtgate.store.base import EventStore, Holder, OpenRuns, RunEnding
from thoughtgate.store.listing import RunChanges, RunPage, RunQuery
from thoughtgate.store.pg_errors import describe_target
from thoughtgate.store.records import ApiKeyRecord, RunRecord, TaskRecord
from thoughtgate.store.run_index import RunChange

__all__ = [
    "SERVER_TOOLS",
    "Attempt",
    "FailingStore",
    "Frame",
    "RawSSE",
    "Replicas",
    "follow",
    "pg_schema_sync",
    "replicas",
    "start_run",
    "stored_run",
    "ticker_prompt",
]

TOOLS_FLAG = ("--tools", "support.served:SERVER_TOOLS")


# ----------------------------------------------------------------------------- raw SSE client


@dataclass(frozen=True, slots=True)
class Frame:
    """One SSE message: ``id`` (the event's sequence number), ``event`` name, ``data`` text."""

    id: int | None
    event: str
    data: str
    at: float = 0.0
    """``time.time()`` when the frame's bytes arrived (comparable with an event's ``ts``)."""

    def json(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.data)
        return loaded


def _parse(block: bytes, at: float) -> Frame | None:
    frame_id: int | None = None
    event = ""
    data: list[str] = []
    for line in block.split(b"\r\n"):
        if line.startswith(b"id: "):
            frame_id = int(line[4:])
        elif line.startswith(b"data: "):
            data.append(line[6:].decode("utf-8"))
        elif line.startswith(b"event: "):
            event = line[7:].decode("utf-8")
    if frame_id is None and not data and not event:
        return None  # a keep-alive comment
    return Frame(frame_id, event, "\n".join(data), at)


class RawSSE:
    """One live-channel connection on a bare asyncio socket (HTTP/1.1, chunked body).

    Light enough for a thousand concurrent readers in one process on two cores, where httpx would
    measure itself. ``abort()`` drops the connection without a goodbye, like a crashed client.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.status = 0
        self.headers: dict[str, str] = {}
        self._buffer = b""
        self._eof = False

    @classmethod
    async def open(
        cls,
        base_url: str,
        run_id: str,
        ticket: str,
        *,
        last_event_id: int | None = None,
        via: str = "header",
    ) -> RawSSE:
        host, port = base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
        path = f"/v1/runs/{run_id}/stream?ticket={ticket}"
        extra = ""
        if last_event_id is not None:
            if via == "header":
                extra = f"Last-Event-ID: {last_event_id}\r\n"
            else:
                path += f"&last_event_id={last_event_id}"
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode())
        conn = cls(reader, writer)
        status_line = await reader.readline()
        conn.status = int(status_line.split()[1])
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            conn.headers[name.strip().lower()] = value.strip()
        if conn.status != 200 or "chunked" not in conn.headers.get("transfer-encoding", ""):
            conn._eof = True
        return conn

    async def _chunk(self) -> bytes:
        size_line = await self.reader.readline()
        if not size_line:
            return b""
        size = int(size_line.strip(), 16)
        if size == 0:
            return b""
        data = await self.reader.readexactly(size + 2)
        return data[:-2]

    async def frames(self) -> AsyncIterator[Frame]:
        """Frames as they arrive, until the server ends the response (or the socket breaks)."""
        while not self._eof:
            try:
                piece = await self._chunk()
            except (OSError, asyncio.IncompleteReadError, ValueError):
                piece = b""
            if not piece:
                self._eof = True
                return
            at = time.time()
            self._buffer += piece
            while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
                block, self._buffer = self._buffer[:end], self._buffer[end + 4 :]
                frame = _parse(block, at)
                if frame is not None:
                    yield frame

    def abort(self) -> None:
        self.writer.transport.abort()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def follow(
    base_url: str,
    run_id: str,
    ticket: str,
    *,
    last_event_id: int | None = None,
    on_first: Callable[[], object] | None = None,
) -> list[Frame]:
    """Every frame from ``last_event_id`` to the end of the run; ``on_first()`` is called when the
    first one arrives (the reader is connected and following)."""
    conn = await RawSSE.open(base_url, run_id, ticket, last_event_id=last_event_id)
    try:
        frames: list[Frame] = []
        async for frame in conn.frames():
            if not frames and on_first is not None:
                on_first()
            frames.append(frame)
        return frames
    finally:
        await conn.close()


def event_frames(frames: Sequence[Frame]) -> list[Frame]:
    """The frames that carry an event (not ``lagging``/``failed`` notes)."""
    return [f for f in frames if f.event in ("", "message") and f.id is not None]


def ends_run(frame: Frame) -> bool:
    return is_run_terminal(str(frame.json()["type"]))


# ----------------------------------------------------------------------------- HTTP helpers


def start_run(base_url: str, key: str, prompt: str, *, mode: str = "surface") -> tuple[str, str]:
    """Start a ``fake:ticker`` run; its id and a live-channel ticket for the key's role."""
    with httpx.Client(base_url=base_url, headers=auth(key), timeout=30) as c:
        made = c.post(
            "/v1/runs", json={"prompt": prompt, "model": "fake:ticker", "chain_of_thought": mode}
        )
        assert made.status_code == 202, made.text
        run_id = str(made.json()["run_id"])
        ticket = c.post("/v1/tickets", json={"run_id": run_id}).json()["ticket"]
    return run_id, str(ticket)


def stored_run(base_url: str, key: str, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run and its whole event log, as the HTTP API returns them."""
    with httpx.Client(base_url=base_url, headers=auth(key), timeout=30) as c:
        run: dict[str, Any] = c.get(f"/v1/runs/{run_id}").json()
        events: list[dict[str, Any]] = c.get(
            f"/v1/runs/{run_id}/events", params={"limit": 5000}
        ).json()["events"]
    return run, events


# ----------------------------------------------------------------------------- PostgreSQL replicas


@contextlib.contextmanager
def pg_schema_sync() -> Iterator[str]:
    """A fresh schema name (created by the first store that opens it), dropped afterwards.

    Fails the test, never skips, when the server is unreachable (see ``support.pg``).
    """
    try:
        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        pytest.fail(
            f"{describe_target(PG_URL)} is unreachable: {exc}\n"
            "Start it (`make postgres-up`) or point THOUGHTGATE_TEST_PG_URL at a server; "
            "the PostgreSQL tests do not skip.",
            pytrace=False,
        )
    name = schema_name()
    try:
        yield name
    finally:
        with admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@dataclass
class Replicas:
    """Two ``thoughtgate serve`` processes on one PostgreSQL schema, and an owner key."""

    db_url: str
    a: ServeProcess
    b: ServeProcess
    owner: str
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def urls(self) -> tuple[str, str]:
        return self.a.base_url, self.b.base_url

    def client(self, base_url: str, key: str | None = None) -> httpx.Client:
        made = httpx.Client(base_url=base_url, headers=auth(key or self.owner), timeout=10)
        self.clients.append(made)
        return made

    def start_run(self, base_url: str, prompt: str, *, mode: str = "surface") -> str:
        r = self.client(base_url).post(
            "/v1/runs", json={"prompt": prompt, "model": "fake:ticker", "chain_of_thought": mode}
        )
        assert r.status_code == 202, r.text
        return str(r.json()["run_id"])

    def ticket(self, base_url: str, run_id: str, key: str | None = None) -> str:
        r = self.client(base_url, key).post("/v1/tickets", json={"run_id": run_id})
        assert r.status_code == 200, r.text
        return str(r.json()["ticket"])

    def events(self, base_url: str, run_id: str) -> list[dict[str, Any]]:
        r = self.client(base_url).get(f"/v1/runs/{run_id}/events", params={"limit": 5000})
        assert r.status_code == 200, r.text
        found: list[dict[str, Any]] = r.json()["events"]
        return found

    def status(self, base_url: str, run_id: str) -> str:
        return str(self.client(base_url).get(f"/v1/runs/{run_id}").json()["status"])

    def wait_done(self, base_url: str, run_id: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while (status := self.status(base_url, run_id)) in ("pending", "running"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {status}")
            time.sleep(0.05)
        return status


@contextlib.contextmanager
def replicas() -> Iterator[Replicas]:
    """A fresh schema, an owner key made once with ``thoughtgate keys create`` (which also
    migrates the schema), then two daemons on it, started at the same time."""
    with pg_schema_sync() as schema:
        db_url = f"{PG_URL}?schema={schema}"
        made = cli("keys", "create", "--role", "owner", "--name", "ops", "--json", "--db", db_url)
        assert made.returncode == 0, made.stderr
        owner = str(json.loads(made.stdout)["key"])
        args = ("--db", db_url, *TOOLS_FLAG, "--no-bootstrap-key", "--shutdown-grace", "0.2")
        a, b = ServeProcess(*args), ServeProcess(*args)
        try:
            ServeProcess.start_all(a, b, timeout=PG_START_S)
            pair = Replicas(db_url, a, b, owner)
            try:
                yield pair
            finally:
                for c in pair.clients:
                    c.close()
        finally:
            a.stop()
            b.stop()


# ----------------------------------------------------------------------------- failing store


class FailingStore(EventStore):
    """Wraps a real store; ``fail_appends`` makes appends raise a ``StoreError`` like a full disk.

    Every attempted batch is kept in ``attempts`` with what came of it: the stored events, or
    ``None`` when the append raised, and whether that failure leaves the outcome unknown (a
    connection lost mid-call: the statement may have committed). A test then checks that the log
    holds exactly the batches that were stored, each one whole.
    """

    def __init__(self, inner: EventStore) -> None:
        super().__init__()
        self.inner = inner
        self.wakeups = inner.wakeups
        self.fail_appends = False
        self.attempts: list[Attempt] = []

    def _refuse_when_full(self, batch: list[NewEvent], what: str) -> None:
        """Raise the injected full-disk error for ``batch`` when ``fail_appends`` is on."""
        if self.fail_appends:
            self.attempts.append(Attempt(batch, None))
            raise StoreError(
                f"cannot {what}: database or disk is full (injected); the write was rolled back "
                "and nothing of it was stored"
            )

    async def append(
        self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
    ) -> list[Event]:
        batch = list(events)
        self._refuse_when_full(batch, f"append {len(batch)} events to run {run_id!r}")
        try:
            out = await self.inner.append(run_id, batch, held_by=held_by)
        except StoreError as exc:
            self.attempts.append(
                Attempt(batch, None, unknown=isinstance(exc, StoreUnavailableError))
            )
            raise
        self.attempts.append(Attempt(batch, out))
        return out

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        return await self.inner.read(run_id, after=after, limit=limit, apart=apart)

    async def read_types(
        self,
        run_id: str,
        types: Collection[str],
        *,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Event]:
        return await self.inner.read_types(run_id, types, after=after, limit=limit)

    async def create_run(self, run: RunRecord) -> None:
        await self.inner.create_run(run)

    async def get_run(self, run_id: str, *, apart: bool = True) -> RunRecord:
        return await self.inner.get_run(run_id, apart=apart)

    async def list_runs(
        self, *, limit: int = 50, offset: int = 0, apart: bool = True
    ) -> list[RunRecord]:
        return await self.inner.list_runs(limit=limit, offset=offset, apart=apart)

    async def query_runs(self, query: RunQuery, *, apart: bool = True) -> RunPage:
        return await self.inner.query_runs(query, apart=apart)

    async def run_changes(self, *, after: int, limit: int = 100, apart: bool = True) -> RunChanges:
        return await self.inner.run_changes(after=after, limit=limit, apart=apart)

    async def latest_run_change(self) -> int:
        return await self.inner.latest_run_change()

    async def wait_for_run_changes(self, after: int, *, poll_s: float | None = None) -> None:
        await self.inner.wait_for_run_changes(after, poll_s=poll_s)

    async def update_run(
        self, run_id: str, *, held_by: Holder | None = None, **change: Unpack[RunChange]
    ) -> None:
        await self.inner.update_run(run_id, held_by=held_by, **change)

    async def save_task(self, task: TaskRecord, *, held_by: Holder | None = None) -> None:
        await self.inner.save_task(task, held_by=held_by)

    async def find_run_ids(self, prefix: str, *, limit: int = 10) -> list[str]:
        return await self.inner.find_run_ids(prefix, limit=limit)

    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        """Ending a run appends its last events: a full disk fails it like any append."""
        batch = list(events)
        self._refuse_when_full(batch, f"finish run {run_id!r}")
        try:
            out = await self.inner.finish_run(run_id, batch, ending)
        except StoreError as exc:  # lost with its connection: it may have committed
            unknown = isinstance(exc, StoreUnavailableError)
            self.attempts.append(Attempt(batch, None, unknown=unknown, finishing=True))
            raise
        self.attempts.append(Attempt(batch, out, finishing=True))
        return out

    async def rebuild_run_index(self, run_id: str) -> RunRecord:
        return await self.inner.rebuild_run_index(run_id)

    async def renew_leases(self, owner: str, ttl_s: float, run_ids: Collection[str]) -> list[str]:
        return await self.inner.renew_leases(owner, ttl_s, run_ids)

    async def open_runs(
        self,
        *,
        limit: int = 1000,
        after: str | None = None,
        expired: bool = False,
        run_ids: Collection[str] | None = None,
    ) -> OpenRuns:
        return await self.inner.open_runs(
            limit=limit, after=after, expired=expired, run_ids=run_ids
        )

    async def clock(self) -> float:
        return await self.inner.clock()

    async def save_api_key(self, key: ApiKeyRecord) -> None:
        await self.inner.save_api_key(key)

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        return await self.inner.list_api_keys()

    async def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        return await self.inner.get_api_key(key_id)

    async def find_api_key(self, key_hash: str) -> ApiKeyRecord | None:
        return await self.inner.find_api_key(key_hash)

    async def revoke_api_key(self, key_id: str) -> bool:
        return await self.inner.revoke_api_key(key_id)

    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        return await self.inner.get_or_create_secret(name, candidate)


@dataclass
class Attempt:
    """One append: the batch, the events stored (``None``: it raised), and whether a failure
    leaves it unknown if the batch committed. ``finishing``: a ``finish_run``, which stores
    nothing (``stored == []``) when the run had already ended."""

    batch: list[NewEvent]
    stored: list[Event] | None
    unknown: bool = False
    finishing: bool = False


def stored_batches_are_whole(attempts: Sequence[Attempt], log: Sequence[Event]) -> None:
    """The log is exactly the batches reported stored, in order, each whole; failed ones left
    nothing behind (one whose outcome is unknown is there whole, or not at all).

    Where the log ends after each attempt is a set, not one position: an attempt whose outcome
    is unknown may have committed or not, and the same batch can follow it. The close retry
    (ADR 0059) tries a run's end again after a lost connection: when the first try did not
    commit, the end in the log is the retry's, and crediting it to the first try (the first
    batch that matches it) would wrongly find the retry's, reported stored, missing. When the
    first try did commit, the retry finds the run ended and stores nothing."""
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert sum(is_run_terminal(e.type) for e in log) <= 1, "the run ended more than once"
    ends = {0}  # where the log may end after the attempts so far
    for attempt in attempts:
        wanted = [(e.type, e.payload) for e in attempt.batch]
        if attempt.stored is not None:
            if attempt.finishing and not attempt.stored:  # the run had ended: nothing stored
                assert any(p and is_run_terminal(log[p - 1].type) for p in ends), (
                    "a run's end stored nothing, but the run had not ended"
                )
                continue
            assert [(e.type, e.payload) for e in attempt.stored] == wanted
            after = {p + len(wanted) for p in ends if _holds(log, p, wanted)}
            assert after, f"batch at seq {min(ends) + 1} is not stored whole"
            ends = after
        elif attempt.unknown:  # it committed before the connection was lost, or not at all
            ends |= {p + len(wanted) for p in ends if _holds(log, p, wanted)}
    assert len(log) in ends, f"events {max(ends) + 1}.. come from no stored batch"


def _holds(log: Sequence[Event], position: int, wanted: list[tuple[str, Any]]) -> bool:
    """Whether ``log`` holds the events ``wanted`` (type and payload) from ``position``."""
    return [(e.type, e.payload) for e in log[position : position + len(wanted)]] == wanted

"""The SQLite backend: the shared conformance suite, plus what only a file on disk can get wrong."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.durable_store_conformance import DurableStoreConformance
from support.listing_conformance import RunListingConformance
from support.store_backends import SQLite
from support.store_conformance import (
    ENDED_UNCLOSED_CLOSED_AT,
    ENDED_UNCLOSED_EVENTS,
    ENDED_UNCLOSED_RUNS,
    GAP_AT,
    EventLogConformance,
    KeyStoreConformance,
    RunIndexConformance,
    a_run_of_tool_failures,
    a_run_to_hole,
    assert_a_gap_is_never_renumbered,
    assert_ended_runs_closed,
    assert_old_rows_replay_upgraded,
    assert_same_events,
    collect,
    deltas,
    make_run,
)

import thoughtgate.store
from thoughtgate.errors import (
    NotOurDatabaseError,
    RunClosedError,
    RunNotFoundError,
    StoreError,
    StoreReadOnlyError,
    StoreUnavailableError,
    UsageError,
)
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.store import codec, sqlite_schema
from thoughtgate.store.base import EventStore, RunEnding
from thoughtgate.store.durable import Admission, Quota, RunSpecRecord
from thoughtgate.store.leases import Owner, orphan_reason
from thoughtgate.store.listing import RunCursor, RunQuery, page_query
from thoughtgate.store.migrations import load_migrations
from thoughtgate.store.private_files import create_private_file
from thoughtgate.store.projection import PROJECTED_EVENT_TYPES
from thoughtgate.store.records import ApiKeyRecord, RunRecord, TaskRecord
from thoughtgate.store.sqlite import (
    _CLAIM_HEAD,
    _CLAIM_TAIL,
    _RENEW,
    _STARTED,
    SQLiteStore,
    open_runs_query,
    read_types_query,
)
from thoughtgate.store.sqlite_schema import applied_versions, apply_migrations, connect
from thoughtgate.store.sqlite_thread import SQLiteThread
from thoughtgate.store.urls import open_store


class TestSQLiteEventLog(SQLite, EventLogConformance):
    pass


class TestSQLiteRunIndex(SQLite, RunIndexConformance, RunListingConformance):
    pass


class TestSQLiteKeyStore(SQLite, KeyStoreConformance):
    pass


class TestSQLiteDurableRuns(SQLite, DurableStoreConformance):
    pass


# -- helpers -------------------------------------------------------------------------------
SRC = Path(thoughtgate.store.__file__).resolve().parents[2]


def names_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make a file or directory unwritable, for root too (root ignores permission bits, so it
    also gets the immutable attribute, which binds root)."""
    mode = path.stat().st_mode
    path.chmod(mode & ~0o222)
    pinned = False
    try:
        if os.geteuid() == 0:
            done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.fail(f"cannot make {path} read-only for root (chattr +i): {done.stderr}")
            pinned = True
        probe = path / "probe" if path.is_dir() else path
        with pytest.raises(PermissionError):  # the test below is only honest if this holds
            probe.open("ab").close()
        yield
    finally:
        if pinned:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


async def run_python(code: str, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def filled_store(path: Path, *, events: int = 5) -> tuple[RunRecord, list[Event]]:
    store = await SQLiteStore.open(path)
    try:
        run = make_run(tasks=2)
        await store.create_run(run)
        appended = await store.append(run.run_id, deltas(events))
        await store.save_api_key(ApiKeyRecord("key_1", "ci", "member", "hash-1"))
    finally:
        await store.close()
    return run, appended


WRITES: list[tuple[str, Callable[[EventStore, str], Awaitable[object]]]] = [
    ("append", lambda s, r: s.append(r, deltas(1))),
    ("create_run", lambda s, r: s.create_run(make_run())),
    ("update_run", lambda s, r: s.update_run(r, status="failed")),
    ("save_task", lambda s, r: s.save_task(TaskRecord("task_new", r, 9, "p"))),
    ("save_api_key", lambda s, r: s.save_api_key(ApiKeyRecord("k", "n", "viewer", "h"))),
    ("revoke_api_key", lambda s, r: s.revoke_api_key("key_1")),
    ("get_or_create_secret", lambda s, r: s.get_or_create_secret("new", "v")),
]


# -- opening, migrations -------------------------------------------------------------------
async def test_open_creates_parent_directories_and_records_migrations(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "thoughtgate.db"
    store = await SQLiteStore.open(path)
    await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT version, name, applied_at FROM thoughtgate_migrations ORDER BY version"
        ).fetchall()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    known = load_migrations("sqlite")
    assert [(v, n) for v, n, _ in rows] == [(m.version, m.name) for m in known]
    assert all(isinstance(at, float) and at > 1.6e9 for _, _, at in rows)

    store = await SQLiteStore.open(path)  # reopening applies nothing twice
    await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        again = conn.execute(
            "SELECT version, name, applied_at FROM thoughtgate_migrations"
        ).fetchall()
    assert sorted(again) == sorted(rows)


async def test_open_store_url_selects_sqlite(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'via-url.db'}")
    try:
        assert isinstance(store, SQLiteStore)
        run = make_run()
        await store.create_run(run)
        assert (await store.get_run(run.run_id)).run_id == run.run_id
    finally:
        await store.close()


@contextlib.contextmanager
def at_version(path: Path, version: int, *, before: str) -> Iterator[sqlite3.Connection]:
    """A new database at schema ``version``, the one just ``before`` the named migration, as a
    thoughtgate of that version left it; closed after the block (which fills it)."""
    known = load_migrations("sqlite")
    assert known[version].name == before
    with contextlib.closing(connect(path, busy_timeout=5)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        apply_migrations(conn, path, known[:version])
        yield conn


async def test_upgrade_from_version_one_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    first = load_migrations("sqlite")[:1]
    with contextlib.closing(connect(path, busy_timeout=5)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        apply_migrations(conn, path, first)
        conn.execute(
            "INSERT INTO runs (run_id, prompt, model, chain_of_thought, worker_backend, status, "
            "created_at, updated_at, usage, error, metadata, last_seq) VALUES "
            "('run_old', 'old prompt', NULL, 'surface', 'provider', 'completed', 1.5, 2.5, "
            '\'{"input_tokens":3}\', NULL, \'{"k":"v"}\', 2)'
        )
        conn.execute(
            "INSERT INTO events (run_id, seq, task_id, type, ts, payload) VALUES "
            "('run_old', 1, NULL, 'run.started', 1.5, '{\"a\":1}'), "
            "('run_old', 2, NULL, 'message.delta', 1.75, '{\"text\":\"hé\"}')"
        )
        conn.execute(
            "INSERT INTO api_keys VALUES ('key_old', 'old', 'admin', 'hash-old', 1.0, NULL)"
        )
        assert applied_versions(conn) == {1}

    store = await SQLiteStore.open(path)
    try:
        run = await store.get_run("run_old")
        assert (run.prompt, run.chain_of_thought, run.usage, run.metadata) == (
            "old prompt",
            "surface",
            {"input_tokens": 3},
            {"k": "v"},
        )
        assert [(e.seq, e.type, dict(e.payload), e.ts) for e in await store.read("run_old")] == [
            (1, "run.started", {"a": 1}, 1.5),
            (2, "message.delta", {"text": "hé"}, 1.75),
        ]
        # Ended (its status) without a closed_at before it: closed by the upgrade (ADR 0134).
        with pytest.raises(RunClosedError):
            await store.append_one("run_old", NewEvent("x"))
        assert (await store.find_api_key("hash-old")) is not None
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert applied_versions(conn) == {m.version for m in load_migrations("sqlite")}
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"runs_by_created_at", "active_api_keys_by_hash"} <= indexes


async def test_upgrade_to_the_run_list_numbers_old_runs_and_pages_them(tmp_path: Path) -> None:
    """Runs stored before the run list existed get one change each, in stored order; the first
    change after the upgrade comes after them; pages and filters cover them."""
    path = tmp_path / "v5.db"
    with at_version(path, 5, before="run_list") as conn:
        for run_id, status, at in (("run_b", "failed", 2.0), ("run_a", "completed", 1.0)):
            conn.execute(
                "INSERT INTO runs (run_id, prompt, model, chain_of_thought, worker_backend, "
                "status, created_at, updated_at, usage, error, metadata, last_seq) VALUES "
                f"('{run_id}', 'old {run_id}', NULL, 'hidden', 'provider', '{status}', {at}, "
                f"{at}, '{{}}', NULL, '{{}}', 0)"
            )
    store = await SQLiteStore.open(path)
    try:
        assert await store.latest_run_change() == 2
        changes = (await store.run_changes(after=0)).changes
        assert [(n, r.run_id, r.started_by) for n, r in changes] == [
            (1, "run_b", None),
            (2, "run_a", None),
        ]
        page = await store.query_runs(RunQuery(statuses=("failed",)))
        assert [r.run_id for r in page.runs] == ["run_b"]
        assert [r.run_id for r in (await store.query_runs(RunQuery(text="OLD RUN_A"))).runs] == [
            "run_a"
        ]
        await store.update_run("run_a", status="failed")
        assert [n for n, _ in (await store.run_changes(after=2)).changes] == [3]
    finally:
        await store.close()


async def test_upgrade_to_run_leases_gives_open_runs_a_lease_that_runs_out(
    tmp_path: Path,
) -> None:
    """Runs a pre-lease thoughtgate left open get the owner ``legacy`` and a minute's lease, so
    the first sweep after that closes them; finished runs are untouched and still readable."""
    path = tmp_path / "v4.db"
    with at_version(path, 4, before="run_leases") as conn:  # as a pre-lease thoughtgate wrote it
        for run_id, status in (("run_open", "running"), ("run_done", "completed")):
            conn.execute(
                "INSERT INTO runs (run_id, prompt, model, chain_of_thought, worker_backend, "
                "status, created_at, updated_at, usage, error, metadata, last_seq) VALUES "
                f"('{run_id}', 'p', NULL, 'hidden', 'provider', '{status}', 1.0, 1.0, '{{}}', "
                "NULL, '{}', 0)"
            )
        conn.execute(
            "INSERT INTO tasks VALUES ('run_open', 'task_open', 0, 'p', 'running', NULL, NULL, "
            "'{}', NULL, NULL, 'provider')"
        )
    before = time.time()
    store = await open_store(f"sqlite:///{path}")  # migrates, then sweeps: nothing expired yet
    try:
        opened = await store.get_run("run_open")
        assert opened.status == "running" and opened.owner == "legacy"
        assert opened.lease_expires_at is not None
        assert before + 50 < opened.lease_expires_at < time.time() + 70
        done = await store.get_run("run_done")
        assert (done.status, done.owner, done.lease_expires_at) == ("completed", None, None)
        assert [r.run_id for r in (await store.open_runs()).runs] == ["run_open"]
        later = (await store.open_runs()).now + 61
        reason = orphan_reason((await store.open_runs()).runs[0], later, Owner.current())
        assert reason is not None, "a minute later nobody has renewed it: it is an orphan"
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert applied_versions(conn) == {m.version for m in load_migrations("sqlite")}
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "open_runs_by_id" in indexes and "open_runs_by_owner" not in indexes  # ADR 0079


async def test_upgrade_to_the_lifecycle_index_keeps_the_events_and_a_check_reads_through_it(
    tmp_path: Path,
) -> None:
    """A store with runs and events from before ``lifecycle_events`` (ADR 0066) gets the index
    built over its rows at its next start; ``read_types`` then finds those rows, and a check's
    statement goes through the index (not the primary key's walk over every event). Types the
    index does not hold are still read, by that walk."""
    path = tmp_path / "v7.db"
    with at_version(path, 7, before="lifecycle_events") as conn:
        for change, run_id in enumerate(("run_a", "run_b"), 1):
            conn.execute(
                "INSERT INTO runs (run_id, prompt, model, chain_of_thought, worker_backend, "
                "status, created_at, updated_at, usage, error, metadata, last_seq, change_seq) "
                f"VALUES ('{run_id}', 'p', NULL, 'hidden', 'provider', 'completed', 1.0, 1.0, "
                f"'{{}}', NULL, '{{}}', 2002, {change})"
            )
            rows = [(run_id, 1, None, "run.started", 1.5, '{"prompt":"p","tasks":0}', 1)]
            rows += [
                (run_id, seq, None, "message.delta", 2.0, f'{{"i":{seq}}}', 1)
                for seq in range(2, 2002)
            ]
            rows.append(
                (run_id, 2002, None, "run.settlement.completed", 3.0, '{"status":"completed"}', 1)
            )
            conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    store = await SQLiteStore.open(path)
    try:
        wanted = [EventType.RUN_STARTED, EventType.RUN_SETTLEMENT_COMPLETED]
        got = await store.read_types("run_b", wanted)
        assert [(e.seq, e.type) for e in got] == [
            (1, "run.started"),
            (2002, "run.settlement.completed"),
        ]
        assert [e.seq for e in await store.read_types("run_b", wanted, after=1)] == [2002]
        deltas_read = await store.read_types("run_b", [EventType.MESSAGE_DELTA], limit=3)
        assert [e.seq for e in deltas_read] == [2, 3, 4]
        assert len(await store.read("run_b")) == 2002, "every event kept"
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert applied_versions(conn) == {m.version for m in load_migrations("sqlite")}
        query, params = read_types_query("run_b", PROJECTED_EVENT_TYPES, after=0, limit=1000)
        plan = " ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {query}", params))
    assert "USING INDEX lifecycle_events (run_id=? AND seq>?)" in plan, plan
    assert "PRIMARY KEY" not in plan and "TEMP B-TREE" not in plan, plan


async def test_upgrade_to_the_open_runs_index_pages_open_runs_by_a_range_read(
    tmp_path: Path,
) -> None:
    """A store from before ``open_runs_by_id`` (ADR 0079), holding 5,000 ended runs and 40 open
    ones, gets the index at its next start; ``open_runs`` then pages every open run once, in
    run id order, and its statement reads a page as a range of that index from the cursor, in
    order -- where SQLite read every open run by status and sorted them (a temporary b-tree).
    The named read (a sweep's finished workflows) and a lease renewal look their runs up in the
    index, which replaced ``open_runs_by_owner``."""
    path = tmp_path / "v8.db"
    with at_version(path, 8, before="open_runs_by_id") as conn:
        conn.executemany(
            "INSERT INTO runs (run_id, prompt, model, chain_of_thought, worker_backend, status, "
            "created_at, updated_at, usage, error, metadata, last_seq, change_seq, owner, "
            "lease_expires_at, closed_at) VALUES (?, 'p', NULL, 'hidden', 'provider', ?, 1.0, "
            "1.0, '{}', NULL, '{}', 0, ?, ?, ?, ?)",
            [
                (f"run_{g:05d}", "running", g, "elsewhere", 4e9, None)
                if g % 125 == 0
                else (f"run_{g:05d}", "completed", g, None, None, 2.0)
                for g in range(1, 5041)
            ],
        )
    opened_runs = [f"run_{g:05d}" for g in range(125, 5041, 125)]
    store = await SQLiteStore.open(path)
    try:
        seen: list[str] = []
        after: str | None = None
        while page := (await store.open_runs(limit=7, after=after)).runs:
            seen += [r.run_id for r in page]
            after = page[-1].run_id
        assert seen == opened_runs, "every open run once, in run id order"
        expired = await store.open_runs(limit=7, expired=True)
        assert expired.runs == [], "their leases run"
        named = await store.open_runs(run_ids=[opened_runs[3], "run_00001"], limit=10)
        assert [r.run_id for r in named.runs] == [opened_runs[3]]
        renewed = await store.renew_leases("elsewhere", 30.0, [*opened_runs[:2], "run_00001"])
        assert sorted(renewed) == opened_runs[:2], "an ended run's lease is not renewed"
    finally:
        await store.close()
    ids = f'["{opened_runs[3]}"]'
    reads = {
        "page after": ("(run_id>?)", dict(after=opened_runs[9], run_ids=None, expired=False)),
        "first page": ("", dict(after=None, run_ids=None, expired=False)),
        "expired": ("", dict(after=opened_runs[9], run_ids=None, expired=True)),
        "named": ("(run_id=?)", dict(after=None, run_ids=ids, expired=False)),
    }
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert applied_versions(conn) == {m.version for m in load_migrations("sqlite")}
        for what, (cond, kw) in reads.items():
            query, params = open_runs_query(limit=7, now=1.0, **kw)  # type: ignore[arg-type]
            rows = conn.execute(f"EXPLAIN QUERY PLAN {query}", params)
            plan = " ".join(str(r[-1]) for r in rows)
            index = "leased_runs_by_id" if what == "expired" else "open_runs_by_id"
            assert f"runs USING INDEX {index} {cond}".strip() in plan, (what, plan)
            assert "TEMP B-TREE" not in plan, (what, plan)
        # a renewal looks its runs up by id, no longer through the owner's open runs
        renew = " ".join(
            str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {_RENEW}", (1.0, ids, "o"))
        )
        assert "runs USING INDEX open_runs_by_id (run_id=?)" in renew, renew


def _indexes_written(conn: sqlite3.Connection, statement: str, params: Sequence[Any]) -> set[str]:
    """The indexes of ``runs`` a statement's program opens for writing (``OpenWrite`` of their
    root page): those whose entries it may delete and insert again."""
    roots = dict(conn.execute("SELECT rootpage, name FROM sqlite_master WHERE type = 'index'"))
    program = conn.execute(f"EXPLAIN {statement}", params).fetchall()
    return {roots[row[3]] for row in program if row[1] == "OpenWrite" and row[3] in roots}


async def test_upgrade_to_open_run_indexes_without_status_keeps_every_open_run_read_exact(
    tmp_path: Path,
) -> None:
    """Schema version 12 (ADR 0127) builds ``open_runs_by_id`` and ``leased_runs_by_id`` on
    predicates that name no ``status``: a run's pending -> running (its first task's start, a
    claim) no longer opens ``open_runs_by_id`` for writing, nor ``leased_runs_by_id`` when its
    owner stays (at version 11 both were). The indexes held ended runs without a
    ``closed_at`` (ended before schema version 5, or by a status written without
    ``finish_run``) until version 13 closed them (ADR 0134); every read of open runs leaves them
    out, and still reads through the indexes (the plans: ``test_upgrade_to_the_open_runs_index_pages_open_runs_by_a_range_read``)."""
    path = tmp_path / "v11.db"
    claim = f"{_CLAIM_HEAD}(?, ?, ?, ?, ?){_CLAIM_TAIL}"
    with at_version(path, 11, before="open_run_indexes_by_closed_at") as conn:
        assert {"open_runs_by_id", "leased_runs_by_id"} <= _indexes_written(
            conn, _STARTED, ("run_x",)
        )
        assert "open_runs_by_id" in _indexes_written(conn, claim, ("run_x", "o", 1.0, 1.0, None))
        conn.executemany(
            "INSERT INTO runs (run_id, prompt, model, chain_of_thought, worker_backend, status, "
            "created_at, updated_at, usage, error, metadata, last_seq, change_seq, owner, "
            "lease_expires_at, closed_at) VALUES (?, 'p', NULL, 'hidden', 'provider', ?, 1.0, "
            "1.0, '{}', NULL, '{}', 0, ?, ?, ?, ?)",
            [
                ("run_a", "pending", 1, None, None, None),  # queued
                ("run_b", "running", 2, "here", 4e9, None),
                ("run_c", "running", 3, "gone", 1.0, None),  # its lease ran out
                ("run_d", "completed", 4, None, None, None),  # ended before version 5
                ("run_e", "failed", 5, "gone", 1.0, None),  # ended without finish_run
                ("run_f", "completed", 6, None, None, 2.0),
                ("run_g", "pending", 7, "here", 4e9, None),  # admitted by its executor
            ],
        )
        conn.executemany(
            "INSERT INTO run_specs (run_id, spec, durable, resume, created_at) "
            "VALUES (?, '{}', 1, 'queue', 1.0)",
            [(f"run_{c}",) for c in "abcdefg"],
        )
    store = await SQLiteStore.open(path)
    try:
        every = await store.open_runs(limit=2)
        seen = [r.run_id for r in every.runs]
        while len(every.runs) == 2:
            every = await store.open_runs(limit=2, after=seen[-1])
            seen += [r.run_id for r in every.runs]
        assert seen == ["run_a", "run_b", "run_c", "run_g"]
        assert [r.run_id for r in (await store.open_runs(expired=True)).runs] == ["run_c"]
        named = await store.open_runs(run_ids=["run_d", "run_e", "run_g"])
        assert [r.run_id for r in named.runs] == ["run_g"]
        assert sorted(await store.renew_leases("gone", 30.0, ["run_c", "run_e"])) == ["run_c"]
        assert await store.claim_run("run_d", "here", 30.0) is None, "ended: not claimed"
        assert await store.claim_run("run_a", "here", 30.0) is not None
        assert (await store.get_run("run_a")).status == "running"
        assert [r.run_id for r in (await store.open_runs()).runs] == [
            "run_a",
            "run_b",
            "run_c",
            "run_g",
        ]
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert applied_versions(conn) == {m.version for m in load_migrations("sqlite")}
        assert not {"open_runs_by_id", "leased_runs_by_id"} & _indexes_written(
            conn, _STARTED, ("run_x",)
        )
        assert _indexes_written(conn, claim, ("run_x", "o", 1.0, 1.0, None)) & {
            "open_runs_by_id",
            "leased_runs_by_id",
        } == {"leased_runs_by_id"}, "a claim gives the run an owner: its leased entry is new"


async def test_upgrade_closes_every_ended_run_at_its_end_so_the_open_run_indexes_hold_open_runs_only(
    tmp_path: Path,
) -> None:
    """Schema version 13 (ADR 0134) closes the runs that ended without a ``closed_at`` (before
    schema version 5, or by a status written without ``finish_run``): at their last terminal
    event's time, else their ``updated_at``. ``open_runs_by_id`` and ``leased_runs_by_id``
    (``closed_at IS NULL``, version 12) then hold the open runs only; every run, its status and
    its events are kept; a closed run's ``closed_at`` is left as it was."""
    path = tmp_path / "v12.db"
    with at_version(path, 12, before="ended_runs_closed") as conn:
        conn.executemany(
            "INSERT INTO runs (run_id, prompt, model, chain_of_thought, worker_backend, status, "
            "created_at, updated_at, usage, error, metadata, last_seq, change_seq, owner, "
            "lease_expires_at, closed_at) VALUES (?, 'p', NULL, 'hidden', 'provider', ?, 1.0, "
            "?, '{}', NULL, '{}', ?, ?, ?, ?, ?)",
            ENDED_UNCLOSED_RUNS,
        )
        conn.executemany(
            "INSERT INTO events (run_id, seq, task_id, type, ts, payload) VALUES (?, ?, NULL, ?, "
            "?, '{}')",
            ENDED_UNCLOSED_EVENTS,
        )
        indexed = "SELECT run_id FROM runs INDEXED BY {} WHERE {}"
        by_id = indexed.format("open_runs_by_id", codec.OPEN_RUN_INDEX_PREDICATE)
        leased = indexed.format("leased_runs_by_id", codec.LEASED_RUN_INDEX_PREDICATE)
        assert [r[0] for r in conn.execute(by_id)] == ["run_a", "run_b", "run_c", "run_d"]
    store = await SQLiteStore.open(path)
    try:
        await assert_ended_runs_closed(store)
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert applied_versions(conn) == {m.version for m in load_migrations("sqlite")}
        closed = dict(conn.execute("SELECT run_id, closed_at FROM runs").fetchall())
        assert closed == ENDED_UNCLOSED_CLOSED_AT
        assert [r[0] for r in conn.execute(by_id)] == ["run_a", "run_b"]
        assert [r[0] for r in conn.execute(leased)] == ["run_b"]


async def test_a_merged_append_after_one_that_ended_its_run_is_refused_as_in_queue_order(
    tmp_path: Path,
) -> None:
    """An append whose event gives its run an ended status closes the run (ADR 0134); an
    append queued after it, merged into the same write, is refused as it would be alone."""
    store = await SQLiteStore.open(tmp_path / "t.db")
    try:
        run = make_run(status="running")
        await store.create_run(run)
        ending = [NewEvent(EventType.RUN_FAILED, {"status": "failed", "error": "x"})]
        first, second = await asyncio.gather(
            store.append(run.run_id, ending),
            store.append(run.run_id, deltas(1)),
            return_exceptions=True,
        )
        assert [e.seq for e in first] == [1]  # type: ignore[union-attr]
        assert isinstance(second, RunClosedError)
        assert [e.type for e in await store.read(run.run_id)] == [EventType.RUN_FAILED]
    finally:
        await store.close()


async def test_upgrade_to_the_ascending_created_at_index_lists_newest_first_without_a_sort(
    tmp_path: Path,
) -> None:
    """A store from before schema version 11 (ADR 0117), holding runs created at the same time
    in threes, gets ``runs_by_created_at`` ascending at its next start. The list still pages
    newest first, runs of one time the later-made first, every run once across cursor pages
    that cut through such ties, and by offset. Its unfiltered, cursor, time-range, text and
    offset reads then come in that order straight off the index, where the ``DESC`` index needed
    a temporary b-tree to sort each group of equal times (and an offset page all of them)."""
    path = tmp_path / "v10.db"
    with at_version(path, 10, before="runs_by_created_at_ascending") as conn:
        conn.executemany(
            "INSERT INTO runs (run_id, prompt, model, chain_of_thought, worker_backend, status, "
            "created_at, updated_at, usage, error, metadata, change_seq) VALUES "
            "(?, ?, NULL, 'surface', 'provider', 'completed', ?, 1.0, '{}', NULL, '{}', ?)",
            [(f"run_{g:03d}", f"prompt {g}", float(g // 3), g) for g in range(1, 61)],
        )
    newest_first = [f"run_{g:03d}" for g in sorted(range(1, 61), key=lambda g: (-(g // 3), -g))]
    store = await SQLiteStore.open(path)
    try:
        seen: list[str] = []
        cursor = None
        while True:
            page = await store.query_runs(RunQuery(limit=4, before=cursor))
            seen += [r.run_id for r in page.runs]
            if page.next is None:
                break
            cursor = page.next
        assert seen == newest_first
        since = await store.query_runs(RunQuery(limit=10, since=15.0))
        assert [r.run_id for r in since.runs] == newest_first[:10]
        offset = await store.list_runs(limit=7, offset=13)
        assert [r.run_id for r in offset] == newest_first[13:20]
    finally:
        await store.close()
    reads = [
        RunQuery(),
        RunQuery(before=RunCursor(10.0, 31)),
        RunQuery(since=5.0, until=15.0),
        RunQuery(text="prompt 1"),
    ]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert applied_versions(conn) == {m.version for m in load_migrations("sqlite")}
        for query in reads:
            sql, params = page_query(
                query, columns=codec.RUN_COLUMNS, placeholder="?", order_column="rowid", like="LIKE"
            )
            plan = " ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
            assert "runs USING INDEX runs_by_created_at" in plan, (query, plan)
            assert "TEMP B-TREE" not in plan, (query, plan)
        offset_page = "SELECT * FROM runs ORDER BY created_at DESC, rowid DESC LIMIT 7 OFFSET 13"
        plan = " ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {offset_page}"))
        assert "TEMP B-TREE" not in plan, plan  # list_runs' page: every row before it was sorted


async def test_a_task_written_again_is_updated_in_place(tmp_path: Path) -> None:
    """A task's end (``finish_run`` alone, or several ends merged into one commit) and
    ``save_task`` write the task over its stored row, in place: its fields are the new ones and
    its row keeps its rowid, so the key's index is left alone (ADR 0117). ``INSERT OR REPLACE``
    deleted the row and inserted it again under a new rowid."""
    store = await SQLiteStore.open(tmp_path / "tasks.db")
    try:
        runs = [make_run(tasks=2) for _ in range(6)]
        for run in runs:
            await store.create_run(run)

        def rowids() -> dict[str, int]:
            with contextlib.closing(sqlite3.connect(tmp_path / "tasks.db")) as conn:
                return {str(t): int(r) for r, t in conn.execute("SELECT rowid, task_id FROM tasks")}

        before = rowids()

        def ended(run: RunRecord) -> RunEnding:
            task = dataclasses.replace(
                run.tasks[0], status="completed", output=f"out of {run.run_id}", usage={"x": 1}
            )
            return RunEnding("completed", tasks=[task])

        await store.finish_run(runs[0].run_id, deltas(2), ended(runs[0]))
        await asyncio.gather(*(store.finish_run(r.run_id, deltas(2), ended(r)) for r in runs[1:]))
        failed = dataclasses.replace(runs[0].tasks[1], status="failed", error="boom")
        await store.save_task(failed)
        assert rowids() == before
        for run in runs:
            stored = (await store.get_run(run.run_id)).tasks
            assert stored[0] == ended(run).tasks[0]
            assert stored[1] == (failed if run is runs[0] else run.tasks[1])
    finally:
        await store.close()


async def test_database_from_a_newer_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    await filled_store(path)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO thoughtgate_migrations VALUES (99, 'future', 1.0)")
        conn.commit()
    before = file_digest(path)
    with pytest.raises(StoreError, match=r"schema version 99.*newer thoughtgate") as info:
        await SQLiteStore.open(path)
    assert str(path) in str(info.value)
    assert file_digest(path) == before


async def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 100)
    before = file_digest(path)
    with pytest.raises(NotOurDatabaseError, match="not a SQLite database") as info:
        await SQLiteStore.open(path)
    assert str(path) in str(info.value)
    assert file_digest(path) == before
    assert names_in(tmp_path) == ["notes.db"]


async def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('ada')")
        conn.commit()
    before = file_digest(path)
    with pytest.raises(NotOurDatabaseError, match=r"did not create.*customers") as info:
        await SQLiteStore.open(path)
    assert "left untouched" in str(info.value)
    assert file_digest(path) == before  # not even switched to WAL
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert conn.execute("SELECT name FROM customers").fetchall() == [("ada",)]


async def test_an_empty_file_becomes_a_store(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    store = await SQLiteStore.open(path)
    try:
        run = make_run()
        await store.create_run(run)
        assert (await store.append_one(run.run_id, NewEvent("x"))).seq == 1
    finally:
        await store.close()


async def test_several_processes_opening_a_new_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "raced.db"
    code = (
        "import asyncio, sys\n"
        "from thoughtgate.store.sqlite import SQLiteStore\n"
        "async def main():\n"
        "    store = await SQLiteStore.open(sys.argv[1])\n"
        "    await store.close()\n"
        "asyncio.run(main())\n"
    )
    await asyncio.gather(*(run_python(code, str(path)) for _ in range(4)))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM thoughtgate_migrations")]
    assert sorted(versions) == [m.version for m in load_migrations("sqlite")]


class _WalSwitches:
    """Counts a connection's switches to WAL mode (traced statements); ``tried_again`` is set
    at the second, when the first was refused."""

    def __init__(self) -> None:
        self.switches: list[str] = []
        self.tried_again = threading.Event()

    def trace(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        def seen(statement: str) -> None:
            if statement.strip().upper() == "PRAGMA JOURNAL_MODE = WAL":
                self.switches.append(statement)
                if len(self.switches) > 1:
                    self.tried_again.set()

        conn.set_trace_callback(seen)
        return conn


async def test_a_new_file_opens_while_another_process_holds_its_write_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes opening a file that does not exist yet (``thoughtgate runs`` polling for a
    run, and the ``thoughtgate run`` about to record it) each switch it to WAL mode. SQLite
    answers a switch made while the other holds the write lock with "database is locked" at
    once, without waiting (the lock is wanted after a read), so the open failed: it must wait
    for the lock as for any other."""
    path = tmp_path / "new.db"
    create_private_file(path)  # as the other process's open does first
    wal = _WalSwitches()
    switches, tried_again = wal.switches, wal.tried_again

    def traced(target: Path, **options: Any) -> sqlite3.Connection:
        return wal.trace(connect(target, **options))

    monkeypatch.setattr(sqlite_schema, "connect", traced)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the other process, switching the file: its write lock
    opening = asyncio.ensure_future(SQLiteStore.open(path))
    waiting = asyncio.ensure_future(asyncio.to_thread(tried_again.wait, 60))
    try:
        # the lock is held until the open tried the switch again (or gave up)
        await asyncio.wait({opening, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        tried_again.set()
        await waiting
        other.execute("COMMIT")
        other.close()
    store = await opening
    try:
        assert await store.list_runs() == []
    finally:
        await store.close()
    assert len(switches) > 1, "the open tried the switch while the lock was held"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        versions = [r[0] for r in conn.execute("SELECT version FROM thoughtgate_migrations")]
    assert versions == [m.version for m in load_migrations("sqlite")]


# -- read-only -----------------------------------------------------------------------------
async def test_read_only_file_reads_work_and_writes_say_read_only(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    run, appended = await filled_store(path)
    before = file_digest(path)
    with read_only(path):
        store = await SQLiteStore.open(path)
        try:
            assert_same_events(await store.read(run.run_id), appended)
            assert (await store.get_run(run.run_id)).run_id == run.run_id
            assert await store.find_api_key("hash-1") is not None
            for name, write in WRITES:
                with pytest.raises(StoreReadOnlyError, match="read-only") as info:
                    await write(store, run.run_id)
                assert str(path) in str(info.value), name
            assert_same_events(await store.read(run.run_id), appended)
        finally:
            await store.close()
        assert file_digest(path) == before
    store = await SQLiteStore.open(path)  # writable again: nothing lost, appends continue
    try:
        assert_same_events(await store.read(run.run_id), appended)
        assert (await store.append_one(run.run_id, NewEvent("x"))).seq == len(appended) + 1
    finally:
        await store.close()


async def test_read_only_directory_reads_work_and_writes_say_read_only(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    path = folder / "store.db"
    run, appended = await filled_store(path)
    assert "store.db-wal" not in names_in(folder)  # closed cleanly: all is in the main file
    before = file_digest(path)
    with read_only(folder):
        store = await SQLiteStore.open(path)
        try:
            assert_same_events(await store.read(run.run_id), appended)
            assert [r.run_id for r in await store.list_runs()] == [run.run_id]
            for _, write in WRITES:
                with pytest.raises(StoreReadOnlyError, match="read-only"):
                    await write(store, run.run_id)
        finally:
            await store.close()
        with pytest.raises(StoreError, match=r"new\.db"):  # nor can a new store be made there
            await SQLiteStore.open(folder / "new.db")
    assert file_digest(path) == before


# -- failures ------------------------------------------------------------------------------
async def test_disk_full_fails_the_whole_write_and_keeps_what_was_stored(tmp_path: Path) -> None:
    path = tmp_path / "small.db"
    store = await SQLiteStore.open(path, max_bytes=256 * 1024)
    run = make_run()
    await store.create_run(run)
    stored: list[Event] = []
    blob = "x" * 2000
    with pytest.raises(StoreError, match="database or disk is full") as info:
        for i in range(1000):
            stored += await store.append(run.run_id, [NewEvent("big", {"i": i, "b": blob})] * 10)
    assert str(path) in str(info.value)
    assert len(stored) >= 10  # some writes fitted before the limit
    assert_same_events(await store.read(run.run_id), stored)  # the failed batch left nothing
    await store.close()

    store = await SQLiteStore.open(path)  # more room: the sequence continues without a gap
    try:
        assert_same_events(await store.read(run.run_id), stored)
        assert (await store.append_one(run.run_id, NewEvent("x"))).seq == len(stored) + 1
    finally:
        await store.close()


async def test_a_write_lock_held_too_long_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    run, _ = await filled_store(path)
    store = await SQLiteStore.open(path, busy_timeout=0.2)
    try:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreUnavailableError, match="locked") as info:
                await store.append(run.run_id, deltas(1))
            assert str(path) in str(info.value)
            other.execute("ROLLBACK")
        assert (await store.append_one(run.run_id, NewEvent("x"))).seq == 6  # no gap
    finally:
        await store.close()


async def test_a_payload_json_cannot_carry_stores_nothing(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        run = make_run()
        await store.create_run(run)
        bad = [NewEvent("ok", {"a": 1}), NewEvent("bad", {"s": {1, 2}})]
        with pytest.raises(UsageError, match="not JSON-serializable"):
            await store.append(run.run_id, bad)
        with pytest.raises(UsageError, match="not JSON-serializable"):
            await store.append_one(run.run_id, NewEvent("nan", {"x": float("nan")}))
        assert await store.read(run.run_id) == []
        assert (await store.append_one(run.run_id, NewEvent("ok"))).seq == 1
    finally:
        await store.close()


async def test_a_closed_store_says_so(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await store.list_runs()


async def test_in_memory_database(tmp_path: Path) -> None:
    store = await SQLiteStore.open(":memory:")
    try:
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, deltas(3))
        assert [e.seq for e in await store.read(run.run_id)] == [1, 2, 3]
    finally:
        await store.close()
    assert not (Path.cwd() / ":memory:").exists()


# -- several processes ---------------------------------------------------------------------
APPENDER = """
import asyncio, sys
from thoughtgate.events.schema import NewEvent
from thoughtgate.store.sqlite import SQLiteStore

async def main(path, run_id, writer, count, final):
    store = await SQLiteStore.open(path)
    print("ready", flush=True)
    sys.stdin.readline()  # wait for "go" so that all writers really overlap
    for i in range(count):
        await store.append_one(run_id, NewEvent("w", {"w": writer, "i": i}))
        if i % 10 == 9:  # now and then let the others in, even on a machine too busy to overlap
            await asyncio.sleep(0.002)
    if final:
        await store.append_one(run_id, NewEvent(final))
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
"""


async def spawn_appenders(
    path: Path, run_id: str, writers: int, count: int, *, final: str = ""
) -> None:
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            APPENDER,
            str(path),
            run_id,
            str(w),
            str(count),
            final,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
        for w in range(writers)
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    for proc in procs:
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()


async def test_writers_in_several_processes_get_gap_free_sequences(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    store = await SQLiteStore.open(path)
    try:
        run = make_run()
        await store.create_run(run)
        await spawn_appenders(path, run.run_id, writers=4, count=200)
        events = await store.read(run.run_id)
    finally:
        await store.close()
    assert [e.seq for e in events] == list(range(1, 801))
    for w in range(4):
        assert [e.payload["i"] for e in events if e.payload["w"] == w] == list(range(200))
    owners = [e.payload["w"] for e in events]
    switches = sum(a != b for a, b in itertools.pairwise(owners))
    assert switches > 3, "the writers never overlapped; the test proved nothing"


async def test_tail_sees_events_appended_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "tail.db"
    store = await SQLiteStore.open(path)
    try:
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, deltas(2))
        tail = asyncio.create_task(collect(store.tail(run.run_id), within=60))
        await spawn_appenders(path, run.run_id, writers=1, count=5, final=EventType.RUN_ERROR)
        got = await tail
    finally:
        await store.close()
    assert [e.seq for e in got] == list(range(1, 9))
    assert got[-1].type == EventType.RUN_ERROR


# -- group commit --------------------------------------------------------------------------
async def _held(thread: SQLiteThread) -> tuple[asyncio.Future[None], threading.Event]:
    """Hold ``thread`` busy until the returned event is set (then await the returned future)."""
    holding, gate = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        holding.set()
        gate.wait(10)

    busy = asyncio.ensure_future(thread.call("wait", hold))
    assert await asyncio.to_thread(holding.wait, 10), "the thread never took the hold"
    return busy, gate


async def _queued_together(thread: SQLiteThread, calls: list[Awaitable[Any]]) -> list[Any]:
    """Run ``calls`` while ``thread`` is held busy, so that they queue up together and meet in one
    group; their results (or errors) in order.

    The calls start only once the thread is inside the holding job: the thread takes whatever is
    queued when it takes a job, so writes queued while it was picking up the hold would share its
    batch and the rest would form a second group. The hold ends only once every write is queued.
    """
    busy, gate = await _held(thread)
    futures = [asyncio.ensure_future(c) for c in calls]
    for _ in range(10_000):  # each call queues its write in its first step
        if thread.waiting() == len(calls):
            break
        await asyncio.sleep(0)
    assert thread.waiting() == len(calls), "not every write was queued"
    gate.set()
    await busy
    return await asyncio.gather(*futures, return_exceptions=True)


async def test_concurrent_writes_share_transactions_and_each_is_durable_when_told(
    tmp_path: Path,
) -> None:
    path = tmp_path / "group.db"
    store = await SQLiteStore.open(path)
    try:
        runs = [make_run() for _ in range(20)]
        for run in runs:
            await store.create_run(run)
        writer = store._writer
        before = writer.commits
        other = sqlite3.connect(path, isolation_level=None)  # another reader of the file
        seen_durable: list[bool] = []

        async def append_and_check(run: RunRecord, i: int) -> list[Event]:
            out = await store.append(run.run_id, deltas(3, start=3 * i))
            # told: a separate connection must find these rows already
            rows = other.execute(
                "SELECT count(*) FROM events WHERE run_id = ? AND seq >= ? AND seq <= ?",
                (run.run_id, out[0].seq, out[-1].seq),
            ).fetchone()
            seen_durable.append(rows[0] == 3)
            return out

        calls = [append_and_check(run, i) for i in range(5) for run in runs]
        results = await _queued_together(store._writer, calls)
        assert all(seen_durable) and len(seen_durable) == 100
        assert writer.commits - before == 1  # one shared transaction, not one per append
        for run in runs:  # gap-free, in order, per run
            stored = await store.read(run.run_id)
            assert [e.seq for e in stored] == list(range(1, 16))
            assert [e.payload["i"] for e in stored] == list(range(15))
        assert sum(len(r) for r in results) == 300
        other.close()
    finally:
        await store.close()


async def test_a_write_that_fails_in_a_group_leaves_the_others_committed(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "group.db")
    try:
        good = [make_run() for _ in range(5)]
        for run in good:
            await store.create_run(run)
        closed = make_run()
        await store.create_run(closed)
        await store.finish_run(closed.run_id, [], RunEnding("completed"))
        calls = [store.append(run.run_id, deltas(2)) for run in good]
        calls.insert(2, store.append("run_nobody", deltas(1)))  # unknown run
        calls.insert(4, store.append(closed.run_id, deltas(1)))  # ended run
        results = await _queued_together(store._writer, calls)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert sorted(type(e).__name__ for e in errors) == ["RunClosedError", "RunNotFoundError"]
        for run in good:
            assert [e.seq for e in await store.read(run.run_id)] == [1, 2]
        assert await store.read(closed.run_id) == []
    finally:
        await store.close()


async def test_a_write_past_the_disk_quota_fails_alone_in_its_group(tmp_path: Path) -> None:
    """SQLite may give up the whole shared transaction after ``SQLITE_FULL``: the other writes of
    the group are then run again, and only the one that does not fit fails."""
    store = await SQLiteStore.open(tmp_path / "small.db", max_bytes=256 * 1024)
    try:
        small = [make_run() for _ in range(8)]
        big = make_run()
        for run in [*small, big]:
            await store.create_run(run)
        blob = "x" * 4000
        huge = [NewEvent("big", {"i": i, "b": blob}) for i in range(200)]  # ~800 KB: never fits
        calls = [store.append(run.run_id, deltas(2)) for run in small]
        calls.insert(3, store.append(big.run_id, huge))
        results = await _queued_together(store._writer, calls)
        failed = [r for r in results if isinstance(r, BaseException)]
        assert len(failed) == 1 and "database or disk is full" in str(failed[0])
        assert await store.read(big.run_id) == []
        for run in small:
            assert [e.seq for e in await store.read(run.run_id)] == [1, 2]
    finally:
        await store.close()


async def _made_runs(store: SQLiteStore, n: int) -> list[RunRecord]:
    runs = [make_run() for _ in range(n)]
    for run in runs:
        await store.create_run(run)
    return runs


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
async def test_a_closed_store_leaves_no_file_descriptor_open(tmp_path: Path) -> None:
    """A daemon opens a store per process and tests open hundreds: the pipes its threads wake
    the event loop through (ADR 0053) are closed with it, as its connections are."""
    store = await SQLiteStore.open(tmp_path / "first.db")  # imports and caches settle first
    await store.close()
    before = _open_descriptors()
    for i in range(3):
        store = await SQLiteStore.open(tmp_path / f"fd{i}.db")
        run = make_run()
        await store.create_run(run)
        await asyncio.gather(*(store.append(run.run_id, deltas(2)) for _ in range(5)))
        await store.close()
    assert _open_descriptors() == before


async def test_a_store_that_fails_to_open_leaves_no_file_descriptor_open(tmp_path: Path) -> None:
    """A failed open leaves its writer's wake pipe to the thread (which may still be handing
    the open's result back through it); the thread closes it when it stops."""
    store = await SQLiteStore.open(tmp_path / "first.db")  # imports and caches settle first
    await store.close()
    foreign = tmp_path / "foreign.db"
    foreign.write_bytes(b"not a database, " * 64)
    threads_before = set(threading.enumerate())
    before = _open_descriptors()
    for _ in range(3):
        with pytest.raises(NotOurDatabaseError):
            await SQLiteStore.open(foreign)
    for thread in set(threading.enumerate()) - threads_before:
        if thread.name.startswith("thoughtgate-sqlite"):
            await asyncio.to_thread(thread.join, 60)
    assert _open_descriptors() == before


async def test_a_loop_that_cannot_watch_a_pipe_still_gets_every_write_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the event loop cannot watch a file descriptor (a proactor loop), the writer's
    results come back by ``call_soon_threadsafe``, as before ADR 0053: groups and all."""
    loop = asyncio.get_running_loop()

    def cannot(*args: Any) -> None:
        raise NotImplementedError

    monkeypatch.setattr(loop, "add_reader", cannot)
    store = await SQLiteStore.open(tmp_path / "proactor.db")
    try:
        runs = [make_run() for _ in range(4)]
        for run in runs:
            await store.create_run(run)
        calls = [store.append(run.run_id, deltas(3, start=3 * i)) for i in range(3) for run in runs]
        commits = store._writer.commits
        results = await _queued_together(store._writer, calls)
        assert store._writer.commits == commits + 1  # still one group
        assert all(isinstance(r, list) and len(r) == 3 for r in results)
        for run in runs:
            assert [e.seq for e in await store.read(run.run_id)] == list(range(1, 10))
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _keyed_table(path: Path) -> AsyncIterator[SQLiteThread]:
    """A writer thread on a fresh database with one table ``t (k TEXT PRIMARY KEY)``."""
    thread = SQLiteThread("test-writer", path, busy_timeout=5)
    await thread.start(lambda: connect(path, busy_timeout=5), "open")
    try:
        await thread.call("create", lambda c: c.execute("CREATE TABLE t (k TEXT PRIMARY KEY)"))
        yield thread
    finally:
        await thread.close()


@pytest.mark.parametrize("size", [3, 20], ids=["small-group", "group-run-on-the-loop"])
async def test_a_group_write_that_raises_after_writing_has_none_of_its_rows_kept(
    tmp_path: Path, size: int
) -> None:
    async with _keyed_table(tmp_path / "raw.db") as thread:

        def insert(key: str, fail: bool = False) -> Callable[[sqlite3.Connection], None]:
            def body(conn: sqlite3.Connection) -> None:
                conn.execute("INSERT INTO t VALUES (?)", (key,))
                if fail:  # after its row went in: all of it must be undone, and only it
                    raise ValueError(f"{key} changed its mind")

            return body

        commits = thread.commits
        keys = [f"k{i:02}" for i in range(size)]
        results = await _queued_together(
            thread, [thread.write(k, insert(k, fail=k == "k01")) for k in keys]
        )
        assert thread.commits == commits + 1  # one shared transaction
        assert isinstance(results[1], ValueError)
        assert results[:1] + results[2:] == [None] * (size - 1)
        rows = await thread.call("read", lambda c: c.execute("SELECT k FROM t").fetchall())
        assert sorted(r[0] for r in rows) == keys[:1] + keys[2:]


async def test_events_of_an_older_vocabulary_replay_upgraded_in_every_page(
    tmp_path: Path,
) -> None:
    """Rows written before the current vocabulary (``v`` 0: camelCase tool keys) come back
    upgraded whether their page is all old (read as columns) or mixed (read row by row)."""
    path = tmp_path / "old.db"
    store = await SQLiteStore.open(path)
    try:
        run_id = await a_run_of_tool_failures(store)
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("UPDATE events SET v = 0 WHERE seq <= 300")
        await assert_old_rows_replay_upgraded(store, run_id)
    finally:
        await store.close()


async def test_a_page_with_a_gap_is_read_as_its_rows(tmp_path: Path) -> None:
    """A page is sent as a count and its largest number (``codec.page_range``, ADR 0037, 0127):
    a page missing a row is recognised and read row by row, never renumbered."""
    path = tmp_path / "gap.db"
    store = await SQLiteStore.open(path)
    try:
        run_id, written = await a_run_to_hole(store)
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM events WHERE run_id = ? AND seq = ?", (run_id, GAP_AT))
        await assert_a_gap_is_never_renumbered(store, run_id, written)
    finally:
        await store.close()


@pytest.mark.parametrize("together", [True, False], ids=["one-group", "apart"])
async def test_an_append_queued_behind_one_that_fails_is_not_stored(
    tmp_path: Path, together: bool
) -> None:
    """``queue_append(after=...)`` may be called before the earlier append committed (the
    recorder queues a task's first delta behind ``task.started``): it must never be stored past
    a hole, whether the two share a transaction or not."""
    store = await SQLiteStore.open(tmp_path / "small.db", max_bytes=256 * 1024)
    try:
        run, other = make_run(), make_run()
        for r in (run, other):
            await store.create_run(r)
        blob = "x" * 4000
        huge = [NewEvent("big", {"i": i, "b": blob}) for i in range(200)]  # never fits
        holding, gate = threading.Event(), threading.Event()
        busy = None
        if together:  # hold the writer so that both are queued before either runs

            def hold(conn: sqlite3.Connection) -> None:
                holding.set()
                gate.wait(10)

            busy = asyncio.ensure_future(store._writer.call("wait", hold))
            assert await asyncio.to_thread(holding.wait, 10)
        first = store.queue_append(run.run_id, huge)
        assert first is not None
        if not together:
            with pytest.raises(StoreError, match="disk is full"):
                await first.wait()
        second = store.queue_append(run.run_id, deltas(1), after=first)
        unrelated = store.queue_append(other.run_id, deltas(1))
        assert second is not None and unrelated is not None
        gate.set()
        if busy is not None:
            await busy
        if together:
            with pytest.raises(StoreError, match="disk is full"):
                await first.wait()
        with pytest.raises(StoreError, match="not stored"):
            await second.wait()
        assert [e.seq for e in await unrelated.wait()] == [1]
        assert await store.read(run.run_id) == []
        # and behind one that was stored, it is stored after it
        third = store.queue_append(run.run_id, deltas(2))
        fourth = store.queue_append(run.run_id, deltas(1), after=third)
        assert third is not None and fourth is not None
        assert [e.seq for e in await fourth.wait()] == [3]
        assert [e.seq for e in await third.wait()] == [1, 2]
    finally:
        await store.close()


async def test_a_page_too_long_for_one_sqlite_value_is_read_row_by_row(tmp_path: Path) -> None:
    """A page whose payloads together pass SQLite's longest value (1e9 bytes by default; here
    the reader's limit is lowered) comes back whole, from its rows."""
    store = await SQLiteStore.open(tmp_path / "long.db")
    try:
        run = make_run()
        await store.create_run(run)
        news = [NewEvent(EventType.AGENT_RESPONSE, {"reasoning": f"{i}" * 400}) for i in range(10)]
        await store.append(run.run_id, [*news, NewEvent(EventType.RUN_ERROR)])
        await store._reader.call(
            "lower the limit", lambda conn: conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 2_000)
        )
        for got in (await store.read(run.run_id), await collect(store.tail(run.run_id))):
            assert [e.seq for e in got] == list(range(1, 12))
            assert [e.payload for e in got[:10]] == [n.payload for n in news]
    finally:
        await store.close()


async def test_a_page_missing_a_number_is_read_row_by_row_as_stored(tmp_path: Path) -> None:
    """A page is taken as columns only when its numbers are all there (a count and the largest
    number); one with a hole (a row deleted by hand) is read from its rows, in order, as stored,
    never handed out as if whole."""
    path = tmp_path / "hole.db"
    store = await SQLiteStore.open(path)
    try:
        run = make_run()
        await store.create_run(run)
        news = [NewEvent(EventType.MESSAGE_DELTA, {"text": f"{i}"}) for i in range(30)]
        await store.append(run.run_id, [*news, NewEvent(EventType.RUN_ERROR)])
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM events WHERE run_id = ? AND seq = 5", (run.run_id,))
        stored = [n for n in range(1, 32) if n != 5]
        for got in (
            await store.read(run.run_id),
            await collect(store.tail(run.run_id)),
            await collect(store.tail(run.run_id, batch=10)),
        ):
            assert [e.seq for e in got] == stored
            assert [e.payload.get("text") for e in got[:29]] == [
                f"{i}" for i in range(30) if i != 4
            ]
    finally:
        await store.close()


async def test_a_call_early_in_a_batch_is_answered_before_the_batch_ends(tmp_path: Path) -> None:
    """The threads hand back each call's (each transaction's) result when it is done: a small
    read queued with others is not held until the last of them ran."""
    path = tmp_path / "batch.db"
    thread = SQLiteThread("test-reader", path, busy_timeout=5)
    await thread.start(lambda: connect(path, busy_timeout=5), "open")
    try:
        holding, gate, answered = threading.Event(), threading.Event(), threading.Event()

        def hold(conn: sqlite3.Connection) -> None:
            holding.set()
            gate.wait(10)

        def second(conn: sqlite3.Connection) -> bool:
            return answered.wait(10)  # only the loop's sight of the first answer ends this

        busy = asyncio.ensure_future(thread.call("wait", hold))
        assert await asyncio.to_thread(holding.wait, 10)
        first = asyncio.ensure_future(thread.call("first", lambda conn: 1))
        later = asyncio.ensure_future(thread.call("second", second))
        for _ in range(10_000):  # both queued: the thread takes them in one batch
            if thread.waiting() == 2:
                break
            await asyncio.sleep(0)
        gate.set()
        await busy
        assert await first == 1
        answered.set()
        assert await later, "the first call's answer waited for the whole batch"
    finally:
        await thread.close()


# -- a group's statements on the loop, its COMMIT on the thread (ADR 0036) -----------------------
async def test_writes_wait_on_the_thread_while_another_connection_holds_the_lock(
    tmp_path: Path,
) -> None:
    """The event loop never waits for another connection's write lock (DBOS writes the same
    file): while one holds it, the loop goes on and the writes -- a group large enough for the
    loop to run -- wait on the writer thread, in order; they commit once the lock is let go."""
    path = tmp_path / "busy.db"
    store = await SQLiteStore.open(path, busy_timeout=20)
    try:
        runs = await _made_runs(store, 20)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        busy, gate = await _held(store._writer)  # so that the appends meet in one group
        first = [asyncio.ensure_future(store.append(r.run_id, deltas(2))) for r in runs]
        await asyncio.sleep(0)
        gate.set()
        await busy
        await asyncio.sleep(0.2)  # (were the loop waiting for the lock, this would not return)
        second = asyncio.ensure_future(store.append(runs[0].run_id, deltas(1, start=2)))
        await asyncio.sleep(0.2)
        assert not any(f.done() for f in [*first, second])
        other.execute("COMMIT")
        other.close()
        assert [[e.seq for e in await f] for f in first] == [[1, 2]] * 20
        assert [e.seq for e in await second] == [3]
        stored = await store.read(runs[0].run_id)
        assert [e.payload["i"] for e in stored] == [0, 1, 2]
        more = [store.append(r.run_id, deltas(1)) for r in runs]
        seqs = [[e.seq for e in appended] for appended in await asyncio.gather(*more)]
        assert seqs == [[4]] + [[3]] * 19
    finally:
        await store.close()


async def test_a_call_queued_after_writes_runs_after_them(tmp_path: Path) -> None:
    """Writes wait on the event loop and calls go to the thread, yet a call sees every write
    queued before it, as when all went through one queue."""
    async with _keyed_table(tmp_path / "order.db") as thread:

        def insert(key: str) -> Callable[[sqlite3.Connection], None]:
            return lambda conn: conn.execute("INSERT INTO t VALUES (?)", (key,))

        busy, gate = await _held(thread)
        writes = [asyncio.ensure_future(thread.write(k, insert(k))) for k in _keys("w")]
        await asyncio.sleep(0)  # (each queues its write in its first step)
        count = asyncio.ensure_future(
            thread.call("count", lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0])
        )
        await asyncio.sleep(0)
        gate.set()
        await busy
        assert await count == len(_keys("w"))
        await asyncio.gather(*writes)


async def test_a_lone_write_that_raises_keeps_nothing_and_the_next_one_commits(
    tmp_path: Path,
) -> None:
    async with _keyed_table(tmp_path / "lone.db") as thread:

        def bad(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO t VALUES ('x')")
            raise ValueError("changed its mind")

        with pytest.raises(ValueError, match="changed its mind"):
            await thread.write("bad", bad)
        await thread.write("good", lambda c: c.execute("INSERT INTO t VALUES ('y')"))
        rows = await thread.call("read", lambda c: c.execute("SELECT k FROM t").fetchall())
        assert rows == [("y",)]


async def test_writes_from_another_event_loop_commit_beside_the_loops_own(tmp_path: Path) -> None:
    """A writer started on one loop also takes writes from another loop (another thread's
    ``asyncio.run``): each is committed once, and the callers on both loops are told."""
    async with _keyed_table(tmp_path / "loops.db") as thread:

        def insert(key: str) -> Callable[[sqlite3.Connection], str]:
            def body(conn: sqlite3.Connection) -> str:
                conn.execute("INSERT INTO t VALUES (?)", (key,))
                return key

            return body

        async def theirs() -> list[str]:
            return list(await asyncio.gather(*(thread.write(k, insert(k)) for k in _keys("o"))))

        other = asyncio.to_thread(asyncio.run, theirs())
        mine = [thread.write(k, insert(k)) for k in _keys("m")]
        told = await asyncio.gather(other, *mine)
        assert told[0] == list(_keys("o")) and told[1:] == list(_keys("m"))
        rows = await thread.call("read", lambda c: c.execute("SELECT k FROM t").fetchall())
        assert sorted(r[0] for r in rows) == sorted([*_keys("o"), *_keys("m")])


def _keys(prefix: str) -> list[str]:
    return [f"{prefix}{i}" for i in range(40)]


async def test_a_large_group_leaves_the_interpreters_switch_interval_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer shortens the switch interval while a large group waits for its COMMIT (ADR
    0036), and puts back what the process had (here, a value of its own)."""
    store = await SQLiteStore.open(tmp_path / "switch.db")
    seen: list[float] = []
    commit = SQLiteThread._commit

    def noting(self: SQLiteThread, *args: Any) -> Any:
        seen.append(sys.getswitchinterval())
        return commit(self, *args)

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        runs = await _made_runs(store, 40)
        commits = store._writer.commits
        monkeypatch.setattr(SQLiteThread, "_commit", noting)
        calls = [store.append(run.run_id, deltas(2)) for run in runs]
        results = await _queued_together(store._writer, calls)
        assert store._writer.commits == commits + 1
        assert all(len(r) == 2 for r in results)
        assert seen == [pytest.approx(0.0005)], "the group's COMMIT ran at the usual interval"
        assert sys.getswitchinterval() == pytest.approx(0.004)
    finally:
        sys.setswitchinterval(before)
        await store.close()


# -- API-key lookups on their own connection -------------------------------------------------
async def test_a_key_lookup_is_answered_while_the_reader_is_busy(tmp_path: Path) -> None:
    """A request's key check does not queue behind the event-page reads of the live streams:
    with the reader thread held inside a long read, both lookups still answer."""
    store = await SQLiteStore.open(tmp_path / "keys.db")
    holding, gate = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        holding.set()
        gate.wait(10)

    try:
        await store.save_api_key(ApiKeyRecord("key_1", "ci", "member", "hash-1"))
        busy = asyncio.ensure_future(store._reader.call("a long read", hold))
        try:
            assert await asyncio.to_thread(holding.wait, 10), "the reader never took the hold"
            found = await asyncio.wait_for(store.find_api_key("hash-1"), 5)
            by_id = await asyncio.wait_for(store.get_api_key("key_1"), 5)
            assert found is not None and found.key_id == "key_1"
            assert by_id is not None and by_id.role == "member"
            assert not busy.done(), "the reader was not busy while the keys were looked up"
        finally:
            gate.set()
            await busy
    finally:
        await store.close()


async def test_a_key_revoked_elsewhere_is_refused_on_the_next_lookup(tmp_path: Path) -> None:
    """No cache in front of the keys: a revocation committed by another connection (the CLI
    while the daemon runs) is what the very next lookup reads."""
    path = tmp_path / "keys.db"
    daemon = await SQLiteStore.open(path)
    cli = await SQLiteStore.open(path)
    try:
        await cli.save_api_key(ApiKeyRecord("key_1", "ci", "member", "hash-1"))
        assert await daemon.find_api_key("hash-1") is not None
        assert await cli.revoke_api_key("key_1") is True
        assert await daemon.find_api_key("hash-1") is None
        revoked = await daemon.get_api_key("key_1")
        assert revoked is not None and revoked.revoked_at is not None
    finally:
        await cli.close()
        await daemon.close()


_KEY_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["append", "look", "add_here", "add_elsewhere", "revoke_here", "revoke_elsewhere"]
        ),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=_KEY_OPS)
def test_every_key_lookup_answers_what_is_committed_whoever_wrote_it(
    tmp_path: Path, ops: list[tuple[str, int]]
) -> None:
    """Keys added and revoked by the daemon's store or by another store on the same file (the
    CLI while the daemon runs), with the daemon's writer committing events in between, in any
    order: every lookup, by hash and by id, answers what a fresh connection reads at that
    moment. A revoked key is refused at the very next lookup, a new one is found, whatever
    the lookups before it found and whoever committed since (ADR 0109: a key cache must keep
    this)."""
    folder = tmp_path / str(next(_EXAMPLE))
    folder.mkdir()
    path = folder / "keys.db"

    def committed() -> dict[str, bool]:
        """key id -> revoked, as a connection opened now reads it."""
        with contextlib.closing(sqlite3.connect(path)) as conn:
            rows = conn.execute("SELECT key_id, revoked_at FROM api_keys").fetchall()
        return {key_id: revoked_at is not None for key_id, revoked_at in rows}

    async def play() -> None:
        daemon = await SQLiteStore.open(path)
        cli = await SQLiteStore.open(path)
        try:
            run = RunRecord("run_1", "p", tasks=[TaskRecord("task_1", "run_1", 0, "t")])
            await daemon.create_run(run)
            for op, k in ops:
                key_id, key_hash = f"key_{k}", f"hash-{k}"
                if op == "append":
                    await daemon.append(run.run_id, deltas(2))
                elif op in ("add_here", "add_elsewhere"):
                    store = daemon if op == "add_here" else cli
                    if key_id not in committed():
                        await store.save_api_key(ApiKeyRecord(key_id, "k", "member", key_hash))
                elif op in ("revoke_here", "revoke_elsewhere"):
                    await (daemon if op == "revoke_here" else cli).revoke_api_key(key_id)
                truth = committed()
                for j in range(3):  # after every step, every key, both ways, twice
                    for _ in range(2):
                        found = await daemon.find_api_key(f"hash-{j}")
                        by_id = await daemon.get_api_key(f"key_{j}")
                        active = f"key_{j}" in truth and not truth[f"key_{j}"]
                        assert (found is not None) == active, (op, k, j, truth)
                        assert (by_id is not None) == (f"key_{j}" in truth), (op, k, j, truth)
                        if by_id is not None:
                            assert (by_id.revoked_at is not None) == truth[f"key_{j}"]
        finally:
            await cli.close()
            await daemon.close()

    asyncio.run(play())


class _RaisingConnection:
    """Stands in for the loop's lookup connection: every statement fails with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code

    def execute(self, *_: object) -> None:
        exc = sqlite3.OperationalError(f"sqlite error {self.code}")
        exc.sqlite_errorcode = self.code
        raise exc


async def test_a_key_lookup_meeting_a_lock_is_answered_by_the_reader(tmp_path: Path) -> None:
    """The loop's connection never waits for a lock (it would hold every request): a lookup
    that finds the database busy is answered, fresh, by the reader thread instead."""
    store = await SQLiteStore.open(tmp_path / "keys.db")
    real = store._lookups
    try:
        await store.save_api_key(ApiKeyRecord("key_1", "ci", "member", "hash-1"))
        store._lookups = _RaisingConnection(5)  # type: ignore[assignment]  # SQLITE_BUSY
        found = await store.find_api_key("hash-1")
        assert found is not None and found.key_id == "key_1"
        await store.revoke_api_key("key_1")
        assert await store.find_api_key("hash-1") is None
    finally:
        store._lookups = real
        await store.close()


async def test_a_failing_key_lookup_refuses_rather_than_guesses(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "keys.db")
    real = store._lookups
    try:
        store._lookups = _RaisingConnection(11)  # type: ignore[assignment]  # SQLITE_CORRUPT
        with pytest.raises(StoreError, match="corrupt"):
            await store.find_api_key("hash-1")
        with pytest.raises(StoreError, match="corrupt"):
            await store.get_api_key("key_1")
    finally:
        store._lookups = real
        await store.close()


async def test_a_short_read_on_the_loop_is_what_the_reader_thread_reads(tmp_path: Path) -> None:
    """A live stream's first page may be answered on the loop's own connection (ADR 0038): the
    same committed events as ``read``; ``None`` (read them the usual way) where it cannot answer
    -- nothing there, the database locked right now -- and an error it meets is a store error."""
    store = await SQLiteStore.open(tmp_path / "now.db")
    real = store._lookups
    try:
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, deltas(10))
        for after, limit in [(0, 64), (0, 3), (4, 64), (9, 5)]:
            now = store.read_now(run.run_id, after=after, limit=limit)
            assert now is not None
            assert_same_events(now, await store.read(run.run_id, after=after, limit=limit))
        assert store.read_now(run.run_id, after=10, limit=64) is None
        assert store.read_now("run_unknown", after=0, limit=64) is None
        with pytest.raises(RunNotFoundError):  # what the usual read then says
            await store.read("run_unknown")
        store._lookups = _RaisingConnection(5)  # type: ignore[assignment]  # SQLITE_BUSY
        assert store.read_now(run.run_id, after=0, limit=64) is None
        store._lookups = _RaisingConnection(11)  # type: ignore[assignment]  # SQLITE_CORRUPT
        with pytest.raises(StoreError, match="corrupt"):
            store.read_now(run.run_id, after=0, limit=64)
    finally:
        store._lookups = real
        await store.close()
    memory = await SQLiteStore.open(":memory:")
    try:
        run = make_run()
        await memory.create_run(run)
        await memory.append(run.run_id, deltas(2))
        assert memory.read_now(run.run_id, after=0, limit=64) is None  # one connection only
    finally:
        await memory.close()


async def test_closing_the_store_ends_every_thread_it_started(tmp_path: Path) -> None:
    def sqlite_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("thoughtgate-sqlite")}

    before = sqlite_threads()
    store = await SQLiteStore.open(tmp_path / "threads.db")
    await store.find_api_key("nothing")
    started = sqlite_threads() - before
    assert {t.name for t in started} == {"thoughtgate-sqlite-writer", "thoughtgate-sqlite-reader"}
    lookups = store._lookups
    await store.close()
    assert not any(t.is_alive() for t in started)
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):  # no connection left open
        lookups.execute("SELECT 1")  # type: ignore[union-attr]
    with pytest.raises(StoreError, match="closed"):
        await store.find_api_key("nothing")


# -- merged appends (ADR 0030) ---------------------------------------------------------------
async def test_plain_appends_of_many_runs_in_one_group_are_numbered_in_queue_order(
    tmp_path: Path,
) -> None:
    """The writer merges a group's plain appends (one statement numbers every run's batches,
    multi-row inserts): each run still gets gap-free sequence numbers in queue order, a batch
    longer than an insert chunk included, and every field comes back as it was appended."""
    store = await SQLiteStore.open(tmp_path / "merged.db")
    try:
        runs = [make_run() for _ in range(12)]
        for run in runs:
            await store.create_run(run)
        sizes = [1, 3, 130, 2]  # 130: more rows than one insert statement takes
        sent: dict[str, list[NewEvent]] = {run.run_id: [] for run in runs}
        calls = []
        for size in sizes:  # each run's appends back to back in the queue, runs interleaved
            for k, run in enumerate(runs):
                batch = [
                    NewEvent(
                        EventType.REASONING_DELTA,
                        {"run": k, "i": len(sent[run.run_id]) + i, "text": "ü\u2028\"'"},
                        task_id=None if i % 2 else f"task_{k}",
                        ts=1_700_000_000.123456 + i / 7,
                    )
                    for i in range(size)
                ]
                sent[run.run_id] += batch
                calls.append(store.append(run.run_id, batch))
        before = store._writer.commits
        results = await _queued_together(store._writer, calls)
        assert store._writer.commits == before + 1
        for run in runs:
            stored = await store.read(run.run_id)
            assert [e.seq for e in stored] == list(range(1, sum(sizes) + 1))
            assert [(e.type, e.payload, e.task_id, e.ts) for e in stored] == [
                (e.type, dict(e.payload), e.task_id, e.ts) for e in sent[run.run_id]
            ]
        told = [e for out in results for e in out]
        assert len(told) == len(runs) * sum(sizes)
        for run in runs:  # what each append returned is what a reader reads
            mine = sorted((e for e in told if e.run_id == run.run_id), key=lambda e: e.seq)
            assert_same_events(mine, await store.read(run.run_id))
        for task_id in (None, "0", ""):  # alone, one row: the task id comes back as it went in
            (alone,) = await store.append(runs[0].run_id, [NewEvent("x", {}, task_id=task_id)])
            (read,) = await store.read(runs[0].run_id, after=alone.seq - 1)
            assert read.task_id == alone.task_id == task_id
    finally:
        await store.close()


async def test_an_append_that_cannot_be_made_fails_alone_in_a_merged_group_as_alone(
    tmp_path: Path,
) -> None:
    """A merged group's append to an ended or unknown run fails with the very error it gets
    alone, an append queued behind it says it was not stored, and the others commit."""
    store = await SQLiteStore.open(tmp_path / "merged.db")
    try:
        good = [make_run() for _ in range(4)]
        closed = make_run()
        for run in [*good, closed]:
            await store.create_run(run)
        await store.finish_run(closed.run_id, [], RunEnding("completed"))
        alone: list[BaseException] = []
        for run_id in (closed.run_id, "run_nobody"):
            with pytest.raises((RunClosedError, RunNotFoundError)) as caught:
                await store.append(run_id, deltas(1))
            alone.append(caught.value)
        busy, gate = await _held(store._writer)
        first = store.queue_append(good[0].run_id, deltas(1))
        on_closed = store.queue_append(closed.run_id, deltas(1))
        behind = store.queue_append(closed.run_id, deltas(2), after=on_closed)
        on_nobody = store.queue_append("run_nobody", deltas(1))
        rest = [store.queue_append(run.run_id, deltas(2)) for run in good]
        queued = [first, on_closed, behind, on_nobody, *rest]
        assert all(q is not None for q in queued)
        gate.set()
        await busy
        outcomes = await asyncio.gather(*(q.wait() for q in queued if q), return_exceptions=True)
        errors = [outcomes[1], outcomes[3]]
        for error, expected in zip(errors, alone, strict=True):
            assert type(error) is type(expected) and str(error) == str(expected)
        assert isinstance(outcomes[2], StoreError) and "not stored" in str(outcomes[2])
        assert [e.seq for e in outcomes[0]] == [1]  # type: ignore[union-attr]
        assert [e.seq for e in await store.read(good[0].run_id)] == [1, 2, 3]
        for run in good[1:]:
            assert [e.seq for e in await store.read(run.run_id)] == [1, 2]
        assert await store.read(closed.run_id) == []
    finally:
        await store.close()


async def test_a_commit_that_fails_fails_every_merged_append(tmp_path: Path) -> None:
    """``COMMIT`` itself refuses (a deferred constraint of another write of the group): no
    append of the group is stored, each says so, and the store goes on afterwards."""
    store = await SQLiteStore.open(tmp_path / "merged.db")
    try:
        runs = [make_run() for _ in range(3)]
        for run in runs:
            await store.create_run(run)

        def setup(conn: sqlite3.Connection) -> None:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
            conn.execute(
                "CREATE TABLE child (p INTEGER REFERENCES parent (id) "
                "DEFERRABLE INITIALLY DEFERRED)"
            )

        await store._writer.call("set up", setup)
        writer = store._writer

        async def orphan() -> None:  # only COMMIT checks the deferred key
            loop = asyncio.get_running_loop()
            job = writer.queue_write(
                "insert an orphan", lambda c: c.execute("INSERT INTO child VALUES (7)"), id
            )
            assert loop is job.loop
            await job.future

        calls: list[Awaitable[Any]] = [store.append(run.run_id, deltas(2)) for run in runs]
        calls.insert(1, orphan())
        before = writer.commits
        results = await _queued_together(writer, calls)
        assert all(isinstance(r, StoreError) for r in results), results
        assert writer.commits == before
        for run in runs:
            assert await store.read(run.run_id) == []
            assert [e.seq for e in await store.append(run.run_id, deltas(1))] == [1]
    finally:
        await store.close()


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "append", "append", "start", "close", "append_behind"]),
        st.integers(0, 3),  # run (3: a run that does not exist)
        st.integers(1, 4),  # events
    ),
    min_size=1,
    max_size=24,
)
_EXAMPLE = itertools.count()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=_OPS)
def test_a_group_stores_what_the_same_writes_one_by_one_store(
    tmp_path: Path, ops: list[tuple[str, int, int]]
) -> None:
    """Any interleaving of plain appends (merged), appends behind another, projecting appends
    (``task.started``) and run endings across runs, queued into one group, ends with the same
    outcomes and the same log and index as the same writes made one at a time."""
    folder = tmp_path / str(next(_EXAMPLE))
    folder.mkdir()

    async def play(path: Path, together: bool) -> tuple[list[object], list[object]]:
        store = await SQLiteStore.open(path)
        try:
            runs = [
                RunRecord(f"run_{k}", "p", tasks=[TaskRecord(f"task_{k}", f"run_{k}", 0, "t")])
                for k in range(3)
            ]
            for run in runs:
                await store.create_run(run)
            ids = [*(r.run_id for r in runs), "run_missing"]
            last: dict[int, Any] = {}

            def write(op: str, k: int, n: int) -> Awaitable[Any]:
                run_id = ids[k]
                if op == "close":
                    return store.finish_run(run_id, deltas(n), RunEnding("completed"))
                if op == "start":
                    task = runs[k].tasks[0].task_id if k < 3 else "task_x"
                    events = [NewEvent(EventType.TASK_STARTED, {}, task_id=task), *deltas(n)]
                    return store.append(run_id, events)
                queued = store.queue_append(
                    run_id, deltas(n), after=last.get(k) if op == "append_behind" else None
                )
                assert queued is not None
                last[k] = queued
                return queued.wait()

            outcomes = await _made(store, [_Deferred(write, *op) for op in ops], together)
            seen = [
                type(o).__name__ if isinstance(o, BaseException) else [_plain(e) for e in o]
                for o in outcomes
            ]
            final: list[object] = []
            for run in runs:
                record = await store.get_run(run.run_id)
                final.append([_plain(e) for e in await store.read(run.run_id)])
                final.append((record.status, [t.status for t in record.tasks]))
            return seen, final
        finally:
            await store.close()

    _assert_grouped_is_one_by_one(folder, play)


def _assert_grouped_is_one_by_one(
    folder: Path, play: Callable[[Path, bool], Awaitable[tuple[list[object], list[object]]]]
) -> None:
    """``play`` on a fresh database with its writes queued into one group, then on another
    with them made one at a time: what the callers were told and what is stored must agree."""

    async def both() -> None:
        grouped = await play(folder / "grouped.db", True)
        one_by_one = await play(folder / "sequential.db", False)
        assert grouped == one_by_one

    asyncio.run(both())


async def _made(store: SQLiteStore, calls: list[_Deferred], together: bool) -> list[Any]:
    """Each call's outcome (its value or its exception), queued into one writer group when
    ``together``, else awaited one after another."""
    if together:
        return await _queued_together(store._writer, calls)
    outcomes: list[Any] = []
    for call in calls:
        try:
            outcomes.append(await call)
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


class _Deferred:
    """A write made only when awaited (``_queued_together`` awaits each in queue order)."""

    def __init__(self, make: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self.make, self.args = make, args

    def __await__(self) -> Any:
        return self.make(*self.args).__await__()


def _plain(event: Event) -> tuple[object, ...]:
    return (event.run_id, event.seq, event.type, dict(event.payload), event.task_id)


# -- merged run starts, claims and endings (ADR 0033) -------------------------------------------
_QUOTAS = (
    Quota("key_a", max_open=2, max_per_minute=100),
    Quota("key_b", max_open=100, max_per_minute=2),
)
_TARGETS = ["run_0", "run_1", "new_0", "new_1", "adm_0", "adm_1", "run_missing"]
"""Runs a write of the property below may name: two made before the group (``run_0`` leased),
two made by ``create`` in it, two by ``admit`` (``adm_0`` … ``adm_6``, the even ones of
``key_a``, at most two open, the odd ones of ``key_b``, at most two starts a minute), one
never made."""
_RUN_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                *("create", "admit", "admit", "append", "append", "start"),
                *("finish", "finish_leased", "claim", "claim_other"),
            ]
        ),
        st.integers(0, len(_TARGETS) - 1),
        st.integers(0, 3),  # events
    ),
    min_size=1,
    max_size=20,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=_RUN_OPS)
def test_merged_starts_appends_and_endings_store_what_they_store_one_by_one(
    tmp_path: Path, ops: list[tuple[str, int, int]]
) -> None:
    """Any mix of run creations, admissions under a quota, claims, appends and endings queued
    into one group -- with some that fail or are refused: a run id made twice, a run that does
    not exist, a key past its quota (open runs and starts a minute, counted within the group
    too), a run another process holds, an ending whose lease was renewed -- tells each caller
    what the same writes made one at a time tell, and leaves the same log, run index, specs,
    leases and run-list change numbers."""
    folder = tmp_path / str(next(_EXAMPLE))
    folder.mkdir()

    async def play(path: Path, together: bool) -> tuple[list[object], list[object]]:
        store = await SQLiteStore.open(path)
        try:
            now = time.time()
            leased = RunRecord(
                "run_0", "p", owner="o", lease_expires_at=now + 600, tasks=[_task("run_0")]
            )
            await store.create_run(leased)
            await store.create_run(RunRecord("run_1", "p", tasks=[_task("run_1")]))
            for quota in _QUOTAS:  # one open run, one start, of each key before the group
                await store.admit_run(
                    RunRecord(f"pre_{quota.key_id}", "p"),
                    RunSpecRecord(f"pre_{quota.key_id}", {}, key_id=quota.key_id),
                    quota=quota,
                )
            before = await store.latest_run_change()

            def write(op: str, k: int, n: int) -> Awaitable[Any]:
                run_id = _TARGETS[k]
                if op == "create":
                    name = f"new_{k % 2}"
                    return store.create_run(RunRecord(name, "p", tasks=[_task(name)]))
                if op == "admit":
                    name, quota = f"adm_{k}", _QUOTAS[k % 2]
                    run = RunRecord(name, "p", tasks=[_task(name)])
                    spec = RunSpecRecord(name, {"k": k}, key_id=quota.key_id)
                    return store.admit_run(run, spec, quota=quota, events=deltas(n))
                if op == "start":
                    started = NewEvent(EventType.TASK_STARTED, {}, task_id=f"task_{run_id}")
                    return store.append(run_id, [started, *deltas(n)])
                if op == "append":
                    return store.append(run_id, deltas(max(n, 1)))
                if op.startswith("claim"):
                    owner = "o2" if op == "claim_other" else "o"
                    return store.claim_run("pre_key_a" if n == 3 else run_id, owner, 30.0)
                by = now + 60 if op == "finish_leased" else None  # run_0's lease goes past it
                ending = RunEnding("completed", lease_expired_by=by, tasks=[])
                return store.finish_run(run_id, deltas(n), ending)

            outcomes = await _made(store, [_Deferred(write, *op) for op in ops], together)
            seen = [_outcome(o) for o in outcomes]
            final: list[object] = []
            names = [*_TARGETS, *(f"adm_{k}" for k in range(7)), "pre_key_a", "pre_key_b"]
            for run_id in dict.fromkeys(names):
                try:
                    record = await store.get_run(run_id)
                except RunNotFoundError:
                    final.append((run_id, None))
                    continue
                spec = await store.get_run_spec(run_id)
                final.append(
                    (
                        run_id,
                        record.status,
                        record.owner,
                        [(t.task_id, t.status) for t in record.tasks],
                        [_plain(e) for e in await store.read(run_id)],
                        None if spec is None else (spec.spec, spec.key_id, spec.attempts),
                    )
                )
            changed = (await store.run_changes(after=before, limit=1000)).changes
            numbers = [number for number, _ in changed]
            assert len(set(numbers)) == len(numbers)  # every change its own number
            final.append(sorted(run.run_id for _, run in changed))
            final.append(await store.latest_run_change())
            return seen, final
        finally:
            await store.close()

    _assert_grouped_is_one_by_one(folder, play)


def _task(run_id: str) -> TaskRecord:
    return TaskRecord(f"task_{run_id}", run_id, 0, "t")


def _outcome(outcome: object) -> object:
    if isinstance(outcome, BaseException):
        return type(outcome).__name__
    if isinstance(outcome, Admission):
        return (outcome.admitted, outcome.reason, outcome.rank)
    if isinstance(outcome, list):
        return [_plain(e) for e in outcome]
    return outcome


async def test_a_key_never_passes_its_quota_within_one_merged_group(tmp_path: Path) -> None:
    """Admissions of one key queued into one group are counted in queue order, each against
    the runs admitted before it in that group: no more are admitted than the quota allows, and
    each admitted run has its rank among the key's open runs."""
    store = await SQLiteStore.open(tmp_path / "quota.db")
    try:
        quota = Quota("key_q", max_open=3, max_per_minute=100)
        calls = [
            store.admit_run(
                RunRecord(f"run_{k}", "p"),
                RunSpecRecord(f"run_{k}", {}, key_id="key_q"),
                quota=quota,
            )
            for k in range(6)
        ]
        before = store._writer.commits
        verdicts = await _queued_together(store._writer, calls)
        assert store._writer.commits - before == 1  # one group, one commit
        assert [v.admitted for v in verdicts] == [True, True, True, False, False, False]
        assert [v.rank for v in verdicts[:3]] == [1, 2, 3]
        assert "3 runs that have not ended" in verdicts[3].reason
        per_minute = Quota("key_m", max_open=100, max_per_minute=2)
        calls = [
            store.admit_run(
                RunRecord(f"run_m{k}", "p"),
                RunSpecRecord(f"run_m{k}", {}, key_id="key_m"),
                quota=per_minute,
            )
            for k in range(4)
        ]
        verdicts = await _queued_together(store._writer, calls)
        assert [v.admitted for v in verdicts] == [True, True, False, False]
        assert "started 2 runs in the last minute" in verdicts[2].reason
        assert 55 < verdicts[2].retry_after <= 60
    finally:
        await store.close()


def test_the_workflows_file_is_switched_to_wal_while_another_process_holds_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The durable engine's workflows file beside the store meets the same race as the store
    (two processes opening it new): the one that lost it left the file in rollback-journal
    mode, every checkpoint then writing, syncing and deleting a journal."""
    from thoughtgate.orchestration import durable

    path = tmp_path / "tg.db.workflows"
    create_private_file(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the other process's write lock
    real_connect = sqlite3.connect
    wal = _WalSwitches()
    switches, tried_again = wal.switches, wal.tried_again

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return wal.trace(real_connect(*args, **kwargs))

    monkeypatch.setattr(durable.sqlite3, "connect", traced)
    failed: list[BaseException] = []

    def switch() -> None:
        try:
            durable._write_ahead(path)
        except BaseException as exc:  # reported below
            failed.append(exc)
        finally:
            tried_again.set()

    worker = threading.Thread(target=switch)
    worker.start()
    try:
        tried_again.wait(60)  # the lock is held until the switch was tried again (or failed)
    finally:
        other.execute("COMMIT")
        other.close()
        worker.join(60)
    monkeypatch.undo()
    assert failed == []
    assert len(switches) > 1, "the switch was tried while the lock was held"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

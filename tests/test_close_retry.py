"""Closing a run as interrupted when the store is briefly unavailable: tried again, not left open.

A close that fails leaves the run ``running`` on every surface until a lease sweep of another
process takes it (ADR 0009), so ``close_run_interrupted`` tries a store that is locked by another
process or lost its connection again, a few times over a few seconds, and gives up (saying so)
only after that, or at its caller's deadline. What cannot succeed is never tried again.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.pg import PG_URL, pg_admin, pg_schema
from support.store_conformance import make_run

from thoughtgate.errors import RunNotFoundError, StoreUnavailableError
from thoughtgate.events.schema import EventType
from thoughtgate.store.leases import close_run_interrupted
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name

REASON = "the process executing it stopped"


def _about(caplog: pytest.LogCaptureFixture, run_id: str, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "thoughtgate.leases" and r.levelno == level and run_id in r.getMessage()
    ]


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    # A short busy timeout: a try meets the other connection's lock and fails at once.
    store = await SQLiteStore.open(tmp_path / "tg.db", busy_timeout=0.05)
    try:
        yield store
    finally:
        await store.close()


@contextmanager
def write_lock(path: Path) -> Iterator[sqlite3.Connection]:
    """Another process's write transaction on the store's file, until the block ends or the
    caller rolls it back."""
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield other
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()


async def _open_run(store: Any) -> str:
    run = make_run(tasks=2)
    await store.create_run(run)
    return run.run_id


async def _assert_closed_once(store: Any, run_id: str) -> None:
    run = await store.get_run(run_id)
    assert run.status == "interrupted" and run.error == f"interrupted: {REASON}"
    assert {t.status for t in run.tasks} == {"interrupted"}
    log = await store.read(run_id)
    assert [e.type for e in log].count(EventType.RUN_INTERRUPTED) == 1
    assert log[-1].type == EventType.RUN_INTERRUPTED


async def _close_while_locked(store: SQLiteStore, path: Path, run_id: str, **options: Any) -> None:
    """Close the run while another process holds the write lock throughout: it fails."""
    with write_lock(path), pytest.raises(StoreUnavailableError, match="locked"):
        await close_run_interrupted(store, run_id, REASON, **options)


async def _assert_still_open(store: SQLiteStore, run_id: str) -> None:
    assert (await store.get_run(run_id)).status in ("pending", "running")
    assert not any(e.type == EventType.RUN_INTERRUPTED for e in await store.read(run_id))


@pytest.mark.inprocess
async def test_a_close_the_sqlite_lock_refuses_is_tried_until_the_lock_goes(
    sqlite_store: SQLiteStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "thoughtgate.leases")
    run_id = await _open_run(sqlite_store)
    with write_lock(tmp_path / "tg.db") as other:
        closing = asyncio.create_task(close_run_interrupted(sqlite_store, run_id, REASON))
        while not _about(caplog, run_id, logging.WARNING):  # the first try met the lock
            assert not closing.done(), "the close went through another process's write lock"
            await asyncio.sleep(0.01)
        other.execute("ROLLBACK")  # the other process lets go within the retry window
        closed = await asyncio.wait_for(closing, 60)
    assert closed[-1].type == EventType.RUN_INTERRUPTED
    await _assert_closed_once(sqlite_store, run_id)
    warned = _about(caplog, run_id, logging.WARNING)
    assert "try 1 of 5" in warned[0] and "locked by another connection" in warned[0]
    assert not _about(caplog, run_id, logging.ERROR)


@pytest.mark.inprocess
async def test_a_close_gives_up_saying_so_and_leaves_the_run_to_the_sweep(
    sqlite_store: SQLiteStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "thoughtgate.leases")
    run_id = await _open_run(sqlite_store)
    await _close_while_locked(sqlite_store, tmp_path / "tg.db", run_id, retry=(0.01, 0.01))
    warned = _about(caplog, run_id, logging.WARNING)
    assert len(warned) == 2 and "try 1 of 3" in warned[0] and "try 2 of 3" in warned[1]
    [gave_up] = _about(caplog, run_id, logging.ERROR)
    assert "gave up" in gave_up and "sweep" in gave_up
    await _assert_still_open(sqlite_store, run_id)
    # the sweep (one try, it comes back anyway) leaves the saying to its caller
    caplog.clear()
    await _close_while_locked(sqlite_store, tmp_path / "tg.db", run_id, retry=())
    assert not _about(caplog, run_id, logging.ERROR)


@pytest.mark.inprocess
async def test_a_close_tries_no_more_after_its_callers_deadline(
    sqlite_store: SQLiteStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A shutdown's budget is spent: one try, no pause, and the error; the run stays open."""
    caplog.set_level(logging.WARNING, "thoughtgate.leases")
    run_id = await _open_run(sqlite_store)
    await _close_while_locked(sqlite_store, tmp_path / "tg.db", run_id, deadline=time.monotonic())
    assert not _about(caplog, run_id, logging.WARNING), "no try after the deadline"
    assert len(_about(caplog, run_id, logging.ERROR)) == 1
    await _assert_still_open(sqlite_store, run_id)


@pytest.mark.unit
async def test_what_cannot_succeed_is_not_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "thoughtgate.leases")
    store = MemoryStore()
    with pytest.raises(RunNotFoundError):
        await close_run_interrupted(store, "run_nowhere", REASON, retry=(60.0,))
    run_id = await _open_run(store)
    assert await close_run_interrupted(store, run_id, REASON)
    # already closed: nothing to do, nothing retried, the first ending kept
    assert await close_run_interrupted(store, run_id, "a later reason", retry=(60.0,)) == []
    await _assert_closed_once(store, run_id)
    assert not [r for r in caplog.records if r.name == "thoughtgate.leases"]


@pytest.mark.postgres
@pytest.mark.timeout(60)
async def test_a_close_whose_postgres_connection_is_dropped_is_tried_again(
    pg_admin: psycopg.AsyncConnection[Any], pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server drops the connection of the close while it waits (an operator's
    pg_terminate_backend, a failover): the next try, on a new connection, closes the run."""
    caplog.set_level(logging.WARNING, "thoughtgate.leases")
    store = await PostgresStore.open(PG_URL, schema=pg_schema, pool_size=2)
    try:
        run_id = await _open_run(store)
        async with await psycopg.AsyncConnection.connect(PG_URL) as holder:  # not autocommit
            await holder.execute(
                f'SELECT 1 FROM "{pg_schema}".runs WHERE run_id = %s FOR UPDATE', (run_id,)
            )
            closing = asyncio.create_task(close_run_interrupted(store, run_id, REASON))
            killed = 0
            while not killed:  # the close waits for the row lock: drop its connection
                assert not closing.done(), "the close went through another transaction's lock"
                cur = await pg_admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = %s AND wait_event_type = 'Lock'",
                    (f"thoughtgate:{pg_schema}",),
                )
                row = await cur.fetchone()
                killed = int(row[0]) if row else 0
                await asyncio.sleep(0.01)
            while not _about(caplog, run_id, logging.WARNING):  # the dropped try, said
                assert not closing.done(), "the close ended with its connection dropped"
                await asyncio.sleep(0.01)
            await holder.rollback()
        await asyncio.wait_for(closing, 30)
        await _assert_closed_once(store, run_id)
        assert "connection was lost" in _about(caplog, run_id, logging.WARNING)[0]
        assert not _about(caplog, run_id, logging.ERROR)
    finally:
        await store.close()

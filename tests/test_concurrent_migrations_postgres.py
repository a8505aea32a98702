"""Schema version 9 builds its index CONCURRENTLY on PostgreSQL: runs keep being written while it
is built, an index a failed build left INVALID is built again, and replicas starting together
migrate once (ADR 0082).

``open_runs_by_id`` (ADR 0079) was built inside the migration's transaction: ``runs`` was locked
against writes -- every run's start, event projection, lease renewal and end of every replica --
for as long as the build took, at the first start of the version on a big store. Each test holds
the build at a known point with a transaction that wrote a run and has not committed (a build
waits for it, CONCURRENTLY or not), and looks at what the rest of the database can do meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.pg import PG_URL, pg_admin, pg_schema

from thoughtgate.store import codec
from thoughtgate.store.migrations import load_migrations
from thoughtgate.store.pg_schema import applied_versions, migrate
from thoughtgate.store.postgres import PostgresStore, open_runs_query

__all__ = ["pg_admin", "pg_schema"]

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

Admin = psycopg.AsyncConnection[Any]
OPEN_RUNS = 40
"""Open runs among the store's 4,000 (every hundredth): run_000100, run_000200, ..."""


async def _at_version_8(admin: Admin, schema: str) -> None:
    """A store at version 8 (before ``open_runs_by_id``) holding 4,000 runs."""
    before = load_migrations("postgres")[:8]
    assert load_migrations("postgres")[8].name == codec.OPEN_RUNS_BY_ID
    await migrate(admin, schema, before, "test")
    await admin.execute(
        sql.SQL(
            "INSERT INTO {}.runs (run_id, prompt, chain_of_thought, worker_backend, status, "
            "created_at, updated_at, usage, error, metadata, last_seq, change_seq, owner, "
            "lease_expires_at, closed_at) "
            "SELECT 'run_' || lpad(g::text, 6, '0'), 'p', 'hidden', 'provider', "
            "CASE WHEN g % 100 = 0 THEN 'running' ELSE 'completed' END, 1.0, 1.0, '{{}}', "
            "NULL, '{{}}', 0, g, CASE WHEN g % 100 = 0 THEN 'elsewhere' END, "
            "CASE WHEN g % 100 = 0 THEN 4e9 END, CASE WHEN g % 100 = 0 THEN NULL ELSE 2.0 END "
            "FROM generate_series(1, 4000) AS g"
        ).format(sql.Identifier(schema))
    )


async def _connect(**kw: Any) -> Admin:
    return await psycopg.AsyncConnection.connect(PG_URL, autocommit=True, **kw)


@pytest.fixture
async def blocker() -> AsyncIterator[Admin]:
    """A connection whose open transaction wrote a run: any index build waits for it."""
    conn = await _connect(application_name="test:blocker")
    try:
        yield conn
    finally:
        await conn.close()


async def _hold_builds(blocker: Admin, schema: str) -> None:
    await blocker.execute("BEGIN")
    await blocker.execute(
        sql.SQL("UPDATE {}.runs SET updated_at = 3.0 WHERE run_id = 'run_000001'").format(
            sql.Identifier(schema)
        )
    )


async def _waiting_builders(admin: Admin, application: str) -> list[tuple[int, str]]:
    """The sessions of ``application`` waiting for a lock, and the statements they wait in."""
    cur = await admin.execute(
        "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s "
        "AND wait_event_type = 'Lock'",
        (application,),
    )
    return [(int(r[0]), str(r[1])) for r in await cur.fetchall()]


async def _until_waiting(admin: Admin, application: str) -> list[tuple[int, str]]:
    for _ in range(600):
        found = await _waiting_builders(admin, application)
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no session of {application} came to wait for the blocker")


async def _index(admin: Admin, schema: str, name: str) -> tuple[int, bool] | None:
    """``(oid, valid)`` of index ``name`` in ``schema``, ``None`` when there is none."""
    cur = await admin.execute(
        "SELECT c.oid, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (schema, name),
    )
    row = await cur.fetchone()
    return None if row is None else (int(row[0]), bool(row[1]))


async def _upgraded(admin: Admin, schema: str, store: PostgresStore) -> None:
    """Version 9 recorded, its index valid and the one it replaced gone; pages read open runs."""
    assert await applied_versions(admin, schema) == {m.version for m in load_migrations("postgres")}
    found = await _index(admin, schema, codec.OPEN_RUNS_BY_ID)
    assert found is not None and found[1], "valid"
    assert await _index(admin, schema, "open_runs_by_owner") is None
    page = await store.open_runs(limit=1000)
    assert len(page.runs) >= OPEN_RUNS - 1


async def _write_runs(schema: str) -> None:
    """What a daemon does to ``runs`` meanwhile: a run starts, a run ends, a lease is renewed.
    A write that waited for a lock longer than 10 s fails (``lock_timeout``): before this
    change each waited for the whole build."""
    conn = await _connect(application_name="test:writer")
    try:
        await conn.execute("SET lock_timeout = '10s'")
        runs = sql.SQL("{}.runs").format(sql.Identifier(schema))
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (run_id, prompt, chain_of_thought, worker_backend, status, "
                "created_at, updated_at, usage, error, metadata, last_seq, change_seq, owner, "
                "lease_expires_at) VALUES ('run_new', 'p', 'hidden', 'provider', 'running', "
                "1.0, 1.0, '{{}}', NULL, '{{}}', 0, 99999, 'here', 4e9)"
            ).format(runs)
        )
        await conn.execute(
            sql.SQL(
                "UPDATE {} SET status = 'completed', closed_at = 5.0 WHERE run_id = 'run_000200'"
            ).format(runs)
        )
        await conn.execute(
            sql.SQL("UPDATE {} SET lease_expires_at = 5e9 WHERE run_id = 'run_000300'").format(runs)
        )
    finally:
        await conn.close()


async def test_runs_are_written_while_the_open_runs_index_is_built(
    pg_admin: Admin, pg_schema: str, blocker: Admin
) -> None:
    await _at_version_8(pg_admin, pg_schema)
    await _hold_builds(blocker, pg_schema)
    opening = asyncio.create_task(PostgresStore.open(PG_URL, schema=pg_schema))
    ((_, query),) = await _until_waiting(pg_admin, "thoughtgate:migrate")
    assert "CONCURRENTLY" in query, query
    await _write_runs(pg_schema)  # failed on lock_timeout before: the build held them
    assert not opening.done()
    await blocker.execute("COMMIT")
    store = await opening
    try:
        await _upgraded(pg_admin, pg_schema, store)
        open_ids = {r.run_id for r in (await store.open_runs(limit=1000)).runs}
        assert "run_new" in open_ids, "a run started during the build is in the index"
        assert "run_000200" not in open_ids, "a run ended during the build is not"
        assert "run_000300" in open_ids
    finally:
        await store.close()


async def test_an_index_a_failed_build_left_invalid_is_built_again(
    pg_admin: Admin, pg_schema: str, blocker: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    """A build that was cancelled (or failed, or lost its session) leaves the index INVALID:
    never used by a reader, still written by every write. The next start drops and builds it
    again; ``IF NOT EXISTS`` alone would have kept it."""
    await _at_version_8(pg_admin, pg_schema)
    await _hold_builds(blocker, pg_schema)
    builder = await _connect(application_name="test:builder")
    try:
        building = asyncio.create_task(
            builder.execute(
                sql.SQL("CREATE INDEX CONCURRENTLY {} ON {}.runs (run_id) WHERE {}").format(
                    sql.Identifier(codec.OPEN_RUNS_BY_ID),
                    sql.Identifier(pg_schema),
                    sql.SQL(codec.OPEN_RUN_PREDICATE),  # pyright: ignore[reportArgumentType]
                )
            )
        )
        ((pid, _),) = await _until_waiting(pg_admin, "test:builder")
        await pg_admin.execute("SELECT pg_cancel_backend(%s)", (pid,))
        with pytest.raises(psycopg.errors.QueryCanceled):
            await building
    finally:
        await builder.close()
    await blocker.execute("COMMIT")
    left = await _index(pg_admin, pg_schema, codec.OPEN_RUNS_BY_ID)
    assert left is not None and not left[1], "the cancelled build left it INVALID"
    with caplog.at_level(logging.WARNING, logger="thoughtgate.store"):
        store = await PostgresStore.open(PG_URL, schema=pg_schema)
    try:
        await _upgraded(pg_admin, pg_schema, store)
        rebuilt = await _index(pg_admin, pg_schema, codec.OPEN_RUNS_BY_ID)
        assert rebuilt is not None and rebuilt[0] != left[0], "a new index, not the old one"
        assert "left INVALID" in caplog.text
    finally:
        await store.close()


async def test_an_index_built_whole_by_a_start_that_stopped_is_kept(
    pg_admin: Admin, pg_schema: str
) -> None:
    """The build finished, the process stopped before recording the version: the next start
    keeps the index and completes the rest."""
    await _at_version_8(pg_admin, pg_schema)
    await pg_admin.execute(
        sql.SQL("CREATE INDEX {} ON {}.runs (run_id) WHERE {}").format(
            sql.Identifier(codec.OPEN_RUNS_BY_ID),
            sql.Identifier(pg_schema),
            sql.SQL(codec.OPEN_RUN_PREDICATE),  # pyright: ignore[reportArgumentType]
        )
    )
    built = await _index(pg_admin, pg_schema, codec.OPEN_RUNS_BY_ID)
    async with contextlib_closing(await PostgresStore.open(PG_URL, schema=pg_schema)) as store:
        await _upgraded(pg_admin, pg_schema, store)
    assert await _index(pg_admin, pg_schema, codec.OPEN_RUNS_BY_ID) == built


async def test_replicas_starting_together_build_it_once(
    pg_admin: Admin, pg_schema: str, blocker: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    """Three replicas open the store at version 8 together. One builds the index; the others
    wait for the migration lock by asking for it again and again, never inside a statement --
    a waiter inside a statement keeps a snapshot, which the build waits for: the deadlock
    detector then aborts one of them, leaving an INVALID index or a replica that cannot
    start."""
    await _at_version_8(pg_admin, pg_schema)
    await _hold_builds(blocker, pg_schema)
    opening = [asyncio.create_task(PostgresStore.open(PG_URL, schema=pg_schema)) for _ in range(3)]
    caplog.set_level(logging.INFO, logger="thoughtgate.store")
    await _until_waiting(pg_admin, "thoughtgate:migrate")
    for _ in range(600):  # both others were refused the lock once (and ask again)
        if caplog.text.count("waiting for another process migrating") == 2:
            break
        await asyncio.sleep(0.05)
    waiting = await _waiting_builders(pg_admin, "thoughtgate:migrate")
    assert len(waiting) == 1 and "CONCURRENTLY" in waiting[0][1], waiting
    assert not any(task.done() for task in opening)
    await blocker.execute("COMMIT")
    stores = await asyncio.gather(*opening)
    try:
        for store in stores:
            await _upgraded(pg_admin, pg_schema, store)
    finally:
        for store in stores:
            await store.close()


class contextlib_closing:  # noqa: N801 - reads as contextlib.aclosing for a store
    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    async def __aenter__(self) -> PostgresStore:
        return self.store

    async def __aexit__(self, *exc: object) -> None:
        await self.store.close()


async def test_the_expired_read_visits_the_held_runs_only(pg_admin: Admin, pg_schema: str) -> None:
    """Schema version 10 (ADR 0082): beside 2,000 suspended runs (open, no owner), the sweep's
    read of expired leases is a range read of ``leased_runs_by_id`` that visits the 80 held
    runs and none of the others -- before, it visited every open run (through
    ``open_runs_by_id``), the suspended ones included."""
    await _at_version_8(pg_admin, pg_schema)
    store = await PostgresStore.open(PG_URL, schema=pg_schema)
    try:
        await pg_admin.execute(
            sql.SQL(
                "INSERT INTO {}.runs (run_id, prompt, chain_of_thought, worker_backend, status, "
                "created_at, updated_at, usage, error, metadata, last_seq, change_seq, owner, "
                "lease_expires_at) "
                "SELECT 'sus_' || lpad(g::text, 6, '0'), 'p', 'hidden', 'provider', 'pending', "
                "1.0, 1.0, '{{}}', NULL, '{{}}', 0, 10000 + g, "
                "CASE WHEN g <= 40 THEN 'gone.1.x' END, CASE WHEN g <= 40 THEN 1.0 END "
                "FROM generate_series(1, 2040) AS g"
            ).format(sql.Identifier(pg_schema))
        )
        await pg_admin.execute(sql.SQL("ANALYZE {}.runs").format(sql.Identifier(pg_schema)))
        expired = await store.open_runs(limit=1000, expired=True)
        assert [r.run_id for r in expired.runs] == [f"sus_{g:06d}" for g in range(1, 41)]
        await pg_admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        try:
            query, params = open_runs_query(limit=1000, after=None, expired=True, run_ids=None)
            explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)"
            rows = await (await pg_admin.execute(f"{explain} {query}", params)).fetchall()
            plan = "\n".join(str(r[0]) for r in rows)
        finally:
            await pg_admin.execute("RESET search_path")
        assert "Index Scan using leased_runs_by_id on runs (actual rows=40 loops=1)" in plan, plan
        # The 40 held runs of _at_version_8 (live leases) are visited too; no suspended one.
        assert "Rows Removed by Filter: 40" in plan, plan
        assert "open_runs_by_id" not in plan and "Seq Scan on runs" not in plan, plan
    finally:
        await store.close()
